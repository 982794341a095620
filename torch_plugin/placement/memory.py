"""The memory a whole-graph compile needs and the memory left for it (the search's memory check).

Every compiled graph holds its own copy of the frozen weights until the pick: OpenVINO's compile
of a 1.2B Llama in f32 took 4.9 GB more (resident 5.4 to 10.3 GB), Inductor's freezing packs
another copy, so the search held three copies where the user's own Inductor holds two. On a
host without room for the next copy the compile would end the process (the OOM killer), so the
search skips that compiler and says so (placement_search.h: compile_bytes, free_bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

MEMINFO = "/proc/meminfo"
# cgroup v2, then v1: a container's limit, which MemAvailable (the host's) does not show.
CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),
)


def free_bytes(
    meminfo: str = MEMINFO, cgroups: Iterable[tuple[str, str]] = CGROUP_FILES
) -> float:
    """The bytes this process can still take: the kernel's MemAvailable, less where the cgroup
    it runs in has a lower limit left. 0.0 where neither can be read (not Linux): unknown."""
    free = []
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free.append(float(line.split()[1]) * 1024)  # kB
                    break
    except OSError:
        pass
    for limit_path, usage_path in cgroups:
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = float(f.read().strip())
        except (OSError, ValueError):
            continue
        # "max" (v2) or a v1 limit near 2^63: no limit.
        if limit != "max" and float(limit) < 2**60:
            free.append(max(0.0, float(limit) - usage))
        break
    return min(free) if free else 0.0


def compile_bytes(
    compilers: Iterable[str],
    frozen: Mapping[str, torch.Tensor],
    computes: Mapping[str, str],
) -> dict[str, float]:
    """Per compiler, the bytes its graph holds besides the model's weights: the frozen weights'
    copy in the precision it computes in (a bf16 compile of f32 weights holds half of them).
    Only for weights on the CPU: a GPU's memory is not what free_bytes reads."""
    cpu = [t for t in frozen.values() if isinstance(t, torch.Tensor) and t.device.type == "cpu"]
    f32 = sum(t.numel() * t.element_size() for t in cpu if t.dtype == torch.float32)
    other = sum(t.numel() * t.element_size() for t in cpu if t.dtype != torch.float32)
    out = {}
    for name in compilers:
        held = (f32 / 2 if computes.get(name) == "bf16" else f32) + other
        if held > 0:
            out[name] = float(held)
    return out
