"""Autograd-aware collectives for schedule syncs (Megatron's f / g operators and a gather).

Each takes the schedule's `Collectives` (group, rank, world, timeouts and error messages), so a
dead or stalled peer fails the step with a message instead of hanging it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..runtime.collectives import Collectives


class AllReduceForward(torch.autograd.Function):
    """Forward: sum over ranks (partial sums of a row-parallel layer). Backward: identity."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Collectives, what: str) -> torch.Tensor:
        return comm.all_reduce(x, what)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None, None


class AllReduceBackward(torch.autograd.Function):
    """Forward: identity. Backward: sum of the gradients over ranks (the input of a
    column-parallel region gets a partial gradient on each rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Collectives, what: str) -> torch.Tensor:
        ctx.comm, ctx.what = comm, what
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return ctx.comm.all_reduce(grad, ctx.what), None, None


class AllGatherLast(torch.autograd.Function):
    """Forward: concatenate every rank's block along the last dim. Backward: this rank's block."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Collectives, what: str) -> torch.Tensor:
        ctx.comm, ctx.width = comm, x.shape[-1]
        parts = comm.all_gather(x, what)  # [world, *x.shape]
        return torch.cat(list(parts.unbind(0)), dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        r, w = ctx.comm.rank, ctx.width
        return grad[..., r * w : (r + 1) * w].contiguous(), None, None


SYNC_OPS = {"all_reduce", "all_gather"}
