"""Our CUDA kernels on a GPU: correctness against float64, time, and fraction of the memory limit.

    python benchmarks/gpu_kernels.py [--quick]

Needs a CUDA build of torch_plugin (`TP_CUDA=1 python setup.py build_ext --inplace` on a machine
with a GPU; scripts/gpu/run.sh does it on a lent one). Both kernels are memory-bound, so the
limit is bytes over the device-to-device copy bandwidth measured in the same run (bytes read +
written, as the copy counts them):

- bias + GeLU (forward, backward) against eager `F.gelu(x + b)` and Inductor on the same shapes;
- decode attention (`torch_plugin::decode_attention`) at Llama-3-8B's attention shape (32 query
  / 8 KV heads, head_dim 128, bf16) from 4K to 128K context: the tensor-core kernel with its
  split count chosen for the device (and a sweep of fixed counts), the older grouped split
  kernel, against PyTorch's SDPA with `enable_gqa`; limit: the measured read bandwidth.

Every timed call runs after an L2 flush (CUDA events around the call alone).

Prints a table, saves benchmarks/results/gpu_kernels.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

import torch_plugin  # noqa: E402,F401  (registers torch.ops.torch_plugin)
from benchmarks.provenance import provenance  # noqa: E402

# --dry-run: the same script on the CPU at tiny sizes, to check it before a lent GPU's minutes.
DEV = "cuda"
SCALE = 1


_FLUSH: torch.Tensor | None = None


def flush_l2() -> None:
    """Reads a buffer of 4x the L2 so no operand of the next call is cached (a Llama-3-8B
    layer's KV fits the H200's 60 MB L2 up to about 12K tokens). A read, not a write: a
    written flush leaves the L2 full of dirty lines whose write-back the next call pays."""
    global _FLUSH
    if DEV == "cpu":
        return
    if _FLUSH is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        _FLUSH = torch.ones(4 * max(l2, 64 << 20) // 4, dtype=torch.float32, device=DEV)
    _FLUSH.sum()


def cuda_ms(fn: Callable[[], Any], iters: int = 50, warmup: int = 5) -> float:
    """Median milliseconds of `fn` by CUDA events around it alone, the L2 flushed before each
    repetition (the flush and a ~0.1 ms spin run before the start event, so host launch
    overhead stays out)."""
    for _ in range(warmup):
        fn()
    if DEV == "cpu":
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush_l2()
        # Keep the GPU busy while the host enqueues fn: the events then time device work alone
        # (what a CUDA-graph decode loop sees), for every contender alike.
        torch.cuda._sleep(200_000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def read_bandwidth() -> float:
    """Bytes/s of a 2 GiB read (a sum over bf16): the decode kernels' limit, which only read."""
    n = (1 << 30) // SCALE
    src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    ms = cuda_ms(lambda: src.sum(), iters=20)
    return src.numel() * src.element_size() / (ms * 1e-3)


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy, counting bytes read plus bytes written."""
    n = (1 << 30) // SCALE  # bf16 elements: 2 GiB
    src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda: dst.copy_(src), iters=20)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


# flat: the default (plain loads, unroll 2 on large tensors, 1 on small ones).
BIAS_GELU_KERNELS = ("flat", "column", "flat:4:plain", "flat:4:cs", "flat:2:cs", "flat:1:cs")


def with_bias_gelu(kernel: str, fn: Callable[[], Any]) -> Any:
    """Runs fn under one bias + GeLU kernel: flat (the default: 16-byte vectors over the tensor
    as one flat array, grid-stride, unroll by size, plain loads), flat:U:plain|cs (unroll U,
    plain or evict-first streaming loads) or column (a thread owns a column vector and walks
    rows)."""
    if kernel != "flat":
        os.environ["TP_BIAS_GELU"] = kernel
    try:
        return fn()
    finally:
        os.environ.pop("TP_BIAS_GELU", None)


def bias_gelu_case(dtype: torch.dtype, r: int, c: int, bw: float) -> list[dict[str, Any]]:
    """One shape: each of our kernels against float64 and against Inductor's fused kernel of
    the same graph (compiled once for the shape)."""
    x = torch.randn(r, c, device=DEV, dtype=dtype)
    b = torch.randn(c, device=DEV, dtype=dtype)
    g = torch.randn(r, c, device=DEV, dtype=dtype)
    ref = F.gelu(x.double() + b.double())
    xd = (x.double() + b.double()).requires_grad_(True)
    F.gelu(xd).backward(g.double())
    # Each shape and dtype its own compile: a reset, so Dynamo's recompile limit (8 per code
    # object) never turns a later case into eager, and dynamic=False, so that a second shape
    # does not make it a dynamic-shape kernel.
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, b: F.gelu(x + b), dynamic=False)
    compiled_bwd = torch.compile(
        lambda g, x, b: torch.ops.aten.gelu_backward(g, x + b), dynamic=False
    )
    compiled(x, b)
    compiled_bwd(g, x, b)
    nbytes = 2 * x.numel() * x.element_size()  # read x, write out
    t_ind = cuda_ms(lambda: compiled(x, b))
    t_ind_bwd = cuda_ms(lambda: compiled_bwd(g, x, b))
    t_eager = cuda_ms(lambda: F.gelu(x + b))
    rows = []
    for kernel in BIAS_GELU_KERNELS:

        def fwd(kernel: str = kernel) -> torch.Tensor:
            return with_bias_gelu(kernel, lambda: torch.ops.torch_plugin.bias_gelu(x, b, "none"))

        def bwd(kernel: str = kernel) -> torch.Tensor:
            return with_bias_gelu(
                kernel, lambda: torch.ops.torch_plugin.bias_gelu_backward(g, x, b, "none")
            )

        ours = poisoned(fwd, x.numel())
        ours_b = poisoned(bwd, x.numel())
        t_ours = cuda_ms(fwd)
        t_bwd = cuda_ms(bwd)
        rows.append(
            {
                "kernel": "bias_gelu",
                "variant": kernel,
                "dtype": str(dtype).split(".")[1],
                "shape": [r, c],
                "rel_err_fwd": rel_err(ours, ref),
                "rel_err_bwd": rel_err(ours_b, xd.grad),
                "ours_ms": t_ours,
                "eager_ms": t_eager,
                "inductor_ms": t_ind,
                "vs_inductor": t_ind / t_ours,
                "bwd_ms": t_bwd,
                "inductor_bwd_ms": t_ind_bwd,
                "bwd_vs_inductor": t_ind_bwd / t_bwd,
                "bytes": nbytes,
                "fraction_of_copy_bw": nbytes / (t_ours * 1e-3) / bw,
                "inductor_fraction_of_copy_bw": nbytes / (t_ind * 1e-3) / bw,
                # backward reads grad and x, writes grad_in: 1.5x the forward's bytes
                "bwd_fraction_of_copy_bw": 1.5 * nbytes / (t_bwd * 1e-3) / bw,
            }
        )
    return rows


def bias_gelu_rows(bw: float, quick: bool) -> list[dict[str, Any]]:
    """Large shapes (the copy-bandwidth regime), a transformer FFN's (BERT-base / GPT-2 at
    8 x 128 tokens: 1024 x 3072) and rows that are not a whole number of vectors (257 x 1001)."""
    rows = []
    shapes = [(8192, 8192)] if quick else [(8192, 8192), (16384, 16384)]
    shapes += [(1024, 3072), (257, 1001)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for r, c in shapes:
            rows += bias_gelu_case(dtype, max(1, r // SCALE), c, bw)
            if DEV == "cuda":
                torch.cuda.empty_cache()
    return rows


def decode_reference(q, k, v, lengths, starts=None, softcap=0.0) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """float64 decode attention: q [B, Hq, D], caches [B, Hkv, S, D], entries [starts, lengths)
    attended, scores capped by softcap * tanh(score / softcap) when softcap > 0."""
    B, Hq, D = q.shape
    rep = Hq // k.shape[1]
    kk = k.double().repeat_interleave(rep, dim=1)
    vv = v.double().repeat_interleave(rep, dim=1)
    scores = torch.einsum("bhd,bhsd->bhs", q.double(), kk) / D**0.5
    pos = torch.arange(k.shape[2], device=q.device)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(pos[None, None, :] >= lengths[:, None, None], float("-inf"))
    if starts is not None:
        scores = scores.masked_fill(pos[None, None, :] < starts[:, None, None], float("-inf"))
    return torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), vv)


VARIANTS: tuple[str, ...] = (
    "tensor_core",
    "tensor_core_cp_async",
    "tensor_core_memset",
    "tensor_core_l2_256B",
    "grouped",
    "warp_per_head",
)
TENSOR_CORE = (
    "tensor_core",
    "tensor_core_cp_async",
    "tensor_core_memset",
    "tensor_core_l2_256B",
)
# Timed: the default (TMA copies on sm_90) and the same kernel with 16-byte cp.async copies.
TIMED = ("tensor_core", "tensor_core_cp_async")
SWEPT = ("tensor_core",)

_PROBE = """
import torch, torch_plugin
for b, hq, hkv, d, s, dt in [(2, 32, 8, 128, 700, torch.bfloat16), (1, 8, 1, 256, 300, torch.half),
                             (3, 40, 2, 64, 900, torch.bfloat16)]:
    q = torch.randn(b, hq, d, device="cuda", dtype=dt)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
    n = torch.full((b,), s, device="cuda", dtype=torch.long)
    for splits in (1, 0, 7):
        torch.ops.torch_plugin.decode_attention(q, k, k, n, splits)
    torch.cuda.synchronize()
