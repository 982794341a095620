"""A training loop that survives a dead rank: an HF Llama config sharded by torch_plugin, AdamW,
a cosine schedule, gradient clipping, a checkpoint every k steps, resume, and an HF export.

    torchrun --nproc-per-node 2 --max-restarts 1 examples/train_with_checkpoints.py
    # multi-node: the same on each node with --nnodes 2 --rdzv-backend c10d \\
    #             --rdzv-endpoint HOST:PORT --node-rank i

On (re)start the script loads the latest complete checkpoint under --out/ckpt, if any, and goes
on from its step: a rank that dies (here on purpose with --kill-rank/--kill-step, in the middle
of a step, on the first attempt only) costs the steps since the last checkpoint. Checkpoints are
torch.distributed.checkpoint directories: each rank writes its own blocks, and they load into
another world size or mesh. At the end rank 0 exports the whole model with save_pretrained and
checks that from_pretrained gives the sharded model's logits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

import torch_plugin
from torch_plugin.models import hf_suite


def batch(step: int, size: int) -> dict[str, torch.Tensor]:
    """The data loader's batch `step` (a real loader would seek to the saved position)."""
    return hf_suite.make_inputs("llama", batch=size, seed=1000 + step)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", default="runs/llama")
    ap.add_argument("--export", default="", help="directory for save_pretrained ('none': skip)")
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=30)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = hf_suite.build_model("llama", seed=0)  # random weights, nothing downloaded
    sharded = torch_plugin.parallelize(model, mesh, batch(0, args.batch), level="fast")
    opt = sharded.optimizer(torch.optim.AdamW, lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

    start = 0
    extra = torch_plugin.load_checkpoint(out / "ckpt", sharded, opt)
    if extra is not None:
        sched.load_state_dict(extra["scheduler"])
        start = extra["step"]
        if rank == 0:
            print(f"restart {restart}: resumed from the checkpoint after step {start}")

    for step in range(start, args.steps):
        loss = sharded(**batch(step, args.batch)).loss
        if restart == 0 and step == args.kill_step and rank == args.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # a node dies mid-step
        loss.backward()
        norm = sharded.clip_grad_norm_(1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if rank == 0:
            row = {"step": step, "loss": loss.item(), "norm": float(norm), "restart": restart}
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            torch_plugin.save_checkpoint(
                out / "ckpt" / f"step-{step + 1:06d}",
                sharded,
                opt,
                extra={"step": step + 1, "scheduler": sched.state_dict()},
                async_save=True,  # written while the next steps run
                keep=2,
            )

    torch_plugin.save_checkpoint(out / "ckpt" / "final", sharded, opt, {"step": args.steps}).wait()
    if args.export != "none":
        export = Path(args.export or out / "hf")
        probe = batch(0, args.batch)
        with torch.no_grad():
            logits = sharded(**probe).logits
        state = sharded.full_state_dict()  # whole tensors on rank 0
        if rank == 0:
            plain = type(model)(model.config)
            plain.load_state_dict(state)
            plain.save_pretrained(export)
            again = type(model).from_pretrained(export).eval()
            with torch.no_grad():
                diff = float((again(**probe).logits - logits).abs().max())
            print(f"exported to {export}: from_pretrained logits differ by {diff:.2e}")
            assert diff <= 1e-6, diff
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
