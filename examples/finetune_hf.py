"""Fine-tune an HF causal LM the way users write it, on several ranks with one `parallelize`.

    torchrun --nproc-per-node 2 examples/finetune_hf.py              # tensor parallel
    torchrun --nproc-per-node 4 examples/finetune_hf.py --mesh 2 2   # data x tensor parallel

What a user's program has, nothing changed for torch_plugin: a library-default config (only
sizes set: use_cache=True, its dropout), a corpus of texts of varying lengths (synthetic token
ids here: nothing is downloaded), a DataLoader whose collate pads each batch to its longest text
(DataCollatorWithPadding-style, pad_to_multiple_of=8, labels -100 on the padding), AdamW with
linear warmup and cosine decay, gradient accumulation (no_sync between micro-batches), clipping,
bf16 autocast, a checkpoint every --save-every steps, resume from the latest one (run it again,
or after a crash), and an export with save_pretrained that HF's from_pretrained loads.

--pretrained DIR starts from a save_pretrained directory: the model is built on the meta device
and each rank reads only its blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.utils.data import DataLoader, Dataset

import torch_plugin

VOCAB, PAD = 512, 0


class SyntheticCorpus(Dataset):
    """Token-id "texts" of 8 to 60 tokens from a fixed random bigram table (so the loss can
    fall): what a tokenizer would hand the collator."""

    def __init__(self, size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        nxt = torch.randint(1, VOCAB, (VOCAB, 4), generator=g)  # 4 likely successors per token
        self.texts = []
        for _ in range(size):
            n = int(torch.randint(8, 61, (1,), generator=g))
            ids = [int(torch.randint(1, VOCAB, (1,), generator=g))]
            for _ in range(n - 1):
                ids.append(int(nxt[ids[-1], int(torch.randint(0, 4, (1,), generator=g))]))
            self.texts.append(torch.tensor(ids))

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.texts[i]


def pad_collate(texts: list[torch.Tensor], multiple: int = 8) -> dict[str, torch.Tensor]:
    """Right padding to the longest text (rounded up to `multiple`), as DataCollatorWithPadding
    does; labels are the ids with -100 on the padding (the model shifts them)."""
    length = -(-max(len(t) for t in texts) // multiple) * multiple
    ids = torch.full((len(texts), length), PAD)
    mask = torch.zeros(len(texts), length, dtype=torch.long)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = t
        mask[i, : len(t)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def micro_batches(corpus: Dataset, batch: int, skip: int) -> Iterator[dict[str, torch.Tensor]]:
    """The loader's batches, epoch after epoch (each shuffled by its own seed, the same on every
    rank), from the `skip`-th on: a resumed run sees the batches it had not yet seen."""
    epoch, seen = 0, 0
    while True:
        loader = DataLoader(
            corpus,
            batch_size=batch,
            shuffle=True,
            generator=torch.Generator().manual_seed(epoch),
            collate_fn=pad_collate,
        )
        for b in loader:
            if seen >= skip:
                yield b
            seen += 1
        epoch += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8, help="samples per micro-batch")
    ap.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--mesh", type=int, nargs="+", default=None, help="(dp, tp); default: tp")
    ap.add_argument("--out", default="build/finetune")
    ap.add_argument("--pretrained", default=None, help="a save_pretrained directory to start from")
    ap.add_argument("--no-bf16", action="store_true", help="train in float32")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)

    shape = tuple(args.mesh) if args.mesh else None
    names = ("dp", "tp") if shape and len(shape) == 2 else None
    mesh = torch_plugin.DeviceMesh.from_torchrun(shape, names, timeout_s=120)
    rank = dist.get_rank()
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=PAD,
    )
    corpus = SyntheticCorpus(2000)
    example = pad_collate([corpus[i] for i in range(args.batch)])
    if args.pretrained:
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
        dist_model = torch_plugin.parallelize(model, mesh, example, pretrained=args.pretrained)
    else:
        torch.manual_seed(0)  # the same random weights on every rank
        model = transformers.LlamaForCausalLM(config)
        dist_model = torch_plugin.parallelize(model, mesh, example)
    opt = dist_model.optimizer(torch.optim.AdamW, lr=args.lr, weight_decay=0.01)

    def warmup_cosine(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        done = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    start = 0
    extra = torch_plugin.load_checkpoint(out / "ckpt", dist_model, opt)
    if extra is not None:
        start = extra["step"]
        sched.load_state_dict(extra["scheduler"])
        if rank == 0:
            print(f"resumed from the checkpoint after step {start}")
    batches = micro_batches(corpus, args.batch, skip=start * args.accumulate)
    autocast = (
        contextlib.nullcontext() if args.no_bf16 else torch.autocast("cpu", dtype=torch.bfloat16)
    )
    dist_model.train()
    t0, tokens = time.perf_counter(), 0
    for step in range(start, args.steps):
        total = 0.0
        for k in range(args.accumulate):
            batch = next(batches)
            tokens += int(batch["attention_mask"].sum())
            last = k == args.accumulate - 1
            with contextlib.nullcontext() if last else dist_model.no_sync(), autocast:
                loss = dist_model(**batch).loss / args.accumulate
            loss.backward()
            total += float(loss.detach())
        norm = dist_model.clip_grad_norm_(1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            rate = tokens / (time.perf_counter() - t0)
            print(
                f"step {step:3d}  loss {total:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                f"grad norm {float(norm):.3f}  {rate:.0f} tokens/s (rank 0's share of the data)"
            )
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            extra = {"step": step + 1, "scheduler": sched.state_dict()}
            torch_plugin.save_checkpoint(
                out / "ckpt" / f"step-{step + 1}", dist_model, opt, extra=extra, keep=2
            )
    programs = len(dist_model.capture_times_s)
    torch_plugin.save_pretrained(dist_model, out / "export")
    dist_model.eval()  # every rank runs the sharded forward; rank 0 compares
    probe = pad_collate([corpus[i] for i in range(4)])
    with torch.no_grad():
        ours = dist_model(**probe).logits
    if rank == 0:
        print(
            f"{programs} new program(s) captured for other lengths and autocast "
            f"({sum(dist_model.capture_times_s.values()):.1f} s in all); exported to "
            f"{out / 'export'}"
        )
        again = transformers.LlamaForCausalLM.from_pretrained(out / "export").eval()
        with torch.no_grad():
            diff = (again(**probe).logits - ours).abs().max()
        print(f"from_pretrained(export) logits match the sharded model's: max diff {diff:.1e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
