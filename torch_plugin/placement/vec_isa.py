"""Inductor's probes of the CPU's vector ISAs, run side by side.

Before its first CPU compile in a process, Inductor builds and loads a test library for each
vector ISA the CPU reports (AVX-512 with AMX, with VNNI, plain, AVX2), one after another: 9.6 s
on the 2-core Xeon with a fresh cache directory, half of ResNet-50's cold compile, and 1.6 s
with a warm one (the libraries kept). The probes are independent compiler runs, so they are
started here side by side, one per core, before Inductor asks for them; Inductor then finds
each answer in its own cache (functools.cache on each ISA). Two at a time on that Xeon: 4.9 s.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _pending() -> list[Any]:
    """The ISAs Inductor would probe and has not: those the CPU reports, on x86-64 Linux; none
    once Inductor has listed the valid ones in this process."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return []
    from torch._inductor import config
    from torch._inductor import cpu_vec_isa as isa

    if config.cpp.vec_isa_ok is not None or config.is_fbcode():
        return []  # no probe made: the answer is configured
    if isa.valid_vec_isa_list.cache_info().currsize:
        return []
    flags = isa.x86_isa_checker()
    return [v for v in isa.supported_vec_isa_list if all(f in flags for f in str(v).split())]


def probe_side_by_side(workers: int | None = None) -> float:
    """Runs Inductor's pending ISA probes `workers` at a time (default: the cores this process
    may use). Returns the seconds that running them one after another, as Inductor does, would
    have taken beyond this: the sum of each probe's own seconds less the wall time. 0 where
    nothing was pending, on one core, or where Inductor's probe API is not the one this was
    written against (Inductor then probes as it always does)."""
    try:
        pending = _pending()
    except (ImportError, AttributeError) as e:
        log.debug("torch_plugin: Inductor's ISA probes left to it (%s)", e)
        return 0.0
    workers = min(workers or _cores(), len(pending))
    if workers < 2:
        return 0.0

    def probe(v: Any) -> float:
        t0 = time.perf_counter()
        bool(v)  # builds and loads its test library; cached on the ISA
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="torch_plugin_isa") as pool:
            each = list(pool.map(probe, pending))
    except Exception as e:  # noqa: BLE001 - Inductor's own compile probes again and decides
        log.debug("torch_plugin: Inductor's ISA probes left to it (%s: %s)", type(e).__name__, e)
        return 0.0
    wall = time.perf_counter() - t0
    log.debug(
        "torch_plugin: Inductor's %d ISA probes took %.1f s side by side, %.1f s in turn",
        len(pending),
        wall,
        sum(each),
    )
    return max(sum(each) - wall, 0.0)
