"""HF Llama decoding at long context on 4 gloo ranks (issue 28's benchmark): tokens/s of

  single  one process (both cores), the model as transformers runs it with a preallocated
          StaticCache (what `cache_implementation="static"` builds), the step called as
          generate() calls it (cache positions and the 2-D attention mask);
  CP      torch_plugin.cache_parallel(model, mesh): the KV cache split by sequence over the 4
          ranks, every weight on every rank, partials all-gathered and merged;
  Helix   torch_plugin.cache_parallel(model, mesh, helix=True): the cache split by sequence,
          o_proj and the MLP tensor-parallel over the same ranks, one all-to-all of partials;
  TP      torch's DTensor Megatron plan (parallelize_module: q/k/v/gate/up column-parallel,
          o/down row-parallel), heads and the (static) cache split over the ranks;

for one decode step of a batch at 1K..32K positions of cache, as ratios to the single process,
measured in one run. The caches are filled with the same random keys and values for every
strategy (a prompt's prefill at 32K would dominate the run and is not what is measured); CP,
Helix and TP logits are checked against the single process on that cache first. Also the
split-KV kernel's roofline fraction at Llama-3-8B's attention shape (benchmarks/
cache_parallel.py's kernel section).

4 ranks share 2 cores here (one thread each; the single process gets both), so the absolute
rates are low and the ratios say how each strategy's work and traffic divide on one box.

    python benchmarks/hf_decode.py [--max-context 32768] [--steps 4]

Writes benchmarks/results/hf_decode.{json,png}.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
WORLD = 4
BATCH = 4
# An HF Llama config whose decode step at long context is dominated by reading the cache:
# 8 query / 4 KV heads of 64 (KV heads divide over 4 ranks for TP), 2 layers.
CONFIG = dict(
    vocab_size=1000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=65536 + 64,
    use_cache=True,
)
STRATEGIES = ("single", "cp", "helix", "tp")


def build_model() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIG, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).eval()


def cache_content(layer: int, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random keys and values for [0, ctx) on every rank and strategy."""
    g = torch.Generator().manual_seed(1000 + layer)
    hd = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    shape = (BATCH, CONFIG["num_key_value_heads"], ctx, hd)
    return torch.randn(shape, generator=g) * 0.5, torch.randn(shape, generator=g)


def static_cache(model: torch.nn.Module, ctx: int, heads: slice | None = None) -> object:
    """A preallocated StaticCache (room for the step) holding the common content (TP: this
    rank's KV heads). Earlier runs used a DynamicCache, which concatenates the whole cache at
    every step: a baseline no careful user runs for long decodes (issue 41)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=ctx + 8)
    for i in range(CONFIG["num_hidden_layers"]):
        k, v = cache_content(i, ctx)
        if heads is not None:
            k, v = k[:, heads].contiguous(), v[:, heads].contiguous()
        cache.update(k, v, i, {"cache_position": torch.arange(ctx)})
    return cache


def static_step(model: torch.nn.Module, cache: object, tok: torch.Tensor, ctx: int) -> object:
    """One decode step at position ctx over a static cache, as generate() calls it."""
    return model(
        input_ids=tok,
        past_key_values=cache,
        cache_position=torch.tensor([ctx]),
        position_ids=torch.full((tok.shape[0], 1), ctx),
        attention_mask=torch.ones(tok.shape[0], ctx + 1, dtype=torch.long),
    )


def split_cache(cp: object, ctx: int, steps: int) -> object:
    """A torch_plugin split cache holding this rank's blocks of the common content."""
    from torch_plugin.cache_parallelism.hf import make_cache

    cache = make_cache(cp.config, cp.placement, ctx + steps + 2)
    for i, layer in enumerate(cache.layers):
        k, v = cache_content(i, ctx)
        layer.update(k, v)  # a prompt: every rank keeps its own blocks
    return cache


def tp_model(base: torch.nn.Module, mesh: object) -> torch.nn.Module:
    from benchmarks.hf_sharding import dtensor_megatron

    return dtensor_megatron(copy.deepcopy(base), mesh)


def timed(step, steps: int, everyone: bool = True) -> float:
    """Seconds per step of `steps` decode steps after one warm-up (barriers around the timed
    part when every rank runs it)."""
    step()
    if everyone:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if everyone:
        dist.barrier()
    return (time.perf_counter() - t0) / steps


