"""Cache-parallel `generate()` on one GPU against HF's `generate()` (its default dynamic cache,
and the static cache with a compiled forward that HF's docs recommend for speed).

    torchrun --nproc-per-node 1 benchmarks/gpu_generate.py [--out DIR]

A TinyLlama-1.1B-shaped `transformers` Llama (22 layers, hidden 2048, 32 query / 4 KV heads,
head_dim 64; random weights, bf16, SDPA attention), batch 4 of 2048-token prompts (one row
left-padded by 300), greedy, 64 new tokens. Ours is `torch_plugin.cache_parallel(model, mesh)`
on a world of 1: its decode steps call `torch_plugin::decode_attention`. Reported: tokens/s of
the whole call (prefill included) and of decoding alone (the call minus a 1-token call), and
how many generated tokens equal HF's dynamic-cache run (bf16 greedy decoding with different
attention kernels parts where two logits nearly tie), and the logits' relative difference over
the steps before a row's first different token. Writes DIR/gpu_generate.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch_plugin  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402

BATCH, PROMPT, NEW, PAD = 4, 2048, 64, 300
DEV, DTYPE = "cuda", torch.bfloat16
SIZE = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22)


def build() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=32000,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
        **SIZE,
    )
    return transformers.LlamaForCausalLM(cfg).to(DEV, DTYPE).eval()


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn: Any) -> tuple[Any, float]:
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the script")
    args = ap.parse_args()
    global BATCH, PROMPT, NEW, PAD, DEV, DTYPE
    if args.dry_run:
        BATCH, PROMPT, NEW, PAD, DEV, DTYPE = 2, 48, 6, 5, "cpu", torch.float32
        SIZE.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2)
    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=120)
    model = build()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 32000, (BATCH, PROMPT), generator=gen).to(DEV)
    mask = torch.ones_like(ids)
    ids[1, :PAD], mask[1, :PAD] = 0, 0  # left padding: a shorter prompt
    kw: dict[str, Any] = dict(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=0)
    cp = torch_plugin.cache_parallel(copy.deepcopy(model), mesh)
    # What HF's docs recommend for speed: a static cache and a compiled forward.
    compiled = copy.deepcopy(model)
    compiled.forward = torch.compile(compiled.forward, mode="reduce-overhead", fullgraph=True)
    kw_out = dict(kw, output_logits=True, return_dict_in_generate=True)
    runs = {
        "hf_dynamic": lambda n: model.generate(**kw_out, max_new_tokens=n),
        "hf_static_compiled": lambda n: compiled.generate(
            **kw_out, max_new_tokens=n, cache_implementation="static"
        ),
        "cache_parallel": lambda n: cp.generate(**kw_out, max_new_tokens=n),
    }
    rows: dict[str, Any] = {}
    with torch.no_grad():
        for name, fn in runs.items():
            # Warm-ups at both timed lengths: kernels loaded, caches allocated, and the compiled
            # forward compiled for each static cache size (a new size recompiles).
            fn(NEW)
            fn(1)
            _, t1 = timed(lambda fn=fn: fn(1))
            out, t = timed(lambda fn=fn: fn(NEW))
            rows[name] = {
                "seconds": t,
                "prefill_s": t1,
                "tokens": out.sequences[:, PROMPT:].cpu(),
                "logits": torch.stack([x.float().cpu() for x in out.logits], 1)
                if out.logits
                else None,
            }
    want = rows["hf_dynamic"]["tokens"]
    want_logits = rows["hf_dynamic"]["logits"]
    result: dict[str, Any] = {
        **provenance(),
        "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)",
        "model": "Llama, TinyLlama-1.1B shape, random weights, bf16, sdpa",
        "batch": BATCH,
        "prompt": PROMPT,
        "new_tokens": NEW,
        "rows": [],
    }
    for name, r in rows.items():
        got = r["tokens"]
        same = (got == want).float()
        first_diff = [
            int((row == 0).nonzero()[0]) if bool((row == 0).any()) else NEW for row in same
        ]
        decode_s = r["seconds"] - r["prefill_s"]
        # Logits of the steps before a row's first different token (same inputs so far),
        # relative to the largest of HF's: what the decode kernel changes, not greedy ties.
        logit_err = None
        if r["logits"] is not None and want_logits is not None:
            errs = [
                float(
                    (r["logits"][b, : first_diff[b]] - want_logits[b, : first_diff[b]]).abs().max()
                    / want_logits[b, : first_diff[b]].abs().max()
                )
                for b in range(BATCH)
                if first_diff[b] > 0
            ]
            logit_err = max(errs) if errs else None
        result["rows"].append(
            {
                "generate": name,
                "seconds": r["seconds"],
                "tokens_per_s": BATCH * NEW / r["seconds"],
                "decode_tokens_per_s": BATCH * (NEW - 1) / decode_s,
                "equal_to_hf_dynamic": float(same.mean()),
                "first_difference_per_row": first_diff,
                "logits_rel_err_before_difference": logit_err,
            }
        )
    base = next(r for r in result["rows"] if r["generate"] == "hf_static_compiled")
    for r in result["rows"]:
        r["decode_vs_hf_static_compiled"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
        print(
            f"{r['generate']:>15}: {r['seconds']:.2f} s, {r['tokens_per_s']:.0f} tok/s, decode "
            f"{r['decode_tokens_per_s']:.0f} tok/s ({r['decode_vs_hf_static_compiled']:.2f}x HF "
            f"static compiled), equal to HF dynamic {r['equal_to_hf_dynamic']:.3f}, first "
            f"difference {r['first_difference_per_row']}, logits rel err before it "
            f"{r['logits_rel_err_before_difference']}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_generate.json").write_text(json.dumps(result, indent=1))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
