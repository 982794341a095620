"""The schedule verifier: static rules over shards and syncs, and differential testing against
the unscheduled model that names the first module whose result differs and what was applied
there (Slapo section 3.5)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils._pytree as pytree

if TYPE_CHECKING:
    from .schedule import _State

from ..runtime.spmd_ops import _block
from .errors import ScheduleError


def _covers(paths: list[str], path: str) -> bool:
    """Whether `path` or one of its ancestors is in `paths` ('' is the model)."""
    return any(p == path or not p or path.startswith(p + ".") for p in paths)


def static_check(st: _State) -> None:
    fwd_sum = [p for p, modes in st.syncs.items() if "fwd_post:all_reduce" in modes]
    bwd_sum = [p for p, modes in st.syncs.items() if "bwd_post:all_reduce" in modes]
    fwd_any = [p for p, modes in st.syncs.items() if any(m.startswith("fwd") for m in modes)]
    problems = []
    for s in st.shards:
        if s.name != "weight":
            continue
        if s.role == "in" and not _covers(fwd_sum, s.path):
            problems.append(
                f'sch["{s.path}"] computes partial outputs (weight split along its inputs or '
                f'its vocabulary) that are never summed: add sch["{s.path}"].sync("fwd_post")'
            )
        owner = st.model.get_submodule(s.path) if s.path else st.model
        if (
            getattr(owner, "_tp_deferred_bias", False)
            and s.path not in fwd_sum
            and _covers(fwd_sum, s.path)
        ):
            problems.append(
                f'sch["{s.path}"]: its bias is added after its own sum, so the all-reduce must '
                f'be on it: sch["{s.path}"].sync("fwd_post"), not on a parent'
            )
        if s.role == "out" and not (_covers(bwd_sum, s.path) or _covers(fwd_any, s.path)):
            problems.append(
                f'sch["{s.path}"] is column-parallel (weight split along its outputs) but the '
                'gradient of its input is never summed over ranks: add .sync("bwd_post") on it '
                "or on the module whose input enters the parallel region"
            )
    if problems:
        raise ScheduleError("schedule check failed:\n  " + "\n  ".join(problems))


@contextlib.contextmanager
def _eval(*models: nn.Module) -> Iterator[None]:
    modes = [[m.training for m in model.modules()] for model in models]
    for model in models:
        model.eval()  # dropout off: both models must compute the same function
    try:
        yield
    finally:
        for model, ms in zip(models, modes, strict=True):
            for m, t in zip(model.modules(), ms, strict=True):
                m.training = t


class _Recorder:
    """Each module's outputs (in completion order, so children first) and the modules running."""

    def __init__(self, model: nn.Module) -> None:
        self.outputs: dict[str, list[torch.Tensor]] = {}
        self.order: list[str] = []
        self.running: list[str] = []
        self.handles = []
        for name, m in model.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._enter(name)))
            self.handles.append(m.register_forward_hook(self._leave(name)))

    def _enter(self, name: str) -> Any:
        def hook(mod: nn.Module, args: Any) -> None:
            self.running.append(name)

        return hook

    def _leave(self, name: str) -> Any:
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            if self.running and self.running[-1] == name:
                self.running.pop()
            if name not in self.outputs:
                self.order.append(name)
            self.outputs[name] = [
                t.detach().clone()
                for t in pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor) and t.is_floating_point()
            ]

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _max_over_ranks(st: _State, value: float) -> float:
    if st.comm is None or st.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=st.comm.group)
    return float(t.item())


