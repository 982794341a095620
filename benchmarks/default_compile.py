"""The default `torch.compile(model, backend="torch_plugin")` against what a user would otherwise
pick, CPU inference (issue 27).

For each model and batch size, in one process per model (fresh Inductor and profile caches):
  - ours, cold: the first compile with empty caches (Dynamo to first output);
  - Inductor, cold: `torch.compile(model)` in a process of its own with an empty cache
    directory (compiled after ours in one process, it found ours' kernels in memory: 3.8 s
    instead of 22 s on the ViT);
  - ours, warm: compiled again in the same process after `torch._dynamo.reset()`, with the
    profile cache and Inductor's FX graph cache now filled;
  - OpenVINO (`ov.convert_model`) and ONNX Runtime (`torch.onnx.export(dynamo=True)`) on the
    whole model;
  - latency of eager, Inductor, OpenVINO, ONNX Runtime and ours, measured in turns.
Ours must match eager within 1e-4 relative. Each row names what ran (our pick per graph).

    python benchmarks/default_compile.py [--models llama vit ...] [--batches 1 8] [--merge]

HF models are the suite's architectures at width 4 (hidden 256, heads of 64, 2 layers, 64
tokens; images 32x32); the zoo's CNNs at their small size. Prints a table; writes
benchmarks/results/default_compile.{json,png}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# One way to name the measured commit (TP_COMMIT wins on a lent GPU machine).
try:
    from benchmarks.provenance import commit as _commit
    from benchmarks.provenance import kept_rows, write_results
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from provenance import commit as _commit
    from provenance import kept_rows, write_results

from torch_plugin.models import output_tensors

RESULTS = Path(__file__).resolve().parent / "results"
HF_MODELS = [
    "llama",
    "qwen2",
    "mistral",
    "gpt2",
    "phi3",
    "bert",
    "roberta",
    "electra",
    "distilbert",
    "t5",
    "bart",
    "vit",
    "deit",
    "swin",
    "convnext",
    "resnet",
]
ZOO_CNNS = ["resnet50", "resnext50", "dcgan"]
WIDTH = 4
SEQ = 64
TIMEOUT_S = 900


class Positional(torch.nn.Module):
    """The model called with positional tensors, returning its output tensors as a tuple: the
    form the whole-model exporters (OpenVINO, ONNX) take."""

    def __init__(self, model: torch.nn.Module, keys: list[str], consts: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.keys, self.consts = model, keys, consts

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not self.keys:  # a zoo model: positional already
            return tuple(output_tensors(self.model(*args)))
        out = self.model(**dict(zip(self.keys, args, strict=True)), **self.consts)
        return tuple(output_tensors(out))


def _model(name: str, batch: int) -> tuple[torch.nn.Module, list[str], tuple, dict[str, Any]]:
    """(model in eval mode, keyword names, positional tensors, non-tensor keywords)."""
    if name in ZOO_CNNS:
        from torch_plugin.models import build

        model, inputs = build(name, small=True, batch=batch)
        return model.eval(), [], tuple(inputs), {}
    from torch_plugin.models import hf_suite

    model = hf_suite.build_model(name, width=WIDTH).eval()
    kw = hf_suite.make_inputs(name, batch=batch, seq=SEQ, pad=0)
    if hf_suite.ARCHS[name].kind not in ("seq2seq", "speech"):
        kw.pop("labels", None)  # inference: logits (seq2seq models take their decoder from labels)
    tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
    consts = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
    return model, list(tensors), tuple(tensors.values()), consts


def _round_robin(fns: dict[str, Any], args: tuple, rounds: int = 5) -> dict[str, float]:
    """Median seconds per call of each callable, in turns (benchmarks/timing.py), with a 0.1 s
    pause before each block: another runtime's pool spins on for a while after its last run
    (ONNX Runtime's by default) and took a core from whatever ran next (ours, measured right
    after the ONNX Runtime baseline, ran 40% slower)."""
    try:
        from benchmarks.timing import medians, round_robin
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from timing import medians, round_robin

    return medians(round_robin(fns, args, rounds, pause_s=0.1))


def _call_overhead_us(compiled: Any, args: tuple, calls: int = 300) -> float:
    """What a call through torch.compile costs beyond the placed graph it runs (Dynamo's guards,
    AOTAutograd's wrapper, our weight guard): the two called alternately, call by call, so
    drift and other runtimes' threads fall on both alike; the median difference, in us."""
    from torch_plugin.backend import recording_calls

    with torch.no_grad(), recording_calls() as recorded:
        compiled(*args)
    if len(recorded) != 1:
        return float("nan")
    graph_fn, flat, _ = recorded[0]
    diffs = []
    with torch.no_grad():
        for _ in range(calls):
            t0 = time.perf_counter()
            compiled(*args)
            t1 = time.perf_counter()
            graph_fn(list(flat))
            t2 = time.perf_counter()
            diffs.append((t1 - t0) - (t2 - t1))
    return statistics.median(diffs) * 1e6


def _max_rel_err(got: Any, want: Any) -> float:
    a, b = output_tensors(got), output_tensors(want)
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return math.inf
        worst = max(worst, float((x - y).abs().max()) / max(1.0, float(y.abs().max())))
    return worst


def inductor_cold(name: str, batches: list[int]) -> None:
    """Inductor's first compile of each batch size, in this fresh process."""
    for batch in batches:
        torch.manual_seed(0)
        model, keys, args, consts = _model(name, batch)
        wrapped = Positional(model, keys, consts)
        torch._dynamo.reset()
        compiled = torch.compile(wrapped)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        row = {"model": name, "batch": batch, "inductor_cold_s": time.perf_counter() - t0}
        print(json.dumps(row), flush=True)


def run_model(name: str, batches: list[int]) -> list[dict[str, Any]]:
    """One model, every batch size, in this process."""
    import benchmarks.placement as bp
    import torch_plugin  # noqa: F401 - registers the backend
    from torch_plugin.backend import collect_stats

    rows = []
    for batch in batches:
        torch.manual_seed(0)
        model, keys, args, consts = _model(name, batch)
        wrapped = Positional(model, keys, consts)
        with torch.no_grad():
            want = wrapped(*args)
        row: dict[str, Any] = {"model": name, "batch": batch, "errors": {}}

        def timed_compile(fn: Any, args: tuple = args) -> tuple[Any, float]:
            t0 = time.perf_counter()
            with torch.no_grad():
                out = fn(*args)
            return out, time.perf_counter() - t0

        # Ours, cold (the process's caches are empty: see main()).
        torch._dynamo.reset()
        ours = torch.compile(wrapped, backend="torch_plugin")
        with collect_stats() as stats:
            got, row["ours_cold_s"] = timed_compile(ours)
        row["ran"] = [r.get("summary", f"{r['kind']}: not placed") for r in stats]
        row["ours_max_rel_err"] = _max_rel_err(got, want)

        # Ours, warm: the decision cached, Inductor's FX graph cache filled.
        torch._dynamo.reset()
        ours_warm = torch.compile(wrapped, backend="torch_plugin")
        got_warm, row["ours_warm_s"] = timed_compile(ours_warm)
        row["ours_warm_max_rel_err"] = _max_rel_err(got_warm, want)

        # Inductor for its latency (its cold compile is timed in a process of its own).
        torch._dynamo.reset()
        inductor = torch.compile(wrapped)
        with torch.no_grad():
            inductor(*args)
        fns: dict[str, Any] = {"eager": wrapped, "inductor": inductor}
        for key in ("openvino", "onnxruntime"):
            t0 = time.perf_counter()
            try:
                fn = bp.BASELINES[key](wrapped, args)
                with torch.no_grad():
                    err = _max_rel_err(fn(*args), want)
                if err > 1e-3:
                    raise RuntimeError(f"outputs differ from eager by {err:.1e}")
                fns[key] = fn
                row[f"{key}_compile_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - a baseline that cannot take the model
                row["errors"][key] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        fns["ours"] = ours_warm
        row["call_overhead_us"] = _call_overhead_us(ours_warm, args)
        times = _round_robin(fns, args)
        for key, seconds in times.items():
            row[f"{key}_ms"] = seconds * 1e3
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _derive(row: dict[str, Any]) -> dict[str, Any]:
    best_ei = min(row["eager_ms"], row["inductor_ms"])
    row["vs_inductor"] = row["inductor_ms"] / row["ours_ms"]
    row["vs_best_eager_inductor"] = best_ei / row["ours_ms"]
    row["cold_vs_inductor"] = row["ours_cold_s"] / row["inductor_cold_s"]
    row["warm_vs_inductor_cold"] = row["ours_warm_s"] / row["inductor_cold_s"]
    return row


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "ours_ms" in r]
    return {
        "rows": len(ok),
        "models": len({r["model"] for r in ok}),
        "geomean_vs_inductor": _geomean([r["vs_inductor"] for r in ok]),
        "min_vs_best_eager_inductor": min((r["vs_best_eager_inductor"] for r in ok), default=0),
        "rows_at_least_best_eager_inductor": sum(r["vs_best_eager_inductor"] >= 1.0 for r in ok),
        "geomean_cold_vs_inductor": _geomean([r["cold_vs_inductor"] for r in ok]),
        "geomean_warm_vs_inductor_cold": _geomean([r["warm_vs_inductor_cold"] for r in ok]),
        "max_rel_err": max((r["ours_max_rel_err"] for r in ok), default=0.0),
    } | (
        {"median_call_overhead_us": statistics.median(overheads)}
        if (overheads := [r["call_overhead_us"] for r in ok if "call_overhead_us" in r])
        else {}
    )


def _pick(row: dict[str, Any]) -> str:
    picks = []
    for line in row.get("ran", []):
        kind, _, rest = line.partition(" graph")
        what = rest.split(": ", 1)[1].split(" (", 1)[0] if ": " in rest else "not placed"
        picks.append(what if kind == "inference" else f"{kind}:{what}")
    return ", ".join(picks) or "-"


def report(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    head = (
        f"{'model':<11}{'b':>3}{'eager':>9}{'induct':>9}{'OV':>9}{'ORT':>9}{'ours':>9}"
        f"{'x ind':>7}{'x best':>7}{'cold s':>8}{'ind s':>7}{'warm s':>7}  ran"
    )
    lines = [head]

    def ms(r: dict[str, Any], k: str) -> str:
        return f"{r[k]:>9.3f}" if k in r else f"{'fail':>9}"

    for r in rows:
        lines.append(
            f"{r['model']:<11}{r['batch']:>3}{ms(r, 'eager_ms')}{ms(r, 'inductor_ms')}"
            f"{ms(r, 'openvino_ms')}{ms(r, 'onnxruntime_ms')}{ms(r, 'ours_ms')}"
            f"{r['vs_inductor']:>7.2f}{r['vs_best_eager_inductor']:>7.2f}"
            f"{r['ours_cold_s']:>8.1f}{r['inductor_cold_s']:>7.1f}{r['ours_warm_s']:>7.1f}  "
            f"{_pick(r)}"
        )
    s = summary
    lines.append(
        f"{s['rows']} rows, {s['models']} models: ours vs Inductor geomean "
        f"{s['geomean_vs_inductor']:.2f}x; vs the best of eager and Inductor min "
        f"{s['min_vs_best_eager_inductor']:.2f}x ({s['rows_at_least_best_eager_inductor']}/"
        f"{s['rows']} rows >= 1.0); cold compile {s['geomean_cold_vs_inductor']:.2f}x "
        f"Inductor's, warm {s['geomean_warm_vs_inductor_cold']:.2f}x (geomeans); max error vs "
        f"eager {s['max_rel_err']:.1e}"
        + (
            f"; a call through torch.compile costs {s['median_call_overhead_us']:.0f} us more "
            "than the placed graph (median)"
            if "median_call_overhead_us" in s
            else ""
        )
    )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(14, 8))
    labels = [f"{r['model']}/{r['batch']}" for r in rows]
    x = range(len(rows))
    for k, (key, name) in enumerate(
        [
            ("eager_ms", "eager"),
            ("openvino_ms", "OpenVINO"),
            ("onnxruntime_ms", "ONNX Runtime"),
            ("ours_ms", "ours (default)"),
        ]
    ):
        ys = [r["inductor_ms"] / r[key] if key in r else 0.0 for r in rows]
        ax1.bar([i + (k - 1.5) * 0.2 for i in x], ys, width=0.2, label=name)
    ax1.axhline(1.0, color="black", lw=0.8)
    ax1.set_ylabel("speed vs Inductor (x)")
    ax1.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax1.legend(fontsize=8)
    ax1.set_title("CPU inference: torch.compile(backend='torch_plugin') with no options")
    ax2.bar([i - 0.2 for i in x], [r["cold_vs_inductor"] for r in rows], width=0.4, label="cold")
    ax2.bar(
        [i + 0.2 for i in x], [r["warm_vs_inductor_cold"] for r in rows], width=0.4, label="warm"
    )
    ax2.axhline(3.0, color="red", lw=0.8, ls="--")
    ax2.axhline(0.3, color="green", lw=0.8, ls="--")
    ax2.set_ylabel("compile time / Inductor's cold")
    ax2.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _child(root: Path, name: str, batches: list[int], extra: list[str]) -> list[dict[str, Any]]:
    """Runs this script on one model in a fresh process with empty caches of its own."""
    with tempfile.TemporaryDirectory(prefix="default_compile_") as tmp:
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
            TORCH_PLUGIN_PROFILE_DB=os.path.join(tmp, "profile.db"),
            PYTHONPATH=str(root),
        )
        cmd = [sys.executable, __file__, "--one", name, *extra, "--batches"]
        try:
            proc = subprocess.run(
                cmd + [str(b) for b in batches],
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                cwd=root,
            )
        except subprocess.TimeoutExpired:
            print(f"{name}{extra}: timed out after {TIMEOUT_S} s", flush=True)
            return []
        got = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 and len(got) < len(batches):
            print(f"{name}{extra}: failed\n{proc.stderr[-1500:]}", flush=True)
        return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=HF_MODELS + ZOO_CNNS)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--merge", action="store_true", help="keep other models' rows in the JSON")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one model
    ap.add_argument("--inductor-cold", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        torch.set_num_threads(os.cpu_count() or 1)
        if args.inductor_cold:
            inductor_cold(args.one, args.batches)
        else:
            run_model(args.one, args.batches)
        return
    out = RESULTS / "default_compile.json"
    rows: list[dict[str, Any]] = []
    if args.merge:
        rows = kept_rows(out, {(m,) for m in args.models}, key=("model",))
    root = Path(__file__).resolve().parent.parent
    here = _commit()
    for name in args.models:
        t0 = time.perf_counter()
        cold = {r["batch"]: r for r in _child(root, name, args.batches, ["--inductor-cold"])}
        for r in _child(root, name, args.batches, []):
            if r["batch"] in cold:
                r["inductor_cold_s"] = cold[r["batch"]]["inductor_cold_s"]
                r["commit"] = here
                rows.append(_derive(r))
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
        _save(rows, out)  # after each model: a run that is stopped keeps what it measured
    print(report(*_save(rows, out)))


def _save(rows: list[dict[str, Any]], out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    order = {m: i for i, m in enumerate(HF_MODELS + ZOO_CNNS)}
    rows.sort(key=lambda r: (order.get(r["model"], 99), r["batch"]))
    summary = summarize(rows)
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "benchmark": "default_compile",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
        "summary": summary,
        "rows": rows,
    }
    write_results(out, payload)
    if rows:
        plot(rows, RESULTS / "default_compile.png")
    return rows, summary


if __name__ == "__main__":
    main()
