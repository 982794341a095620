"""Gradient blocks whose norms add up over the ranks of a distributed model.

A sharded model's or a pipeline stage's parameters hold this rank's part of the model, so
a training loop that clips with torch's own `torch.nn.utils.clip_grad_norm_(model.parameters(),
max_norm)` (HF Trainer and accelerate outside FSDP, Lightning, most hand-written loops) would
clip each rank by the norm of its part: ranks scale by different factors and replicated blocks
drift apart. FSDP2 answers this with DTensor parameters; our programs run on plain local
blocks, so only the gradients change type: after each accumulation a parameter's gradient is
made a `GradBlock`, an alias of the same memory (nothing is copied). The norm of a block is a
`NormPart` that knows whose part it is; the norm of a stack of parts (the total torch computes
from per-gradient norms) is reduced over the owner's ranks, every parameter counted once. The
result is the whole model's norm on every rank, so torch's clip scales every block alike.
Every other op on a gradient runs as on a plain tensor and returns plain tensors.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

# reduce(owner, tensor, op) -> the op over the owner's ranks of every rank's tensor.
Reduce = Callable[[Any, torch.Tensor, Any], torch.Tensor]


class GradGroup:
    """The ranks whose gradient blocks make up one model, as its owner (a sharded module or a
    pipeline, held weakly: gradients left on a model's parameters after it is gone count
    alone) reduces over them. `lead`: this rank counts what every rank holds alike.
    `refuse(owner)` may name why a total over parameters' gradients would be wrong (gradients
    kept elsewhere); the total then raises that."""

    def __init__(
        self,
        owner: Any,
        reduce: Reduce,
        what: str,
        lead: bool,
        refuse: Callable[[Any], str | None] | None = None,
    ):
        self._owner = weakref.ref(owner)
        self._reduce, self._refuse, self.what, self.lead = reduce, refuse, what, lead

    def alive(self) -> bool:
        return self._owner() is not None

    def reduce(self, t: torch.Tensor, op: Any) -> torch.Tensor:
        owner = self._owner()
        if owner is None:
            return t
        if self._refuse is not None and (why := self._refuse(owner)):
            raise RuntimeError(why)
        return self._reduce(owner, t, op)


@dataclass(frozen=True)
class NormShare:
    """One parameter's place in its group's norm: counted on this rank (a block of a sharded
    tensor, or the copy of a replicated one that one rank of the group counts)."""

    group: GradGroup
    counted: bool


def count_gradients(params: Iterable[tuple[nn.Parameter, NormShare]]) -> list[RemovableHandle]:
    """Make each parameter's gradient a GradBlock of its share after every accumulation; a
    frozen parameter too (a loop may unfreeze it later)."""
    handles = []
    for p, share in params:
        frozen = not p.requires_grad
        p.requires_grad_(True)  # torch registers hooks on tensors that require grad only
        handles.append(p.register_post_accumulate_grad_hook(functools.partial(as_block, share)))
        p.requires_grad_(not frozen)
    return handles


def as_block(share: NormShare, param: torch.Tensor) -> None:
    """Make param's gradient (if any) a GradBlock of `share`."""
    g = param.grad
    if g is None or not share.group.alive():
        return
    if type(g) is GradBlock:
        g._share = share  # a model parallelized again: the latest plan's share
        return
    block = g.as_subclass(GradBlock)
    block._share = share
    param.grad = block


_NORMS = {torch.linalg.vector_norm, torch.norm, torch.Tensor.norm}
# Value-preserving ops a per-gradient norm goes through on its way to the total.
_KEEPS = {
    torch.Tensor.to,
    torch.Tensor.detach,
    torch.Tensor.clone,
    torch.Tensor.float,
    torch.Tensor.double,
}


def _whole_norm_order(func: Any, args: tuple, kwargs: dict) -> float | None:
    """The order of a norm over a whole tensor (no dim), or None for anything else."""
    if func not in _NORMS:
        return None
    ord_ = args[1] if len(args) > 1 else kwargs.get("ord", kwargs.get("p", 2.0))
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    if dim is not None or kwargs.get("keepdim") or kwargs.get("out") is not None:
        return None
    if ord_ == "fro" or ord_ is None:
        return 2.0
    return float(ord_) if isinstance(ord_, (int, float)) else None