def worker(rank: int, port: int, contexts: list[int], steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=900)
    )
    from torch.distributed.device_mesh import init_device_mesh

    import torch_plugin

    mesh = init_device_mesh("cpu", (WORLD,))
    base = build_model()
    tok = torch.randint(
        0, CONFIG["vocab_size"], (BATCH, 1), generator=torch.Generator().manual_seed(7)
    )
    cp = torch_plugin.cache_parallel(copy.deepcopy(base), mesh, block_size=64)
    helix = torch_plugin.cache_parallel(copy.deepcopy(base), mesh, block_size=64, helix=True)
    tp = tp_model(base, mesh)
    kv_per_rank = CONFIG["num_key_value_heads"] // WORLD
    heads = slice(rank * kv_per_rank, (rank + 1) * kv_per_rank)

    def params(m: torch.nn.Module) -> int:
        total = 0
        for p in m.parameters():
            p = p.to_local() if hasattr(p, "to_local") else p
            total += p.numel() * p.element_size()
        return total

    res: dict = {
        "seconds": {s: {} for s in STRATEGIES},
        "param_bytes_per_rank": {
            "single": params(base),
            "cp": params(cp),
            "helix": params(helix),
            "tp": params(tp),
        },
        "kv_bytes_per_rank": {s: {} for s in STRATEGIES},
        "comm_bytes_per_step": {},
        "comm_calls_per_step": {},
        "check": {},
    }
    with torch.no_grad():
        for ctx in contexts:
            if ctx == contexts[0]:  # every strategy's logits against the single process
                want = static_step(base, static_cache(base, ctx), tok, ctx).logits
                for name, m, cache in (
                    ("cp", cp, split_cache(cp, ctx, steps)),
                    ("helix", helix, split_cache(helix, ctx, steps)),
                    ("tp", tp, static_cache(tp, ctx, heads)),
                ):
                    if name == "tp":
                        got = static_step(m, cache, tok, ctx).logits
                    else:
                        got = m(input_ids=tok, past_key_values=cache).logits
                    res["check"][f"{name}_max_abs_diff"] = float((got - want).abs().max())
                res["check"]["context"] = ctx
                res["check"]["logit_scale"] = float(want.abs().max())
            # single: rank 0 with both cores while the others wait
            if rank == 0:
                torch.set_num_threads(2)
                cache = static_cache(base, ctx)
                res["seconds"]["single"][ctx] = timed(
                    lambda c=cache, n=ctx: static_step(base, c, tok, n), steps, everyone=False
                )
                res["kv_bytes_per_rank"]["single"][ctx] = sum(
                    layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
                )
                del cache
                torch.set_num_threads(1)
            dist.barrier()
            for name, m in (("cp", cp), ("helix", helix)):
                cache = split_cache(m, ctx, steps)
                m.comm.reset_counts()
                res["seconds"][name][ctx] = timed(
                    lambda m=m, c=cache: m(input_ids=tok, past_key_values=c), steps
                )
                res["kv_bytes_per_rank"][name][ctx] = sum(
                    layer.local_bytes() for layer in cache.layers
                )
                if ctx == contexts[0]:
                    res["comm_bytes_per_step"][name] = sum(m.comm.bytes_sent.values()) / (steps + 1)
                    res["comm_calls_per_step"][name] = {
                        k: v / (steps + 1) for k, v in m.comm.calls.items()
                    }
                del cache
            cache = static_cache(tp, ctx, heads)
            res["seconds"]["tp"][ctx] = timed(
                lambda c=cache, n=ctx: static_step(tp, c, tok, n), steps
            )
            res["kv_bytes_per_rank"]["tp"][ctx] = sum(
                layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
            )
            if ctx == contexts[0]:
                from torch.distributed.tensor.debug import CommDebugMode

                with CommDebugMode() as comm:
                    static_step(tp, cache, tok, ctx)
                counts = {str(k): v for k, v in comm.get_comm_counts().items()}
                act = BATCH * CONFIG["hidden_size"] * 4  # [B, 1, hidden] fp32 per all-reduce
                res["comm_bytes_per_step"]["tp"] = (
                    sum(counts.values()) * 2 * (WORLD - 1) / WORLD * act
                )
                res["comm_calls_per_step"]["tp"] = counts
            del cache
            if rank == 0:
                row = "  ".join(f"{s} {BATCH / res['seconds'][s][ctx]:8.1f}" for s in STRATEGIES)
                print(f"  context {ctx:>6}: {row} tokens/s", flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def run(contexts: list[int], steps: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(), "hf_decode.json")
    mp.spawn(worker, args=(port, contexts, steps, out), nprocs=WORLD, join=True)
    with open(out) as f:
        return json.load(f)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ctx = [r["context"] for r in rows]
    for s in STRATEGIES:
        a.plot(ctx, [r[f"{s}_tokens_per_s"] for r in rows], marker="o", label=s)
        if s != "single":
            b.plot(ctx, [r[f"{s}_vs_single"] for r in rows], marker="o", label=s)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (positions of cache)")
        ax.legend()
    a.set_ylabel("tokens/s")
    a.set_title(f"HF Llama decode, batch {BATCH}, {WORLD} gloo ranks on 2 cores")
    b.axhline(1.0, color="grey", lw=0.8)
    b.set_ylabel("tokens/s relative to one process")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-context", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    contexts = [c for c in (1024, 2048, 4096, 8192, 16384, 32768) if c <= args.max_context]
    print(f"HF Llama decode on {WORLD} gloo ranks (batch {BATCH}, {CONFIG})")
    res = run(contexts, args.steps)
    rows = []
    for ctx in contexts:
        key = str(ctx)
        row: dict = {"context": ctx}
        for s in STRATEGIES:
            row[f"{s}_tokens_per_s"] = BATCH / res["seconds"][s][key]
        for s in STRATEGIES[1:]:
            row[f"{s}_vs_single"] = row[f"{s}_tokens_per_s"] / row["single_tokens_per_s"]
        row["helix_vs_cp"] = row["helix_tokens_per_s"] / row["cp_tokens_per_s"]
        row["helix_vs_tp"] = row["helix_tokens_per_s"] / row["tp_tokens_per_s"]
        for s in STRATEGIES:
            row[f"{s}_kv_mb_per_rank"] = res["kv_bytes_per_rank"][s][key] / 1e6
        rows.append(row)
    print(
        f"  {'context':>8} "
        + " ".join(f"{s + ' tok/s':>13}" for s in STRATEGIES)
        + f" {'CP/1':>6} {'Helix/1':>8} {'TP/1':>6} {'Helix/CP':>9} {'Helix/TP':>9}"
    )
    for r in rows:
        print(
            f"  {r['context']:>8} "
            + " ".join(f"{r[s + '_tokens_per_s']:13.1f}" for s in STRATEGIES)
            + f" {r['cp_vs_single']:6.2f} {r['helix_vs_single']:8.2f} {r['tp_vs_single']:6.2f}"
            + f" {r['helix_vs_cp']:9.2f} {r['helix_vs_tp']:9.2f}"
        )
    print(f"  check at {res['check']['context']}: {res['check']}")
    print(f"  parameter bytes per rank: {res['param_bytes_per_rank']}")
    print(f"  bytes sent per rank and step: {res['comm_bytes_per_step']}")

    from benchmarks.cache_parallel import kernel_bench

    print("split-KV kernel at Llama-3-8B's attention shape (32 query / 8 KV heads of 128):")
    kernel = kernel_bench([32768])
    out = {
        "config": CONFIG,
        "batch": BATCH,
        "world": WORLD,
        "steps": args.steps,
        "rows": rows,
        "check": res["check"],
        "param_bytes_per_rank": res["param_bytes_per_rank"],
        "comm_bytes_per_step": res["comm_bytes_per_step"],
        "comm_calls_per_step": res["comm_calls_per_step"],
        "kernel": kernel,
        "baseline_cache": "StaticCache (preallocated), generate()'s cache positions and mask",
        "torch": torch.__version__,
    }
    os.makedirs(RESULTS, exist_ok=True)
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(os.path.join(RESULTS, "hf_decode.json"), out)
    plot(rows, os.path.join(RESULTS, "hf_decode.png"))
    print(f"wrote {RESULTS}/hf_decode.json and hf_decode.png")


if __name__ == "__main__":
    main()