def _broadcast_inputs(st: _State, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    if st.comm is None or st.world == 1:
        return inputs
    src = dist.get_global_rank(st.comm.group, 0)

    def bcast(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            x = x.clone()
            dist.broadcast(x, src=src, group=st.comm.group)
        return x

    return pytree.tree_map(bcast, inputs)


def _err(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> float:
    """How far past the tolerance a is from b (<= 0: within it; inf: shapes differ)."""
    if a.shape != b.shape:
        return float("inf")
    if not a.numel():
        return -1.0
    # Relative to the tensor's scale: sharded sums add in another order than one process's.
    bound = atol + rtol * float(b.abs().max())
    return float((a - b).abs().max()) - bound


def _steps_at(st: _State, path: str) -> list[str]:
    """Primitives applied at `path` or inside it; else at its nearest ancestor that has some."""
    while True:
        here = [
            str(s) for s in st.steps if s.path == path or (path and s.path.startswith(path + "."))
        ]
        if here or not path:
            here = here or [str(s) for s in st.steps]
            return here[:8] + [f"... and {len(here) - 8} more"] * (len(here) > 8)
        path = path.rsplit(".", 1)[0] if "." in path else ""


def _random_like(x: Any, gen: torch.Generator) -> Any:
    """Random values of an example input's shape and dtype (integers within its range, so
    token ids stay valid ids)."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.dtype == torch.bool:
        return torch.rand(x.shape, generator=gen) < 0.5
    if not x.is_floating_point():
        lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
        return torch.randint(lo, hi + 1, x.shape, generator=gen, dtype=x.dtype)
    return torch.randn(x.shape, generator=gen, dtype=x.dtype) * (x.std() if x.numel() > 1 else 1)


def verify(
    st: _State,
    example_inputs: tuple[Any, ...],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    backward: bool = True,
    seed: int = 0,
    random_trials: int = 2,
) -> dict[str, Any]:
    """Compares the scheduled model with the unscheduled one on the example inputs and on
    `random_trials` random inputs like them; returns the largest differences measured."""
    static_check(st)
    gen = torch.Generator().manual_seed(seed)
    report = _verify_once(st, example_inputs, rtol, atol, backward, seed)
    for _ in range(random_trials):
        more = _verify_once(
            st,
            pytree.tree_map(lambda x: _random_like(x, gen), example_inputs),
            rtol,
            atol,
            backward,
            seed,
        )
        for k in ("output_max_diff", "grad_max_diff"):
            if more[k] is not None:
                report[k] = max(report[k] or 0.0, more[k])
    report["trials"] = 1 + random_trials
    return report


def _verify_once(
    st: _State,
    example_inputs: tuple[Any, ...],
    rtol: float,
    atol: float,
    backward: bool,
    seed: int,
) -> dict[str, Any]:
    inputs = _broadcast_inputs(st, example_inputs)
    ref_model, model = st.original, st.model
    ref_rec, rec = _Recorder(ref_model), _Recorder(model)
    try:
        with _eval(ref_model, model):
            ref_out = ref_model(*inputs)
            try:
                out = model(*inputs)
            except ScheduleError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure of the scheduled model
                where = rec.running[-1] if rec.running else ""
                raise ScheduleError(
                    f'verify: the scheduled model fails in sch["{where}"] ({type(e).__name__}: '
                    f"{str(e).splitlines()[0] if str(e) else ''}); primitives applied there: "
                    + "; ".join(_steps_at(st, where))
                ) from e
    finally:
        ref_rec.remove()
        rec.remove()
    ref_leaves = [t for t in pytree.tree_leaves(ref_out) if isinstance(t, torch.Tensor)]
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    out_err = max(
        (
            _err(a.detach(), b.detach(), rtol, atol)
            for a, b in zip(leaves, ref_leaves, strict=False)
        ),
        default=-1.0,
    )
    if len(leaves) != len(ref_leaves):
        out_err = float("inf")
    out_diff = max(
        (
            float((a.detach() - b.detach()).abs().max())
            for a, b in zip(leaves, ref_leaves, strict=False)
            if a.shape == b.shape and a.numel()
        ),
        default=0.0,
    )
    out_err = _max_over_ranks(st, out_err)
    if out_err > 0:
        # The first module (in completion order, so the deepest first) whose output has the
        # unscheduled shape and other values.
        culprit = ""
        for name in rec.order:
            mine, theirs = rec.outputs.get(name), ref_rec.outputs.get(name)
            if not mine or not theirs or len(mine) != len(theirs):
                continue
            if all(a.shape == b.shape for a, b in zip(mine, theirs, strict=True)) and any(
                _err(a, b, rtol, atol) > 0 for a, b in zip(mine, theirs, strict=True)
            ):
                culprit = name
                break
        what = (
            "the output shape differs (is it still sharded? add a fwd_post all_gather sync)"
            if out_err == float("inf")
            else f"outputs differ by {out_err:.3g} past rtol={rtol:g}, atol={atol:g}"
        )
        where = f'first differing module: sch["{culprit}"]' if culprit else "at the model output"
        # Its inputs may come from a parallel region that starts in a sibling: name what was
        # applied in its parent too.
        region = culprit.rsplit(".", 1)[0] if "." in culprit else culprit
        raise ScheduleError(
            f'verify: {what}; {where}; primitives applied in sch["{region}"]: '
            + "; ".join(_steps_at(st, region))
        )
    report: dict[str, Any] = {"output_max_diff": out_diff, "grad_max_diff": None, "grads": 0}
    if not backward:
        return report
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in ref_leaves]
    ref_model.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)
    with _eval(ref_model, model):
        sum(
            (t * w).sum()
            for t, w in zip(pytree.tree_leaves(ref_model(*inputs)), weights, strict=True)
        ).backward()
        sum(
            (t * w).sum() for t, w in zip(pytree.tree_leaves(model(*inputs)), weights, strict=False)
        ).backward()
    shards = {(s.path, s.name): s for s in st.shards}
    ref_params = dict(ref_model.named_parameters(remove_duplicate=False))
    worst, worst_name = -1.0, ""
    checked, grad_diff = 0, 0.0
    for name, p in model.named_parameters(remove_duplicate=False):
        ref = ref_params.get(name)
        if ref is None or (p.grad is None) != (ref.grad is None):
            if ref is not None:
                worst, worst_name = float("inf"), name
            continue
        if p.grad is None:
            continue
        owner, _, pname = name.rpartition(".")
        info = shards.get((owner, pname))
        expect = (
            ref.grad
            if info is None
            else _block(ref.grad, info.axis, info.sections, st.world, st.rank)
        )
        e = _err(p.grad, expect, rtol, atol)
        if p.grad.shape == expect.shape and p.grad.numel():
            grad_diff = max(grad_diff, float((p.grad - expect).abs().max()))
        checked += 1
        if e > worst:
            worst, worst_name = e, name
    flag = _max_over_ranks(st, worst)
    report.update(grad_max_diff=grad_diff, grads=checked)
    if flag > 0:
        owner = worst_name.rpartition(".")[0]
        raise ScheduleError(
            f"verify: gradients differ from the unscheduled model's (worst {flag:.3g} past the "
            f"tolerance{f', at {worst_name}' if worst_name else ' on another rank'}); "
            "primitives applied there: " + "; ".join(_steps_at(st, owner))
        )
    return report
