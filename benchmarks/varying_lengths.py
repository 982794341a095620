"""CPU inference on padded batches of changing lengths, as a collator makes them (issue 39).

A user runs a model over a dataset: each batch is padded to its longest sequence, so every
batch has another length. Dynamo traces the first length as it is and the next one with the
length a symbol (its automatic dynamic shapes); the default compile places that dynamic graph
whole on a compiler that compiles for every length (OpenVINO) and keeps serving it, where a
static-shape pick could not. Contenders, each as its documentation sets it up for inputs of
changing shape, threads equal:
- eager; Inductor with freezing (torch.compile's automatic dynamic shapes);
- OpenVINO: ov.convert_model, whose model takes any length (dynamic dimensions), at f32 and at
  its default precision (bf16 on a CPU with bf16 units);
- ONNX Runtime on torch.onnx.export with the batch and length exported dynamic;
- ours: torch.compile(model, backend="torch_plugin"), f32 and options={"precision": "bf16"}.

Reported per model: the first pass over the batches (every compile included) and the mean
per batch of the passes after it, timed in turns, as ratios to the best contender of the same
precision; what ours ran. Writes benchmarks/results/varying_lengths.{json,png}.

    python benchmarks/varying_lengths.py [--models bert gpt2] [--passes 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time
import warnings
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
MODELS = ["bert", "gpt2"]
BATCH = 8
# The longest sequence of each batch in turn (a collator pads to it); the other rows are shorter.
LENGTHS = [128, 97, 112, 64, 121, 80]
F32 = ["eager", "inductor_freezing", "ov_convert_f32", "onnxruntime", "ours"]
BF16 = ["inductor_freezing_bf16", "ov_convert", "ours_bf16"]


class _Masked(torch.nn.Module):
    """model(input_ids, attention_mask) -> its one output tensor (positional, for the
    exporters)."""

    def __init__(self, model: torch.nn.Module, field: str) -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask), self.field)


def build(name: str) -> torch.nn.Module:
    """The model at its library-default config and published size, random weights, eval."""
    import transformers

    torch.manual_seed(0)
    if name == "bert":
        return _Masked(transformers.BertModel(transformers.BertConfig()), "last_hidden_state")
    if name == "gpt2":
        return _Masked(transformers.GPT2Model(transformers.GPT2Config()), "last_hidden_state")
    raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")


def batches(vocab: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Padded batches: each row a random length up to the batch's longest, padding masked."""
    g = torch.Generator().manual_seed(1)
    out = []
    for longest in LENGTHS:
        ids = torch.randint(0, vocab, (BATCH, longest), generator=g)
        real = torch.randint(longest // 2, longest + 1, (BATCH,), generator=g)
        real[0] = longest
        mask = (torch.arange(longest)[None, :] < real[:, None]).long()
        out.append((ids, mask))
    return out


def contenders(model: torch.nn.Module, example: tuple, which: list[str]) -> dict[str, Any]:
    """name -> a callable. Eager, Inductor and ours as real_size_inference sets them up (they
    take any length as they are); OpenVINO and ONNX Runtime exported for any length."""
    try:
        from benchmarks.real_size_inference import contenders as same_as_fixed_sizes
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from real_size_inference import contenders as same_as_fixed_sizes

    out: dict[str, Any] = {}
    threads = torch.get_num_threads()
    for name in which:
        if name.startswith("ov_convert"):
            out[name] = _ov_convert(model, example, threads, f32=name.endswith("f32"))
        elif name == "onnxruntime":
            out[name] = _onnxruntime(model, example, threads)
        else:
            out.update(same_as_fixed_sizes(model, example, [name]))
    return out


def _ov_convert(model: torch.nn.Module, example: tuple, threads: int, f32: bool) -> Any:
    """ov.convert_model (its inputs' dimensions dynamic, any length) and compile_model for the
    CPU, latency hint, at its default precision or held to f32."""
    import openvino as ov

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = ov.convert_model(model, example_input=example, input=[[-1, -1], [-1, -1]])
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = ov.Core().compile_model(converted, "CPU", config)
    request = compiled.create_infer_request()
    first = compiled.outputs[0]

    def run(*a: torch.Tensor) -> torch.Tensor:
        res = request.infer([x.numpy() for x in a], share_inputs=True)
        return torch.from_numpy(res[first])

    return run


def _onnxruntime(model: torch.nn.Module, example: tuple, threads: int) -> Any:
    """torch.onnx.export (dynamo) with the batch and the length dynamic, and an
    InferenceSession with every graph optimisation (ONNX Runtime's documented CPU setup)."""
    import onnxruntime as ort

    batch, length = torch.export.Dim("batch", max=64), torch.export.Dim("length", max=512)
    shapes = ({0: batch, 1: length}, {0: batch, 1: length})
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, buf, dynamo=True, dynamic_shapes=shapes, verbose=False)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    session = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*a: torch.Tensor) -> torch.Tensor:
        feed = {n: x.numpy() for n, x in zip(names, a, strict=True)}
        return torch.from_numpy(session.run(None, feed)[0])

    return run


