"""Our CUDA kernels on a GPU: correctness against float64, time, and fraction of the memory limit.

    python benchmarks/gpu_kernels.py [--quick]

Needs a CUDA build of torch_plugin (`TP_CUDA=1 python setup.py build_ext --inplace` on a machine
with a GPU; scripts/gpu/run.sh does it on a lent one). Both kernels are memory-bound, so the
limit is bytes over the device-to-device copy bandwidth measured in the same run (bytes read +
written, as the copy counts them):

- bias + GeLU (forward, backward) against eager `F.gelu(x + b)` and Inductor on the same shapes;
- split-KV decode attention at Llama-3-8B's attention shape (32 query / 8 KV heads, head_dim 128,
  bf16) from 4K to 128K context, both CUDA variants (one block per query head; one per KV head
  serving its query group) over a sweep of splits, against PyTorch's SDPA with `enable_gqa`.

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

# --dry-run: the same script on the CPU at tiny sizes, to check it before a lent GPU's minutes.
DEV = "cuda"
SCALE = 1


def cuda_ms(fn: Callable[[], Any], iters: int = 50, warmup: int = 5) -> float:
    """Median milliseconds of `fn` by CUDA events, after a warm-up."""
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
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


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


def bias_gelu_case(dtype: torch.dtype, r: int, c: int, bw: float) -> dict[str, Any]:
    x = torch.randn(r, c, device=DEV, dtype=dtype)
    b = torch.randn(c, device=DEV, dtype=dtype)
    g = torch.randn(r, c, device=DEV, dtype=dtype)
    ref = F.gelu(x.double() + b.double())
    ours = torch.ops.torch_plugin.bias_gelu(x, b, "none")
    xd = (x.double() + b.double()).requires_grad_(True)
    F.gelu(xd).backward(g.double())
    ours_b = torch.ops.torch_plugin.bias_gelu_backward(g, x, b, "none")
    compiled = torch.compile(lambda x, b: F.gelu(x + b))
    compiled(x, b)
    nbytes = 2 * x.numel() * x.element_size()  # read x, write out
    t_ours = cuda_ms(lambda: torch.ops.torch_plugin.bias_gelu(x, b, "none"))
    t_bwd = cuda_ms(lambda: torch.ops.torch_plugin.bias_gelu_backward(g, x, b, "none"))
    return {
        "kernel": "bias_gelu",
        "dtype": str(dtype).split(".")[1],
        "shape": [r, c],
        "rel_err_fwd": rel_err(ours, ref),
        "rel_err_bwd": rel_err(ours_b, xd.grad),
        "ours_ms": t_ours,
        "eager_ms": cuda_ms(lambda: F.gelu(x + b)),
        "inductor_ms": cuda_ms(lambda: compiled(x, b)),
        "bwd_ms": t_bwd,
        "bytes": nbytes,
        "fraction_of_copy_bw": nbytes / (t_ours * 1e-3) / bw,
        # backward reads grad and x, writes grad_in: 1.5x the forward's bytes
        "bwd_fraction_of_copy_bw": 1.5 * nbytes / (t_bwd * 1e-3) / bw,
    }


def bias_gelu_rows(bw: float, quick: bool) -> list[dict[str, Any]]:
    rows = []
    shapes = [(8192, 8192)] if quick else [(8192, 8192), (16384, 16384)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for r, c in shapes:
            rows.append(bias_gelu_case(dtype, r // SCALE, c, bw))
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


def with_variant(variant: str, fn: Callable[[], Any]) -> Any:
    os.environ["TP_SPLIT_KV_CUDA"] = variant
    try:
        return fn()
    finally:
        os.environ.pop("TP_SPLIT_KV_CUDA", None)


def variant_error(
    variant: str, fn: Callable[[], torch.Tensor], want: torch.Tensor, label: str
) -> float | None:
    """fn's relative error under one CUDA kernel variant; None where the grouped kernel
    refuses the shape (it serves only some), inf (printed) for any other failure."""
    try:
        return rel_err(with_variant(variant, fn), want)
    except RuntimeError as e:
        if "not supported" in str(e):
            return None
        print(f"{label}: {e}")
        return float("inf")


def split_kv_case(
    dtype: torch.dtype, B: int, Hq: int, Hkv: int, D: int, gen: torch.Generator
) -> list[dict[str, Any]]:
    S = 700
    q = torch.randn(B, Hq, D, device=DEV, dtype=dtype, generator=gen)
    k = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype, generator=gen)
    v = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype, generator=gen)
    lengths = torch.randint(1, S + 1, (B,), device=DEV, generator=gen)
    lengths[0] = 3  # shorter than the splits: some are empty
    want = decode_reference(q, k, v, lengths)
    rows = []
    for variant in ("warp_per_head", "grouped"):
        for splits in (1, 5, 16):
            err = variant_error(
                variant,
                lambda s=splits: torch_plugin.ops.split_kv_decode_attention(q, k, v, lengths, s),
                want,
                f"split_kv {variant} {B, Hq, Hkv, D} {dtype}",
            )
            rows.append(
                {
                    "dtype": str(dtype).split(".")[1],
                    "shape": [B, Hq, Hkv, D],
                    "variant": variant,
                    "splits": splits,
                    "rel_err": err,
                }
            )
        # Left padding skipped (starts) and Gemma-2's soft cap, through the raw op.
        starts = (torch.rand(B, device=DEV, generator=gen) * lengths).long()
        want_sc = decode_reference(q, k, v, lengths, starts, softcap=5.0)

        def capped(starts: torch.Tensor = starts) -> torch.Tensor:
            out, lse = torch.ops.torch_plugin.split_kv_attention(
                q, k, v, lengths, 5, 0.0, starts, 5.0
            )
            return torch.ops.torch_plugin.merge_attention_partials(out, lse)[0]

        err = variant_error(
            variant, capped, want_sc, f"split_kv starts+softcap {variant} {B, Hq, Hkv, D} {dtype}"
        )
        rows.append(
            {
                "dtype": str(dtype).split(".")[1],
                "shape": [B, Hq, Hkv, D],
                "variant": variant,
                "splits": 5,
                "starts_softcap": True,
                "rel_err": err,
            }
        )
    return rows


def split_kv_correctness() -> list[dict[str, Any]]:
    """Random shapes (GQA groups 1-8 and 3, head_dim 64/128/256/80, ragged lengths, empty splits)
    on both variants."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    cases = [(3, 8, 2, 64), (2, 32, 8, 128), (2, 16, 16, 128), (1, 8, 1, 256), (2, 6, 2, 80)]
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for B, Hq, Hkv, D in cases:
            rows += split_kv_case(dtype, B, Hq, Hkv, D, gen)
    return rows


