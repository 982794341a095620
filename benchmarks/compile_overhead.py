"""Compile overhead and run time of the identity round trip, per zoo model.

For each model (published shapes, small batch, inference) this measures in one run:
  - Dynamo + AOTAutograd capture time (first call under `aot_eager`, minus one eager call),
  - our added work per compiled graph: FX -> C++ export, C++ verify, C++ -> FX import,
  - run time of the round-tripped module and of aot_eager relative to eager (median of k,
    interleaved so machine drift hits all three alike).
Prints a table, writes benchmarks/results/compile_overhead.{json,png}.

    python benchmarks/compile_overhead.py [--models gpt2,bert] [--reps 7] [--small]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time

import torch
import torch._dynamo

import torch_plugin
from torch_plugin.backend import collect_stats

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# Batch per model: the published shapes with a batch small enough for a 2-core CPU.
BATCH = {
    "mlp": 32,
    "resnet50": 2,
    "resnext50": 2,
    "dcgan": 4,
    "nasnet": 1,
    "bert": 1,
    "gpt2": 1,
    "gpt": 1,
    "llama": 1,
    "mmt": 1,
    "dlrm": 4,
    "candle_uno": 8,
}


def first_call_s(fn, inputs) -> float:
    t = time.perf_counter()
    fn(*inputs)
    return time.perf_counter() - t


def measure(name: str, small: bool, reps: int) -> dict:
    if name not in BATCH:
        raise SystemExit(f"compile_overhead: no batch for zoo model {name!r}; add it to BATCH")
    model, inputs = torch_plugin.models.build(name, small=small, batch=BATCH[name])
    model.eval()
    gc.collect()
    with torch.no_grad():
        eager_first = first_call_s(model, inputs)
        eager_once = min(first_call_s(model, inputs) for _ in range(2))
        torch._dynamo.reset()
        # Inference does not mutate the model, so all three share it (a copy of a 1B model
        # would not fit twice more on this machine); Dynamo guards each entry on its backend.
        aot = torch.compile(model, backend="aot_eager")
        aot_first = first_call_s(aot, inputs)
        ours = torch.compile(model, backend="torch_plugin", options={"passes": []})
        with collect_stats() as stats:
            ours_first = first_call_s(ours, inputs)
        exact = torch.equal(ours(*inputs), model(*inputs))
        runs: dict[str, list[float]] = {"eager": [], "aot_eager": [], "torch_plugin": []}
        order = [("eager", model), ("aot_eager", aot), ("torch_plugin", ours)]
        for rep in range(reps):
            # Rotate who runs first so cache and frequency effects hit all three alike.
            for key, fn in order[rep % 3 :] + order[: rep % 3]:
                runs[key].append(first_call_s(fn, inputs))
    med = {k: statistics.median(v) for k, v in runs.items()}
    bridge_ms = sum(
        r.get("export_ms", 0) + r.get("pipeline_ms", 0) + r.get("import_ms", 0) for r in stats
    )
    return {
        "model": name,
        "batch": BATCH[name],
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "graphs": len(stats),
        "fx_nodes": sum(r["nodes"] for r in stats),
        "fallbacks": sum(1 for r in stats if r["fallback"]),
        "capture_s": max(aot_first - eager_once, 0.0),
        "export_ms": sum(r.get("export_ms", 0) for r in stats),
        "verify_ms": sum(r.get("verify_ms", 0) for r in stats),
        "import_ms": sum(r.get("import_ms", 0) for r in stats),
        "bridge_ms": bridge_ms,
        "bridge_over_capture": bridge_ms / 1e3 / max(aot_first - eager_once, 1e-9),
        "first_call_ours_s": ours_first,
        "eager_ms": med["eager"] * 1e3,
        "ratio_ours_eager": med["torch_plugin"] / med["eager"],
        "ratio_aot_eager": med["aot_eager"] / med["eager"],
        "ratio_ours_aot": med["torch_plugin"] / med["aot_eager"],
        "bit_exact_vs_eager": exact,
        "eager_first_s": eager_first,
    }


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in rows]
    x = range(len(rows))
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    a.bar(
        [i - 0.2 for i in x], [r["capture_s"] * 1e3 for r in rows], 0.4, label="Dynamo+AOT capture"
    )
    a.bar(
        [i + 0.2 for i in x], [r["bridge_ms"] for r in rows], 0.4, label="our export+verify+import"
    )
    a.set_yscale("log")
    a.set_ylabel("ms")
    a.set_title("Compile time per model")
    a.set_xticks(list(x), names, rotation=45, ha="right")
    a.legend()
    b.bar(
        [i - 0.2 for i in x],
        [r["ratio_ours_eager"] for r in rows],
        0.4,
        label="torch_plugin / eager",
    )
    b.bar(
        [i + 0.2 for i in x], [r["ratio_aot_eager"] for r in rows], 0.4, label="aot_eager / eager"
    )
    b.axhline(1.0, color="k", lw=0.8)
    b.axhspan(0.97, 1.03, color="g", alpha=0.1)
    b.set_ylim(0.8, 1.2)
    b.set_title("Run time relative to eager (median)")
    b.set_xticks(list(x), names, rotation=45, ha="right")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(torch_plugin.models.names()))
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--small", action="store_true", help="test-size models (fast smoke run)")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args()
    torch.set_num_threads(2)
    rows = []
    header = (
        f"{'model':11s} {'params':>8s} {'graphs':>6s} {'nodes':>6s} {'capture':>9s} "
        f"{'export':>8s} {'verify':>7s} {'import':>8s} {'bridge/cap':>10s} {'eager':>9s} "
        f"{'ours/eag':>8s} {'aot/eag':>8s} {'ours/aot':>8s} exact"
    )
    print(header)
    for name in args.models.split(","):
        r = measure(name, args.small, args.reps)
        rows.append(r)
        print(
            f"{r['model']:11s} {r['params_m']:7.1f}M {r['graphs']:6d} {r['fx_nodes']:6d} "
            f"{r['capture_s']:8.2f}s {r['export_ms']:6.1f}ms {r['verify_ms']:5.2f}ms "
            f"{r['import_ms']:6.1f}ms {r['bridge_over_capture']:10.3f} {r['eager_ms']:7.1f}ms "
            f"{r['ratio_ours_eager']:8.3f} {r['ratio_aot_eager']:8.3f} {r['ratio_ours_aot']:8.3f} "
            f"{r['bit_exact_vs_eager']}",
            flush=True,
        )
    os.makedirs(args.out, exist_ok=True)
    meta = {
        "torch": torch.__version__,
        "host": platform.node(),
        "cpu_threads": 2,
        "reps": args.reps,
        "small": args.small,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    suffix = "_small" if args.small else ""
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(
        os.path.join(args.out, f"compile_overhead{suffix}.json"), {"meta": meta, "rows": rows}
    )
    plot(rows, os.path.join(args.out, f"compile_overhead{suffix}.png"))
    print(f"wrote {args.out}/compile_overhead{suffix}.json and .png")


if __name__ == "__main__":
    main()