def _plain(func: Any, args: tuple, kwargs: dict) -> Any:
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _as_plain(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


class _CopiedPlain(torch.Tensor):
    """torch.save(p.grad), *_object collectives, deepcopy: a plain tensor (the share is this
    run's, and torch copies subclasses through new_empty)."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _as_plain(self).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        return _as_plain(self).__deepcopy__(memo)


class GradBlock(_CopiedPlain):
    """A gradient block of a distributed model (see the module's docstring)."""

    _share: NormShare

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = _plain(func, args, kwargs)
        if func is torch._foreach_norm:  # clip_grad_norm_(..., foreach=True)
            order = args[1] if len(args) > 1 else kwargs.get("ord", 2.0)
            if kwargs.get("dtype") is None and len(args) < 3:
                return [
                    NormPart.of(n, (t._share,), float(order)) if type(t) is GradBlock else n
                    for t, n in zip(args[0], out, strict=True)
                ]
            return out
        order = _whole_norm_order(func, args, kwargs)
        if order is not None and type(args[0]) is GradBlock:
            return NormPart.of(out, (args[0]._share,), order)
        return out


class NormPart(_CopiedPlain):
    """Norms of gradient blocks (0-d, or 1-d once stacked): this rank's parts, each with its
    share. Their norm is the norm over the group; any other op sees plain local values."""

    _shares: tuple[NormShare | None, ...]
    _order: float

    @staticmethod
    def of(t: torch.Tensor, shares: tuple[NormShare | None, ...], order: float) -> NormPart:
        part = t.as_subclass(NormPart)
        part._shares, part._order = shares, order
        return part

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func is torch.stack and args and _all_scalars(args[0]):
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            parts = [x for x in args[0] if type(x) is NormPart]
            if dim == 0 and "out" not in kwargs and len({p._order for p in parts}) == 1:
                shares = tuple(x._shares[0] if type(x) is NormPart else None for x in args[0])
                return NormPart.of(_plain(func, args, kwargs), shares, parts[0]._order)
        self = args[0] if args else None
        if type(self) is NormPart:
            if func in _KEEPS:
                return NormPart.of(_plain(func, args, kwargs), self._shares, self._order)
            order = _whole_norm_order(func, args, kwargs)
            if order is not None and order == self._order:
                return _total(self, order)
        return _plain(func, args, kwargs)


def _all_scalars(seq: Any) -> bool:
    return (
        isinstance(seq, (list, tuple))
        and len(seq) > 0
        and all(isinstance(x, torch.Tensor) and x.dim() == 0 for x in seq)
        and any(type(x) is NormPart for x in seq)
    )


def _total(part: NormPart, order: float) -> torch.Tensor:
    """The norm of every rank's parts together: each share counted once, other entries
    (plain tensors stacked with ours) taken as replicated and counted on one rank."""
    with torch._C.DisableTorchFunctionSubclass():
        values = part.detach().reshape(-1)
    shares = part._shares if len(part._shares) == values.numel() else (None,) * values.numel()
    groups = {id(s.group): s.group for s in shares if s is not None}
    if len(groups) > 1:
        raise ValueError(
            "torch_plugin: one gradient norm over the parameters of several distributed models "
            f"({', '.join(g.what for g in groups.values())}); their ranks differ, so clip each "
            "model's parameters in a call of its own"
        )
    (group,) = groups.values()
    x = values.double()
    if math.isinf(order):
        local = x.max() if order > 0 else x.min()
        op = dist.ReduceOp.MAX if order > 0 else dist.ReduceOp.MIN
    elif order > 0:
        counted = [
            True if not group.alive() else s.counted if s is not None else group.lead
            for s in shares
        ]
        local = (x.pow(order) * torch.tensor(counted, dtype=x.dtype, device=x.device)).sum()
        op = dist.ReduceOp.SUM
    else:
        raise ValueError(
            f"torch_plugin: a norm of order {order} over a distributed model's gradients is "
            "not defined per rank; use a positive order or inf"
        )
    total = group.reduce(local, op)
    if not math.isinf(order):
        total = total.pow(1.0 / order)
    return total.to(values.dtype)
