"""runtime/recompute.py: checkpointed layers outlined from a captured program."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.fx as fx
from user_programs import _saved_bytes, default_config_model

from torch_plugin.runtime.recompute import (
    Recomputed,
    by_module_stack,
    checkpoint_regions,
    checkpointed_layers,
    recompute,
)


class _Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.dropout(self.a(x).relu(), 0.5) + x
        x = torch.nn.functional.dropout(self.b(x).relu(), 0.5) + x
        return self.head(x).sum()


def test_each_layers_run_is_one_recomputed_region_with_eagers_values_and_gradients() -> None:
    """Two layers whose module calls are labelled and whose functional ops between are not
    (as a collective the sharding adds is not), then the head: two regions, each taking the
    unlabelled ops after its call. Values, gradients and the generator's stream are eager's,
    and each region's forward runs again in the backward."""
    torch.manual_seed(0)
    model = _Blocks()
    gm = fx.symbolic_trace(model)
    owner = {n.name: str(n.target) for n in gm.graph.nodes if n.op == "call_module"}

    def region(n: fx.Node) -> str | None:
        s = owner.get(n.name)
        return "" if s is None else None if s == "head" else s

    out, count = checkpoint_regions(gm, region)
    assert count == 2
    recomputed = [m for m in out.modules() if isinstance(m, Recomputed)]
    assert len(recomputed) == 2
    calls = [0]
    for m in recomputed:
        m.inner.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    x = torch.randn(4, 8, requires_grad=True)
    ref = copy.deepcopy(model)
    torch.manual_seed(1)
    loss = out(x)
    loss.backward()
    after = torch.rand(2)
    xr = x.detach().clone().requires_grad_()
    torch.manual_seed(1)
    want = ref(xr)
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(x.grad, xr.grad)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(after, torch.rand(2), rtol=0, atol=0)
    assert calls[0] == 4  # each region ran in the forward and again in the backward
    with torch.no_grad():  # no gradients recorded: each region runs once
        calls[0] = 0
        out(x)
        assert calls[0] == 2


def test_no_region_leaves_the_program_as_it_is() -> None:
    gm = fx.symbolic_trace(_Blocks())
    out, count = checkpoint_regions(gm, lambda n: None)
    assert out is gm and count == 0


def test_checkpointed_layers_no_node_recorded_are_named_in_a_warning(caplog) -> None:
    """Asked to keep checkpointing where no node says which module it ran in (a capture without
    module stacks): the program is left as it is, and the log says it keeps every activation."""
    gm = fx.symbolic_trace(_Blocks())
    with caplog.at_level(logging.INFO, logger="torch_plugin"):
        out = recompute(gm, ["model.layers.0"], "sharding")
    assert out is gm
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "keeps every activation" in warned[0].getMessage()
    assert "model.layers.0" in warned[0].getMessage()


def test_checkpointed_layers_are_hfs_outermost_checkpointing_layers() -> None:
    model = default_config_model("llama")  # 2 layers
    assert checkpointed_layers(model) == []
    model.gradient_checkpointing_enable()
    assert checkpointed_layers(model) == ["model.layers.0", "model.layers.1"]
    region = by_module_stack(["model.layers.0"])
    node = fx.Graph().placeholder("x")
    node.meta["nn_module_stack"] = {"": ("", "M"), "l": ("model.layers.0.mlp", "MLP")}
    assert region(node) == "model.layers.0"
    node.meta["nn_module_stack"] = {"": ("", "M"), "n": ("model.norm", "Norm")}
    assert region(node) is None
    node.meta["nn_module_stack"] = {"": ("", "M")}  # the root module: cannot tell
    assert region(node) == ""
    del node.meta["nn_module_stack"]
    assert region(node) == ""