print("probe ok")
"""


def probe_tensor_core(copy: str | None = None) -> str | None:
    """Runs the tensor-core kernel (with the given TP_DECODE_COPY) on a few shapes in a child
    process: a fault or a hang there must not take the other variants' figures with it.
    Returns the failure (with compute-sanitizer's first findings), or None."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if copy is not None:
        env["TP_DECODE_COPY"] = copy
    try:
        run = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env
        )
    except subprocess.TimeoutExpired:
        return f"{copy}: the probe did not finish in 60 s (a hang)"
    if run.returncode == 0:
        return None
    failure = run.stderr[-1500:]
    try:
        san = subprocess.run(
            ["compute-sanitizer", "--print-limit", "5", sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        failure += "\ncompute-sanitizer:\n" + san.stdout[:3000]
    except (OSError, subprocess.TimeoutExpired) as e:
        failure += f"\ncompute-sanitizer: {e}"
    return failure


def with_variant(variant: str, fn: Callable[[], Any]) -> Any:
    """Runs fn under one CUDA decode kernel: tensor_core is the default (decode_attention with
    the merge fused, TMA tensor-map copies on sm_90); tensor_core_cp_async the same with 16-byte
    cp.async copies; tensor_core_memset with a fresh merge-counter buffer zeroed by a memset on
    every call (what the kernel did before); tensor_core_l2_256B with cp.async and the L2::256B
    prefetch hint; grouped and warp_per_head the older split kernels plus the merge."""
    if variant == "tensor_core_l2_256B":
        os.environ["TP_DECODE_COPY"] = "l2_256"
    elif variant == "tensor_core_cp_async":
        os.environ["TP_DECODE_COPY"] = "cp_async"
    elif variant == "tensor_core_memset":
        os.environ["TP_DECODE_MEMSET"] = "1"
    elif variant != "tensor_core":
        os.environ["TP_SPLIT_KV_CUDA"] = variant
    try:
        return fn()
    finally:
        for name in ("TP_SPLIT_KV_CUDA", "TP_DECODE_COPY", "TP_DECODE_MEMSET"):
            os.environ.pop(name, None)


def poisoned(fn: Callable[[], torch.Tensor], numel: int) -> torch.Tensor:
    """fn() after the caching allocator's free blocks of that size were filled with NaN, so an
    output element the kernel never writes shows up as NaN."""
    if DEV == "cuda":
        junk = torch.full((numel * 4,), float("nan"), device=DEV)
        del junk
    return fn()


def decode(q, k, v, lengths, splits, starts=None, softcap=0.0):  # type: ignore[no-untyped-def]
    return torch.ops.torch_plugin.decode_attention(q, k, v, lengths, splits, 0.0, starts, softcap)


def variant_error(
    variant: str, fn: Callable[[], torch.Tensor], want: torch.Tensor, label: str
) -> float | None:
    """fn's relative error under one CUDA kernel variant; None where the grouped kernel
    refuses the shape (it serves only some), inf (printed) for any other failure."""
    try:
        return rel_err(with_variant(variant, lambda: poisoned(fn, want.numel())), want)
    except RuntimeError as e:
        if "not supported" in str(e):
            return None
        print(f"{label}: {e}")
        return float("inf")


def split_kv_case(
    dtype: torch.dtype, B: int, Hq: int, Hkv: int, D: int, S: int, gen: torch.Generator
) -> list[dict[str, Any]]:
    q = torch.randn(B, Hq, D, device=DEV, dtype=dtype, generator=gen)
    k = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype, generator=gen)
    v = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype, generator=gen)
    lengths = torch.randint(1, S + 1, (B,), device=DEV, generator=gen)
    lengths[0] = 3  # shorter than the splits: some are empty
    if B > 2:
        lengths[1] = 0  # nothing to attend: out 0, lse -inf
    want = decode_reference(q, k, v, lengths)
    want[lengths == 0] = 0.0
    starts = (torch.rand(B, device=DEV, generator=gen) * lengths).long()
    want_sc = decode_reference(q, k, v, lengths, starts, softcap=5.0)
    want_sc[lengths == 0] = 0.0
    # The cache past each length is NaN (never written, as in a static cache from torch.empty):
    # a kernel that lets it into the sums returns NaN.
    past = torch.arange(S, device=DEV)[None, :] >= lengths[:, None]
    k[past[:, None, :, None].expand_as(k)] = float("nan")
    v[past[:, None, :, None].expand_as(v)] = float("nan")
    rows = []
    variants = [v for v in VARIANTS if dtype != torch.float32 or v not in TENSOR_CORE]
    for variant in variants:
        for splits in (1, 0, 7):
            err = variant_error(
                variant,
                lambda s=splits: decode(q, k, v, lengths, s)[0],
                want,
                f"decode {variant} {B, Hq, Hkv, D, S} {dtype}",
            )
            rows.append(
                {
                    "dtype": str(dtype).split(".")[1],
                    "shape": [B, Hq, Hkv, D, S],
                    "variant": variant,
                    "splits": splits,
                    "rel_err": err,
                }
            )
        # Left padding skipped (starts) and Gemma-2's soft cap.
        err = variant_error(
            variant,
            lambda: decode(q, k, v, lengths, 5, starts, 5.0)[0],
            want_sc,
            f"decode starts+softcap {variant} {B, Hq, Hkv, D, S} {dtype}",
        )
        rows.append(
            {
                "dtype": str(dtype).split(".")[1],
                "shape": [B, Hq, Hkv, D, S],
                "variant": variant,
                "splits": 5,
                "starts_softcap": True,
                "rel_err": err,
            }
        )
    return rows


