"""The default `torch.compile(model, backend="torch_plugin")` on a GPU against Inductor, on HF
models at real sizes, batch 1 and 8 (issue 40, item 3).

    python benchmarks/gpu_default_compile.py [--models bert gpt2 ...] [--batches 1 8]
                                             [--budget-s 420] [--out DIR] [--dry-run]

Models from library-default configs, sizes only: BERT-base and DistilBERT (sequence
classification, 128 tokens with an attention mask), GPT-2 124M (LM head, 128 tokens), a ~1.1B
Llama (hidden 2048, 16 layers, GQA 32/8, bf16, 128 tokens), ViT-B/16 and ResNet-50 (224 x 224),
random weights, eval mode, under `torch.no_grad()`. Each contender compiled with
`dynamic=False` after a Dynamo reset (a recompile at a second batch would otherwise turn a
static-shape kernel into a dynamic one):

  - eager;
  - Inductor as `torch.compile(model)` documents it by default (the acceptance baseline);
  - Inductor `mode="reduce-overhead"` (CUDA graphs), what a user chasing batch-1 latency runs;
  - ours.

Latency is wall-clock per call with the device synchronised (what a user waits for: at batch 1
the host's launch overhead is most of it), median over calls measured in turns. First-call
(compile) seconds and ours' largest error against eager, relative to eager's largest output, are
recorded. A time budget stops starting new rows; skipped rows are listed. Writes
benchmarks/results/gpu_default_compile.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

import torch_plugin  # noqa: E402,F401  (registers the backend)
from benchmarks.provenance import kept_rows, provenance  # noqa: E402
from torch_plugin import placement  # noqa: E402

DEV = "cuda"
SEQ = 128
IMAGE = 224


def _build(name: str, dry: bool) -> tuple[torch.nn.Module, str, torch.dtype]:
    """(model, input kind, dtype): library-default configs with only sizes set."""
    import transformers as tf

    small = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128} if dry else {}
    if name == "bert":
        cfg = tf.BertConfig(**({**small, "num_attention_heads": 2} if dry else {}))
        return tf.BertForSequenceClassification(cfg), "text", torch.float32
    if name == "distilbert":
        extra = {"n_layers": 1, "dim": 64, "hidden_dim": 128, "n_heads": 2} if dry else {}
        return (
            tf.DistilBertForSequenceClassification(tf.DistilBertConfig(**extra)),
            "text",
            (torch.float32),
        )
    if name == "gpt2":
        extra = {"n_layer": 1, "n_embd": 64, "n_head": 2} if dry else {}
        return tf.GPT2LMHeadModel(tf.GPT2Config(**extra)), "text", torch.float32
    if name == "llama":
        sizes = {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
        }
        if dry:
            sizes = {**sizes, **small, "num_attention_heads": 4, "num_key_value_heads": 2}
        return tf.LlamaForCausalLM(tf.LlamaConfig(**sizes)), "text", torch.bfloat16
    if name == "vit":
        cfg = tf.ViTConfig(**({**small, "num_attention_heads": 2} if dry else {}))
        return tf.ViTForImageClassification(cfg), "image", torch.float32
    if name == "resnet":
        extra = {"depths": [1, 1, 1, 1], "hidden_sizes": [32, 64, 64, 64]} if dry else {}
        return tf.ResNetForImageClassification(tf.ResNetConfig(**extra)), "image", torch.float32
    raise SystemExit(f"gpu_default_compile: unknown model {name!r}")


# Cheapest compiles first: a budget that runs out leaves the most models measured.
MODELS = ("bert", "gpt2", "resnet", "vit", "distilbert", "llama")


def _inputs(kind: str, batch: int, dtype: torch.dtype, vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(batch)
    if kind == "image":
        return {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE, generator=gen).to(DEV, dtype)}
    ids = torch.randint(5, vocab, (batch, SEQ), generator=gen)
    mask = torch.ones(batch, SEQ, dtype=torch.long)
    if batch > 1:
        mask[1:, SEQ - SEQ // 4 :] = 0  # padded rows, as a collator gives them
    return {"input_ids": ids.to(DEV), "attention_mask": mask.to(DEV)}


def _first(out: Any) -> torch.Tensor:
    """The model's main output (logits)."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _in_turns(fns: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    """Median ms per call of each callable, measured in turns (rounds x calls each)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                _sync()
                times[name].append((time.perf_counter() - t) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def run_row(name: str, batch: int, dry: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model, kind, dtype = _build(name, dry)
    model = model.to(DEV, dtype).eval()
    vocab = int(getattr(model.config, "vocab_size", 1000))
    inputs = _inputs(kind, batch, dtype, vocab)
    row: dict[str, Any] = {"model": name, "batch": batch, "dtype": str(dtype).split(".")[1]}
    fns: dict[str, Callable[[], Any]] = {"eager": lambda: model(**inputs)}
    with torch.no_grad():
        want = _first(model(**inputs)).float()
        contenders = {
            "inductor": lambda m: torch.compile(m, dynamic=False),
            "inductor_reduce_overhead": lambda m: torch.compile(
                m, mode="reduce-overhead", dynamic=False
            ),
            "ours": lambda m: torch.compile(m, backend="torch_plugin", dynamic=False),
        }
        for label, make in contenders.items():
            torch._dynamo.reset()
            compiled = make(model)
            t0 = time.perf_counter()
            try:
                with placement.record() as placed:
                    got = _first(compiled(**inputs)).float()
                    _sync()
            except Exception as e:  # noqa: BLE001 - a contender that fails is a row's finding
                row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                continue
            row[f"{label}_compile_s"] = time.perf_counter() - t0
            if label == "ours":
                # What the whole-graph search picked per graph, and each candidate's median ms.
                plans = [r.whole_graph for r in placed if r.whole_graph]
                row["ours_pick"] = [p["pick"] for p in plans]
                row["ours_failures"] = [f for r in placed for f in r.failures]
                # Candidates the search did not try, and why (the budget, a bound).
                row["ours_skipped"] = [
                    f"{t['backend']}: {t['skipped']}"
                    for p in plans
                    for t in p["trials"]
                    if t.get("skipped")
                ]
                row["ours_trials_ms"] = [
                    {
                        t["backend"]: round(t["median_s"] * 1e3, 4) if t["compiled"] else None
                        for t in p["trials"]
                    }
                    for p in plans
                ]
            row[f"{label}_max_rel_err"] = float(
                (got - want).abs().max() / want.abs().max().clamp_min(1e-30)
            )
            for _ in range(3):  # warm-up: CUDA graphs record on their first calls
                compiled(**inputs)
            fns[label] = lambda c=compiled: c(**inputs)
        _sync()
        ms = _in_turns(fns, rounds=3 if dry else 5, calls=3 if dry else 20)
    for label, v in ms.items():
        row[f"{label}_ms"] = v
    if "ours_ms" in row and "inductor_ms" in row:
        row["ours_vs_inductor"] = row["inductor_ms"] / row["ours_ms"]
    if "ours_ms" in row and "inductor_reduce_overhead_ms" in row:
        row["ours_vs_reduce_overhead"] = row["inductor_reduce_overhead_ms"] / row["ours_ms"]
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for batch in sorted({r["batch"] for r in rows}):
        ratios = [
            r["ours_vs_inductor"] for r in rows if r["batch"] == batch and "ours_vs_inductor" in r
        ]
        if ratios:
            out[f"batch{batch}"] = {
                "models": len(ratios),
                "at_least_inductor": sum(x >= 1.0 for x in ratios),
                "geomean_vs_inductor": statistics.geometric_mean(ratios),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny configs: checks the script")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of benchmarks/results/gpu_default_compile.json this run does not "
        "measure (each row names its commit and device)",
    )
    args = ap.parse_args()
    global DEV
    if args.dry_run:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_default_compile: no CUDA device here (scripts/gpu/run.sh runs it)")
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    saved = RESULTS / "gpu_default_compile.json"
    # Every saved row until this run measures its (model, batch) again: a run stopped by its
    # budget or time limit kept only the rows of models it was not asked for, and lost the
    # others (the H100's GPT-2 rows, 2026-12-04).
    saved_rows = kept_rows(saved, set()) if args.merge else []

    def kept() -> list[dict[str, Any]]:
        done = {(r["model"], r["batch"]) for r in rows}
        return [r for r in saved_rows if (r["model"], r["batch"]) not in done]

    here = {"commit": provenance().get("commit"), "device": _device()}
    for name in args.models:
        for batch in args.batches:
            if time.perf_counter() - start > args.budget_s:
                skipped.append(f"{name} x{batch}")
                continue
            with contextlib.suppress(KeyboardInterrupt):
                row = {**here, **run_row(name, batch, args.dry_run)}
                rows.append(row)
                write(args.out, _in_order(kept() + rows), skipped)
                torch._dynamo.reset()  # the row's compiled models and their memory go
                gc.collect()
                if DEV == "cuda":
                    torch.cuda.empty_cache()
                print(
                    f"{name:>10} x{batch:<2} {row.get('dtype', '')[:4]:>4} "
                    + " ".join(
                        f"{k[:-3]} {row[k]:.3f}"
                        for k in (
                            "eager_ms",
                            "inductor_ms",
                            "inductor_reduce_overhead_ms",
                            "ours_ms",
                        )
                        if k in row
                    )
                    + f" | ours/Ind {row.get('ours_vs_inductor', float('nan')):.2f}"
                    + f" err {row.get('ours_max_rel_err', float('nan')):.1e}"
                    + f" pick {row.get('ours_pick')}"
                    + "".join(f"\n    failed: {f[:240]}" for f in row.get("ours_failures", []))
                    + "".join(f"\n    skipped: {f[:240]}" for f in row.get("ours_skipped", []))
                    + "".join(f" [{k}]" for k in row if k.endswith("_error")),
                    flush=True,
                )
    data = write(args.out, _in_order(kept() + rows), skipped)
    print(json.dumps(data["summary"]), "skipped:", skipped)


def _device() -> str:
    return torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)"


def _in_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (MODELS.index(r["model"]), r["batch"]))


COLUMNS = (
    "model",
    "batch",
    "dtype",
    "ours_vs_inductor",
    "ours_vs_reduce_overhead",
    "eager_ms",
    "inductor_ms",
    "inductor_reduce_overhead_ms",
    "ours_ms",
    "ours_pick",
    "ours_compile_s",
    "inductor_compile_s",
    "ours_max_rel_err",
    "commit",
)


def write(out_dir: str, rows: list[dict[str, Any]], skipped: list[str]) -> dict[str, Any]:
    """The results so far (after every row: a run stopped by its time limit keeps its rows)."""
    data = {
        **provenance(),
        "device": _device(),
        "timing": "wall-clock per call, device synchronised, median of calls in turns",
        # The figures the results page shows first.
        "columns": list(COLUMNS),
        "rows": rows,
        "skipped": skipped,
        # Over this device's rows only: a merged file may hold another GPU's.
        "summary": summarize([r for r in rows if r.get("device", _device()) == _device()]),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_default_compile.json").write_text(json.dumps(data, indent=1))
    return data


if __name__ == "__main__":
    main()
