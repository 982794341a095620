"""Graph pipeline parallelism on a multi-branch model.

Plan only (any machine): GraphPipe (GPP) vs a sequential pipeline (SPP) for the thesis's
Multi-Modal Transformer on 8 A100s, with PNGs of both stage graphs and schedules:

    python examples/graphpipe.py

Train (4 processes on this CPU, gloo; or under torchrun on GPUs):

    torchrun --nproc-per-node 4 examples/graphpipe.py --train
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_plugin
from torch_plugin import models


def plan_only(out_dir: str) -> None:
    with torch.device("meta"):  # the published shapes, without allocating them
        model, inputs = models.build("mmt", batch=128)
    traced = torch_plugin.distributed.cost_records(model, inputs)
    for strategy in ("gpp", "spp"):
        plan, _ = torch_plugin.plan_pipeline(
            traced, num_devices=8, strategy=strategy, device="a100", scope_depth=3
        )
        print(plan.summary(), "\n")
        print("wrote", *plan.save_png(os.path.join(out_dir, f"mmt_{strategy}")), "\n")


def train(steps: int) -> None:
    dist.init_process_group("gloo")
    model, inputs = models.build("mmt", small=True, batch=16)
    target = torch.zeros(16, 10)
    pp = torch_plugin.PipelineParallel(model, inputs, loss_fn=F.mse_loss, micro_batch_sizes=[4])
    if dist.get_rank() == 0:
        print(pp.plan.summary())
    opt = torch.optim.AdamW(pp.parameters(), lr=1e-3)
    for step in range(steps):
        loss = pp.step(inputs, target)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss:.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="/tmp")
    args = ap.parse_args()
    train(args.steps) if args.train else plan_only(args.out)
