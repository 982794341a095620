"""Cache parallelism for long-context decoding: kernel, 4-rank CPU runs, and modelled GPUs.

1. Kernel: our CPU split-KV decode attention (+ merge) vs torch's scaled_dot_product_attention
   for one new token over a 1K..32K cache (Llama-3-8B attention shape: 32 query heads, 8 KV
   heads, head_dim 128, fp32, batch 1). Target: >= 1.0x at 32K.
2. Real decoding on 4 gloo ranks of this CPU: a 2-layer Llama-style decoder (dim 256, 4 heads,
   batch 4) with its KV caches filled to 1K..16K, tokens/s of
     CP  torch_plugin.cache_parallel (the pass's scheme choice, sequence-sharded cache),
     TP  torch's DTensor plan (ColwiseParallel q/k/v/w1/w3, RowwiseParallel wo/w2, heads and
         cache split over ranks: the Megatron layout),
     DP  one request per rank, whole model and cache local.
   CP's logits are checked against single-process eager on the same cache first. 4 ranks share
   2 cores here, so absolute rates are low and the ratios are the result.
3. Modelled (cost/decode_model.h): one Llama-7B layer, tokens/s per layer for DP, TP and CP on
   4 x A5000 (the thesis's box) and 8 x H100, batch 32..512, context 1K..128K; where CP
   overtakes TP. DP's imbalance comes from seeded request lengths uniform in [L/2, 3L/2].

    python benchmarks/cache_parallel.py [--skip-real] [--max-context 16384]

Writes benchmarks/results/cache_parallel.{json,png}.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import torch_plugin
from torch_plugin import _C
from torch_plugin.models.llama import build_llama

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REAL = dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=688, vocab_size=1000)
REAL_BATCH, REAL_STEPS = 4, 4


def _median_time(fn, reps: int = 7) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def read_bandwidth(x: torch.Tensor | None = None) -> float:
    """Bytes/s this process reads from memory: torch.sum over 512 MiB (past every cache), the
    median of 9, at the benchmark's thread count; the floor of a memory-bound kernel."""
    x = torch.randn(1 << 27) if x is None else x
    return x.numel() * x.element_size() / _median_time(lambda: x.sum(), reps=9)


