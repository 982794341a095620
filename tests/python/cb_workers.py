"""Workers for cache parallelism under transformers' continuous batching (issue 41): run on
the kept-alive gloo ranks (`pool.run(fn, *args)` calls fn(rank, world, *args)). The decoder
check itself is benchmarks/cp_serving.py's `check_decoder`, which its --suite run applies to
every suite decoder."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.cp_serving import NEW_TOKENS, cb_config_small, one_process
from benchmarks.cp_serving import stream_small as stream


def manager_form_matches(rank: int, world: int) -> dict[str, Any]:
    """The manager form: init_continuous_batching(), start(), requests added one at a time
    while the loop runs (on rank 0, which broadcasts them), get_result() on every rank."""
    from transformers import GenerationConfig

    import torch_plugin
    from torch_plugin.models import hf_suite

    torch.manual_seed(0)
    model, _ = hf_suite.build("llama")
    model.eval()
    inputs = stream(model.config.vocab_size, n=12, seed=3)
    gen = GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=hf_suite.PAD
    )
    want, _ = one_process(model, inputs, gen)
    cp = torch_plugin.cache_parallel(model, torch_plugin.DeviceMesh((world,), timeout_s=60))
    manager = cp.init_continuous_batching(gen, cb_config_small())
    manager.start()
    for i, prompt in enumerate(inputs):  # a no-op on ranks other than 0
        manager.add_request(prompt, request_id=f"req_{i}", max_new_tokens=NEW_TOKENS)
    got: dict[str, list[int]] = {}
    while len(got) < len(inputs):
        r = manager.get_result(timeout=30)
        assert r is not None, f"rank {rank}: no result within 30 s"
        if r.is_finished():
            got[r.request_id] = list(r.generated_tokens)
    manager.stop(block=True, timeout=30)
    manager.destroy()
    return {
        "equal": got == want,
        "attention_restored": model.config._attn_implementation == "sdpa",
        "peak_blocks": cp.last_cb.shard.peak,
    }
