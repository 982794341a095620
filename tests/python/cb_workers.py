"""Workers for cache parallelism under transformers' continuous batching (issue 41): run on
the kept-alive gloo ranks (`pool.run(fn, *args)` calls fn(rank, world, *args))."""

from __future__ import annotations

import collections
from typing import Any

import torch

NEW_TOKENS = 12


def stream(vocab: int, n: int = 36, seed: int = 1) -> list[list[int]]:
    """n prompts of 3 to 40 tokens (ids 1 .. vocab-1)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 41, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (k,), generator=g).tolist() for k in lengths]


def cb_config(**kw: Any) -> Any:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    base = dict(num_blocks=48, page_size=8, max_batch_tokens=64)
    base.update(kw)
    return ContinuousBatchingConfig(**base)


def one_process(model: Any, inputs: list[list[int]], gen: Any) -> tuple[dict[str, list[int]], int]:
    """transformers' own generate_batch in this process: tokens by request id, and the most
    cache blocks it held at once."""
    held = {"now": 0, "peak": 0}
    manager = model.init_continuous_batching(gen, cb_config())
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
            out[r.request_id] = list(r.generated_tokens)
    manager.stop(block=True, timeout=10)
    manager.destroy()
    return out, held["peak"]


def generate_batch_matches(rank: int, world: int, name: str, requests: str) -> dict[str, Any]:
    """cache_parallel(model, mesh).generate_batch on a stream of 36 requests equals
    transformers' generate_batch in one process; this rank's KV blocks at most 1/world of the
    single-process peak plus one per request."""
    from transformers import GenerationConfig

    import torch_plugin
    from torch_plugin.models import hf_suite

    torch.manual_seed(0)
    model, _ = hf_suite.build(name)
    model.eval()
    vocab = model.config.get_text_config().vocab_size
    inputs = stream(vocab)
    greedy = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=hf_suite.PAD)
    # An end-of-sequence token the model emits early for some requests: some finish early.
    first, _ = one_process(model, inputs, GenerationConfig(**greedy, eos_token_id=-1))
    counts = collections.Counter(t for toks in first.values() for t in toks[1 : NEW_TOKENS // 2])
    eos = counts.most_common(1)[0][0]
    gen = GenerationConfig(**greedy, eos_token_id=eos)
    want, peak = one_process(model, inputs, gen)
    mesh = torch_plugin.DeviceMesh((world,), timeout_s=60)
    helix = requests == "helix"  # o_proj and the MLP tensor-parallel, rows replicated
    cp = torch_plugin.cache_parallel(model, mesh, helix=helix)
    got = cp.generate_batch(inputs, gen, cb_config(), requests="replicated" if helix else requests)
    shard = cp.last_cb.shard
    return {
        "equal": {k: v.generated_tokens for k, v in got.items()} == want,
        "early": sum(len(v) < NEW_TOKENS for v in want.values()),
        "requests": len(got),
        "peak_blocks": shard.peak,
        "most_requests": shard.most_requests,
        "one_process_peak_blocks": peak,
        "steps": cp.last_cb.steps,
        "kernel_calls": cp.last_cb.kernel_calls,
        "layers": model.config.get_text_config().num_hidden_layers,
        "bytes": dict(cp.comm.bytes_sent),
    }
