"""Gloo processes kept alive across tests: a class of multi-rank tests pays for starting Python,
importing torch and joining a process group once, not once per test.

`pool.run(fn, *args)` calls fn(rank, world, *args) on every rank (fn: a module-level function,
found again by module and name in the workers) and returns each rank's result; the assertions
stay in the test. A rank that raises fails the run with its traceback; a run past its deadline
kills the pool (nothing hangs), and after either the next run starts fresh processes, since a
failed collective can leave the group out of step. Tests that kill ranks on purpose keep
spawning their own.
"""

from __future__ import annotations

import importlib
import os
import pickle
import queue
import time
import traceback
from typing import Any

import dist_workers
import torch.multiprocessing as mp


def _serve(rank: int, world: int, port: int, tasks: Any, results: Any) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist_workers._init(rank, world, port)
    # From here on dist_workers' functions skip joining and leaving the group.
    os.environ["TP_GLOO_POOL"] = "1"
    parent = os.getppid()
    while True:
        try:
            task = tasks.get(timeout=5)
        except queue.Empty:
            if os.getppid() != parent:  # the test process died: do not linger
                break
            continue
        if task is None:
            break
        (module, name), args = task
        try:
            import torch._dynamo

            torch._dynamo.reset()
            torch.manual_seed(0)
            fn = getattr(importlib.import_module(module), name)
            value = fn(rank, world, *args)
            pickle.dumps(value)  # an unpicklable result fails here, with its name, not silently
            results.put((rank, True, value))
        except BaseException:  # noqa: BLE001 - reported to the test, with the traceback
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()
    # Nothing is left to flush (the test read every result), and a worker's interpreter
    # shutdown after a module of tests (thread pools, compile workers) took up to the 5 s
    # close() waits: 24 s of the suite's teardowns.
    results.close()
    results.join_thread()
    os._exit(0)


class GlooPool:
    def __init__(self, world: int, deadline_s: float = 300.0) -> None:
        self.world, self.deadline_s = world, deadline_s
        self._procs: list[Any] = []

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        port = dist_workers.free_port()
        self._tasks = [ctx.Queue() for _ in range(self.world)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_serve,
                args=(r, self.world, port, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(self.world)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn: Any, *args: Any, deadline_s: float | None = None) -> list[Any]:
        """fn(rank, world, *args) on every rank; their results in rank order."""
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.close()
            self._start()
        for q in self._tasks:
            q.put(((fn.__module__, fn.__name__), args))
        deadline = time.monotonic() + (deadline_s or self.deadline_s)
        got: dict[int, tuple[bool, Any]] = {}
        try:
            while len(got) < self.world:
                try:
                    rank, ok, value = self._results.get(timeout=1.0)
                except queue.Empty:
                    missing = sorted(set(range(self.world)) - set(got))
                    dead = [r for r in missing if not self._procs[r].is_alive()]
                    if dead or time.monotonic() > deadline:
                        why = f"ranks {dead} died" if dead else "gave no result within the deadline"
                        raise TimeoutError(f"{fn.__name__}: ranks {missing}: {why}") from None
                    continue
                got[rank] = (ok, value)
        except BaseException:
            # Whatever went wrong, no result of this run may be read by the next one.
            self.close()
            raise
        failed = {r: v for r, (ok, v) in got.items() if not ok}
        if failed:
            self.close()
            # The cause first: a rank that failed on its own, before those that then waited on
            # it in vain.
            r = min(failed, key=lambda r: ("Connection closed" in failed[r], r))
            raise RuntimeError(f"{fn.__name__} failed on rank {r}:\n{failed[r]}")
        return [got[r][1] for r in range(self.world)]

    def close(self) -> None:
        for p, q in zip(self._procs, getattr(self, "_tasks", []), strict=False):
            if p.is_alive():
                q.put(None)
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        self._procs = []
