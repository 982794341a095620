"""Timing in turns, shared by the benchmarks that compare runtimes in one process."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch


def round_robin(
    fns: dict[str, Any],
    args: tuple,
    rounds: int = 5,
    pause_s: float = 0.0,
    window_s: float = 0.25,
    min_samples: int = 3,
) -> dict[str, list[float]]:
    """Seconds per call of each callable, one median per round, measured in turns: each round
    runs every callable for a block of >= window_s (after a warm-up of >= 0.05 s) and takes the
    median call. Turns spread the machine's drift and the other runtimes' idle thread pools
    evenly over all of them, which one measurement after another did not: a sub-millisecond
    model measured right after another backend's session ran up to 50% slower.

    pause_s: a pause before each block; another runtime's pool spins on for a while after its
    last run (ONNX Runtime's by default) and took a core from whatever ran next. The order
    rotates by one each round, so no callable always runs right after the same one."""
    per: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    with torch.no_grad():
        for r in range(rounds):
            shift = r % max(len(keys), 1)
            for key in keys[shift:] + keys[:shift]:
                fn = fns[key]
                time.sleep(pause_s)
                t_end = time.perf_counter() + 0.05
                while time.perf_counter() < t_end:
                    fn(*args)
                times: list[float] = []
                t_end = time.perf_counter() + window_s
                while time.perf_counter() < t_end or len(times) < min_samples:
                    t0 = time.perf_counter()
                    fn(*args)
                    times.append(time.perf_counter() - t0)
                per[key].append(statistics.median(times))
    return per


def medians(per_round: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in per_round.items()}
