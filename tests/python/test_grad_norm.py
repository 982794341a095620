"""runtime/grad_norm.py in one process: a stub reduce stands in for the other ranks, so the
part this rank contributes to a norm, and what torch's clip does with the total, are exact."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from torch_plugin.runtime.grad_norm import GradBlock, GradGroup, NormShare, count_gradients


class _Owner:
    """A model's owner as GradGroup holds it: the other ranks' part is `other`."""

    def __init__(self, other: float = 0.0, refuse: str | None = None):
        self.other, self.refuse = other, refuse
        self.calls: list[tuple[float, Any]] = []


def _reduce(owner: _Owner, t: torch.Tensor, op: Any) -> torch.Tensor:
    owner.calls.append((float(t), op))
    if op == dist.ReduceOp.SUM:
        return t + owner.other
    return torch.maximum(t, torch.tensor(owner.other, dtype=t.dtype))


def _model(owner: _Owner, lead: bool) -> tuple[nn.Linear, GradGroup]:
    """A Linear whose weight is a block of a sharded tensor and whose bias is replicated."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    group = GradGroup(owner, _reduce, "a test model", lead, lambda o: o.refuse)
    count_gradients([(layer.weight, NormShare(group, True)), (layer.bias, NormShare(group, lead))])
    return layer, group


def _grads(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    layer(torch.randn(5, 4)).square().sum().backward()
    return layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize("lead", [True, False])
def test_torch_clip_sums_this_ranks_counted_parts_with_the_others(lead: bool) -> None:
    owner = _Owner(other=9.0)
    layer, _ = _model(owner, lead)
    w, b = (g.detach().clone() for g in _grads(layer))
    assert type(layer.weight.grad) is GradBlock
    mine = float(w.double().square().sum() + (b.double().square().sum() if lead else 0.0))
    norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), 0.5)
    assert len(owner.calls) == 1
    assert owner.calls[0][0] == pytest.approx(mine, rel=1e-6)
    assert owner.calls[0][1] == dist.ReduceOp.SUM
    assert float(norm) == pytest.approx(math.sqrt(mine + 9.0), rel=1e-6)
    assert type(norm) is torch.Tensor
    # Every gradient scaled by the whole model's factor, in place (still a block).
    coef = 0.5 / (float(norm) + 1e-6)
    assert torch.allclose(layer.weight.grad, w * coef) and torch.allclose(layer.bias.grad, b * coef)
    assert type(layer.bias.grad) is GradBlock


def test_inf_norm_is_the_max_over_ranks_of_every_block() -> None:
    owner = _Owner(other=123.0)
    layer, _ = _model(owner, lead=False)
    w, b = _grads(layer)
    norm = torch.nn.utils.get_total_norm([w, b], norm_type=math.inf)
    local = max(float(w.abs().max()), float(b.abs().max()))  # replicated ones count too
    assert owner.calls == [(pytest.approx(local), dist.ReduceOp.MAX)]
    assert float(norm) == 123.0


def test_other_ops_on_gradients_are_plain_and_the_optimizer_steps_as_on_plain_ones() -> None:
    owner = _Owner()
    layer, _ = _model(owner, lead=True)
    plain = nn.Linear(4, 3)
    plain.load_state_dict(layer.state_dict())
    torch.manual_seed(1)
    x = torch.randn(5, 4)
    for m in (layer, plain):
        for _ in range(2):  # accumulation: the second backward adds into the block
            m(x).square().sum().backward()
    assert type(layer.weight.grad) is GradBlock
    assert torch.equal(layer.weight.grad, plain.weight.grad)
    assert type(layer.weight.grad * 2) is torch.Tensor
    assert type(layer.weight.grad.norm(dim=0)) is torch.Tensor  # not a whole-tensor norm
    for m in (layer, plain):
        opt = torch.optim.AdamW(m.parameters(), lr=0.1)
        opt.step()
    assert torch.equal(layer.weight, plain.weight) and torch.equal(layer.bias, plain.bias)
    assert all(type(v) is torch.Tensor for v in opt.state[plain.weight].values())
    state = torch.optim.AdamW(layer.parameters()).state  # fresh: nothing leaked there
    assert not state
    assert not owner.calls  # nothing above reduced


def test_a_norm_over_two_models_gradients_is_refused() -> None:
    owners = _Owner(), _Owner()  # held: a gone owner's gradients count alone
    a, _ = _model(owners[0], lead=True)
    b, _ = _model(owners[1], lead=True)
    _grads(a), _grads(b)
    with pytest.raises(ValueError, match="several distributed models"):
        torch.nn.utils.clip_grad_norm_([*a.parameters(), *b.parameters()], 1.0)


def test_a_norm_the_owner_refuses_raises_its_reason() -> None:
    owner = _Owner(refuse="gradients kept elsewhere; call dist_model.clip_grad_norm_")
    layer, _ = _model(owner, lead=True)
    _grads(layer)
    with pytest.raises(RuntimeError, match="kept elsewhere"):
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)


def test_order_zero_is_refused() -> None:
    owner = _Owner()
    layer, _ = _model(owner, lead=True)
    w, b = _grads(layer)
    with pytest.raises(ValueError, match="order 0"):
        torch.nn.utils.get_total_norm([w, b], norm_type=0)


def test_gradients_outlive_their_owner_as_local_ones() -> None:
    owner = _Owner(other=100.0)
    layer, group = _model(owner, lead=False)
    w, b = _grads(layer)
    del owner
    assert not group.alive()
    want = torch.nn.utils.get_total_norm([w.detach().clone(), b.detach().clone()])
    assert float(torch.nn.utils.get_total_norm([w, b])) == pytest.approx(float(want))
    layer.zero_grad(set_to_none=True)
    _grads(layer)
    assert type(layer.weight.grad) is torch.Tensor  # no longer made a block


def test_the_foreach_path_and_a_parameter_unfrozen_later_count_too() -> None:
    """clip_grad_norm_(..., foreach=True) goes through torch._foreach_norm; a parameter
    frozen when the model was parallelized and trained later gets a block as well."""
    owner = _Owner(other=4.0)
    layer, group = _model(owner, lead=True)
    frozen = nn.Parameter(torch.randn(3), requires_grad=False)
    count_gradients([(frozen, NormShare(group, True))])
    assert not frozen.requires_grad  # left as it was
    frozen.requires_grad_(True)
    (frozen * 2).sum().backward()
    assert type(frozen.grad) is GradBlock
    w, b = _grads(layer)
    mine = float(w.double().square().sum() + b.double().square().sum() + 12.0)  # 3 x 2^2
    norm = torch.nn.utils.clip_grad_norm_([*layer.parameters(), frozen], 0.5, foreach=True)
    assert float(norm) == pytest.approx(math.sqrt(mine + 4.0), rel=1e-6)


def test_gradients_save_and_copy_as_plain_tensors() -> None:
    import copy
    import io

    owner = _Owner()
    layer, _ = _model(owner, lead=True)
    w, _ = _grads(layer)
    buf = io.BytesIO()
    torch.save({"grad": w, "norm": w.norm()}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert type(loaded["grad"]) is torch.Tensor and torch.equal(loaded["grad"], w)
    assert type(copy.deepcopy(w)) is torch.Tensor
