"""Search time of the pipeline partitioner: GraphPipe (GPP) vs the sequential baseline (SPP).

Thesis settings (Table 3.1 / §3.10.3): MMT, DLRM and CANDLE-Uno at their published shapes
(built on the `meta` device, costed by running each node on meta tensors), 4 / 8 / 16 / 32
devices with the thesis's mini-batch sizes, every power-of-two micro-batch size. Both searches
run here, in the same process; the thesis's figures (Apple M1 Max) are printed beside them.
Our SPP baseline is the same DP run over the topological order as one chain with one
micro-batch size (PipeDream's search space), not PipeDream's own code.

    python benchmarks/graphpipe_search.py [--devices 4,8,16,32] [--models mmt,dlrm,candle_uno]

Writes benchmarks/results/graphpipe_search.{json,png}.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from torch_plugin import models
from torch_plugin.distributed import cost_records, plan_pipeline

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MINI_BATCH = {  # thesis §3.10.3
    "mmt": {4: 64, 8: 128, 16: 256, 32: 512},
    "dlrm": {4: 256, 8: 512, 16: 1024, 32: 2048},
    "candle_uno": {4: 4096, 8: 8192, 16: 16384, 32: 32768},
}
# Table 3.1: seconds for (Piper, PipeDream, GraphPipe); None = could not complete.
THESIS = {
    "mmt": {
        4: (52.9, 2.57, 0.12),
        8: (126, 11.9, 0.76),
        16: (304, 44.3, 3.00),
        32: (745, 151, 10.11),
    },
    "dlrm": {
        4: (None, 6.39, 0.33),
        8: (None, 31.3, 2.73),
        16: (None, 131, 13.28),
        32: (None, 505, 54.6),
    },
    "candle_uno": {
        4: (None, 3.84, 0.19),
        8: (None, 17.0, 1.43),
        16: (None, 66.10, 6.14),
        32: (None, 234, 22.37),
    },
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mmt,dlrm,candle_uno")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--profile", default="v100", help="device profile (the thesis ran V100s)")
    ap.add_argument("--spp-time-limit", type=float, default=120.0)
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        for devices in [int(d) for d in args.devices.split(",")]:
            batch = MINI_BATCH[name][devices]
            t0 = time.perf_counter()
            with torch.device("meta"):
                model, inputs = models.build(name, batch=batch)
            traced = cost_records(model, inputs)
            trace_s = time.perf_counter() - t0
            row = {"model": name, "devices": devices, "mini_batch": batch, "trace_s": trace_s}
            for strategy in ("gpp", "spp"):
                t0 = time.perf_counter()
                plan, _ = plan_pipeline(
                    traced,
                    num_devices=devices,
                    strategy=strategy,
                    device=args.profile,
                    scope_depth=3,
                    time_limit_s=args.spp_time_limit if strategy == "spp" else 0.0,
                )
                wall = time.perf_counter() - t0
                row[strategy] = {
                    "search_s": wall,
                    "cpp_search_s": plan.raw.stats.search_seconds,
                    "timed_out": plan.raw.stats.timed_out,
                    "blocks": plan.raw.stats.blocks,
                    "dp_states": plan.raw.stats.dp_states,
                    "stages": plan.num_stages,
                    "depth": plan.raw.depth,
                    "bottleneck_tps": plan.raw.bottleneck_tps,
                    "sim_throughput": plan.raw.sim.throughput,
                }
            piper, pipedream, graphpipe = THESIS[name][devices]
            row["thesis"] = {"piper": piper, "pipedream": pipedream, "graphpipe": graphpipe}
            rows.append(row)
            print(
                f"{name:10s} {devices:3d} dev  B={batch:6d}"
                f"  ours GPP {row['gpp']['search_s']:8.3f} s"
                f"  ours SPP {row['spp']['search_s']:8.3f} s  | thesis GraphPipe {graphpipe:6.2f} s"
                f"  PipeDream {pipedream:6.2f} s  Piper {piper if piper else 'X'}",
                flush=True,
            )
    print()
    hdr = (
        f"{'model':10s} {'dev':>4s} {'blocks':>6s} {'GPP s':>9s} {'thesis GP':>9s} {'ratio':>7s}"
        f" {'SPP s':>9s} {'thesis PD':>9s} {'GPP depth':>9s} {'SPP depth':>9s}"
    )
    print(hdr)
    for r in rows:
        g, s, t = r["gpp"], r["spp"], r["thesis"]
        print(
            f"{r['model']:10s} {r['devices']:4d} {g['blocks']:6d} {g['search_s']:9.3f}"
            f" {t['graphpipe']:9.2f} {g['search_s'] / t['graphpipe']:7.3f} {s['search_s']:9.3f}"
            f" {t['pipedream']:9.2f} {g['depth']:9d} {s['depth']:9d}"
            + ("  (SPP hit its time limit)" if s["timed_out"] else "")
        )
    os.makedirs(RESULTS, exist_ok=True)
    meta = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "profile": args.profile,
    }
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(os.path.join(RESULTS, "graphpipe_search.json"), {"meta": meta, "rows": rows})
    _plot(rows)


def _plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["model"] for r in rows}, key=[r["model"] for r in rows].index)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        rs = [r for r in rows if r["model"] == name]
        dev = [r["devices"] for r in rs]
        ax.plot(dev, [r["gpp"]["search_s"] for r in rs], "o-", label="ours GPP")
        ax.plot(dev, [r["spp"]["search_s"] for r in rs], "s-", label="ours SPP")
        ax.plot(dev, [r["thesis"]["graphpipe"] for r in rs], "o--", label="thesis GraphPipe")
        ax.plot(dev, [r["thesis"]["pipedream"] for r in rs], "s--", label="thesis PipeDream")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel("search time (s)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "graphpipe_search.png"), dpi=110)


if __name__ == "__main__":
    main()