def split_kv_timing_case(B: int, S: int, bw: float) -> list[dict[str, Any]]:
    Hq, Hkv, D, dtype = 32, 8, 128, torch.bfloat16
    q = torch.randn(B, Hq, D, device=DEV, dtype=dtype)
    k = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype)
    v = torch.randn(B, Hkv, S, D, device=DEV, dtype=dtype)
    lengths = torch.full((B,), S, device=DEV, dtype=torch.long)
    nbytes = 2 * k.numel() * k.element_size()  # K and V read once
    floor_ms = nbytes / bw * 1e3  # the copy's traffic rate, spent on reads alone
    want = decode_reference(q[:1], k[:1], v[:1], lengths[:1]) if S <= 32768 else None
    t_sdpa = cuda_ms(
        lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True), iters=30
    )
    rows = []
    for variant in ("warp_per_head", "grouped"):
        timed = [
            (
                with_variant(
                    variant,
                    lambda s=splits: cuda_ms(
                        lambda: torch_plugin.ops.split_kv_decode_attention(q, k, v, lengths, s),
                        iters=30,
                    ),
                ),
                splits,
            )
            for splits in (8, 16, 32, 64, 128)
        ]
        t, splits = min(timed)
        err = None
        if want is not None:
            got = with_variant(
                variant,
                lambda s=splits: torch_plugin.ops.split_kv_decode_attention(
                    q[:1], k[:1], v[:1], lengths[:1], s
                ),
            )
            err = rel_err(got, want)
        rows.append(
            {
                "kernel": "split_kv_attention",
                "variant": variant,
                "batch": B,
                "context": S,
                "best_splits": splits,
                "ms_by_splits": {str(s_): t_ for t_, s_ in timed},
                "ms": t,
                "sdpa_ms": t_sdpa,
                "vs_sdpa": t_sdpa / t,
                "bytes": nbytes,
                "read_gbps": nbytes / (t * 1e-3) / 1e9,
                "floor_ms": floor_ms,
                "fraction_of_read_limit": floor_ms / t,
                "sdpa_fraction_of_read_limit": floor_ms / t_sdpa,
                "rel_err_bf16": err,
            }
        )
    return rows


