"""Schedule language (issue 8) against hand-written tensor parallelism, in one run.

A GPT (dim 256, 4 layers, Megatron-style q/k/v/o + MLP) is trained for a few SGD steps on N
gloo ranks, three ways, from the same initial weights:
  * `schedule`: `megatron_schedule` below, a Slapo schedule built with torch_plugin.build;
  * `dtensor`:  the same plan hand-written with DTensor `parallelize_module`;
  * `single`:   one process, no parallelism (the numerics reference).
It reports the schedule's lines against the hand-written plan's, the training-step time of
each (the ratio dtensor/schedule is the throughput ratio, target >= 0.95x), parameter bytes per
rank, and the loss difference against one process.

    python benchmarks/schedule.py [--world 4] [--steps 10]

Prints a table; writes benchmarks/results/schedule.{json,png}.
"""

from __future__ import annotations

import argparse
import copy
import inspect
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
from torch_plugin.models import gpt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sharding import _dtensor_plan as dtensor_plan  # noqa: E402  (the same hand-written plan)

RESULTS = Path(__file__).resolve().parent / "results"
CFG = gpt.GPTConfig(dim=256, n_layers=4, n_heads=8, vocab_size=1024, seq_len=64, lm_head=False)


def megatron_schedule(sch: torch_plugin.Schedule) -> None:
    for block in sch["blocks.*"]:
        for name in ("attn.q", "attn.k", "attn.v"):
            block[name].shard(["weight", "bias"], axis=0)
        block["attn"].sync("bwd_post")
        block["attn.o"].shard("weight", axis=1)
        block["attn.o"].sync("fwd_post")
        block["fc1"].shard(["weight", "bias"], axis=0)
        block["fc1"].sync("bwd_post")
        block["fc2"].shard("weight", axis=1)
        block["fc2"].sync("fwd_post")


def _body_lines(fn: Any) -> int:
    """Non-blank, non-comment lines of a function's body (its signature excluded)."""
    lines = inspect.getsource(fn).splitlines()[1:]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def _worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    torch.set_num_threads(1)
    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=120)
    torch.manual_seed(0)
    model = gpt.GPT(CFG)
    tokens = torch.randint(0, CFG.vocab_size, (8, CFG.seq_len))
    target = torch.randn(8, CFG.seq_len, CFG.dim)

    def run(m: torch.nn.Module, distributed: bool = True) -> tuple[float, list[float]]:
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        losses = []
        for i in range(steps + 2):
            if i == 2:  # two warm-up steps
                if distributed:
                    dist.barrier()
                t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.mse_loss(m(tokens), target)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        if distributed:
            dist.barrier()
        return (time.perf_counter() - t0) / steps, losses

    def param_bytes(m: torch.nn.Module) -> int:
        return sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
            for p in m.parameters()
        )

    # Alternate the two programs so neither always runs on a warmer machine.
    times: dict[str, list[float]] = {"schedule": [], "dtensor": []}
    losses: dict[str, list[float]] = {}
    nbytes: dict[str, int] = {}
    for _ in range(2):
        sch = torch_plugin.create_schedule(copy.deepcopy(model), mesh)
        megatron_schedule(sch)
        scheduled = torch_plugin.build(sch)
        s, losses["schedule"] = run(scheduled)
        times["schedule"].append(s)
        nbytes["schedule"] = param_bytes(scheduled)
        tp_mesh = init_device_mesh("cpu", (world,))
        ref = parallelize_module(copy.deepcopy(model), tp_mesh, dtensor_plan(model))
        s, losses["dtensor"] = run(ref)
        times["dtensor"].append(s)
        nbytes["dtensor"] = param_bytes(ref)
    single_s, losses["single"] = run(copy.deepcopy(model), distributed=False)
    if rank == 0:
        Path(out).write_text(
            json.dumps(
                {
                    "world": world,
                    "steps": steps,
                    "step_s": {k: min(v) for k, v in times.items()} | {"single": single_s},
                    "losses": losses,
                    "param_bytes": nbytes | {"single": param_bytes(model)},
                }
            )
        )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    from dist_workers import free_port

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "schedule.json")
        mp.spawn(
            _worker, args=(args.world, free_port(), args.steps, out), nprocs=args.world, join=True
        )
        r = json.loads(Path(out).read_text())
    r["lines"] = {"schedule": _body_lines(megatron_schedule), "dtensor": _body_lines(dtensor_plan)}
    r["throughput_ratio"] = r["step_s"]["dtensor"] / r["step_s"]["schedule"]
    r["max_loss_diff_vs_single"] = {
        k: max(abs(a - b) for a, b in zip(r["losses"][k], r["losses"]["single"], strict=True))
        for k in ("schedule", "dtensor")
    }
    print(
        f"GPT dim {CFG.dim} x {CFG.n_layers} layers, batch 8 x {CFG.seq_len}, "
        f"{r['world']} gloo ranks, {r['steps']} SGD steps"
    )
    print(
        f"{'program':<10} {'lines':>6} {'ms/step':>9} {'vs schedule':>12} {'param bytes/rank':>17} "
        f"{'max |loss - single|':>20}"
    )
    for k in ("schedule", "dtensor", "single"):
        lines = r["lines"].get(k, "-")
        diff = r["max_loss_diff_vs_single"].get(k, 0.0)
        print(
            f"{k:<10} {lines!s:>6} {r['step_s'][k] * 1e3:>9.2f} "
            f"{r['step_s'][k] / r['step_s']['schedule']:>11.2f}x {r['param_bytes'][k]:>17,} "
            f"{diff:>20.2e}"
        )
    print(f"throughput schedule / dtensor: {r['throughput_ratio']:.3f}x (target >= 0.95x)")

    RESULTS.mkdir(exist_ok=True)
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(RESULTS / "schedule.json", r)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    names = ["schedule", "dtensor", "single"]
    ax1.bar(names, [r["step_s"][k] * 1e3 for k in names], color=["C0", "C1", "C7"])
    ax1.set_ylabel("ms / training step")
    ax1.set_title(f"GPT dim {CFG.dim} x {CFG.n_layers}, {r['world']} gloo ranks")
    ax2.bar(["schedule", "dtensor"], [r["lines"]["schedule"], r["lines"]["dtensor"]])
    ax2.set_ylabel("lines of plan code")
    ax2.set_title("Megatron plan: schedule vs DTensor")
    fig.tight_layout()
    fig.savefig(RESULTS / "schedule.png")
    print(f"wrote {RESULTS / 'schedule.json'} and schedule.png")


if __name__ == "__main__":
    main()
