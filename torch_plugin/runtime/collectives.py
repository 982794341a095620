"""torch.distributed calls on one process group, shared by the distributed runtimes.

Each call counts the bytes this rank sends (so measured traffic can be checked against the cost
models) and turns a backend failure into an error naming the op, the rank and the likely cause.
Collectives a backend lacks (gloo has no reduce-scatter; some builds no all-to-all) are filled
explicitly with ones it has, counted at the volume they really move.
"""

from __future__ import annotations

import atexit
import weakref
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

# Objects that keep process groups. A group still referenced when the interpreter shuts down
# is destroyed during finalization, where gloo's destructor can abort the process ("terminate
# called without an active exception": a clean run exiting with SIGABRT), even after
# destroy_process_group. So every holder drops its references at exit, before finalization.
_HOLDERS: weakref.WeakSet[Any] = weakref.WeakSet()


def hold_groups(holder: Any) -> None:
    """Registers an object whose `_release_groups()` drops its process-group references."""
    _HOLDERS.add(holder)


@atexit.register
def _release_process_groups() -> None:
    for holder in list(_HOLDERS):
        holder._release_groups()


class Collectives:
    """Collectives on `group` (`world` ranks, this one `rank`); `owner` prefixes error messages."""

    def __init__(self, group: Any, world: int, rank: int, owner: str = "torch_plugin"):
        self.group, self.world, self.rank, self.owner = group, world, rank, owner
        hold_groups(self)
        self.bytes_sent: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self._all_to_all_ok: bool | None = None
        backend = dist.get_backend(group) if dist.is_initialized() else "gloo"
        # NCCL and gloo (torch >= 2.6) have one; the fake backend stands in for NCCL when
        # planning large worlds. The sharding ILP prices what this says (ShardingOptions).
        self.has_reduce_scatter = backend in ("nccl", "gloo", "fake")

    def _release_groups(self) -> None:
        self.group = None

    def _fail(self, op: str, kind: str, e: Exception) -> RuntimeError:
        return RuntimeError(
            f"{self.owner}: {op} of {kind} on rank {self.rank} of {self.world} "
            f"failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); a peer "
            "rank died, stalled past the process-group timeout, or runs a different model - "
            "check the other ranks' logs"
        )

    def _count(self, kind: str, nbytes: float) -> None:
        self.bytes_sent[kind] += int(nbytes)
        self.calls[kind] += 1

    def all_gather(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """[world, *t.shape]: every rank's t (a ring all-gather sends world-1 copies of t)."""
        t = t.contiguous()
        if self.world == 1:
            return t.unsqueeze(0)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        try:
            dist.all_gather(parts, t, group=self.group)
        except (RuntimeError, dist.DistBackendError) as e:
            raise self._fail("all_gather", kind, e) from e
        self._count(kind, (self.world - 1) * t.numel() * t.element_size())
        return torch.stack(parts)

    def all_reduce(
        self, t: torch.Tensor, kind: str, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> torch.Tensor:
        """The sum (or `op`) of every rank's t (a new tensor; a ring all-reduce sends 2(w-1)/w
        of t)."""
        out = t.contiguous().clone()
        if self.world == 1:
            return out
        try:
            dist.all_reduce(out, op=op, group=self.group)
        except (RuntimeError, dist.DistBackendError) as e:
            raise self._fail("all_reduce", kind, e) from e
        self._count(kind, 2 * (self.world - 1) / self.world * t.numel() * t.element_size())
        return out

    def reduce_scatter(self, t: torch.Tensor, dim: int, kind: str) -> torch.Tensor:
        """This rank's block along `dim` of the sum of every rank's t."""
        if self.world == 1:
            return t.contiguous().clone()
        if self.has_reduce_scatter:
            moved = t.movedim(dim, 0).contiguous()
            out = torch.empty(
                (moved.shape[0] // self.world, *moved.shape[1:]), dtype=t.dtype, device=t.device
            )
            try:
                dist.reduce_scatter_tensor(out, moved, group=self.group)
            except (RuntimeError, dist.DistBackendError) as e:
                raise self._fail("reduce_scatter", kind, e) from e
            self._count(kind, (self.world - 1) / self.world * t.numel() * t.element_size())
            return out.movedim(0, dim).contiguous()
        # A backend without one: an all-reduce, keeping this rank's block (twice the volume;
        # counted as such).
        whole = self.all_reduce(t, kind)
        return whole.chunk(self.world, dim)[self.rank].contiguous()

    def all_to_all(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """t [world*n, ...]: chunk j goes to rank j; returns [world, n, ...] from every rank."""
        t = t.contiguous()
        n = t.shape[0] // self.world
        if self.world == 1:
            return t.unsqueeze(0)
        out = torch.empty_like(t)
        chunk = t.numel() // self.world * t.element_size()
        if self._all_to_all_ok is not False:
            try:
                dist.all_to_all_single(out, t, group=self.group)
                self._all_to_all_ok = True
                self._count(kind, (self.world - 1) * chunk)
                return out.view(self.world, n, *t.shape[1:])
            except (RuntimeError, NotImplementedError) as e:
                if self._all_to_all_ok or "not supported" not in str(e).lower():
                    raise self._fail("all_to_all", kind, e) from e
                self._all_to_all_ok = False
        # A backend without all-to-all: every rank gathers everything and keeps its chunks
        # (counted as sent, so the accounting shows the extra volume this costs).
        every = self.all_gather(t, kind)  # [world, world*n, ...]
        return every[:, self.rank * n : (self.rank + 1) * n]

    def share_rng_state(self) -> None:
        """Every rank draws what rank 0 draws: its CPU generator state (5 KB) is broadcast.
        Ranks need not be seeded alike (torch seeds each process differently)."""
        if self.world == 1:
            return
        state = torch.get_rng_state()
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        try:
            dist.broadcast(state, src=src, group=self.group)
        except (RuntimeError, dist.DistBackendError) as e:
            raise self._fail("broadcast", "rng state", e) from e
        torch.set_rng_state(state)

    def reset_counts(self) -> None:
        self.bytes_sent.clear()
        self.calls.clear()
