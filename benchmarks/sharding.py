"""Automatic sharding (issue 5) against hand-written plans, in one run.

(a) Modelled training step of GPT-3 350M / 1.3B / 6.7B / 13B (batch 8 x 1024 tokens; the
    transformer without the LM head, whose vocabulary-parallel form needs a rule we lack) on 8
    modelled A100s (80 GB each, parameters + Adam state + saved activations budgeted): our ILP
    plan on 8 tp ranks and our search over (dp, tp) mesh shapes (each one ILP with the dp
    axis's gradient sync and ZeRO-1 per parameter) vs the Megatron-LM plan (the same planner
    with Megatron's specs pinned) vs pure data parallelism (every parameter replicated, the
    batch split; ZeRO-1 where memory needs it, as DeepSpeed users would). The graphs are
    captured on the `meta` device.
(b) ILP solve time for 12 / 24 / 48 / 96 layers of 1.3B width: the exact level (whole graph) and
    the fast level (repeated layers share variables), and the fast plan's objective over exact.
(c) A real 4-rank gloo run of a GPT config: training-step throughput of our sharded program vs a
    hand-written DTensor `parallelize_module` Megatron plan of the same model, and the parameter
    bytes each rank holds.

    python benchmarks/sharding.py [--quick]

Prints a table; writes benchmarks/results/sharding.{json,png}.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import torch_plugin
from torch_plugin import _C, PlanError
from torch_plugin.models import gpt
from torch_plugin.sharding.module import capture_graph

RESULTS = Path(__file__).resolve().parent / "results"
BATCH, WORLD, BUDGET = 8, 8, 80e9


def _meta_gpt(cfg: gpt.GPTConfig, batch: int = BATCH) -> tuple[gpt.GPT, _C.Graph]:
    with torch.device("meta"):
        model = gpt.GPT(cfg)
    tokens = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
    return model, capture_graph(model, (tokens,))


def _plan(
    graph: _C.Graph,
    pins: dict[str, str],
    time_limit: float = 300.0,
    level: str = "auto",
    dp: int = 1,
) -> dict[str, Any]:
    """The ILP on `graph` (one dp replica's batch) with tp = WORLD / dp; ZeRO-1 allowed."""
    t0 = time.perf_counter()
    try:
        options = _C.ShardingOptions(
            world=WORLD // dp,
            device="a100",
            memory_budget_bytes=BUDGET,
            time_limit_s=time_limit,
            pinned=pins,
            level=level,
            dp=dp,
        )
        p = _C.PassManager().plan_sharding(graph, options)
    except PlanError as e:
        return {"fits": False, "min_gb": e.min_memory_bytes / 1e9, "solve_s": 0.0}
    return {
        "fits": True,
        "step_s": p.objective,
        "compute_s": p.compute_s,
        "comm_s": p.comm_s,
        "grad_sync_s": p.grad_sync_s,
        "param_gb_per_rank": p.param_bytes_per_rank / 1e9,
        "state_gb_per_rank": p.state_bytes_per_rank / 1e9,
        "activation_gb_per_rank": p.activation_bytes_per_rank / 1e9,
        "zero_params": len(p.zero_copies),
        "zero_gather_s": p.zero_gather_s,
        "mesh": [dp, WORLD // dp],
        "solve_s": time.perf_counter() - t0,
        "status": p.status,
        "variables": p.variables,
        "level": p.level,
    }


def _mesh_search(cfg: gpt.GPTConfig, megatron: bool = False) -> dict[str, Any]:
    """The (dp, tp) mesh shapes of WORLD ranks: each shape is one ILP (the dp axis's gradient
    sync and ZeRO-1 inside it) on a replica's batch slice; the fastest that fits. `megatron`:
    Megatron-LM's specs pinned on the tp axis (tp >= 2), as its users pick tp and dp by hand."""
    shapes = {}
    for dp in (d for d in range(1, WORLD + 1) if WORLD % d == 0 and BATCH % d == 0):
        if megatron and WORLD // dp < 2:
            continue
        model, graph = _meta_gpt(cfg, BATCH // dp)
        pins = gpt.megatron_constraints(model) if megatron else {}
        shapes[f"{dp}x{WORLD // dp}"] = _plan(graph, pins, dp=dp)
    fits = {k: v for k, v in shapes.items() if v["fits"]}
    if not fits:
        return {"fits": False, "min_gb": min(v["min_gb"] for v in shapes.values()), "solve_s": 0}
    best = min(fits, key=lambda k: fits[k]["step_s"])
    return {**fits[best], "shapes": {k: v.get("step_s") for k, v in shapes.items()}}


def modelled(sizes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        cfg = dataclasses.replace(gpt.SIZES[size], lm_head=False)
        model, graph = _meta_gpt(cfg)
        dp_pins = {n: "R" for n, _ in model.named_parameters()}
        row = {
            "size": size,
            "params_b": sum(p.numel() for p in model.parameters()) / 1e9,
            "ours": _plan(graph, {}),
            "ours_2d": _mesh_search(cfg),
            "megatron": _plan(graph, gpt.megatron_constraints(model)),
            "megatron_2d": _mesh_search(cfg, megatron=True),
            "dp": _plan(graph, dp_pins),
        }
        rows.append(row)
        print(f"  {size}: {_fmt(row)}", flush=True)
    return rows


def solve_times(layer_counts: list[int]) -> list[dict[str, Any]]:
    rows = []
    for n in layer_counts:
        cfg = gpt.GPTConfig(2048, n, 16, lm_head=False)
        t0 = time.perf_counter()
        _, graph = _meta_gpt(cfg)
        capture_s = time.perf_counter() - t0
        fast = _plan(graph, {}, time_limit=120.0, level="fast")
        exact = _plan(graph, {}, time_limit=120.0, level="exact")
        rows.append(
            {
                "layers": n,
                "nodes": len(graph.records()[1]),
                "capture_s": capture_s,
                "fast": fast,
                "exact": exact,
            }
        )
        print(
            f"  {n} layers: fast {fast['solve_s']:.2f} s, exact {exact['solve_s']:.1f} s "
            f"({exact.get('status')}); objective fast/exact {fast['step_s'] / exact['step_s']:.6f}",
            flush=True,
        )
    return rows


# ----------------------------------------------------------------------------- (c) real run


def _dtensor_plan(model: gpt.GPT) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for i in range(len(model.blocks)):
        for lin in ("attn.q", "attn.k", "attn.v", "fc1"):
            plan[f"blocks.{i}.{lin}"] = ColwiseParallel()
        for lin in ("attn.o", "fc2"):
            plan[f"blocks.{i}.{lin}"] = RowwiseParallel()
    return plan


def _real_worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(dim=256, n_layers=4, n_heads=8, vocab_size=1024, seq_len=64, lm_head=False)
    model = gpt.GPT(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len))
    target = torch.randn(8, cfg.seq_len, cfg.dim)

    def run(m: torch.nn.Module, params: Any) -> tuple[float, float]:
        opt = torch.optim.SGD(params, lr=1e-3)
        losses = []
        for i in range(steps + 2):
            if i == 2:
                dist.barrier()
                t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.mse_loss(m(tokens), target)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        dist.barrier()
        return (time.perf_counter() - t0) / steps, losses[0]

    mesh = torch_plugin.DeviceMesh.from_torchrun()
    ours = torch_plugin.parallelize(copy.deepcopy(model), mesh, (tokens,), device="cpu")
    ours_s, ours_loss = run(ours, ours.parameters())
    ours_bytes = ours.local_parameter_bytes()

    tp_mesh = init_device_mesh("cpu", (world,))
    ref = parallelize_module(copy.deepcopy(model), tp_mesh, _dtensor_plan(model))
    ref_s, ref_loss = run(ref, ref.parameters())
    ref_bytes = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
        for p in ref.parameters()
    )
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    specs = {n: s for n, _, s in ours.named_local_parameters()}
    sharded_whole = sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters()
        if specs.get(n, "R") != "R"
    )
    if rank == 0:
        Path(out).write_text(
            json.dumps(
                {
                    "ours_step_s": ours_s,
                    "dtensor_step_s": ref_s,
                    "ours_first_loss": ours_loss,
                    "dtensor_first_loss": ref_loss,
                    "ours_param_bytes": ours_bytes,
                    "dtensor_param_bytes": ref_bytes,
                    "whole_param_bytes": whole,
                    "sharded_whole_bytes": sharded_whole,
                    "ours_plan": str(ours.plan),
                }
            )
        )
    dist.destroy_process_group()


def real_run(steps: int) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    from dist_workers import free_port

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "real.json")
        mp.spawn(_real_worker, args=(4, free_port(), steps, out), nprocs=4, join=True)
        r = json.loads(Path(out).read_text())
    r["throughput_ratio"] = r["dtensor_step_s"] / r["ours_step_s"]
    shards = r["sharded_whole_bytes"]
    r["memory_target_bytes"] = shards / 4 + (r["whole_param_bytes"] - shards)
    return r