def _error(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> float:
    """Relative error over the real (unpadded) positions."""
    keep = mask.bool()
    g, w = got.float()[keep], want.float()[keep]
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-12))


def measure(name: str, passes: int, which: list[str]) -> dict[str, Any]:
    """One model: every contender's first pass (compiles included), then `passes` passes timed
    in turns (a pass of each contender, then the next pass). With passes=0, the first pass
    only: the parent times each contender's in a process of its own, since Dynamo's automatic
    dynamic shapes are per function, not per torch.compile: a second torch.compile of the same
    model would start from the first one's dynamic length and skip its static graph."""
    from torch_plugin import placement

    model = build(name).eval()
    data = batches(model.model.config.vocab_size)
    with torch.no_grad():
        want = [model(*b) for b in data]
    fns: dict[str, Any] = {}
    row: dict[str, Any] = {
        "model": name,
        "batch": BATCH,
        "lengths": LENGTHS,
        "first_pass_s": {},
        "error": {},
        "failed": {},
        "ran": {},
    }
    with torch.no_grad():
        for key in which:
            try:
                with placement.record() as placed:
                    t0 = time.perf_counter()
                    # Built inside the timing: the exporters convert here (compile time).
                    fns[key] = contenders(model, data[0], [key])[key]
                    got = [fns[key](*b) for b in data]
                    row["first_pass_s"][key] = time.perf_counter() - t0
                row["error"][key] = max(
                    _error(g, w, b[1]) for g, w, b in zip(got, want, data, strict=True)
                )
                if key.startswith("ours"):
                    row["ran"][key] = [p.summary() for p in placed]
            except Exception as e:  # noqa: BLE001 - a contender that fails is reported
                # First and last lines: OpenVINO's first says only "Check 'false' failed".
                lines = [ln for ln in str(e).splitlines() if ln.strip()] or [""]
                why = lines[0][:120] + (f" ... {lines[-1][:160]}" if len(lines) > 1 else "")
                row["failed"][key] = f"{type(e).__name__}: {why}"
                fns.pop(key, None)
        if passes == 0:
            return row
        per: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(passes):
            for key, fn in fns.items():
                time.sleep(0.1)  # another runtime's spinning pool winds down
                t0 = time.perf_counter()
                for b in data:
                    fn(*b)
                per[key].append((time.perf_counter() - t0) / len(data))
    row["ms_per_batch"] = {k: statistics.median(v) * 1e3 for k, v in per.items()}
    row["spread_ms"] = {k: (min(v) * 1e3, max(v) * 1e3) for k, v in per.items()}
    for prec, names, ours in (("f32", F32, "ours"), ("bf16", BF16, "ours_bf16")):
        ms = row["ms_per_batch"]
        others = {k: ms[k] for k in names if k in ms and k != ours}
        if ours in ms and others:
            best = min(others, key=others.get)
            row[f"best_{prec}"] = best
            row[f"ratio_{prec}"] = others[best] / ms[ours]
    return row


def _child(name: str, passes: int, only: str | None = None) -> dict[str, Any]:
    return run_child(__file__, name, passes, only)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.6), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        ms = row.get("ms_per_batch", {})
        keys = [k for k in F32 + BF16 if k in ms]
        colors = ["C1" if k.startswith("ours") else "C0" for k in keys]
        ax.barh(keys, [ms[k] for k in keys], color=colors)
        ax.set_title(f"{row['model']}, batch {BATCH}, lengths {min(LENGTHS)}-{max(LENGTHS)}")
        ax.set_xlabel("ms per batch (lower is better)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child: one model, its row on stdout
    p.add_argument("--only", help=argparse.SUPPRESS)  # ... one contender's first pass
    args = p.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.one:
        which = [args.only] if args.only else F32 + BF16
        print(json.dumps(measure(args.one, args.passes, which)), flush=True)
        return
    rows = []
    for name in args.models:
        row = _child(name, args.passes)
        # The first pass of each contender (its compiles), in a process of its own.
        row["first_pass_in_own_process_s"] = {}
        for c in F32 + BF16:
            first = _child(name, 0, c)
            row["first_pass_in_own_process_s"][c] = first.get("first_pass_s", {}).get(c)
            if c.startswith("ours"):
                row.setdefault("ran", {})[c] = first.get("ran", {}).get(c)
        rows.append(row)
        print(json.dumps(rows[-1])[:600], flush=True)
    ratios = {p: [r[f"ratio_{p}"] for r in rows if r.get(f"ratio_{p}")] for p in ("f32", "bf16")}
    summary = {
        f"geomean_ratio_{p}": statistics.geometric_mean(v) if v else None for p, v in ratios.items()
    }
    RESULTS.mkdir(exist_ok=True)
    write_results(RESULTS / "varying_lengths.json", {"summary": summary, "rows": rows})
    plot(rows, RESULTS / "varying_lengths.png")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