class _SelfCheckpointing(torch.nn.Module):
    """A user's model that checkpoints its own blocks with torch.utils.checkpoint (not through
    HF's layers): the second block checkpoints its halves inside its own call (nested)."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
            for _ in range(2)
        )
        self.head = torch.nn.Linear(8, 2)

    def _checkpoint(self, fn: object, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=self.reentrant)

    def _nested(self, x: torch.Tensor) -> torch.Tensor:
        x = self._checkpoint(self.blocks[1][:2], x)
        return torch.nn.functional.dropout(self.blocks[1][2](x), 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._checkpoint(self.blocks[0], x)
        x = x + self._checkpoint(self._nested, x)
        return self.head(x).sum()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_forwards_own_checkpoint_calls_recompute_in_its_captured_program(reentrant) -> None:
    """A model calling torch.utils.checkpoint itself was traced through: the captured program
    replayed op by op and saved every activation, and nothing said so. The nodes of each
    outermost call are tagged in the trace and recompute in the backward: values, gradients
    and dropout are the plain trace's, and the program saves less. torch's checkpoint
    internals are as they were after the trace."""
    from torch_plugin.runtime.capture import trace_call
    from torch_plugin.runtime.recompute import CHECKPOINTED

    internals = _checkpoint_internals()
    torch.manual_seed(0)
    model = _SelfCheckpointing(reentrant).train()
    x = torch.randn(16, 8, requires_grad=True)
    traced = trace_call(model, ((x,), {}))
    assert _checkpoint_internals() == internals
    with torch.no_grad():  # a capture under no_grad (the first call at a new shape) tags too
        untracked = trace_call(model, ((x,), {}))
    assert {n.meta.get(CHECKPOINTED) for n in untracked.gm.graph.nodes} == {None, 0, 1}
    calls = {n.meta.get(CHECKPOINTED) for n in traced.gm.graph.nodes}
    assert calls == {None, 0, 1}  # two outermost calls; the head outside both
    head = [n for n in traced.gm.graph.nodes if n.op == "call_function"][-3:]
    assert all(CHECKPOINTED not in n.meta for n in head)  # t, addmm, sum of the head

    program = recompute(traced.gm, [], "test")
    assert sum(isinstance(m, Recomputed) for m in program.modules()) == 2
    state = [*model.parameters()]

    def run(gm: fx.GraphModule) -> tuple[torch.Tensor, list[torch.Tensor], int]:
        for t in [*state, x]:
            t.grad = None
        torch.manual_seed(1)
        loss, saved = _saved_bytes(lambda: gm(*state, x)[0])
        loss.backward()
        return loss, [t.grad for t in [*state, x]], saved

    loss, grads, saved = run(program)
    want, want_grads, kept = run(traced.gm)
    torch.testing.assert_close(loss, want)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    assert saved < 0.5 * kept, (saved, kept)
    torch.manual_seed(1)
    torch.testing.assert_close(model(x), want)  # the trace is eager's model


def _checkpoint_internals() -> list[object]:
    """What tag_checkpointed_calls patches while a trace runs, as torch defines it."""
    import torch.utils.checkpoint as tuc

    return [
        vars(tuc.CheckpointFunction)["forward"],
        tuc._checkpoint_without_reentrant_generator,
        dict(vars(tuc._checkpoint_hook)),
    ]


def test_checkpoint_internals_are_set_back_when_the_traced_forward_raises() -> None:
    from torch_plugin.runtime.capture import trace_call

    class Raises(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            def fails(y: torch.Tensor) -> torch.Tensor:
                raise ValueError("the model's own error")

            return torch.utils.checkpoint.checkpoint(fails, x, use_reentrant=False)

    internals = _checkpoint_internals()
    with pytest.raises(ValueError, match="the model's own error"):
        trace_call(Raises(), ((torch.randn(2, 2),), {}))
    assert _checkpoint_internals() == internals


class _Selective(torch.nn.Module):
    """Selective checkpointing as torchtitan sets it up: a policy that saves the matmuls."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.nn.Sequential(
            torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)
        )
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import (
            CheckpointPolicy,
            create_selective_checkpoint_contexts,
        )

        def policy(ctx: object, op: object, *args: object, **kwargs: object) -> object:
            if op is torch.ops.aten.addmm.default:
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        x = x + torch.utils.checkpoint.checkpoint(
            self.block,
            x,
            use_reentrant=False,
            context_fn=lambda: create_selective_checkpoint_contexts(policy),
        )
        return self.head(x).sum()


def test_a_checkpoint_calls_selective_policy_is_kept_in_its_region() -> None:
    """A call's context_fn (selective checkpointing: save the matmuls, recompute the rest)
    goes with its region: the backward recomputes the GELU but no matmul (a full recompute
    ran the block's first addmm again), with the plain trace's gradients. The trace leaves
    torch.fx's current node meta as it found it (the policy's caching mode wrote recompute
    tags there, and the process's next torch.compile failed in its partitioner)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_plugin.runtime.capture import trace_call

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.addmm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.addmm += func is torch.ops.aten.addmm.default
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = _Selective().train()
    x = torch.randn(4, 8, requires_grad=True)
    meta = dict(torch.fx.traceback.current_meta)
    traced = trace_call(model, ((x,), {}))
    assert dict(torch.fx.traceback.current_meta) == meta
    program = recompute(traced.gm, [], "test")
    assert sum(isinstance(m, Recomputed) for m in program.modules()) == 1
    state = [*model.parameters(), x]
    grads = []
    for gm in (program, traced.gm):
        for t in state:
            t.grad = None
        loss = gm(*state)[0]
        with Count() as count:
            loss.backward()
        grads.append([t.grad for t in state])
        if gm is program:
            assert count.addmm == 0, count.addmm
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w)


def test_a_module_level_trace_counts_the_checkpoint_calls_it_ran_through() -> None:
    """torch.fx runs through a forward's checkpoint calls (a pipeline split at module level
    would keep every activation, so it splits the ATen graph instead); a leaf module, which
    runs as the model wrote it, is not traced into, and its own calls are not counted."""
    from torch_plugin.runtime.graph import trace_module_level
    from torch_plugin.runtime.recompute import CHECKPOINT_CALLS

    class Leaf(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.utils.checkpoint.checkpoint(self.lin, x, use_reentrant=False)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.leaf, self.lin = Leaf(), torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.leaf(torch.utils.checkpoint.checkpoint(self.lin, x, use_reentrant=False))

    x = torch.randn(2, 8)
    assert trace_module_level(Model(), (x,)).meta[CHECKPOINT_CALLS] == 2
    assert trace_module_level(Model(), (x,), ["leaf"]).meta[CHECKPOINT_CALLS] == 1
    assert trace_module_level(_Blocks(), (x,)).meta[CHECKPOINT_CALLS] == 0
