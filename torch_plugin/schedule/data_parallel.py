"""Data parallelism around a scheduled model on a ("dp", "tp") mesh.

Each dp replica runs the schedule's tensor-parallel program on its slice of the batch (dim 0 of
every tensor input); the outputs are gathered over dp, so the caller computes the loss on the
whole batch as on one process; gradients are summed over dp in one bucket at the end of
backward (one all-reduce per step, not one per parameter).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.func import functional_call

from ..runtime.collectives import Collectives
from ..runtime.spmd_ops import _register_group, grad_sync


class _GatherBatch(torch.autograd.Function):
    """Forward: every replica's slice, concatenated along dim 0. Backward: this replica's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Collectives) -> torch.Tensor:
        ctx.comm, ctx.n = comm, x.shape[0]
        return torch.cat(list(comm.all_gather(x, "dp outputs").unbind(0)), dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        r, n = ctx.comm.rank, ctx.n
        return grad[r * n : (r + 1) * n], None


class DataParallelSchedule(nn.Module):
    """A scheduled model replicated over the mesh's 'dp' axis (see the module docstring)."""

    def __init__(self, model: nn.Module, comm: Collectives) -> None:
        super().__init__()
        self.module = model
        self.comm = comm
        self._handle = _register_group(comm)  # for the sharded runtime's bucketed grad_sync

    def _slice(self, x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return x
        if x.shape[0] % self.comm.world:
            raise ValueError(
                f"batch of {x.shape[0]} is not divisible by the {self.comm.world} data-parallel "
                "replicas"
            )
        n = x.shape[0] // self.comm.world
        return x[self.comm.rank * n : (self.comm.rank + 1) * n]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = pytree.tree_map(self._slice, (args, kwargs))
        names, params = zip(*self.module.named_parameters(), strict=True)
        trainable = [i for i, p in enumerate(params) if p.requires_grad]
        synced = list(params)
        if torch.is_grad_enabled() and trainable:
            outs = grad_sync([params[i] for i in trainable], self._handle)
            for i, t in zip(trainable, outs, strict=True):
                synced[i] = t
        out = functional_call(self.module, dict(zip(names, synced, strict=True)), args, kwargs)
        return pytree.tree_map(
            lambda t: (
                _GatherBatch.apply(t, self.comm)
                if isinstance(t, torch.Tensor) and t.dim() > 0
                else t
            ),
            out,
        )
