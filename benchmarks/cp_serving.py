"""Cache parallelism where it is used: continuous batching of request streams (issue 41).

The thesis evaluated cache parallelism inside a serving engine: requests joining and leaving
the batch every step, maximum batch sizes 32 to 512, long prompts and long decodes, CP against
data and tensor parallelism. This benchmark runs that on what this machine has (2 cores, gloo
ranks of one thread each), on transformers' own continuous batching (`generate_batch`):

  one     transformers' generate_batch in one process on both cores (the baseline: its paged
          cache, its scheduler);
  dp      N replicas, each transformers' generate_batch on 1/N of the requests (round robin)
          with 1/N of the maximum batch;
  cp      torch_plugin.cache_parallel(model, mesh).generate_batch(..., requests="dp"): the
          paged cache split by page over the ranks, the non-attention layers on 1/N of each
          batch's tokens, q/k/v all-gathered, partials back by one all-to-all;
  helix   the same with helix=True: rows replicated, o_proj and the MLP tensor-parallel, the
          partials to their head group by one all-to-all;
  tp      DTensor's Megatron plan (torch's parallelize_module) under transformers' own
          tensor-parallel continuous batching (its cache split by KV head).

Streams: `long_prompts` (prompts of 256-384 tokens, 16 new) and `long_decodes` (prompts of
16-64 tokens, 64 new), 32 requests each, maximum batch 8 / 16 / 32 (the thesis's 32 / 128 /
512 scaled to 32 requests), 2 and 4 ranks. Figures: tokens/s and per-step latency (median and
spread over --runs runs), every contender's tokens against `one`'s, the bytes each rank sent
per step (measured for cp, helix and tp, against the thesis's formulas for cp and tp from the
tokens each step processed), and a projection to 4 and 8 H100s from the decode cost model
(`_C.model_decode_layer`, a model, not a measurement).

    python benchmarks/cp_serving.py [--runs 5] [--worlds 2 4] [--quick]
    python benchmarks/cp_serving.py --suite [--worlds 2 4]

Writes benchmarks/results/cp_serving.{json,png}; --suite: generate_batch on every HF suite
decoder (tokens against transformers' one process, or the reason it is refused) into
benchmarks/results/cp_serving_suite.json; --projection: only the modelled H100 projection into
benchmarks/results/cp_serving_projection.json.
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# A Llama scaled for 2 cores; 8 query / 4 KV heads so TP divides the heads over 4 ranks.
CONFIG = dict(
    vocab_size=1000,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
)
STREAMS = {
    "long_prompts": dict(requests=32, prompt=(256, 384), new=16),
    "long_decodes": dict(requests=32, prompt=(16, 64), new=64),
}
MAX_BATCH = (8, 16, 32)
CONTENDERS = ("one", "dp", "cp", "helix", "tp")
PAGE = 32


def build_model() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIG, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).eval()


def stream(kind: str, seed: int = 0) -> tuple[list[list[int]], int]:
    spec = STREAMS[kind]
    g = torch.Generator().manual_seed(seed)
    lo, hi = spec["prompt"]
    lengths = torch.randint(lo, hi + 1, (spec["requests"],), generator=g).tolist()
    prompts = [torch.randint(1, CONFIG["vocab_size"], (n,), generator=g).tolist() for n in lengths]
    return prompts, spec["new"]


def cb_config(max_batch: int, longest: int) -> Any:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    blocks = max_batch * -(-longest // PAGE) + 8  # room for max_batch requests at full length
    return ContinuousBatchingConfig(
        num_blocks=blocks,
        page_size=PAGE,
        max_batch_tokens=512,
        max_requests_per_batch=max_batch,
    )


def generation(new: int) -> Any:
    from transformers import GenerationConfig

    # eos -1: every request generates `new` tokens, so every contender does the same work.
    return GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)


class Steps:
    """Model calls (one per engine step) on this rank."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.n = 0
        model.register_forward_pre_hook(self._count)

    def _count(self, *args: Any) -> None:
        self.n += 1