def split_kv_timing(bw: float, quick: bool) -> list[dict[str, Any]]:
    configs = [(8, 4096), (1, 32768), (8, 32768)]
    if not quick:
        configs += [(4, 32768), (1, 131072)]
    rows = []
    for B, S in configs:
        rows += split_kv_timing_case(B, S // SCALE, bw)
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
    for i, variant in enumerate(("warp_per_head", "grouped")):
        vals = [
            next(
                r["fraction_of_read_limit"]
                for r in rows
                if (r["batch"], r["context"]) == lab and r["variant"] == variant
            )
            for lab in labels
        ]
        ax.bar([x + 0.27 * i for x in xs], vals, width=0.27, label=f"ours: {variant}")
    sdpa = [
        next(r["sdpa_fraction_of_read_limit"] for r in rows if (r["batch"], r["context"]) == lab)
        for lab in labels
    ]
    ax.bar([x + 0.54 for x in xs], sdpa, width=0.27, label="PyTorch SDPA (enable_gqa)")
    ax.set_xticks([x + 0.27 for x in xs], [f"B={b}\n{s // 1024}K" for b, s in labels])
    ax.set_ylabel("fraction of the read limit")
    ax.set_title(f"split-KV decode attention, Llama-3-8B heads, bf16, {data['device']}")
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
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)"
    print(f"{name}: device-to-device copy {bw / 1e9:.0f} GB/s (read + write)")
    data: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "copy_bandwidth_gbps": bw / 1e9,
    }
    data["split_kv_correctness"] = split_kv_correctness()
    tol = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}
    bad = [
        r
        for r in data["split_kv_correctness"]
        if r["rel_err"] is not None and not r["rel_err"] < tol[r["dtype"]]
    ]
    print(f"split_kv correctness: {len(data['split_kv_correctness'])} cases, {len(bad)} bad")
    for r in bad:
        print("  BAD", r)
    data["split_kv_timing"] = split_kv_timing(bw, args.quick)
    print(
        f"{'B':>3} {'ctx':>7} {'variant':>14} {'splits':>6} {'ms':>8} {'GB/s':>7} "
        f"{'limit':>6} {'SDPA ms':>8} {'vs SDPA':>7} {'err':>8}"
    )
    for r in data["split_kv_timing"]:
        err = "-" if r["rel_err_bf16"] is None else f"{r['rel_err_bf16']:.1e}"
        print(
            f"{r['batch']:>3} {r['context']:>7} {r['variant']:>14} {r['best_splits']:>6} "
            f"{r['ms']:>8.3f} {r['read_gbps']:>7.0f} {r['fraction_of_read_limit']:>6.2f} "
            f"{r['sdpa_ms']:>8.3f} {r['vs_sdpa']:>7.2f} {err:>8}"
        )
    data["bias_gelu"] = bias_gelu_rows(bw, args.quick)
    print(
        f"{'dtype':>9} {'shape':>13} {'err fwd':>8} {'err bwd':>8} {'ours ms':>8} "
        f"{'eager':>7} {'Inductor':>8} {'limit':>6} {'bwd ms':>7} {'limit':>6}"
    )
    for r in data["bias_gelu"]:
        print(
            f"{r['dtype']:>9} {str(tuple(r['shape'])):>13} {r['rel_err_fwd']:>8.1e} "
            f"{r['rel_err_bwd']:>8.1e} {r['ours_ms']:>8.3f} {r['eager_ms']:>7.3f} "
            f"{r['inductor_ms']:>8.3f} {r['fraction_of_copy_bw']:>6.2f} {r['bwd_ms']:>7.3f} "
            f"{r['bwd_fraction_of_copy_bw']:>6.2f}"
        )
    (out / "gpu_kernels.json").write_text(json.dumps(data, indent=1))
    save_png(data, out / "gpu_kernels.png")
    print(f"saved {out / 'gpu_kernels.json'} and .png")


if __name__ == "__main__":
    main()
