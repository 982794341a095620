"""Automatic sharding: train a GPT with one `parallelize` call, checked against one process.

    torchrun --nproc-per-node 4 examples/sharding.py [--steps 3] [--layers 4]

Every rank builds the same GPT (random weights, seed 0). `torch_plugin.parallelize` captures the
forward, plans the sharding (ILP on CBC), keeps this rank's parameter blocks and returns the
SPMD program; a few SGD steps follow. Rank 0 prints the plan and checks the losses against
single-process training. gloo on CPU, NCCL when CUDA is available.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_plugin
from torch_plugin.models import gpt


def train(
    model: torch.nn.Module, tokens: torch.Tensor, target: torch.Tensor, steps: int
) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(tokens), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=120)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(
        dim=128, n_layers=args.layers, n_heads=8, vocab_size=512, seq_len=32, lm_head=False
    )
    model = gpt.GPT(cfg).to(device)
    tokens = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), device=device)
    target = torch.randn(8, cfg.seq_len, cfg.dim, device=device)
    reference = copy.deepcopy(model)

    sharded = torch_plugin.parallelize(
        model, mesh, (tokens,), device="cpu" if device == "cpu" else "a100"
    )
    losses = train(sharded, tokens, target, args.steps)
    if mesh.rank == 0:
        print(sharded.plan)
        expect = train(reference, tokens, target, args.steps)
        ok = all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, expect, strict=True))
        whole = sum(p.numel() * p.element_size() for p in reference.parameters())
        print(
            f"losses {[round(x, 6) for x in losses]} vs one process "
            f"{[round(x, 6) for x in expect]}: {'equal' if ok else 'DIFFERENT'}"
        )
        print(
            f"parameters on this rank: {sharded.local_parameter_bytes():,} of {whole:,} bytes; "
            f"collectives sent: {dict(sharded.comm.bytes_sent)}"
        )
        if not ok:
            raise SystemExit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
