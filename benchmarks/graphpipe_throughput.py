"""Throughput of graph pipelines (GPP) vs sequential pipelines (SPP), simulated and real.

1. Simulated, A100 preset: MMT, DLRM and CANDLE-Uno at the thesis's shapes and mini-batch
   sizes on 4 / 8 / 16 / 32 devices. As in the thesis's evaluation, every micro-batch size is
   tried for each strategy (GPP also with per-stage sizes); each search picks stages and
   replicas for the bottleneck time per sample, the event simulator runs one 1F1B iteration,
   and the fastest plan per strategy is kept. The thesis reports GPP up to 1.61x over SPP
   (measured on V100s).
2. Real, 4 gloo ranks on this CPU, a mid-size MMT (4 branches): training steps/s of our runtime
   with the GPP plan, with the SPP plan, and of torch.distributed.pipelining with GPipe and
   1F1B over a hand-split sequential pipeline (one branch per stage, the other modalities
   carried along) - what users write today. Same micro-batch count everywhere.

    python benchmarks/graphpipe_throughput.py [--devices 4,8,16,32] [--skip-real]

Writes benchmarks/results/graphpipe_throughput.{json,png}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from torch_plugin import _C, models
from torch_plugin.distributed import PipelineParallel, cost_records, plan_pipeline

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MINI_BATCH = {
    "mmt": {4: 64, 8: 128, 16: 256, 32: 512},
    "dlrm": {4: 256, 8: 512, 16: 1024, 32: 2048},
    "candle_uno": {4: 4096, 8: 8192, 16: 16384, 32: 32768},
}
REAL_MMT = dict(layers_per_branch=2, hidden=128, heads=4, ffn=512, seq_len=32, num_classes=16)
REAL_BATCH, REAL_MICRO = 32, 8
REAL_STEPS = 6


def _sweep(traced, devices: int, strategy: str, profile: str, batch: int) -> dict:
    """Best simulated throughput over micro-batch sizes (the thesis's protocol: every
    micro-batch size is tried and the fastest strategy kept); GPP also tries mixed sizes."""
    sizes = [b for b in (2**i for i in range(20)) if b <= batch and batch % b == 0]
    candidates = [[b] for b in sizes] + ([None] if strategy == "gpp" else [])
    best = None
    for micro in candidates:
        try:
            plan, _ = plan_pipeline(
                traced,
                num_devices=devices,
                strategy=strategy,
                device=profile,
                scope_depth=3,
                micro_batch_sizes=micro,
                time_limit_s=30,
            )
        except _C.PlanError:
            continue
        sim = plan.raw.sim
        if best is None or sim.throughput > best["throughput"]:
            best = {
                "throughput": sim.throughput,
                "bubble": sim.bubble_fraction,
                "depth": plan.raw.depth,
                "stages": plan.num_stages,
                "micro_batches": sorted({s.micro_batch for s in plan.stages}),
                "peak_memory_gib": max(sim.device_peak_memory) / 2**30,
            }
    assert best is not None, f"no {strategy} plan fits"
    return best


def simulated(devices: list[int], profile: str) -> list[dict]:
    rows = []
    for name in ("mmt", "dlrm", "candle_uno"):
        for d in devices:
            batch = MINI_BATCH[name][d]
            with torch.device("meta"):
                model, inputs = models.build(name, batch=batch)
            traced = cost_records(model, inputs)
            row = {"model": name, "devices": d, "mini_batch": batch}
            for strategy in ("gpp", "spp"):
                row[strategy] = _sweep(traced, d, strategy, profile, batch)
            row["speedup"] = row["gpp"]["throughput"] / row["spp"]["throughput"]
            rows.append(row)
            g, s = row["gpp"], row["spp"]
            print(
                f"sim {name:10s} {d:3d} dev: GPP {g['throughput']:10.1f}/s depth {g['depth']:2d}"
                f" b={g['micro_batches']} | SPP {s['throughput']:10.1f}/s depth {s['depth']:2d}"
                f" b={s['micro_batches']} | GPP/SPP {row['speedup']:.2f}x",
                flush=True,
            )
    return rows


# ---- real 4-rank CPU run ---------------------------------------------------------------------


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is made contiguous: torch.distributed.pipelining sizes its
    receive buffers from the sender's gradient strides (a cat's input gradients are narrow
    views), and gloo only receives into contiguous tensors."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return g.contiguous()


class _Carry(nn.Module):
    """Stage i of a hand-split sequential MMT: runs branch i, carries the rest along."""

    def __init__(self, model: nn.Module, i: int):
        super().__init__()
        self.i, self.n = i, model.num_branches
        self.branch = model.branches[i]
        self.head = model.head if i == self.n - 1 else None

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
        xs = tuple(_ContiguousGrad.apply(x) for x in xs)
        pooled, rest = list(xs[: self.i]), list(xs[self.i :])
        pooled.append(self.branch(rest.pop(0)).mean(dim=1))
        if self.head is not None:
            return self.head(torch.cat(pooled, dim=-1))
        return (*pooled, *rest)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    model, inputs = models.build("mmt", small=True, batch=REAL_BATCH, **REAL_MMT)
    torch.manual_seed(1)
    target = torch.randn(REAL_BATCH, REAL_MMT["num_classes"])
    times: dict[str, list[float]] = {}
    for strategy in ("gpp", "spp"):
        pp = PipelineParallel(
            model, inputs, loss_fn=F.mse_loss, strategy=strategy, micro_batch_sizes=[REAL_MICRO]
        )
        opt = torch.optim.SGD(pp.parameters(), lr=1e-3)
        ts = []
        for _ in range(REAL_STEPS):
            dist.barrier()
            t0 = time.perf_counter()
            pp.step(inputs, target)
            opt.step()
            opt.zero_grad()
            dist.barrier()
            ts.append(time.perf_counter() - t0)
        times[f"ours_{strategy}"] = ts[1:]
        if rank == 0:
            times[f"ours_{strategy}_depth"] = [pp.plan.raw.depth]
    for sched_name, sched_cls in (("torch_gpipe", ScheduleGPipe), ("torch_1f1b", Schedule1F1B)):
        stage_mod = _Carry(model, rank)
        stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
        sched = sched_cls(stage, REAL_BATCH // REAL_MICRO, loss_fn=F.mse_loss)
        opt = torch.optim.SGD(stage_mod.parameters(), lr=1e-3)
        ts = []
        for _ in range(REAL_STEPS):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                sched.step(*inputs)
            elif rank == world - 1:
                sched.step(target=target)
            else:
                sched.step()
            opt.step()
            opt.zero_grad()
            dist.barrier()
            ts.append(time.perf_counter() - t0)
        times[sched_name] = ts[1:]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def real() -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.spawn(_worker, args=(4, port, out), nprocs=4, join=True)
        with open(out) as f:
            times = json.load(f)
    res = {}
    for k in ("ours_gpp", "ours_spp", "torch_gpipe", "torch_1f1b"):
        med = statistics.median(times[k])
        res[k] = {"median_step_s": med, "samples_per_s": REAL_BATCH / med}
        print(
            f"real 4-rank CPU MMT {k:12s}: {REAL_BATCH / med:8.1f} samples/s "
            f"(median step {med * 1e3:.1f} ms)",
            flush=True,
        )
    res["gpp_depth"] = times["ours_gpp_depth"][0]
    res["spp_depth"] = times["ours_spp_depth"][0]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--profile", default="a100")
    ap.add_argument("--skip-real", action="store_true")
    args = ap.parse_args()
    sim_rows = simulated([int(d) for d in args.devices.split(",")], args.profile)
    real_res = None if args.skip_real else real()
    print()
    print(
        f"{'model':10s} {'dev':>4s} {'GPP/s':>10s} {'SPP/s':>10s} {'GPP/SPP':>8s} {'depth G/S':>9s}"
    )
    for r in sim_rows:
        print(
            f"{r['model']:10s} {r['devices']:4d} {r['gpp']['throughput']:10.1f}"
            f" {r['spp']['throughput']:10.1f} {r['speedup']:8.2f}"
            f" {r['gpp']['depth']:4d}/{r['spp']['depth']:<4d}"
        )
    if real_res:
        base = real_res["torch_1f1b"]["samples_per_s"]
        print("\nreal 4-rank CPU MMT, samples/s (ratio to torch.distributed.pipelining 1F1B):")
        for k in ("ours_gpp", "ours_spp", "torch_gpipe", "torch_1f1b"):
            v = real_res[k]["samples_per_s"]
            print(f"  {k:12s} {v:8.1f}  {v / base:.2f}x")
    os.makedirs(RESULTS, exist_ok=True)
    meta = {
        "profile": args.profile,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "real_model": REAL_MMT,
        "real_batch": REAL_BATCH,
        "real_micro_batch": REAL_MICRO,
        "python": sys.version.split()[0],
    }
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(
        os.path.join(RESULTS, "graphpipe_throughput.json"),
        {"meta": meta, "simulated": sim_rows, "real": real_res},
    )
    _plot(sim_rows, real_res)


def _plot(rows: list[dict], real_res: dict | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, marker in (("mmt", "o"), ("dlrm", "s"), ("candle_uno", "^")):
        rs = [r for r in rows if r["model"] == name]
        axes[0].plot(
            [r["devices"] for r in rs], [r["speedup"] for r in rs], marker + "-", label=name
        )
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("devices")
    axes[0].set_ylabel("simulated throughput GPP / SPP")
    axes[0].set_title("A100 preset, 1F1B")
    axes[0].legend(fontsize=8)
    if real_res:
        keys = ["ours_gpp", "ours_spp", "torch_gpipe", "torch_1f1b"]
        axes[1].bar(
            keys,
            [real_res[k]["samples_per_s"] for k in keys],
            color=["#36c", "#69c", "#c63", "#c96"],
        )
        axes[1].set_ylabel("samples/s")
        axes[1].set_title("real: 4 gloo ranks on this CPU, MMT")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "graphpipe_throughput.png"), dpi=110)


if __name__ == "__main__":
    main()
