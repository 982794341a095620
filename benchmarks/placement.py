"""Backend placement (issue 4) against every single backend on the whole model, in one run.

For each model and batch size: inference latency of eager, Inductor, OpenVINO (converted from
TorchScript, and through its own torch.compile backend) and ONNX Runtime each on the whole
model, and of ours (DP only, and DP + evolutionary search), with the search time cold (empty
profile cache) and warm (same cache). Ratios are against the best single backend measured in
the same run.

    python benchmarks/placement.py [--quick] [--models bert,gpt2] [--batches 1,8] [--full-size]

Default shapes are the zoo's small configurations (2-core CPU budget); --full-size uses the
zoo's full ones (BERT-base at seq 128, GPT-2-small, ResNet-50, ...). Prints a table; writes
benchmarks/results/placement.{json,png} (placement_full.{json,png} with --full-size).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import io
import json
import math
import os
import tempfile
import time
import warnings
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

import torch_plugin
from torch_plugin.models import build, output_tensors

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ["bert", "gpt2", "resnet50", "resnext50", "dcgan", "nasnet", "mmt"]
SAMPLES = 7


def _close(got: Any, want: Any, tol: float = 1e-3) -> bool:
    a, b = output_tensors(got), output_tensors(want)

    def near(x: torch.Tensor, y: torch.Tensor) -> bool:
        atol = tol * max(1.0, float(y.abs().max()))
        return x.shape == y.shape and torch.allclose(x.float(), y.float(), rtol=tol, atol=atol)

    return len(a) == len(b) and all(near(x, y) for x, y in zip(a, b, strict=True))


def _round_robin(fns: dict[str, Any], inputs: tuple, rounds: int = 5) -> dict[str, float]:
    """Median seconds per call of each callable, measured in turns (benchmarks/timing.py)."""
    try:
        from benchmarks.timing import medians, round_robin
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from timing import medians, round_robin

    return medians(round_robin(fns, inputs, rounds))


def _release_freed_memory() -> None:
    """Collects garbage and hands glibc's free heap pages back to the system. Without the trim,
    the freed intermediates of an export or a conversion (gigabytes at full size) stay resident
    and the next build stacks on top of them."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _inductor(model: torch.nn.Module, inputs: tuple) -> Any:
    return torch.compile(model)


def _openvino(model: torch.nn.Module, inputs: tuple) -> Any:
    import openvino as ov

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ov_model = ov.convert_model(model, example_input=inputs)
    compiled = ov.Core().compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()

    def run(*args: torch.Tensor) -> Any:
        res = request.infer([a.numpy() for a in args], share_inputs=True)
        return tuple(torch.from_numpy(res[o]) for o in compiled.outputs)

    return run


def _openvino_compile(model: torch.nn.Module, inputs: tuple) -> Any:
    """OpenVINO's own torch.compile backend: Dynamo, AOTAutograd's ATen graph and the FX
    frontend that our OpenVINO groups use, without the TorchScript conversion above."""
    import openvino.torch  # noqa: F401 - registers the "openvino" torch.compile backend

    # dynamic=False: with automatic dynamic shapes its guards fail on ResNet (torch 2.13).
    return torch.compile(
        model,
        backend="openvino",
        dynamic=False,
        options={"device": "CPU", "config": {"INFERENCE_PRECISION_HINT": "f32"}},
    )


def _onnxruntime(model: torch.nn.Module, inputs: tuple) -> Any:
    import onnxruntime as ort

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buf, dynamo=True, verbose=False)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*args: torch.Tensor) -> Any:
        feed = {n: a.numpy() for n, a in zip(names, args, strict=False)}
        return tuple(torch.from_numpy(r) for r in session.run(None, feed))

    return run


BASELINES = {
    "inductor": _inductor,
    "openvino": _openvino,
    "openvino_tc": _openvino_compile,
    "onnxruntime": _onnxruntime,
}


