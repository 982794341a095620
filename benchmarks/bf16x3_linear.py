"""f32 linears as three bf16 products (torch_plugin::linear_bf16x3, what the default compile runs
under torch.set_float32_matmul_precision("high") on a CPU with AMX) against the f32 linears a
careful user's compile runs, at the linear layers of the real-size models: bert-base and GPT-2
at 128 tokens (batch 1 and 8), the 1.2B Llama at 512 prompt tokens.

Per shape, timed in turns (benchmarks/timing.round_robin, 5 rounds), the weight in the caches:
MKL's prepacked f32 sgemm (`torch.ops.mkl._mkl_linear`, what Inductor with freezing calls),
torch's f32 `F.linear` (eager), ours (the activation's split and two MKL bf16 GEMMs with f32
output), and one bf16 product (`F.linear` on bf16 tensors: oneDNN on AMX, torch's "medium").
Each says its GFLOP/s (2MNK per call) and how near the limits it runs: f32 against the f32
multiply-add peak measured in the same process, ours against a third of the one-product rate.
Error: relative L2 against float64.

Then as in a model: bert-base's 72 linears (12 layers of 6), each weight read from memory in
turn, at 128 to 1024 rows, MKL's packed f32 against ours. A GEMM of few rows is bound by reading
its weight, of which ours reads 1.5x the f32 bytes: this says from how many rows the default
compile takes a linear (torch_plugin/placement/bf16x3.py: MIN_ROWS).

    python benchmarks/bf16x3_linear.py [--rounds 5]

Writes benchmarks/results/bf16x3_linear.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

import torch_plugin  # noqa: F401 - registers torch.ops.torch_plugin
from torch_plugin.placement import bf16x3

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance  # noqa: E402
from timing import round_robin  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# model, layer, M (tokens in the batch), K (in), N (out)
SHAPES = [
    ("bert-base b1", "attention qkv / out", 128, 768, 768),
    ("bert-base b1", "MLP up", 128, 768, 3072),
    ("bert-base b1", "MLP down", 128, 3072, 768),
    ("bert-base b8", "attention qkv / out", 1024, 768, 768),
    ("bert-base b8", "MLP up", 1024, 768, 3072),
    ("bert-base b8", "MLP down", 1024, 3072, 768),
    ("GPT-2 b1", "LM head", 128, 768, 50257),
    ("GPT-2 b8", "LM head", 1024, 768, 50257),
    ("Llama 1.2B", "attention q / out", 512, 2048, 2048),
    ("Llama 1.2B", "MLP gate / up", 512, 2048, 8192),
    ("Llama 1.2B", "MLP down", 512, 8192, 2048),
    ("Llama 1.2B", "LM head", 512, 2048, 128256),
]


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def run(rounds: int) -> list[dict[str, Any]]:
    from torch_plugin import _C

    rows = []
    g = torch.Generator().manual_seed(0)
    for model, layer, m, k, n in SHAPES:
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / math.sqrt(k)
        b = torch.randn(n, generator=g)
        w2 = torch.ops.torch_plugin.split_bf16x3_weight(w)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
        fns = {
            "f32_mkl_packed": lambda x=x, p=packed, w=w, b=b, m=m: torch.ops.mkl._mkl_linear(
                x, p, w, b, m
            ),
            "f32_linear": lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b),
            "ours_bf16x3": lambda x=x, w2=w2, b=b: torch.ops.torch_plugin.linear_bf16x3(x, w2, b),
            "bf16_one_product": lambda x=xb, w=wb, b=bb: torch.nn.functional.linear(x, w, b),
        }
        want = torch.nn.functional.linear(x.double(), w.double(), b.double())
        errors = {key: _relative(fn(), want) for key, fn in fns.items()}
        peak = float(_C.measure_f32_peak(torch.get_num_threads())) / 1e9
        per = round_robin(fns, (), rounds, window_s=0.3)
        ms = {key: statistics.median(v) * 1e3 for key, v in per.items()}
        gflop = 2 * m * k * n / 1e9
        rate = {key: gflop / (t * 1e-3) for key, t in ms.items()}
        row = {
            "model": model,
            "layer": layer,
            "M": m,
            "K": k,
            "N": n,
            "ms": ms,
            "gflops": rate,
            "error": errors,
            "f32_peak_gflops": peak,
            "speedup_vs_packed_f32": ms["f32_mkl_packed"] / ms["ours_bf16x3"],
            # Whether the default compile runs this linear so (bf16x3.worth).
            "taken_by_the_compile": bf16x3.worth(m, n * k),
            "packed_f32_of_peak": rate["f32_mkl_packed"] / peak,
            "ours_of_three_products_limit": rate["ours_bf16x3"] / (rate["bf16_one_product"] / 3),
        }
        rows.append(row)
        print(
            f"{model:<13} {layer:<20} {m}x{k}x{n}: packed f32 {ms['f32_mkl_packed']:.2f} ms, "
            f"ours {ms['ours_bf16x3']:.2f} ms ({row['speedup_vs_packed_f32']:.2f}x, error "
            f"{errors['ours_bf16x3']:.1e}), one bf16 product {ms['bf16_one_product']:.2f} ms",
            flush=True,
        )
    return rows


# bert-base's linears per layer: query, key, value, output (768 -> 768), MLP up and down.
BERT_LAYER = [(768, 768)] * 4 + [(3072, 768), (768, 3072)]


def run_stacks(rounds: int, row_counts: tuple[int, ...] = (128, 256, 512, 1024)) -> list[Any]:
    """bert-base's 72 linears one after another, each weight read from memory as in the model
    (340 MB of them: past the caches), per row count: MKL's packed f32 against ours."""
    g = torch.Generator().manual_seed(0)
    weights = [
        (torch.randn(n, k, generator=g) / math.sqrt(k), torch.randn(n, generator=g), k)
        for _ in range(12)
        for n, k in BERT_LAYER
    ]
    # Ours' split does not depend on the rows; MKL's packing takes them as a hint.
    splits = [torch.ops.torch_plugin.split_bf16x3_weight(w) for w, _, _ in weights]
    out = []
    for m in row_counts:
        xs = {k: torch.randn(m, k, generator=g) for k in (768, 3072)}
        layers = [
            (w, b, torch.ops.mkl._mkl_reorder_linear_weight(w, m), w2, k)
            for (w, b, k), w2 in zip(weights, splits, strict=True)
        ]

        def packed(layers: list[Any] = layers, xs: dict[int, Any] = xs, m: int = m) -> None:
            for w, b, p, _, k in layers:
                torch.ops.mkl._mkl_linear(xs[k], p, w, b, m)

        def ours(layers: list[Any] = layers, xs: dict[int, Any] = xs) -> None:
            for _, b, _, w2, k in layers:
                torch.ops.torch_plugin.linear_bf16x3(xs[k], w2, b)

        per = round_robin({"f32_mkl_packed": packed, "ours_bf16x3": ours}, (), rounds, window_s=1)
        ms = {key: statistics.median(v) * 1e3 for key, v in per.items()}
        out.append(
            {
                "rows": m,
                "ms": ms,
                "speedup_vs_packed_f32": ms["f32_mkl_packed"] / ms["ours_bf16x3"],
                "taken_by_the_compile": m >= bf16x3.MIN_ROWS,
            }
        )
        print(f"bert-base's 72 linears at {m} rows: {json.dumps(out[-1])}", flush=True)
        del layers
    return out


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4))
    labels = [f"{r['model']}\n{r['layer']}" for r in rows]
    ax.bar(range(len(rows)), [r["speedup_vs_packed_f32"] for r in rows])
    ax.axhline(1.0, color="black", lw=0.7)
    ax.set_xticks(range(len(rows)), labels, fontsize=6)
    ax.set_ylabel("packed f32 time / ours (higher: ours faster)")
    ax.set_title("f32 linears as three bf16 products, against MKL's packed f32 (warm weights)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not torch.ops.torch_plugin.linear_bf16x3_available():
        raise SystemExit("this torch build does not export MKL's bf16 GEMM")
    rows = run(args.rounds)
    stacks = run_stacks(args.rounds)
    taken = [r["speedup_vs_packed_f32"] for r in rows if r["taken_by_the_compile"]]
    summary = {
        "geomean_speedup_vs_packed_f32_where_the_compile_takes_it": math.exp(
            sum(map(math.log, taken)) / len(taken)
        ),
        "bert_base_linears_from_memory_speedup_by_rows": {
            str(r["rows"]): r["speedup_vs_packed_f32"] for r in stacks
        },
        "worst_error_ours": max(r["error"]["ours_bf16x3"] for r in rows),
        "worst_error_f32": max(r["error"]["f32_mkl_packed"] for r in rows),
    }
    print(json.dumps(summary, indent=1))
    RESULTS.mkdir(exist_ok=True)
    data = {**provenance(), "summary": summary, "rows": rows, "bert_base_linears": stacks}
    (RESULTS / "bf16x3_linear.json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(rows, RESULTS / "bf16x3_linear.png")


if __name__ == "__main__":
    main()
