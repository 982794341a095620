"""Checks that every rank was launched alike and planned alike, before any collective can hang.

A rank launched with another WORLD_SIZE, another mesh, or a plan that differs (a solver that hit
its time limit on one rank only, a model built with other options) would otherwise meet the
others in mismatched collectives: a hang until the process-group timeout and a gloo/NCCL message
that names nothing. Both checks here fail within the timeout and name the ranks that differ.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from typing import Any

import torch.distributed as dist

_PREFIX = "torch_plugin/handshake"


def digest(value: Any) -> str:
    """A short stable hash of a JSON-serialisable value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def planning_only(group: Any = None) -> bool:
    """True on torch's fake backend (planning large worlds in one process): there are no other
    ranks to agree with, and its store and collectives carry nothing."""
    return dist.is_initialized() and dist.get_backend(group) == "fake"


def handshake(
    what: str,
    view: dict[str, Any],
    timeout_s: float,
    *,
    store: Any = None,
    rank: int | None = None,
    world: int | None = None,
    started: float | None = None,
) -> None:
    """Every rank publishes `view` in the rendezvous store and reads the others' as they arrive;
    raises as soon as one differs, or when one has not arrived within `timeout_s`.

    The store, not a collective, carries it: a rank that believes in another world size cannot
    take part in a collective of this one, but its view can still be read and named. By default
    it runs on the default process group's store, rank and world.
    """
    if store is None:
        if planning_only():
            return
        store = dist.distributed_c10d._get_default_store()
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    # Each rank counts its own handshakes, so the n-th one of every rank shares one key space
    # without any process-wide state.
    seq = store.add(f"{_PREFIX}/seq/{what}/{rank}", 1)
    key = f"{_PREFIX}/{what}/{seq}"
    mine = json.dumps(view, sort_keys=True)
    store.set(f"{key}/{rank}", mine)
    # Keys are awaited until 90% of the timeout; rank 0, which usually hosts the store, stays
    # a little longer so that ranks that started later can still read it. A rank that started
    # much later may see the store go away first: its error then names the ranks still
    # missing, as a timeout would. Every rank is done within the timeout of its own start
    # (`started`, a time.monotonic() value, when the caller's clock began earlier).
    start = time.monotonic() if started is None else started
    deadline = start + 0.9 * timeout_s
    missing: list[int] = []
    try:
        missing = _compare_views(store, what, key, view, rank, world, deadline)
    finally:
        # Rank 0 usually hosts the store: it stays until every rank that is there has read what
        # it needs, so its own exit cannot look like a lost store to ranks that started later.
        try:
            store.add(f"{key}/done", 1)
            if rank == 0:
                stay_until = start + 0.98 * timeout_s
                while (
                    store.add(f"{key}/done", 0) < world - len(missing)
                    and time.monotonic() < stay_until
                ):
                    time.sleep(0.01)
        except Exception:  # the store is gone already; the error raised says why
            pass
    if missing:
        raise RuntimeError(
            f"torch_plugin {what}: rank(s) {missing} did not arrive within {timeout_s:g} s "
            f"(rank {rank} of a world of {world}): they died, stalled, or were launched with "
            "another WORLD_SIZE / MASTER_ADDR / MASTER_PORT; launch every rank with the same "
            "torchrun command"
        )


def _compare_views(
    store: Any,
    what: str,
    key: str,
    view: dict[str, Any],
    rank: int,
    world: int,
    deadline: float,
) -> list[int]:
    """Compares each rank's view with this one's as it arrives; returns the ranks that did not
    arrive by the deadline."""
    missing: list[int] = []
    for r in range(world):
        if r == rank:
            continue
        left = max(deadline - time.monotonic(), 0.01)
        try:
            store.wait([f"{key}/{r}"], datetime.timedelta(seconds=left))
        except Exception as e:  # DistStoreError on a timeout; other errors: the store is gone
            if "timeout" not in str(e).lower():
                unseen = [x for x in [*missing, *range(r, world)] if x != rank]
                raise RuntimeError(
                    f"torch_plugin {what}: rank(s) {unseen} had not arrived (rank {rank} of a "
                    f"world of {world}) when the rendezvous store went away (its host, rank 0 "
                    "or the launcher, gave up or failed: see its log); they died, stalled, or "
                    "were launched with another WORLD_SIZE / MASTER_ADDR / MASTER_PORT"
                ) from e
            missing.append(r)
            continue
        theirs = json.loads(store.get(f"{key}/{r}"))
        if theirs != view:
            diffs = {
                k: {f"rank {rank}": view.get(k), f"rank {r}": theirs.get(k)}
                for k in sorted(set(view) | set(theirs))
                if view.get(k) != theirs.get(k)
            }
            raise RuntimeError(
                f"torch_plugin {what}: rank {r} differs from this rank ({rank}) in {diffs}; "
                "launch every rank with the same torchrun command and script arguments"
            )
    return missing


def check_same(group: Any, what: str, value: str, world: int, hint: str) -> None:
    """All ranks of `group` compare `value` (a digest); raises naming the ranks that differ."""
    if planning_only(group):
        return
    values: list[Any] = [None] * world
    dist.all_gather_object(values, value, group=group)
    odd = [r for r, v in enumerate(values) if v != values[0]]
    if odd:
        raise RuntimeError(
            f"torch_plugin: {what} differ between ranks (rank 0 has {values[0]}, ranks {odd} "
            f"have {sorted({values[r] for r in odd})}); {hint}"
        )