class CollectiveBytes(TorchDispatchMode):
    """Bytes this rank sends in the functional collectives DTensor issues (the TP contender),
    by the ring model the cache-parallel counters use: all-reduce 2(n-1)/n of the tensor,
    all-gather n-1 copies of the input, reduce-scatter and all-to-all (n-1)/n of it. DTensor
    ops are passed on to DTensor (NotImplemented), so the collectives its dispatch issues come
    back here."""

    FACTORS = {
        "all_reduce": lambda n: 2 * (n - 1) / n,
        "all_gather_into_tensor": lambda n: n - 1,
        "reduce_scatter_tensor": lambda n: (n - 1) / n,
        "all_to_all_single": lambda n: (n - 1) / n,
    }

    def __init__(self, world: int) -> None:
        super().__init__()
        self.world = world
        self.sent: dict[str, float] = collections.defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        if func.namespace == "_c10d_functional":
            name = func.__name__.split(".")[0].removesuffix("_")
            factor = self.FACTORS.get(name)
            if factor is not None and isinstance(args[0], torch.Tensor):
                t = args[0]
                self.sent[f"tp_{name}"] += factor(self.world) * t.numel() * t.element_size()
        return func(*args, **(kwargs or {}))


class CountedForward:
    """The TP model's forward, each call (an engine step, in transformers' generation thread)
    under CollectiveBytes while `on`; counts the tokens the steps processed."""

    def __init__(self, model: torch.nn.Module, world: int) -> None:
        self.forward, self.world = model.forward, world
        self.on = False
        self.mode = CollectiveBytes(world)
        self.tokens = 0
        model.forward = self

    def reset(self, on: bool) -> None:
        self.on, self.tokens = on, 0
        self.mode = CollectiveBytes(self.world)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.on:
            return self.forward(*args, **kwargs)
        ids = kwargs.get("input_ids")
        self.tokens += int(ids.numel()) if isinstance(ids, torch.Tensor) else 0
        with self.mode:
            return self.forward(*args, **kwargs)


def hf_generate(model: torch.nn.Module, prompts: list[list[int]], new: int, cb: Any) -> dict:
    out = model.generate_batch(prompts, generation(new), cb)
    return {k: list(v.generated_tokens) for k, v in out.items()}