def run_one(
    name: str, batch: int, full: bool, backends: list[str], evals: int, budget_s: float
) -> dict[str, Any]:
    model, inputs = build(name, small=not full, batch=batch)
    model.eval()
    with torch.no_grad():
        want = model(*inputs)
    row: dict[str, Any] = {"model": name, "batch": batch}
    fns: dict[str, Any] = {"eager": model}
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "profile.db")
        # Cold: an empty profile cache, everything measured and searched. Warm: the same
        # cache. DP: the dynamic program's placement alone (warm, no evolutionary search).
        for key, evolve in (("cold", True), ("warm", True), ("dp", False)):
            torch._dynamo.reset()
            t0 = time.perf_counter()
            placed = torch_plugin.place(
                model,
                inputs,
                backends=backends,
                cache_path=db,
                samples=SAMPLES,
                evolve=evolve,
                max_evaluations=evals,
                time_budget_s=budget_s,
            )
            row[f"{key}_search_s"] = time.perf_counter() - t0
            if not _close(placed(*inputs), want):
                raise AssertionError(f"{name}: placed model ({key}) differs from eager")
            result = placed.placement
            if key == "cold":
                fns["evo"] = placed
                row["evo_backends"] = result.backend_counts()
                row["candidates"] = result.candidates
                row["measured_groups"] = result.measured
                row["phase_s"] = result.phase_s
                if result.evolution is not None:
                    row["evolution"] = {
                        "evaluations": result.evolution["evaluations"],
                        "seed_ms": result.evolution["seed_fitness"] * 1e3,
                        "best_ms": result.evolution["best_fitness"] * 1e3,
                        "rounds": [
                            (r["backend"], r["offloaded"], r["evaluations"])
                            for r in result.evolution["rounds"]
                        ],
                    }
            elif key == "dp":
                fns["dp"] = placed
                row["dp_backends"] = result.backend_counts()
    # The baselines are built after our searches and share the eager model's weights (none of
    # them writes to the module), and freed memory goes back to the system after each build:
    # with a deep copy per baseline, all alive during a search, full-size MMT at batch 8 (1.55 GB
    # of weights) ran out of 24 GiB. Every latency is measured at the end, in turns.
    del placed, result
    _release_freed_memory()
    for base, make in BASELINES.items():
        torch._dynamo.reset()
        try:
            t0 = time.perf_counter()
            fn = make(model, inputs)
            with torch.no_grad():
                got = fn(*inputs)
            row[f"{base}_compile_s"] = time.perf_counter() - t0
            if not _close(got, want):
                row[f"{base}_ms"] = None
                row[f"{base}_error"] = "wrong numerics"
                continue
            fns[base] = fn
        except Exception as e:  # noqa: BLE001 - a backend that cannot take the model is a result
            row[f"{base}_ms"] = None
            row[f"{base}_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        _release_freed_memory()
    for key, seconds in _round_robin(fns, inputs).items():
        row[f"{key}_ms"] = seconds * 1e3
    for base in BASELINES:
        row.setdefault(f"{base}_ms", None)
    singles = {b: row.get(f"{b}_ms") for b in ["eager", *BASELINES]}
    singles = {b: v for b, v in singles.items() if v is not None}
    best = min(singles, key=singles.get)
    row["best_single"] = best
    row["best_single_ms"] = singles[best]
    for key in ("dp", "evo"):
        row[f"{key}_speedup_vs_best"] = singles[best] / row[f"{key}_ms"]
    row["warm_over_cold"] = row["cold_search_s"] / row["warm_search_s"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="batch 1 only, three models")
    ap.add_argument("--models", default=None)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--full-size", action="store_true")
    ap.add_argument("--backends", default="aten,fused,openvino,onnxruntime,inductor")
    ap.add_argument("--evals", type=int, default=12, help="evaluations per evolution round")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=120.0,
        help="place()'s time_budget_s: the whole search (whole graphs, measuring, evolution)",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the saved rows of the models and batches this run does not measure",
    )
    args = ap.parse_args()
    models = args.models.split(",") if args.models else MODELS
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        models = args.models.split(",") if args.models else ["bert", "resnet50", "mmt"]
        batches = [1]
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    backends = args.backends.split(",")
    previous = _previous_rows(args) if args.merge else []
    commit = _commit()
    rows: list[dict[str, Any]] = []
    for name in models:
        for batch in batches:
            print(f"== {name} batch {batch}", flush=True)
            try:
                rows.append(
                    run_one(name, batch, args.full_size, backends, args.evals, args.budget_s)
                )
            except Exception as e:  # noqa: BLE001 - report and go on with the next model
                rows.append({"model": name, "batch": batch, "error": f"{type(e).__name__}: {e}"})
            rows[-1]["commit"] = commit
            print(json.dumps(rows[-1], default=str), flush=True)
            # Partial results survive a kill.
            _report(_merged(previous, rows), args, backends, final=False)
    _report(_merged(previous, rows), args, backends)