def kernel_bench(contexts: list[int]) -> list[dict]:
    """Per context: our kernel (its AVX-512 form where the CPU has one, and the AVX2 form),
    SDPA, and the read bandwidth measured just before and just after ours (this VM's bandwidth
    drifts by tens of percent over minutes: the floor is the mean of the two)."""
    torch.manual_seed(0)
    b, hq, hkv, d = 1, 32, 8, 128
    x = torch.randn(1 << 27)
    rows = []
    for ctx in contexts:
        q = torch.randn(b, hq, d)
        k, v = torch.randn(b, hkv, ctx, d), torch.randn(b, hkv, ctx, d)
        lengths = torch.full((b,), ctx)
        splits = max(1, min(8, ctx // 512))

        ours = functools.partial(
            torch_plugin.ops.split_kv_decode_attention, q, k, v, lengths, num_splits=splits
        )
        sdpa = functools.partial(
            F.scaled_dot_product_attention, q.unsqueeze(2), k, v, enable_gqa=True
        )

        err = float((ours() - sdpa().squeeze(2)).abs().max())
        os.environ["TP_SPLIT_KV_CPU"] = "avx2"
        try:
            t_avx2 = _median_time(ours)
        finally:
            del os.environ["TP_SPLIT_KV_CPU"]
        bw_before = read_bandwidth(x)
        t_ours = _median_time(ours)
        bw = (bw_before + read_bandwidth(x)) / 2
        t_sdpa = _median_time(sdpa)
        # A library kernel streaming the same keys: MKL's K.q (a GEMV per KV head), what well-
        # tuned code doing arithmetic on each row reads at here.
        kq = functools.partial(torch.matmul, k.view(hkv, ctx, d), q.view(hkv, hq // hkv, d).mT)
        gemv_gbps = k.nbytes / _median_time(kq) / 1e9
        floor = (k.nbytes + v.nbytes) / bw  # reading the cache once
        rows.append(
            dict(
                context=ctx,
                ours_ms=t_ours * 1e3,
                ours_avx2_ms=t_avx2 * 1e3,
                sdpa_ms=t_sdpa * 1e3,
                speedup=t_sdpa / t_ours,
                max_abs_err=err,
                floor_ms=floor * 1e3,
                roofline_fraction=floor / t_ours,
                read_gbps=bw / 1e9,
                ours_gbps=(k.nbytes + v.nbytes) / t_ours / 1e9,
                mkl_gemv_gbps=gemv_gbps,
            )
        )
        print(
            f"  kernel {ctx:>6}: ours {t_ours * 1e3:7.2f} ms (AVX2 form {t_avx2 * 1e3:7.2f})  "
            f"sdpa {t_sdpa * 1e3:7.2f} ms  {t_sdpa / t_ours:5.2f}x  floor {floor * 1e3:6.2f} ms "
            f"at {bw / 1e9:.1f} GB/s: {floor / t_ours:.0%} of the read bandwidth (ours "
            f"{(k.nbytes + v.nbytes) / t_ours / 1e9:.1f} GB/s, MKL's K.q {gemv_gbps:.1f})  "
            f"(max |diff| {err:.1e})"
        )
    return rows


# ----------------------------------------------------------------------------- real, 4 ranks


def _caches(layer: int, ctx: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random cache content for [0, ctx) on every rank and strategy."""
    g = torch.Generator().manual_seed(1000 + layer)
    shape = (REAL_BATCH, cfg.n_kv_heads, ctx, cfg.dim // cfg.n_heads)
    return torch.randn(shape, generator=g) * 0.5, torch.randn(shape, generator=g)


def _decode_rate(step, ctx: int) -> float:
    """tokens/s of REAL_STEPS decode steps at positions ctx, ctx+1, ... (after one warm-up)."""
    step(ctx - 1)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(REAL_STEPS):
        step(ctx + i)
    dist.barrier()
    return REAL_BATCH * REAL_STEPS / (time.perf_counter() - t0)


def _worker(rank: int, world: int, port: int, contexts: list[int], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600)
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    max_ctx = max(contexts) + REAL_STEPS + 2
    torch.manual_seed(0)
    base = build_llama(small=True, **REAL, max_seq_len=max_ctx, max_batch=REAL_BATCH).eval()
    cfg = base.config
    tok = torch.randint(
        0, cfg.vocab_size, (REAL_BATCH, 1), generator=torch.Generator().manual_seed(7)
    )
    results: dict = {"cp": {}, "cp_qkv": {}, "tp": {}, "dp": {}, "check": {}}

    # CP: fill the shards straight from the common cache content.
    cp = torch_plugin.cache_parallel(copy.deepcopy(base), mesh, block_size=64)
    m = cp.manager
    # The other scheme, forced, to see whether the pass's choice was the faster one.
    cp_qkv = torch_plugin.cache_parallel(
        copy.deepcopy(base), mesh, block_size=64, scheme="gather_qkv"
    )
    # DP: one request per rank, the full model and its own cache.
    dp = copy.deepcopy(base)
    # TP: the DTensor Megatron plan; heads and caches split over the ranks.
    tp = copy.deepcopy(base)
    plan = {}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        plan.update(
            {
                p + "attention.wq": ColwiseParallel(),
                p + "attention.wk": ColwiseParallel(),
                p + "attention.wv": ColwiseParallel(),
                p + "attention.wo": RowwiseParallel(),
                p + "feed_forward.w1": ColwiseParallel(),
                p + "feed_forward.w3": ColwiseParallel(),
                p + "feed_forward.w2": RowwiseParallel(),
            }
        )
    parallelize_module(tp, mesh, plan)
    heads_per_rank = cfg.n_kv_heads // world
    for layer in tp.layers:
        att = layer.attention
        att.n_heads //= world
        att.n_kv_heads //= world
        att.cache_k = att.cache_k[:, rank * heads_per_rank : (rank + 1) * heads_per_rank].clone()
        att.cache_v = att.cache_v[:, rank * heads_per_rank : (rank + 1) * heads_per_rank].clone()

    for ctx in contexts:
        for i in range(cfg.n_layers):
            k, v = _caches(i, ctx, cfg)
            key = f"layers.{i}.attention.cache_k"
            for mgr in (m, cp_qkv.manager):
                shard = mgr._shard(key, k, REAL_BATCH, cfg.max_seq_len)
                pos = mgr.local_positions(mgr.local_length(ctx))
                shard.k[:, :, : len(pos)] = k[:, :, pos]
                shard.v[:, :, : len(pos)] = v[:, :, pos]
            att = dp.layers[i].attention
            att.cache_k[:1, :, :ctx] = k[rank : rank + 1]
            att.cache_v[:1, :, :ctx] = v[rank : rank + 1]
            hs = slice(rank * heads_per_rank, (rank + 1) * heads_per_rank)
            tp.layers[i].attention.cache_k[:, :, :ctx] = k[:, hs]
            tp.layers[i].attention.cache_v[:, :, :ctx] = v[:, hs]
        with torch.no_grad():
            if ctx == contexts[0]:  # CP and TP equal eager on the same cache before timing
                ref = copy.deepcopy(base)
                for i in range(cfg.n_layers):
                    k, v = _caches(i, ctx, cfg)
                    ref.layers[i].attention.cache_k[:, :, :ctx] = k
                    ref.layers[i].attention.cache_v[:, :, :ctx] = v
                want = ref(tok, ctx)
                results["check"] = dict(
                    context=ctx,
                    cp_max_abs_diff=float((cp(tok, ctx) - want).abs().max()),
                    cp_qkv_max_abs_diff=float((cp_qkv(tok, ctx) - want).abs().max()),
                    tp_max_abs_diff=float((tp(tok, ctx) - want).abs().max()),
                    dp_max_abs_diff=float(
                        (dp(tok[rank : rank + 1], ctx) - want[rank : rank + 1]).abs().max()
                    ),
                )
            m.comm.reset_counts()
            results["cp"][ctx] = _decode_rate(lambda p: cp(tok, p), ctx)
            results["cp_bytes_per_step"] = sum(
                v for k, v in m.comm.bytes_sent.items() if k != "output"
            ) / (REAL_STEPS + 1)
            if ctx == contexts[0]:  # TP's traffic, counted by torch's CommDebugMode
                from torch.distributed.tensor.debug import CommDebugMode

                with CommDebugMode() as comm:
                    tp(tok, ctx)
                counts = {str(k): v for k, v in comm.get_comm_counts().items()}
                activation = REAL_BATCH * cfg.dim * 4  # [B, 1, dim] fp32 per all-reduce
                results["tp_comm_counts"] = counts
                results["tp_bytes_per_step"] = (
                    sum(counts.values()) * 2 * (world - 1) / world * activation
                )
            results["cp_qkv"][ctx] = _decode_rate(lambda p: cp_qkv(tok, p), ctx)
            results["tp"][ctx] = _decode_rate(lambda p: tp(tok, p), ctx)
            results["dp"][ctx] = _decode_rate(lambda p: dp(tok[rank : rank + 1], p), ctx)
        if rank == 0:
            print(
                f"  4 ranks, context {ctx:>6}: CP {results['cp'][ctx]:7.1f}  "
                f"CP(gather_qkv) {results['cp_qkv'][ctx]:7.1f}  TP "
                f"{results['tp'][ctx]:7.1f}  DP {results['dp'][ctx]:7.1f} tokens/s",
                flush=True,
            )
    results["scheme"] = m.scheme
    layer = dict(
        batch=REAL_BATCH,
        context=contexts[0],
        hidden=cfg.dim,
        q_heads=cfg.n_heads,
        kv_heads=cfg.n_kv_heads,
        head_dim=cfg.dim // cfg.n_heads,
        ffn_hidden=cfg.ffn_dim,
        dtype_bytes=4,
    )
    results["modelled_bytes_per_step"] = {
        name: cfg.n_layers
        * _C.model_decode_layer(layer, world, strategy, "cpu")["bytes_sent_per_rank"]
        for name, strategy in (("cp", "cp_" + m.scheme), ("tp", "tp"), ("dp", "dp"))
    }
    results["cp_cache_bytes"] = m.memory_bytes()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def real_bench(contexts: list[int]) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(), "real.json")
    mp.spawn(_worker, args=(4, port, contexts, out), nprocs=4, join=True)
    with open(out) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- modelled


def _imbalance(batch: int, world: int, ctx: int, seed: int = 0) -> float:
    rng = random.Random(seed)
    lengths = [rng.uniform(0.5 * ctx, 1.5 * ctx) for _ in range(batch)]
    loads = [sum(lengths[i::world]) for i in range(world)]
    return max(loads) / (sum(loads) / world)


def modelled() -> list[dict]:
    rows = []
    llama7b = dict(
        hidden=4096,
        q_heads=32,
        kv_heads=32,
        head_dim=128,
        ffn_hidden=11008,
        dtype_bytes=2,
        layers=1,  # the thesis runs one layer "to maximize sequence length"; memory checked so
    )
    for device, world in (("a5000", 4), ("h100", 8)):
        for batch in (32, 128, 512):
            for ctx in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072):
                layer = dict(
                    llama7b, batch=batch, context=ctx, dp_imbalance=_imbalance(batch, world, ctx)
                )
                row = dict(device=device, world=world, batch=batch, context=ctx)
                for name, strategy in (("dp", "dp"), ("tp", "tp"), ("cp", "cp_gather_qkv")):
                    c = _C.model_decode_layer(layer, world, strategy, device)
                    row[name] = batch / c["total_s"] if c["fits"] and c["valid"] else 0.0
                    row[name + "_bytes"] = c["bytes_sent_per_rank"]
                    row[name + "_overhead_s"] = c["overhead_s"]
                row["thesis_cp_bytes"] = c["thesis_cp_bytes"]
                row["thesis_tp_bytes"] = c["thesis_tp_bytes"]
                rows.append(row)
    return rows


def helix_modelled() -> list[dict]:
    """Helix (KV split by sequence for attention, the rest tensor-parallel, one all-to-all
    between) against plain CP (the better scheme) and plain TP, modelled per layer of a
    Llama-3-8B (32 query / 8 KV heads) on H100s: tokens/s per layer, batch 8..128, 1K..128K.
    Past 8 devices TP duplicates KV heads, Helix does not."""
    rows = []
    llama3_8b = dict(
        hidden=4096, q_heads=32, kv_heads=8, head_dim=128, ffn_hidden=14336, dtype_bytes=2
    )
    for world in (8, 16):
        for batch in (8, 32, 128):
            for ctx in (1024, 4096, 16384, 65536, 131072):
                layer = dict(llama3_8b, batch=batch, context=ctx, layers=32)
                row = dict(world=world, batch=batch, context=ctx)
                for name, strategy in (
                    ("tp", "tp"),
                    ("cp_qkv", "cp_gather_qkv"),
                    ("cp_partials", "cp_gather_partials"),
                    ("helix", "helix"),
                ):
                    c = _C.model_decode_layer(layer, world, strategy, "h100")
                    row[name] = batch / c["total_s"] if c["valid"] else 0.0
                row["cp"] = max(row.pop("cp_qkv"), row.pop("cp_partials"))
                row["best"] = max(("tp", "cp", "helix"), key=lambda k: row[k])
                rows.append(row)
    return rows


def crossover(rows: list[dict], device: str, batch: int) -> int | None:
    for r in rows:
        if r["device"] == device and r["batch"] == batch and r["cp"] > r["tp"] > 0:
            return r["context"]
    return None


def plot(kernel: list[dict], real: dict | None, model: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    ax = axes[0]
    ax.plot([r["context"] for r in kernel], [r["speedup"] for r in kernel], "o-")
    ax.axhline(1.0, color="grey", ls="--")
    ax.set(
        xscale="log",
        xlabel="context (tokens)",
        ylabel="speedup over SDPA",
        title="CPU split-KV decode kernel vs SDPA",
    )
    ax = axes[1]
    if real:
        for name in ("cp", "cp_qkv", "tp", "dp"):
            xs = sorted(int(c) for c in real[name])
            ax.plot(
                xs,
                [real[name][str(c)] if str(c) in real[name] else real[name][c] for c in xs],
                "o-",
                label={
                    "cp": f"CP ({real['scheme']}, the pass's choice)",
                    "cp_qkv": "CP (gather_qkv, forced)",
                }.get(name, name.upper()),
            )
        ax.legend()
    ax.set(
        xscale="log",
        xlabel="context (tokens)",
        ylabel="tokens/s",
        title="4 gloo ranks on 2 CPU cores, 2-layer decoder",
    )
    for ax, (device, world) in zip(axes[2:], (("a5000", 4), ("h100", 8)), strict=True):
        for batch, color in ((32, "C0"), (128, "C1"), (512, "C2")):
            rs = [r for r in model if r["device"] == device and r["batch"] == batch and r["tp"]]
            xs = [r["context"] for r in rs]
            ax.plot(
                xs, [r["cp"] / r["tp"] for r in rs], "-o", color=color, label=f"CP/TP b={batch}"
            )
            ax.plot(xs, [r["dp"] / r["tp"] for r in rs], ":", color=color, label=f"DP/TP b={batch}")
        ax.axhline(1.0, color="grey", ls="--")
        ax.set(
            xscale="log",
            xlabel="context (tokens)",
            ylabel="throughput over TP (modelled)",
            title=f"Llama-7B layer, {world} x {device} (points that fit in memory)",
        )
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--skip-real",
        action="store_true",
        help="do not run the 4-rank decoding; keep the saved results' real section, if any",
    )
    ap.add_argument("--max-context", type=int, default=16384)
    args = ap.parse_args()
    os.makedirs(RESULTS, exist_ok=True)
    torch.set_num_threads(2)
    print("1. kernel (B=1, 32 q heads, 8 KV heads, head_dim 128, fp32)")
    kernel = kernel_bench([1024, 2048, 4096, 8192, 16384, 32768])
    real = None
    saved = os.path.join(RESULTS, "cache_parallel.json")
    if args.skip_real and os.path.exists(saved):
        with open(saved) as f:
            real = json.load(f).get("real")
        if real is not None:
            real["kept_from_an_earlier_run"] = True
    if not args.skip_real:
        contexts = [c for c in (1024, 2048, 4096, 8192, 16384) if c <= args.max_context]
        print("2. real decoding, 4 gloo ranks")
        real = real_bench(contexts)
        print(f"  scheme chosen by the pass: {real['scheme']}; check vs eager: {real['check']}")
        print(
            f"  bytes sent per rank per decode step: CP counted {real['cp_bytes_per_step']:.0f}"
            f", TP counted {real['tp_bytes_per_step']:.0f} ({real['tp_comm_counts']}); "
            f"modelled {real['modelled_bytes_per_step']}"
        )
    print("3. modelled, Llama-7B layer")
    model = modelled()
    for device, world in (("a5000", 4), ("h100", 8)):
        for batch in (32, 128, 512):
            x = crossover(model, device, batch)
            print(
                f"  {world} x {device}, batch {batch}: CP overtakes TP at context "
                f"{x if x else '> 128K'}"
            )
    print("  context  device  batch    DP tok/s    TP tok/s    CP tok/s   CP/TP")
    for r in model:
        if r["batch"] == 128:
            print(
                f"  {r['context']:>7} {r['device']:>7} {r['batch']:>6} {r['dp']:>11.0f} "
                f"{r['tp']:>11.0f} {r['cp']:>11.0f} {r['cp'] / max(r['tp'], 1e-9):7.2f}"
            )
    print("4. modelled, Helix vs CP vs TP: Llama-3-8B layer (32/8 heads) on H100s, tokens/s")
    helix = helix_modelled()
    print("  world  batch  context        TP        CP     Helix  best   Helix/max(TP,CP)")
    for r in helix:
        print(
            f"  {r['world']:>5} {r['batch']:>6} {r['context']:>8} {r['tp']:>9.0f} {r['cp']:>9.0f}"
            f" {r['helix']:>9.0f}  {r['best']:>5}  {r['helix'] / max(r['tp'], r['cp']):.2f}"
        )
    result = dict(
        kernel=kernel,
        real=real,
        modelled=model,
        helix_modelled=helix,
        crossover={
            f"{w}x{d}_b{b}": crossover(model, d, b)
            for d, w in (("a5000", 4), ("h100", 8))
            for b in (32, 128, 512)
        },
        host=dict(
            threads=torch.get_num_threads(), torch=torch.__version__, python=sys.version.split()[0]
        ),
    )
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(os.path.join(RESULTS, "cache_parallel.json"), result)
    plot(kernel, real, model, os.path.join(RESULTS, "cache_parallel.png"))
    print("wrote benchmarks/results/cache_parallel.{json,png}")


if __name__ == "__main__":
    main()