def split_kv_correctness() -> list[dict[str, Any]]:
    """Random shapes on every variant: GQA groups 1, 3, 4, 8, 12, 16, 20 (one or two n-tiles of
    heads, head chunks), head_dim 64/128/256 (80: the older kernel only), ragged lengths with
    empty splits and an empty sequence, caches not a multiple of the 64-key tile."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    cases = [
        (3, 8, 2, 64, 700),
        (2, 32, 8, 128, 700),
        (2, 16, 16, 128, 700),
        (1, 8, 1, 256, 700),
        (2, 6, 2, 80, 700),
        (3, 32, 2, 128, 1500),
        (1, 40, 2, 64, 700),
        (2, 24, 2, 256, 700),
        (3, 12, 4, 128, 5000),
    ]
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for B, Hq, Hkv, D, S in cases:
            rows += split_kv_case(dtype, B, Hq, Hkv, D, S // max(1, SCALE // 8), gen)
    return rows


def split_kv_timing_case(B: int, S: int, read_bw: float) -> list[dict[str, Any]]:
    Hq, Hkv, D, dtype = 32, 8, 128, torch.bfloat16
    q = torch.randn(B, Hq, D, device=DEV, dtype=dtype)
    k = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype)
    v = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype)
    lengths = torch.full((B,), S, device=DEV, dtype=torch.long)
    nbytes = 2 * k.numel() * k.element_size()  # K and V read once
    floor_ms = nbytes / read_bw * 1e3
    want = decode_reference(q[:1], k[:1], v[:1], lengths[:1]) if S <= 32768 else None
    t_sdpa = cuda_ms(
        lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True), iters=30
    )
    rows = []
    for variant in [name for name in VARIANTS if name in TIMED]:
        sweep = (0, 8, 16, 32, 64) if variant in SWEPT else (0,)
        timed = {
            s_: with_variant(
                variant, lambda s=s_: cuda_ms(lambda: decode(q, k, v, lengths, s), iters=30)
            )
            for s_ in sweep
        }
        t = timed[0]  # what a user gets: the split count chosen for the device
        err = None
        if want is not None:
            got = with_variant(variant, lambda: decode(q[:1], k[:1], v[:1], lengths[:1], 0)[0])
            err = rel_err(got, want)
        rows.append(
            {
                "kernel": "decode_attention",
                "variant": variant,
                "batch": B,
                "context": S,
                "ms_by_splits": {("auto" if s_ == 0 else str(s_)): t_ for s_, t_ in timed.items()},
                "ms": t,
                "best_ms": min(timed.values()),
                "sdpa_ms": t_sdpa,
                "vs_sdpa": t_sdpa / t,
                "bytes": nbytes,
                "read_gbps": nbytes / (t * 1e-3) / 1e9,
                "floor_ms": floor_ms,
                "fraction_of_read_bw": floor_ms / t,
                "sdpa_fraction_of_read_bw": floor_ms / t_sdpa,
                "rel_err_bf16": err,
            }
        )
    return rows


def split_kv_timing(read_bw: float, quick: bool) -> list[dict[str, Any]]:
    configs = [(8, 4096), (1, 32768), (4, 32768), (8, 32768), (1, 131072)]
    if quick:
        configs = configs[:3]
    rows = []
    for B, S in configs:
        rows += split_kv_timing_case(B, S // SCALE, read_bw)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    return rows


def save_png(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["split_kv_timing"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    labels = sorted({(r["batch"], r["context"]) for r in rows})
    xs = range(len(labels))
    shown = [v for v in TIMED if v in {r["variant"] for r in rows}]
    for i, variant in enumerate(shown):
        vals = [
            next(
                r["fraction_of_read_bw"]
                for r in rows
                if (r["batch"], r["context"]) == lab and r["variant"] == variant
            )
            for lab in labels
        ]
        ax.bar([x + 0.2 * i for x in xs], vals, width=0.2, label=f"ours: {variant}")
    sdpa = [
        next(r["sdpa_fraction_of_read_bw"] for r in rows if (r["batch"], r["context"]) == lab)
        for lab in labels
    ]
    ax.bar([x + 0.2 * len(shown) for x in xs], sdpa, width=0.2, label="PyTorch SDPA (enable_gqa)")
    ax.set_xticks([x + 0.1 * len(shown) for x in xs], [f"B={b}\n{s // 1024}K" for b, s in labels])
    ax.set_ylabel("fraction of measured read bandwidth")
    ax.set_title(f"decode attention, Llama-3-8B heads, bf16, L2 flushed, {data['device']}")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the script")
    args = ap.parse_args()
    global DEV, SCALE
    if args.dry_run:
        DEV, SCALE = "cpu", 64
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_kernels: no CUDA device here (scripts/gpu/run.sh runs it on one)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth()
    read_bw = read_bandwidth()
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)"
    print(
        f"{name}: device-to-device copy {bw / 1e9:.0f} GB/s (read + write), "
        f"read {read_bw / 1e9:.0f} GB/s (bf16 sum); L2 flushed before every timed call"
    )
    data: dict[str, Any] = {
        **provenance(),
        "device": name,
        "torch": torch.__version__,
        "copy_bandwidth_gbps": bw / 1e9,
        "read_bandwidth_gbps": read_bw / 1e9,
        "timing": "median of CUDA-event times around each call (device time: a GPU spin "
        "covers the host enqueue), L2 flushed before each",
    }
    global VARIANTS, TIMED
    failure = probe_tensor_core() if DEV == "cuda" else None
    data["tensor_core_probe"] = failure or "ok"
    if failure:
        print(f"tensor-core decode kernel FAILED its probe; timing the others only:\n{failure}")
        VARIANTS = tuple(v for v in VARIANTS if v not in TENSOR_CORE)
        TIMED = ()
    cp_failure = probe_tensor_core("cp_async") if DEV == "cuda" and not failure else None
    data["cp_async_probe"] = cp_failure or "ok"
    if cp_failure:
        print(f"cp.async decode kernel FAILED its probe; left out:\n{cp_failure}")
        VARIANTS = tuple(v for v in VARIANTS if v != "tensor_core_cp_async")
        TIMED = tuple(v for v in TIMED if v != "tensor_core_cp_async")
    data["split_kv_correctness"] = split_kv_correctness()
    tol = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}
    bad = [
        r
        for r in data["split_kv_correctness"]
        if r["rel_err"] is not None and not r["rel_err"] < tol[r["dtype"]]
    ]
    worst = {
        v: max((r["rel_err"] or 0.0) for r in data["split_kv_correctness"] if r["variant"] == v)
        for v in VARIANTS
    }
    data["decode_worst_rel_err"] = worst
    print(
        f"decode correctness: {len(data['split_kv_correctness'])} cases, {len(bad)} bad; "
        f"worst rel err by variant {worst}"
    )
    for r in bad:
        print("  BAD", r)
    data["split_kv_timing"] = split_kv_timing(read_bw, args.quick)
    print(
        f"{'B':>3} {'ctx':>7} {'variant':>12} {'ms':>8} {'best':>8} {'GB/s':>7} "
        f"{'of read':>7} {'SDPA ms':>8} {'SDPA of':>7} {'vs SDPA':>7} {'err':>8}"
    )
    for r in data["split_kv_timing"]:
        err = "-" if r["rel_err_bf16"] is None else f"{r['rel_err_bf16']:.1e}"
        print(
            f"{r['batch']:>3} {r['context']:>7} {r['variant']:>12} {r['ms']:>8.4f} "
            f"{r['best_ms']:>8.4f} {r['read_gbps']:>7.0f} {r['fraction_of_read_bw']:>7.2f} "
            f"{r['sdpa_ms']:>8.4f} {r['sdpa_fraction_of_read_bw']:>7.2f} {r['vs_sdpa']:>7.2f} "
            f"{err:>8}"
        )
    data["bias_gelu"] = bias_gelu_rows(bw, args.quick)
    print(
        f"{'dtype':>9} {'shape':>13} {'kernel':>12} {'err fwd':>8} {'err bwd':>8} {'ours ms':>8} "
        f"{'eager':>7} {'Inductor':>8} {'vs Ind':>6} {'of copy':>7} {'bwd ms':>7} {'of copy':>7} "
        f"{'bwd vs Ind':>10}"
    )
    for r in data["bias_gelu"]:
        print(
            f"{r['dtype']:>9} {str(tuple(r['shape'])):>13} {r['variant']:>12} "
            f"{r['rel_err_fwd']:>8.1e} {r['rel_err_bwd']:>8.1e} {r['ours_ms']:>8.4f} "
            f"{r['eager_ms']:>7.4f} {r['inductor_ms']:>8.4f} {r['vs_inductor']:>6.2f} "
            f"{r['fraction_of_copy_bw']:>7.2f} {r['bwd_ms']:>7.4f} "
            f"{r['bwd_fraction_of_copy_bw']:>7.2f} {r['bwd_vs_inductor']:>10.2f}"
        )
    (out / "gpu_kernels.json").write_text(json.dumps(data, indent=1))
    save_png(data, out / "gpu_kernels.png")
    print(f"saved {out / 'gpu_kernels.json'} and .png")


if __name__ == "__main__":
    main()