def _previous_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    # Everything saved: _merged drops what this run measures again.
    return kept_rows(RESULTS / f"{_stem(args)}.json", set())


def _merged(previous: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This run's rows, and the saved ones for other (model, batch) pairs, in zoo order."""
    measured = {(r["model"], r["batch"]) for r in rows}
    kept = [r for r in previous if (r["model"], r["batch"]) not in measured]

    def order(r: dict[str, Any]) -> tuple[int, int]:
        name = r["model"]
        return (MODELS.index(name) if name in MODELS else len(MODELS), r["batch"])

    return sorted(kept + rows, key=order)


def _stem(args: argparse.Namespace) -> str:
    """Full-size runs keep their own files: the small-shape table stays next to them."""
    return "placement_full" if args.full_size else "placement"


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def _report(
    rows: list[dict[str, Any]], args: argparse.Namespace, backends: list[str], final: bool = True
) -> None:
    header = (
        f"{'model':<10} {'b':>2} {'eager':>8} {'inductor':>8} {'openvino':>8} {'ov-tc':>8} "
        f"{'ort':>8} "
        f"{'DP':>8} {'DP+evo':>8} {'best':>10} {'x best':>6} {'cold s':>7} {'warm s':>7}"
    )
    ok = [r for r in rows if "error" not in r]
    if not final:
        _save(rows, ok, args, backends)
        return
    print(header)
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<10} {r['batch']:>2} error: {r['error'][:90]}")
            continue
        print(
            f"{r['model']:<10} {r['batch']:>2} {_fmt(r['eager_ms']):>8} "
            f"{_fmt(r.get('inductor_ms')):>8} {_fmt(r.get('openvino_ms')):>8} "
            f"{_fmt(r.get('openvino_tc_ms')):>8} "
            f"{_fmt(r.get('onnxruntime_ms')):>8} {_fmt(r['dp_ms']):>8} {_fmt(r['evo_ms']):>8} "
            f"{r['best_single']:>10} {r['evo_speedup_vs_best']:>6.2f} "
            f"{r['cold_search_s']:>7.1f} {r['warm_search_s']:>7.1f}"
        )
    geo, warm = _geomeans(ok)
    print(
        f"geomean speedup over the best single backend: {geo:.3f}x; "
        f"cold/warm search time geomean {warm:.1f}x (latencies in ms)"
    )
    _save(rows, ok, args, backends)


def _geomeans(ok: list[dict[str, Any]]) -> tuple[float, float]:
    if not ok:
        return 0.0, 0.0
    geo = math.exp(sum(math.log(r["evo_speedup_vs_best"]) for r in ok) / len(ok))
    warm = math.exp(sum(math.log(r["warm_over_cold"]) for r in ok) / len(ok))
    return geo, warm


def _save(
    rows: list[dict[str, Any]],
    ok: list[dict[str, Any]],
    args: argparse.Namespace,
    backends: list[str],
) -> None:
    geo, warm = _geomeans(ok)
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "args": vars(args),
        "backends": backends,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "geomean_speedup_vs_best_single": geo,
        "geomean_cold_over_warm": warm,
    }
    write_results(RESULTS / f"{_stem(args)}.json", payload, default=str)
    _plot(ok, _stem(args))


def _plot(rows: list[dict[str, Any]], stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    labels = [f"{r['model']}\nb{r['batch']}" for r in rows]
    series = ["inductor", "openvino", "openvino_tc", "onnxruntime", "dp", "evo"]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(rows)), 4))
    width = 0.8 / len(series)
    for k, s in enumerate(series):
        vals = [(r["eager_ms"] / r[f"{s}_ms"]) if r.get(f"{s}_ms") else 0.0 for r in rows]
        ax.bar(
            [i + k * width for i in range(len(rows))],
            vals,
            width,
            label={
                "dp": "ours (DP)",
                "evo": "ours (DP+evo)",
                "openvino_tc": "openvino (torch.compile)",
            }.get(s, s),
        )
    ax.axhline(1.0, color="black", lw=0.7)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels)
    ax.set_ylabel("speedup over eager")
    ax.set_title("Backend placement: whole-model backends vs ours (CPU inference)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
