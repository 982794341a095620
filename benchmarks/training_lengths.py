"""Fine-tuning as users write it, under the default compile: library-default HF configs (dropout
as shipped), padded batches of changing length, AdamW.

A user compiles the model and trains on a collator's batches, each padded to its longest row.
Dynamo traces the first length as it is and the next one with the length a symbol; dropout
makes every training forward draw random numbers. The default compile places those graphs
(eager or Inductor, Inductor drawing eager's masks) where it used to run them as aot_eager.
Contenders, threads equal:
- eager;
- aot_eager: what the default compile ran these graphs as before (its own graphs, no
  compiler);
- Inductor: torch.compile(model), as PyTorch documents it (its own random numbers);
- ours: torch.compile(model, backend="torch_plugin").

Every contender starts from the same weights and seed. Reported per model: the first pass over
the batches (every compile included; each contender in a process of its own), the median per
step of the passes after it (all contenders in one process, timed in turns), the ratio of each
to ours, and each step's loss against eager's (ours draws eager's dropout masks: its losses are
eager's to f32 rounding; Inductor's own masks give other losses). Writes
benchmarks/results/training_lengths.{json,png}.

    python benchmarks/training_lengths.py [--models gpt2 bert] [--passes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

try:
    from benchmarks.children import run_child
    from benchmarks.provenance import write_results
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from children import run_child
    from provenance import write_results

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ["gpt2", "bert"]
BATCH = 4
# The longest row of each batch in turn (a collator pads to it); the other rows are shorter.
LENGTHS = [128, 97, 112, 64, 121, 80]
CONTENDERS = ["eager", "aot_eager", "inductor", "ours"]
SEED = 1234


def build(name: str) -> torch.nn.Module:
    """The model at its library-default config (published size, dropout as shipped), random
    weights, in training mode."""
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config()).train()
    if name == "bert":
        return transformers.BertForMaskedLM(transformers.BertConfig()).train()
    raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")


def batches(name: str, vocab: int) -> list[dict[str, torch.Tensor]]:
    """Padded batches with labels: next-token (GPT-2) or 15% masked tokens (BERT), padding
    ignored (-100)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for longest in LENGTHS:
        ids = torch.randint(0, vocab, (BATCH, longest), generator=g)
        real = torch.randint(longest // 2, longest + 1, (BATCH,), generator=g)
        real[0] = longest
        mask = (torch.arange(longest)[None, :] < real[:, None]).long()
        labels = ids.masked_fill(mask == 0, -100)
        if name == "bert":
            picked = torch.rand(ids.shape, generator=g) < 0.15
            labels = labels.masked_fill(~picked, -100)
            ids = ids.masked_fill(picked & (mask == 1), 103)  # [MASK]
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def make(name: str, contender: str) -> tuple[Any, torch.nn.Module, Any]:
    """(the callable a step calls, the model it trains, its optimizer)."""
    model = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if contender == "eager":
        return model, model, opt
    if contender == "ours":
        import torch_plugin  # noqa: F401 - registers the backend

        return torch.compile(model, backend="torch_plugin"), model, opt
    return torch.compile(model, backend=contender), model, opt


def step(fn: Any, opt: Any, batch: dict[str, torch.Tensor]) -> float:
    loss = fn(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def measure(name: str, passes: int, which: list[str]) -> dict[str, Any]:
    """Each contender's first pass (compiles included, losses recorded), then `passes` passes
    timed in turns. With passes=0 the first pass only (the parent runs each contender's in a
    process of its own: Dynamo's automatic dynamic shapes are per function, so a second
    torch.compile of the same model would start from the first one's dynamic length)."""
    from torch_plugin import placement

    data = batches(name, build(name).config.vocab_size)
    row: dict[str, Any] = {"model": name, "batch": BATCH, "lengths": LENGTHS}
    row.update(first_pass_s={}, losses={}, failed={}, ran={})
    runs: dict[str, tuple[Any, Any]] = {}
    for key in which:
        try:
            fn, _, opt = make(name, key)
            torch.manual_seed(SEED)
            with placement.record() as placed:
                t0 = time.perf_counter()
                row["losses"][key] = [step(fn, opt, b) for b in data]
                row["first_pass_s"][key] = time.perf_counter() - t0
            if key == "ours":
                row["ran"][key] = [p.summary() for p in placed]
            runs[key] = (fn, opt)
        except Exception as e:  # noqa: BLE001 - a contender that fails is reported
            row["failed"][key] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if "eager" in row["losses"]:
        want = row["losses"]["eager"]
        row["loss_vs_eager"] = {
            k: max(abs(a - b) for a, b in zip(v, want, strict=True))
            for k, v in row["losses"].items()
        }
    if passes == 0:
        return row
    per: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(passes):
        for key, (fn, opt) in runs.items():
            time.sleep(0.1)
            t0 = time.perf_counter()
            for b in data:
                step(fn, opt, b)
            per[key].append((time.perf_counter() - t0) / len(data))
    row["ms_per_step"] = {k: statistics.median(v) * 1e3 for k, v in per.items()}
    row["spread_ms"] = {k: (min(v) * 1e3, max(v) * 1e3) for k, v in per.items()}
    ms = row["ms_per_step"]
    if "ours" in ms:
        row["ratio_to_ours"] = {k: v / ms["ours"] for k, v in ms.items() if k != "ours"}
    return row


def _child(name: str, passes: int, only: str | None = None) -> dict[str, Any]:
    return run_child(__file__, name, passes, only)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.2), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        ms = row.get("ms_per_step", {})
        keys = [k for k in CONTENDERS if k in ms]
        ax.barh(keys, [ms[k] for k in keys], color=["C1" if k == "ours" else "C0" for k in keys])
        ax.set_title(
            f"{row['model']} training, batch {BATCH}, lengths {min(LENGTHS)}-{max(LENGTHS)}"
        )
        ax.set_xlabel("ms per step (lower is better)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child: one model, its row on stdout
    p.add_argument("--only", help=argparse.SUPPRESS)  # ... one contender's first pass
    args = p.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.one:
        which = [args.only] if args.only else CONTENDERS
        print(json.dumps(measure(args.one, args.passes, which)), flush=True)
        return
    rows = []
    for name in args.models:
        row = _child(name, args.passes)
        row["first_pass_in_own_process_s"] = {}
        for c in CONTENDERS:
            first = _child(name, 0, c)
            row["first_pass_in_own_process_s"][c] = first.get("first_pass_s", {}).get(c)
            if c == "ours":
                row.setdefault("ran", {})[c] = first.get("ran", {}).get(c)
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("model", "ms_per_step", "failed")}), flush=True)
    ratios = [
        r["ratio_to_ours"]["inductor"] for r in rows if "inductor" in r.get("ratio_to_ours", {})
    ]
    summary = {"geomean_inductor_over_ours": statistics.geometric_mean(ratios) if ratios else None}
    RESULTS.mkdir(exist_ok=True)
    write_results(RESULTS / "training_lengths.json", {"summary": summary, "rows": rows})
    plot(rows, RESULTS / "training_lengths.png")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
