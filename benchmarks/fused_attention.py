"""Prefill attention: our flash kernel (torch_plugin::attention, the placement pass's fused
backend) against ATen's _scaled_dot_product_flash_attention_for_cpu, the node it replaces, and
against SDPA's math path (matmul, softmax, matmul: what a framework without a fused kernel runs).

Shapes are the zoo's attention at full size: BERT-base and GPT-2-small (12 heads, head_dim 64,
seq 128; GPT-2 with its float mask, causal + padding), batches 1 and 8; a long prompt (seq 512
and 1024, causal) and a grouped-query Llama-style layer (32 query heads over 8 KV heads, head_dim
128, seq 512). q, k, v are laid out as a transformer's head split gives them ([B, S, H, D]
viewed as [B, H, S, D]). Every variant of a row is timed in turns (5 rounds; each round's
median of >= 0.2 s of calls), at 1 and 2 threads; the figure is the median over rounds.

    python benchmarks/fused_attention.py [--threads 1,2] [--rounds 5]

Writes benchmarks/results/fused_attention.{json,png}.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torch_plugin  # noqa: F401 - registers torch.ops.torch_plugin

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import commit as _commit  # noqa: E402 - one way to name a commit

RESULTS = Path(__file__).resolve().parent / "results"
OURS = torch.ops.torch_plugin.attention.default
ATEN = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

# name, batch, heads, kv heads, seq, head_dim, mask ("none", "gpt2": float causal + padding,
# "causal": is_causal)
SHAPES = [
    ("bert-base", 1, 12, 12, 128, 64, "none"),
    ("bert-base", 8, 12, 12, 128, 64, "none"),
    ("gpt2-small", 1, 12, 12, 128, 64, "gpt2"),
    ("gpt2-small", 8, 12, 12, 128, 64, "gpt2"),
    ("long prompt", 1, 12, 12, 512, 64, "causal"),
    ("long prompt", 1, 12, 12, 1024, 64, "causal"),
    ("llama gqa", 1, 32, 8, 512, 128, "causal"),
]


def _inputs(b: int, h: int, hkv: int, s: int, d: int, mask: str) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, s, h, d, generator=g).transpose(1, 2)
    k = torch.randn(b, s, hkv, d, generator=g).transpose(1, 2)
    v = torch.randn(b, s, hkv, d, generator=g).transpose(1, 2)
    attn_mask = None
    if mask == "gpt2":
        attn_mask = torch.zeros(b, 1, s, s)
        attn_mask.masked_fill_(torch.ones(s, s, dtype=torch.bool).triu(1), -3.4e38)
        for i in range(b):  # a few padded positions per sequence
            attn_mask[i, ..., s - (i % 4) :] = -3.4e38
    return {"q": q, "k": k, "v": v, "mask": attn_mask, "causal": mask == "causal"}


def _variants(x: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    q, k, v, mask, causal = x["q"], x["k"], x["v"], x["mask"], x["causal"]
    group = q.shape[1] // k.shape[1]
    ke = k.repeat_interleave(group, 1) if group > 1 else k  # ATen's node takes MHA only
    ve = v.repeat_interleave(group, 1) if group > 1 else v

    def math_path() -> Any:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(
                q, ke, ve, attn_mask=mask, is_causal=causal
            )

    return {
        "ours": lambda: OURS(q, k, v, mask, causal, None),
        "aten_flash": lambda: ATEN(q, ke, ve, 0.0, causal, attn_mask=mask),
        "sdpa_math": math_path,
    }


def _time(fn: Callable[[], Any], min_s: float = 0.2) -> float:
    fn()
    times = []
    end = time.perf_counter() + min_s
    while len(times) < 5 or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(threads: list[int], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for t in threads:
        torch.set_num_threads(t)
        for name, b, h, hkv, s, d, mask in SHAPES:
            x = _inputs(b, h, hkv, s, d, mask)
            fns = _variants(x)
            with torch.no_grad():
                want = fns["sdpa_math"]()
                got = fns["ours"]()[0]
                err = (got - want).abs().max().item()
                per: dict[str, list[float]] = {k: [] for k in fns}
                for _ in range(rounds):
                    for key, fn in fns.items():
                        per[key].append(_time(fn))
            ms = {key: statistics.median(v) * 1e3 for key, v in per.items()}
            row = {
                "shape": name,
                "batch": b,
                "heads": h,
                "kv_heads": hkv,
                "seq": s,
                "head_dim": d,
                "mask": mask,
                "threads": t,
                **{f"{k}_ms": v for k, v in ms.items()},
                "speedup_vs_aten_flash": ms["aten_flash"] / ms["ours"],
                "speedup_vs_sdpa_math": ms["sdpa_math"] / ms["ours"],
                "max_abs_err_vs_math": err,
            }
            rows.append(row)
            print(
                f"{name:<12} b{b:<2} s{s:<5} {mask:<6} t{t}  ours {ms['ours']:8.3f}  "
                f"aten flash {ms['aten_flash']:8.3f}  math {ms['sdpa_math']:8.3f} ms  "
                f"x aten {row['speedup_vs_aten_flash']:.2f}  x math "
                f"{row['speedup_vs_sdpa_math']:.2f}  err {err:.1e}",
                flush=True,
            )
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = sorted({r["threads"] for r in rows})
    fig, axes = plt.subplots(1, len(threads), figsize=(6 * len(threads), 4), squeeze=False)
    for ax, t in zip(axes[0], threads, strict=True):
        rs = [r for r in rows if r["threads"] == t]
        labels = [f"{r['shape']}\nb{r['batch']} s{r['seq']}" for r in rs]
        xs = range(len(rs))
        ax.bar(
            [x - 0.2 for x in xs],
            [r["speedup_vs_aten_flash"] for r in rs],
            0.4,
            label="ours / ATen flash",
        )
        ax.bar(
            [x + 0.2 for x in xs],
            [r["speedup_vs_sdpa_math"] for r in rs],
            0.4,
            label="ours / SDPA math",
        )
        ax.axhline(1.0, color="black", lw=0.7)
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("speedup (higher: ours faster)")
        ax.set_title(f"prefill attention, fp32, {t} thread(s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    rows = run(threads, args.rounds)
    summary = {
        f"geomean_vs_aten_flash_t{t}": _geomean(
            [r["speedup_vs_aten_flash"] for r in rows if r["threads"] == t]
        )
        for t in threads
    }
    for key, value in summary.items():
        print(f"{key}: {value:.3f}x")
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "commit": _commit(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "rows": rows,
        **summary,
    }
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(RESULTS / "fused_attention.json", payload)
    _plot(rows, RESULTS / "fused_attention.png")
    print("wrote benchmarks/results/fused_attention.{json,png}")


if __name__ == "__main__":
    main()
