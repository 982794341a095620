"""A Megatron-style tensor-parallel schedule for a GPT-2 model, written as a Slapo schedule.

    torchrun --nproc-per-node 2 examples/slapo_style_gpt.py [--steps 3] [--layers 4]

The model is `transformers`' GPT2LMHeadModel (GPT-2 config at test size, random weights),
unmodified. `megatron_schedule` shards the vocabulary of the embedding and of the LM head that
shares its weight, and each block's attention (packed q|k|v, column-parallel,
then row-parallel output) and MLP (column-, then row-parallel) over the ranks, with one
all-reduce per attention and per MLP in forward and one per region in backward, and
checkpoints every block. The verifier checks the schedule against the unscheduled model
(outputs and gradients); then a few SGD steps run and rank 0 compares the losses with
single-process training. gloo on CPU, NCCL when CUDA is available.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

import torch_plugin
from torch_plugin.models import hf


def megatron_schedule(sch: torch_plugin.Schedule) -> None:
    world = sch.world_size
    # Vocabulary-parallel embedding; the LM head shares its weight, so it is sharded too.
    sch["model.transformer.wte"].shard("weight", axis=0)
    sch["model.transformer.wte"].sync("fwd_post")  # sum of the ranks' partial lookups
    sch["model.lm_head"].sync("bwd_post")
    sch["model.lm_head"].sync("fwd_post", "all_gather")  # whole logits for the loss
    for block in sch["model.transformer.h.*"]:
        attn, mlp = block["attn"], block["mlp"]
        # q|k|v in one Conv1D (weight: in x 3*out): each rank keeps its heads of all three.
        attn["c_attn"].shard(["weight", "bias"], axis=1, sections=3)
        attn.sync("bwd_post")  # the input's gradient is summed over the ranks' heads
        attn["c_proj"].shard("weight", axis=0)  # row-parallel: partial sums ...
        attn["c_proj"].sync("fwd_post")  # ... summed once, then the bias
        attn.module.split_size //= world  # this rank's heads
        attn.module.num_heads //= world
        mlp["c_fc"].shard(["weight", "bias"], axis=1)
        mlp.sync("bwd_post")
        mlp["c_proj"].shard("weight", axis=0)
        mlp["c_proj"].sync("fwd_post")
        block.checkpoint()


def train(model: torch.nn.Module, tokens: torch.Tensor, steps: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def build_model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return hf.build_gpt2(
        small=True,
        n_layer=layers,
        n_embd=128,
        n_head=8,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=120)
    model = build_model(args.layers)
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, model.vocab_size, (4, model.seq_len))

    sch = torch_plugin.create_schedule(model, mesh)
    megatron_schedule(sch)
    report = sch.verify((tokens,))
    scheduled = torch_plugin.build(sch)
    losses = train(scheduled, tokens, args.steps)
    if mesh.rank == 0:
        expect = train(reference, tokens, args.steps)
        print(f"schedule: {len(sch.steps)} primitives; verify: {report}")
        for step, (a, b) in enumerate(zip(losses, expect, strict=True)):
            print(f"step {step}: loss {a:.6f} (single process {b:.6f}, diff {abs(a - b):.2e})")
        assert max(abs(a - b) for a, b in zip(losses, expect, strict=True)) < 1e-5
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
