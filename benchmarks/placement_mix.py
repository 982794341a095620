"""Does a program that mixes two graph compilers beat the better one on the whole graph?

The profile behind issue 4's missed geomean target: on this CPU the search's picks are whole
graphs of one compiler. For each model this cuts the placement pass's ATen graph at K-1 points
of its topological order and measures, end to end and in turns with both whole graphs:

  OV|ORT   OpenVINO runs the nodes before the cut, ONNX Runtime those after;
  ORT|OV   the other way round;
  ORT*|OV  as ORT|OV, but ONNX Runtime's pool left spinning after its run (what regions did
           before a1046e9): the cost of a switch when the runtime before it keeps a core.

Splitting where each compiler is faster would show as a split below both whole graphs.

    python benchmarks/placement_mix.py [--models resnet50,bert] [--cuts 8] [--small]

Prints a table; writes benchmarks/results/placement_mix.{json,png}.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import operator
import os
import statistics
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

import torch_plugin
from torch_plugin.models import build
from torch_plugin.placement import planner, whole_graph
from torch_plugin.placement.backends import get_backends

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLES = 7
TURNS = 3


@contextlib.contextmanager
def _captured() -> Iterator[dict[str, Any]]:
    """The ATen graph, inputs and input kinds the placement pass receives (an inference graph
    goes to the whole-graph-first driver, which calls the finer search itself)."""
    seen: dict[str, Any] = {}
    first = whole_graph.place_whole_graph_first

    def spy(gm, example_inputs, opts, input_kinds=None, **kw):  # noqa: ANN001, ANN003, ANN202
        # A copy of the graph: the driver freezes the weights into the one it is given.
        seen.setdefault("gm", fx.GraphModule(gm, copy.deepcopy(gm.graph)))
        seen.setdefault("inputs", list(example_inputs))
        seen.setdefault("kinds", input_kinds)
        return first(gm, example_inputs, opts, input_kinds, **kw)

    whole_graph.place_whole_graph_first = spy
    try:
        yield seen
    finally:
        whole_graph.place_whole_graph_first = first


class _Splitter:
    """Compiles contiguous stretches of one graph on a backend and places them together."""

    def __init__(self, model: torch.nn.Module, inputs: tuple) -> None:
        with _captured() as seen, tempfile.TemporaryDirectory() as tmp:
            torch_plugin.place(
                model,
                inputs,
                backends=["aten"],
                cache_path=os.path.join(tmp, "p.db"),
                evolve=False,
                samples=3,
            )
        self.gm: fx.GraphModule = seen["gm"]
        self.inputs: list[Any] = seen["inputs"]
        recorder = planner._Recorder(self.gm)
        with torch.no_grad():
            recorder.run(*self.inputs)
        self.values = recorder.values
        self.frozen = planner.frozen_inputs(self.gm, self.inputs, seen["kinds"])
        self.nodes = [
            n.name
            for n in self.gm.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem
        ]
        self.backends = {b.name: b for b in get_backends(["openvino", "onnxruntime"])}
        missing = {"openvino", "onnxruntime"} - set(self.backends)
        if missing:
            raise SystemExit(f"placement_mix needs {', '.join(sorted(missing))} installed")

    def region(self, backend: str, lo: int, hi: int, rule: str) -> tuple[planner.Group, Any]:
        # The planner's own region compile: what the search would build for these nodes.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return planner.compile_region(
                self.gm, self.nodes[lo:hi], self.backends[backend], self.values, self.frozen, rule
            )

    def placed(self, parts: list[tuple[str, int, int, str]]) -> fx.GraphModule:
        built = [self.region(*p) for p in parts]
        return planner.materialize(self.gm, [g for g, _ in built], [f for _, f in built])


def _measure_in_turns(mods: dict[str, fx.GraphModule], inputs: list[Any]) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in mods}
    with torch.no_grad():
        for _ in range(TURNS):
            for k, m in mods.items():
                times[k].append(planner.time_end_to_end(m, inputs, SAMPLES))
    return {k: statistics.median(t) * 1e3 for k, t in times.items()}


def run_model(name: str, small: bool, cuts: int) -> dict[str, Any]:
    model, inputs = build(name, small=small, batch=1)
    model.eval()
    s = _Splitter(model, inputs)
    n = len(s.nodes)
    whole = {
        "OV": s.placed([("openvino", 0, n, "graph")]),
        "ORT": s.placed([("onnxruntime", 0, n, "graph")]),
    }
    row: dict[str, Any] = {"model": name, "nodes": n, "splits": []}
    for k in range(1, cuts):
        c = round(n * k / cuts)
        mods = dict(whole)
        mods["OV|ORT"] = s.placed([("openvino", 0, c, "graph"), ("onnxruntime", c, n, "region")])
        mods["ORT|OV"] = s.placed([("onnxruntime", 0, c, "region"), ("openvino", c, n, "graph")])
        # "graph": ONNX Runtime's pool keeps spinning after its run.
        mods["ORT*|OV"] = s.placed([("onnxruntime", 0, c, "graph"), ("openvino", c, n, "graph")])
        with torch.no_grad():
            for key, m in list(mods.items()):
                if not planner._outputs_match(m, s.gm, s.inputs, 1e-3):
                    print(f"{name} cut {c}: {key} differs from eager; left out")
                    del mods[key]
        ms = _measure_in_turns(mods, s.inputs)
        best_whole = min(ms.get("OV", float("inf")), ms.get("ORT", float("inf")))
        split = {"cut": c, "fraction": c / n, "best_whole_ms": best_whole}
        for key, v in ms.items():
            split[f"{key}_ms"] = v
        row["splits"].append(split)
        print(
            f"{name:<9} cut {c:>4}/{n}  whole OV {ms.get('OV', 0):7.2f}"
            f"  ORT {ms.get('ORT', 0):7.2f}"
            f"  | OV|ORT {ms.get('OV|ORT', 0):7.2f}  ORT|OV {ms.get('ORT|OV', 0):7.2f}"
            f"  ORT*|OV {ms.get('ORT*|OV', 0):7.2f} ms",
            flush=True,
        )
    splits = row["splits"]
    mixed = [
        sp[f"{k}_ms"] / sp["best_whole_ms"]
        for sp in splits
        for k in ("OV|ORT", "ORT|OV")
        if f"{k}_ms" in sp
    ]
    row["best_split_over_best_whole"] = min(mixed) if mixed else None
    # What a switch costs, stopped and left spinning: the split against the sum of its parts
    # is not measurable here, so against the faster whole graph, averaged over the cuts.
    for key in ("ORT|OV", "ORT*|OV"):
        vals = [sp[f"{key}_ms"] - sp["best_whole_ms"] for sp in splits if f"{key}_ms" in sp]
        row[f"mean_{key}_over_best_whole_ms"] = statistics.mean(vals) if vals else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,bert")
    ap.add_argument("--cuts", type=int, default=8, help="K: the graph is cut at K-1 points")
    ap.add_argument("--small", action="store_true", help="the zoo's small shapes (quick)")
    args = ap.parse_args()
    rows = [run_model(m, args.small, args.cuts) for m in args.models.split(",")]
    print(f"\n{'model':<10} {'best split / best whole':>24} {'ORT|OV +ms':>11} {'ORT*|OV +ms':>12}")
    for r in rows:
        print(
            f"{r['model']:<10} {r['best_split_over_best_whole']:>24.3f} "
            f"{r['mean_ORT|OV_over_best_whole_ms']:>11.2f} "
            f"{r['mean_ORT*|OV_over_best_whole_ms']:>12.2f}"
        )
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(RESULTS / "placement_mix.json", payload)
    _plot(rows)


def _plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        xs = [sp["fraction"] for sp in r["splits"]]
        for key, style in (("OV|ORT", "o-"), ("ORT|OV", "s-"), ("ORT*|OV", "x--")):
            ys = [sp.get(f"{key}_ms") / sp["best_whole_ms"] for sp in r["splits"]]
            ax.plot(xs, ys, style, label=key)
        for key, color in (("OV", "tab:gray"), ("ORT", "black")):
            ys = [sp.get(f"{key}_ms") / sp["best_whole_ms"] for sp in r["splits"]]
            ax.plot(xs, ys, ":", color=color, label=f"whole {key}")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_title(f"{r['model']} ({r['nodes']} ATen nodes)")
        ax.set_xlabel("cut (fraction of the topological order)")
        ax.set_ylabel("latency / faster whole graph")
        ax.legend(fontsize=7)
    fig.suptitle("Two graph compilers, split at one cut, against each on the whole graph")
    fig.tight_layout()
    fig.savefig(RESULTS / "placement_mix.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
