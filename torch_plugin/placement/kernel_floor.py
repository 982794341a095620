"""Inductor's matmul floor on the CPU: what its graph's matmuls take alone (issue 39).

Inductor compiles a CPU graph's matmuls to calls of the BLAS eager calls too (aten.mm and
aten.addmm, or with frozen weights MKL's packed sgemm, torch.ops.mkl._mkl_linear); what it fuses
around them adds time and never removes theirs. So the sum of those calls, each timed alone at
the graph's shapes, bounds Inductor's run time from below before anything is compiled. For
transformers at real sizes in f32 that bound is often over OpenVINO's measured graph (bert-base
at batch 1: 140 ms of matmuls against OpenVINO's 108 ms), and Inductor's compile, most of a cold
compile (20-40 s), cannot pay: the search skips it (WholeGraphMeasurer::floor).

The calls are timed largest first, each with its weights warm in the cache (in the graph they
come from memory: slower, so the bound stays a bound), and only until the sum reaches the
target: a partial sum is a bound too. Not used where Inductor may run matmuls some other way:
max-autotune (its own GEMM templates), reduced-precision f32 matmuls, bf16 compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .backends import InductorBackend

aten = torch.ops.aten

# Smaller matmuls are left out: Inductor may turn them into loops of its own (a pooler's
# 1 x 768 x 768), and they add little.
MIN_FLOPS = 2**24
# At most this many seconds of timing per floor: past it, the sum so far is the bound.
MAX_MEASURE_S = 3.0
# Bytes a second a group's operands are expected to be made at (filled, and the weight packed
# for MKL): a group whose operands would overrun MAX_MEASURE_S is left out before it is made,
# since the cap is checked between groups. A sum without it is a bound too. 1.3 GB/s measured
# on the 2-core Xeon; the 1.2B Llama's vocabulary projection (1 GB, packed again) took 18 s in
# the middle of its compile, with 10 GB of the search's graphs held.
SETUP_BYTES_PER_S = 1e9


def applies(backend: Any, inputs: Sequence[Any]) -> bool:
    """Whether Inductor's floor holds for this backend and these inputs: Inductor computing in
    f32 on the CPU with its default matmul lowering."""
    import torch._inductor.config as inductor_config  # not at import: torch._inductor is large

    return (
        isinstance(backend, InductorBackend)
        and backend.compute == "f32"
        and all(x.device.type == "cpu" for x in inputs if isinstance(x, torch.Tensor))
        and not inductor_config.max_autotune
        and not inductor_config.max_autotune_gemm
        and torch.backends.mkldnn.matmul.fp32_precision in ("none", "ieee")
    )


def matmuls(gm: fx.GraphModule) -> list[tuple[tuple[Any, ...], int]]:
    """The graph's f32 matmuls of MIN_FLOPS or more, grouped by what they compute: (op, the
    operands' shapes and strides, whether a bias is added) and how many times, largest total
    FLOPs first."""
    groups: dict[tuple[Any, ...], int] = {}
    flops: dict[tuple[Any, ...], int] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in (aten.mm.default, aten.addmm.default):
            continue
        operands = n.args[1:3] if n.target is aten.addmm.default else n.args[:2]
        vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in operands]
        if not all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in vals):
            continue
        a, b = vals
        sizes = (*a.shape, *b.shape)
        if a.dim() != 2 or b.dim() != 2 or not all(isinstance(s, int) for s in sizes):
            continue  # symbolic sizes: no fixed shape to time
        m, k, nn = int(a.shape[0]), int(a.shape[1]), int(b.shape[1])
        scaled = n.kwargs.get("alpha", 1) != 1 or n.kwargs.get("beta", 1) != 1
        if 2 * m * k * nn < MIN_FLOPS or scaled:
            continue
        key = (
            "addmm" if n.target is aten.addmm.default else "mm",
            (m, k),
            tuple(a.stride()),
            (k, nn),
            tuple(b.stride()),
        )
        groups[key] = groups.get(key, 0) + 1
        flops[key] = 2 * m * k * nn
    return sorted(groups.items(), key=lambda kv: -kv[1] * flops[kv[0]])


def best_of(fn: Callable[[], Any], reps: int = 3, max_s: float = 0.3) -> float:
    """The fastest of the warm-up call and 1 to `reps` more, fewer where all last over max_s
    together: the warm-up counts toward max_s, and a slow one only leaves the minimum to the
    others (GPT-2's batch-8 vocabulary projection, 0.2 s a call: two calls a way, not three)."""
    t0 = time.perf_counter()
    fn()
    best = spent = time.perf_counter() - t0
    for _ in range(reps):  # at least one call after the warm-up
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        best, spent = min(best, t), spent + t
        if spent >= max_s:
            break
    return best


def _calls(key: tuple[Any, ...]) -> list[Callable[[], Any]]:
    """The ways Inductor may run one matmul: ATen's call, and MKL's packed sgemm where the
    right operand is a transposed (N, K) weight, as Inductor packs a frozen nn.Linear's."""
    op, a_shape, a_stride, b_shape, b_stride = key
    a, b = _strided(a_shape, a_stride), _strided(b_shape, b_stride)
    bias = torch.full((b_shape[1],), 0.25)
    calls: list[Callable[[], Any]] = [
        (lambda: torch.addmm(bias, a, b)) if op == "addmm" else (lambda: torch.mm(a, b))
    ]
    w = b.t()
    if torch._C.has_mkl and w.is_contiguous() and a.is_contiguous():
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, a_shape[0])
        kept = bias if op == "addmm" else None
        calls.append(lambda: torch.ops.mkl._mkl_linear(a, packed, w, kept, a_shape[0]))
    return calls


def _strided(shape: tuple[int, int], stride: tuple[int, int]) -> torch.Tensor:
    """An operand in its layout, whatever its strides (a broadcast one's 0). Its values do not
    change a BLAS call's time, so one value, not random ones: drawing GPT-2's 50257 x 768
    vocabulary matrix took 0.23 s, filling it 0.04 s."""
    return torch.full((_extent(shape, stride),), 0.25).as_strided(shape, stride)


def _extent(shape: tuple[int, int], stride: tuple[int, int]) -> int:
    """The elements a strided operand's storage spans."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))


def setup_bytes(key: tuple[Any, ...]) -> int:
    """The bytes _calls makes for one group: both operands, the bias and MKL's packed copy of
    the weight (about the weight's size)."""
    _, a_shape, a_stride, b_shape, b_stride = key
    return 4 * (_extent(a_shape, a_stride) + 2 * _extent(b_shape, b_stride) + b_shape[1])


def matmul_floor(
    gm: fx.GraphModule,
    target_s: float,
    timer: Callable[[Callable[[], Any]], float] = best_of,
    max_measure_s: float = MAX_MEASURE_S,
) -> float:
    """Seconds the graph's matmuls take at least (each group's fastest way times its count),
    summed largest first until the sum reaches target_s or max_measure_s of timing is spent;
    a group whose operands would take longer to make than what is left of max_measure_s
    (SETUP_BYTES_PER_S) is left out."""
    total = 0.0
    t0 = time.perf_counter()
    with torch.no_grad():
        for key, count in matmuls(gm):
            left = max_measure_s - (time.perf_counter() - t0)
            if setup_bytes(key) / SETUP_BYTES_PER_S > left:
                continue
            total += count * min(timer(call) for call in _calls(key))
            if total >= target_s or time.perf_counter() - t0 >= max_measure_s:
                break
    return total