def _fmt(row: dict[str, Any]) -> str:
    def one(p: dict[str, Any]) -> str:
        if not p["fits"]:
            return f"OOM (needs {p['min_gb']:.0f} GB)"
        return f"{p['step_s'] * 1e3:.1f} ms, {p['param_gb_per_rank']:.2f} GB"

    return (
        f"ours {one(row['ours'])} | ours (dp x tp) {one(row['ours_2d'])} "
        f"{row['ours_2d'].get('mesh', '')} | megatron {one(row['megatron'])} | megatron (dp x "
        f"tp) {one(row['megatron_2d'])} {row['megatron_2d'].get('mesh', '')} | dp {one(row['dp'])}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="350M only, 12/24 layers, 3 steps")
    args = ap.parse_args()
    sizes = ["350m"] if args.quick else list(gpt.SIZES)
    layers = [12, 24] if args.quick else [12, 24, 48, 96]

    print("(a) modelled step on 8 A100s (ILP objective: compute + collectives + grad sync)")
    a = modelled(sizes)
    print("(b) ILP solve time, fast and exact levels")
    b = solve_times(layers)
    print("(c) real 4-rank gloo training step vs DTensor parallelize_module")
    c = real_run(3 if args.quick else 10)

    print()
    print("8 tp ranks (1-D):")
    print(
        f"{'model':<8} {'params':>7} {'ours ms':>9} {'megatron ms':>12} {'dp ms':>9} "
        f"{'megatron/ours':>14} {'dp/ours':>8} {'ZeRO params (ours, dp)':>23}"
    )

    def ms(p: dict[str, Any]) -> str:
        return f"{p['step_s'] * 1e3:.1f}" if p["fits"] else "OOM"

    def ratio(p: dict[str, Any], q: dict[str, Any]) -> str:
        return f"{p['step_s'] / q['step_s']:.3f}x" if p["fits"] and q["fits"] else "-"

    for r in a:
        o, m, d = r["ours"], r["megatron"], r["dp"]
        zero = f"{o.get('zero_params', 0)}, {d.get('zero_params', '-')}"
        print(
            f"{r['size']:<8} {r['params_b']:>6.2f}B {ms(o):>9} {ms(m):>12} {ms(d):>9} "
            f"{ratio(m, o):>14} {ratio(d, o):>8} {zero:>23}"
        )
    print("best (dp, tp) mesh shape of 8 ranks, each searched:")
    print(
        f"{'model':<8} {'ours ms':>9} {'mesh':>5} {'megatron ms':>12} {'mesh':>5} "
        f"{'megatron/ours':>14} {'dp/ours':>8} {'ours ZeRO params':>17}"
    )
    for r in a:
        t, m, d = r["ours_2d"], r["megatron_2d"], r["dp"]

        def mesh(p: dict[str, Any]) -> str:
            return "x".join(map(str, p["mesh"])) if p["fits"] else "-"

        print(
            f"{r['size']:<8} {ms(t):>9} {mesh(t):>5} {ms(m):>12} {mesh(m):>5} "
            f"{ratio(m, t):>14} {ratio(d, t):>8} {t.get('zero_params', 0):>17}"
        )
    print()
    print(f"{'layers':>6} {'nodes':>6} {'fast s':>8} {'exact s':>8} {'fast/exact objective':>21}")
    for r in b:
        f, e = r["fast"], r["exact"]
        print(
            f"{r['layers']:>6} {r['nodes']:>6} {f['solve_s']:>8.2f} {e['solve_s']:>8.1f} "
            f"{f['step_s'] / e['step_s']:>21.6f}"
        )
    print()
    print(
        f"real 4-rank gloo step: ours {c['ours_step_s'] * 1e3:.1f} ms, DTensor "
        f"{c['dtensor_step_s'] * 1e3:.1f} ms -> throughput ratio {c['throughput_ratio']:.2f}x "
        f"(target >= 0.95x); parameter bytes per rank: ours {c['ours_param_bytes']:,}, DTensor "
        f"{c['dtensor_param_bytes']:,}, target <= {int(c['memory_target_bytes']):,}"
    )

    RESULTS.mkdir(exist_ok=True)
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(RESULTS / "sharding.json", {"modelled": a, "solve": b, "real": c})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    xs = range(len(a))
    bars = ["ours", "ours_2d", "megatron", "megatron_2d", "dp"]
    for k, name in enumerate(bars):
        ys = [r[name]["step_s"] * 1e3 if r[name]["fits"] else 0 for r in a]
        ax1.bar([x + (k - 2) * 0.16 for x in xs], ys, width=0.16, label=name)
    ax1.set_xticks(list(xs), [r["size"] for r in a])
    ax1.set_ylabel("modelled ms / step (0 = does not fit)")
    ax1.set_title("GPT on 8 modelled A100s")
    ax1.legend()
    ax2.plot(
        [r["layers"] for r in b], [r["exact"]["solve_s"] for r in b], marker="o", label="exact"
    )
    ax2.plot([r["layers"] for r in b], [r["fast"]["solve_s"] for r in b], marker="o", label="fast")
    ax2.legend()
    ax2.axhline(10, ls="--", c="gray")
    ax2.set_xlabel("layers")
    ax2.set_ylabel("ILP solve s")
    ax2.set_title("ILP solve time")
    ax3.bar(["ours", "DTensor"], [c["ours_step_s"] * 1e3, c["dtensor_step_s"] * 1e3])
    ax3.set_ylabel("ms / training step")
    ax3.set_title("real 4-rank gloo, GPT dim 256 x 4 layers")
    fig.tight_layout()
    fig.savefig(RESULTS / "sharding.png")
    print(f"wrote {RESULTS / 'sharding.json'} and {RESULTS / 'sharding.png'}")


if __name__ == "__main__":
    main()