def worker(rank: int, world: int, port: int, args: dict, out: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600)
    )
    from torch.distributed.device_mesh import init_device_mesh

    import torch_plugin
    from benchmarks.hf_sharding import dtensor_megatron

    mesh = init_device_mesh("cpu", (world,))
    base = build_model()
    models = {
        "one": base,
        "dp": base,
        "cp": torch_plugin.cache_parallel(copy.deepcopy(base), mesh),
        "helix": torch_plugin.cache_parallel(copy.deepcopy(base), mesh, helix=True),
        "tp": dtensor_megatron(copy.deepcopy(base), mesh),
    }
    models["tp"]._device_mesh = mesh  # transformers' tensor-parallel serving over the mesh
    counters = {
        "one": Steps(base),
        "cp": Steps(models["cp"].module),
        "helix": Steps(models["helix"].module),
        "tp": Steps(models["tp"]),
    }
    counters["dp"] = counters["one"]
    # TP's bytes: counted in the untimed first run only (the dispatch mode costs time).
    tp_forward = CountedForward(models["tp"], world)
    rows = []
    for kind in args["streams"]:
        prompts, new = stream(kind)
        longest = max(len(p) for p in prompts) + new
        for max_batch in args["max_batch"]:
            reference: dict | None = None
            for name in args["contenders"]:
                times, steps, equal, sent = [], [], None, {}
                processed, sent_steps = 0, 1.0
                for run in range(args["runs"] + 1):  # the first run warms up, untimed
                    counter = counters[name]
                    counter.n = 0
                    dist.barrier()
                    t0 = time.perf_counter()
                    got: dict | None = None
                    if name == "one":
                        if rank == 0:
                            torch.set_num_threads(2)
                            got = hf_generate(base, prompts, new, cb_config(max_batch, longest))
                            torch.set_num_threads(1)
                    elif name == "dp":
                        mine = prompts[rank::world]
                        got = hf_generate(
                            base, mine, new, cb_config(max(1, max_batch // world), longest)
                        )
                        # request ids are per replica: key by the prompt's index in the stream
                        got = {
                            f"req_{rank + world * int(k.split('_')[1])}": v for k, v in got.items()
                        }
                    elif name in ("cp", "helix"):
                        m = models[name]
                        m.comm.reset_counts()
                        res = m.generate_batch(
                            prompts, generation(new), cb_config(max_batch, longest)
                        )
                        got = {k: list(v.generated_tokens) for k, v in res.items()}
                        sent = dict(m.comm.bytes_sent)
                        processed = m.last_cb.tokens
                    else:
                        tp_forward.reset(on=run == 0)
                        got = hf_generate(models["tp"], prompts, new, cb_config(max_batch, longest))
                        if run == 0:
                            sent = dict(tp_forward.mode.sent)
                            processed = tp_forward.tokens
                        tp_forward.reset(on=False)
                    dist.barrier()
                    elapsed = time.perf_counter() - t0
                    n_steps = torch.tensor([float(counter.n)])
                    dist.all_reduce(n_steps, op=dist.ReduceOp.MAX)
                    if name in ("cp", "helix") or run == 0:
                        sent_steps = max(float(n_steps), 1.0)
                    if run == 0:
                        equal = check(got, name, rank, world, reference)
                        if name == "one":
                            reference = broadcast_tokens(got, rank)
                        continue
                    times.append(elapsed)
                    steps.append(float(n_steps))
                row = dict(
                    stream=kind,
                    max_batch=max_batch,
                    world=world,
                    contender=name,
                    tokens=len(prompts) * new,
                    seconds=times,
                    steps=steps,
                    tokens_per_s=[len(prompts) * new / t for t in times],
                    step_ms=[1e3 * t / max(s, 1.0) for t, s in zip(times, steps, strict=True)],
                    equal_to_one=equal,
                )
                if sent:  # cp, helix: the last run's counts; tp: the first run's (measured)
                    row["bytes_per_step"] = {k: v / sent_steps for k, v in sent.items()}
                    row["tokens_per_step"] = processed / sent_steps
                rows.append(row)
                if rank == 0:
                    tps = statistics.median(row["tokens_per_s"])
                    print(
                        f"  {world} ranks {kind:>12} max batch {max_batch:>3} {name:>5}: "
                        f"{tps:8.1f} tokens/s, {statistics.median(row['step_ms']):7.1f} ms/step"
                        f"{'' if equal in (None, True) else '  TOKENS DIFFER'}",
                        flush=True,
                    )
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def broadcast_tokens(got: dict | None, rank: int) -> dict:
    holder = [got if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def check(got: dict | None, name: str, rank: int, world: int, reference: dict | None) -> Any:
    """Whether the contender's tokens equal one process's (dp: gathered from the replicas)."""
    if name == "one":
        return None
    if name == "dp":
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, got)
        got = {k: v for part in parts for k, v in part.items()}
    return reference is not None and got == reference


def on_ranks(fn: Any, world: int, *args: Any) -> Any:
    """fn(rank, world, port, *args, out) on `world` fresh gloo processes; what rank 0 wrote."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(), "out.json")
    mp.spawn(fn, args=(world, port, *args, out), nprocs=world, join=True)
    with open(out) as f:
        return json.load(f)


def run(world: int, args: dict) -> list[dict]:
    return on_ranks(worker, world, args)


def thesis_bytes(row: dict) -> dict:
    """The thesis's per-rank volume for the tokens a step processed (fp32, every layer): CP
    all-gathers q, k, v and exchanges partials all-to-all; TP all-reduces twice per layer."""
    n, t = row["world"], row.get("tokens_per_step", 0.0)
    hd = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    q = CONFIG["num_attention_heads"] * hd
    kv = 2 * CONFIG["num_key_value_heads"] * hd
    layers, b = CONFIG["num_hidden_layers"], 4
    gather = (n - 1) * (t / n) * (q + kv) * b
    to_all = (n - 1) / n * t * CONFIG["num_attention_heads"] * (hd + 1) * b
    tp = 2 * 2 * (n - 1) / n * t * CONFIG["hidden_size"] * b
    return {"cp": layers * (gather + to_all), "tp": layers * tp}


def measured_h100() -> dict:
    """The H100 profile with what the GPU script measured on one (benchmarks/results/
    gpu_kernels.json): its read bandwidth for the weights, and our split-KV decode kernel's
    median fraction of it for the KV cache. NVLink stays the preset's (no multi-GPU machine
    was measured). Without that file (or from another device): the preset alone."""
    path = os.path.join(RESULTS, "gpu_kernels.json")
    try:
        with open(path) as f:
            gpu = json.load(f)
    except (OSError, ValueError):
        return {"profile": "h100", "source": "the h100 preset (no gpu_kernels.json)"}
    device = str(gpu.get("device", ""))
    rows = [r for r in gpu.get("split_kv_timing", []) if r.get("variant") == "tensor_core"]
    if "H100" not in device or not rows or not gpu.get("read_bandwidth_gbps"):
        return {"profile": "h100", "source": f"the h100 preset (gpu_kernels.json is {device!r})"}
    read = float(gpu["read_bandwidth_gbps"]) * 1e9
    fraction = statistics.median(float(r["fraction_of_read_bw"]) for r in rows)
    return {
        "profile": {"base": "h100", "mem_bandwidth": read, "attention_bandwidth": read * fraction},
        "source": (
            f"gpu_kernels.json at {gpu.get('commit')} on {device}: read bandwidth "
            f"{read / 1e9:.0f} GB/s, the split-KV decode kernel at {fraction:.2f} of it (median "
            f"of {len(rows)} shapes); NVLink, peak FLOP/s and memory from the h100 preset"
        ),
    }


def projection() -> list[dict]:
    """Modelled (not measured): a Llama-3-8B layer's decode step on 4 and 8 H100s (NVLink), DP
    / TP / CP / Helix tokens/s per layer, from the decode cost model with the H100's measured
    read bandwidth and our decode kernel's measured fraction of it (measured_h100)."""
    from torch_plugin import _C

    device = measured_h100()["profile"]

    layer = dict(hidden=4096, q_heads=32, kv_heads=8, head_dim=128, ffn_hidden=14336, dtype_bytes=2)
    rows = []
    for world in (4, 8):
        for batch in (32, 128, 512):
            for ctx in (4096, 16384, 65536):
                spec = dict(layer, batch=batch, context=ctx, layers=32, dp_imbalance=1.1)
                row: dict = dict(world=world, batch=batch, context=ctx, model=True)
                for name, strategy in (
                    ("dp", "dp"),
                    ("tp", "tp"),
                    ("cp", "cp_gather_qkv"),
                    ("helix", "helix"),
                ):
                    c = _C.model_decode_layer(spec, world, strategy, device)
                    ok = c["valid"] and c.get("fits", True)
                    row[name] = batch / c["total_s"] if ok else 0.0
                fits = [k for k in ("dp", "tp", "cp", "helix") if row[k] > 0]
                row["best"] = max(fits, key=lambda k: row[k]) if fits else None
                rows.append(row)
    return rows


def write(name: str, payload: dict) -> None:
    """benchmarks/results/<name> with its provenance (the repository root is on sys.path)."""
    from benchmarks.provenance import write_results

    os.makedirs(RESULTS, exist_ok=True)
    write_results(os.path.join(RESULTS, name), payload)
    print(f"wrote {RESULTS}/{name}")


def write_projection() -> None:
    """The modelled projection alone (0 where the strategy does not fit 80 GB per device)."""
    rows = projection()
    for r in rows:
        cells = "  ".join(f"{k} {r[k] / 1e3:7.1f}K" for k in ("dp", "tp", "cp", "helix"))
        print(f"  {r['world']} x H100 batch {r['batch']:>3} context {r['context']:>6}: {cells}")
    h100 = measured_h100()
    print(f"  device: {h100['source']}")
    write(
        "cp_serving_projection.json",
        {
            "model": "torch_plugin._C.model_decode_layer (a model, not a measurement)",
            "device": h100["source"],
            "profile": h100["profile"],
            "rows": rows,
        },
    )


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        tps = r["tokens_per_s"]
        med = statistics.median(tps)
        s = dict(
            stream=r["stream"],
            max_batch=r["max_batch"],
            world=r["world"],
            contender=r["contender"],
            tokens_per_s=med,
            tokens_per_s_min=min(tps),
            tokens_per_s_max=max(tps),
            step_ms=statistics.median(r["step_ms"]),
            steps=statistics.median(r["steps"]),
            equal_to_one=r["equal_to_one"],
        )
        if "bytes_per_step" in r:
            s["bytes_per_step"] = sum(r["bytes_per_step"].values())
            s["thesis_bytes_per_step"] = thesis_bytes(r)
        out.append(s)
    for s in out:
        one = [
            o
            for o in out
            if o["contender"] == "one"
            and (o["stream"], o["max_batch"], o["world"])
            == (s["stream"], s["max_batch"], s["world"])
        ]
        if one:
            s["vs_one"] = s["tokens_per_s"] / one[0]["tokens_per_s"]
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world"] for r in rows})
    kinds = list(dict.fromkeys(r["stream"] for r in rows))
    fig, axes = plt.subplots(
        len(worlds), len(kinds), figsize=(6 * len(kinds), 4 * len(worlds)), squeeze=False
    )
    for i, w in enumerate(worlds):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for name in CONTENDERS:
                pts = [
                    r
                    for r in rows
                    if r["world"] == w and r["stream"] == kind and r["contender"] == name
                ]
                if not pts:
                    continue
                xs = [p["max_batch"] for p in pts]
                ax.errorbar(
                    xs,
                    [p["tokens_per_s"] for p in pts],
                    yerr=[
                        [p["tokens_per_s"] - p["tokens_per_s_min"] for p in pts],
                        [p["tokens_per_s_max"] - p["tokens_per_s"] for p in pts],
                    ],
                    marker="o",
                    capsize=3,
                    label=name,
                )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("maximum batch (requests)")
            ax.set_ylabel("tokens/s")
            ax.set_title(f"{kind}, {w} gloo ranks on 2 cores")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- correctness on the HF suite's decoders (tests and --suite) ------------------------------

NEW_TOKENS = 12


def stream_small(vocab: int, n: int = 36, seed: int = 1) -> list[list[int]]:
    """n prompts of 3 to 40 tokens (ids 1 .. vocab-1)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 41, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (k,), generator=g).tolist() for k in lengths]


def cb_config_small(**kw: Any) -> Any:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    base = dict(num_blocks=48, page_size=8, max_batch_tokens=64)
    base.update(kw)
    return ContinuousBatchingConfig(**base)


class TransformersFails(RuntimeError):
    """transformers' own generate_batch fails on the model in one process (nothing to match)."""


def one_process(
    model: Any, inputs: list[list[int]], gen: Any, cb: Any = None
) -> tuple[dict[str, list[int]], int]:
    """transformers' own generate_batch in this process: tokens by request id, and the most
    cache blocks it held at once."""
    held = {"now": 0, "peak": 0}
    manager = model.init_continuous_batching(gen, cb if cb is not None else cb_config_small())
    create = manager._create_batch_processor

    def created() -> Any:
        processor = create()
        pool = processor.cache.pool
        if not getattr(pool, "_counted", False):
            get, free = pool.get_free_blocks, pool.free_blocks

            def got(index: int, n: int) -> list[int]:
                blocks = get(index, n)
                held["now"] += len(blocks)
                held["peak"] = max(held["peak"], held["now"])
                return blocks

            def freed(index: int, blocks: list[int]) -> None:
                held["now"] -= len(blocks)
                free(index, blocks)

            pool.get_free_blocks, pool.free_blocks, pool._counted = got, freed, True
        return processor

    manager._create_batch_processor = created
    manager.start()
    ids = manager.add_requests(inputs, max_new_tokens=NEW_TOKENS)
    out: dict[str, list[int]] = {}
    while len(out) < len(ids):
        r = manager.get_result(timeout=10)
        assert r is not None, "transformers' generate_batch stalled"
        if r.is_finished():
            if r.error is not None:
                manager.stop(block=True, timeout=10)
                manager.destroy()
                raise TransformersFails(
                    f"transformers' own generate_batch fails on {type(model).__name__}: "
                    f"{str(r.error).splitlines()[-1][:200]}"
                )
            out[r.request_id] = list(r.generated_tokens)
    manager.stop(block=True, timeout=10)
    manager.destroy()
    return out, held["peak"]


def check_decoder(
    rank: int, world: int, name: str, requests: str, page_size: int = 8
) -> dict[str, Any]:
    """cache_parallel(model, mesh).generate_batch on a stream of 36 requests equals
    transformers' generate_batch in one process; this rank's KV blocks at most 1/world of the
    single-process peak plus one per request and attention group. The cache holds 384 tokens
    a layer in pages of `page_size`."""
    from transformers import GenerationConfig

    import torch_plugin
    from torch_plugin.models import hf_suite

    torch.manual_seed(0)
    model, _ = hf_suite.build(name)
    model.eval()
    vocab = model.config.get_text_config().vocab_size
    inputs = stream_small(vocab)
    greedy = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=hf_suite.PAD)
    # An end-of-sequence token the model emits early for some requests: some finish early.
    cb = cb_config_small(page_size=page_size, num_blocks=384 // page_size)
    first, _ = one_process(model, inputs, GenerationConfig(**greedy, eos_token_id=-1), cb)
    counts = collections.Counter(t for toks in first.values() for t in toks[1 : NEW_TOKENS // 2])
    eos = counts.most_common(1)[0][0]
    gen = GenerationConfig(**greedy, eos_token_id=eos)
    want, peak = one_process(model, inputs, gen, cb)
    mesh = torch_plugin.DeviceMesh((world,), timeout_s=60)
    helix = requests == "helix"  # o_proj and the MLP tensor-parallel, rows replicated
    cp = torch_plugin.cache_parallel(model, mesh, helix=helix)
    got = cp.generate_batch(inputs, gen, cb, requests="replicated" if helix else requests)
    shard = cp.last_cb.shard
    return {
        "equal": {k: v.generated_tokens for k, v in got.items()} == want,
        "early": sum(len(v) < NEW_TOKENS for v in want.values()),
        "requests": len(got),
        "peak_blocks": shard.peak,
        "groups": len(shard.groups),  # attention groups (full, sliding window)
        "most_requests": shard.most_requests,
        "transformers_cache_device": shard.transformers_cache_device,
        "mask_allocated": cp.last_cb.mask_allocated,
        "ids_only": cp.last_cb.ids_only,
        "vocab": vocab,
        "one_process_peak_blocks": peak,
        "steps": cp.last_cb.steps,
        "kernel_calls": cp.last_cb.kernel_calls,
        "layers": model.config.get_text_config().num_hidden_layers,
        "bytes": dict(cp.comm.bytes_sent),
    }


def suite_worker(rank: int, world: int, port: int, names: list[str], out: str) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    cells = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            r = check_decoder(rank, world, name, "dp")
            ok = torch.tensor([float(r["equal"])])
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            cell = dict(status="pass" if ok.item() else "mismatch", **r)
        except TransformersFails as e:
            cell = dict(status="transformers_fails", reason=str(e)[:300])
        except NotImplementedError as e:
            cell = dict(status="refused", reason=str(e).splitlines()[0][:300])
        except Exception as e:  # noqa: BLE001 - every failure is a cell of the table
            cell = dict(
                status="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            )
        cell["seconds"] = time.perf_counter() - t0
        cells[name] = cell
        if rank == 0:
            print(
                f"  {world} ranks {name:>14}: {cell['status']} {cell.get('reason', '')}", flush=True
            )
        dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(cells, f)
    dist.destroy_process_group()


def suite(worlds: list[int]) -> None:
    """generate_batch on every suite decoder: tokens equal to transformers' one process, or
    the reason it is refused."""
    from torch_plugin.models import hf_suite

    names = hf_suite.decoders()
    table = {}
    for world in worlds:
        table[str(world)] = on_ranks(suite_worker, world, names)
    counts = {
        w: collections.Counter(c["status"] for c in cells.values()) for w, cells in table.items()
    }
    print(f"  {counts}")
    write(
        "cp_serving_suite.json",
        {"decoders": names, "by_world": table, "counts": counts, "requests": 36},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-batch", type=int, nargs="+", default=list(MAX_BATCH))
    ap.add_argument("--streams", nargs="+", default=list(STREAMS))
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS))
    ap.add_argument("--quick", action="store_true", help="1 run, 2 ranks, batch 8 (a smoke run)")
    ap.add_argument(
        "--suite", action="store_true", help="generate_batch on every suite decoder instead"
    )
    ap.add_argument(
        "--projection", action="store_true", help="only the modelled H100 projection (no ranks)"
    )
    args = vars(ap.parse_args())
    if args.pop("suite"):
        suite(args["worlds"])
        return
    if args.pop("projection"):
        write_projection()
        return
    if args.pop("quick"):
        args.update(runs=1, worlds=[2], max_batch=[8])
    print(f"continuous batching of request streams, {CONFIG}")
    rows = []
    for world in args["worlds"]:
        rows += run(world, {k: v for k, v in args.items() if k != "worlds"})
    table = summary(rows)
    model = projection()
    print("  modelled, 8 x H100, Llama-3-8B layer (tokens/s per layer; best):")
    for r in model:
        if r["world"] == 8:
            print(f"    batch {r['batch']:>3} context {r['context']:>6}: best {r['best']}")
    out = {
        "config": CONFIG,
        "streams": STREAMS,
        "page_size": PAGE,
        "runs": args["runs"],
        "rows": table,
        "raw": rows,
        "projection_model": model,
        "torch": torch.__version__,
    }
    write("cp_serving.json", out)
    plot(table, os.path.join(RESULTS, "cp_serving.png"))
    print(f"wrote {RESULTS}/cp_serving.png")


if __name__ == "__main__":
    main()
