"""Cache parallelism: the C++ pass on real Llama graphs, the sharded KV cache, and greedy decoding
on 2 and 4 gloo ranks against single-process eager."""

from __future__ import annotations

import copy
import functools
import json
import logging
from pathlib import Path
from typing import Any

import aten_graphs
import dist_workers
import pytest
import torch

import torch_plugin
from torch_plugin import _C
from torch_plugin.distributed import KVCacheManager
from torch_plugin.models.llama import build_llama
from torch_plugin.runtime.kv_cache import CacheCapacityError


@pytest.mark.parametrize(
    ("world", "schemes"), [(2, ["gather_qkv", "auto"]), (4, ["gather_partials"])]
)
def test_greedy_decode_matches_single_process(
    gloo, tmp_path: Path, world: int, schemes: list[str]
) -> None:
    steps = 16
    dist_workers.pooled(gloo(world), dist_workers.cp_decode_matches, schemes, steps, str(tmp_path))
    for scheme in schemes:
        for rank in range(world):
            r = json.loads((tmp_path / f"rank{rank}_{scheme}.json").read_text())
            assert r["sites"] == 2, "both layers' attention must be rewritten"
            assert r["cp_tokens"] == r["ref_tokens"]
            assert len(r["cp_tokens"]) == steps
            assert r["max_logit_diff"] < 1e-4
            if scheme != "auto":
                assert r["scheme"] == scheme
            # Counted traffic of every decode step equals the model's per-layer volume x layers.
            expected = r["modelled_bytes_per_layer"] * r["layers"]
            assert r["bytes_per_step"] == [pytest.approx(expected)] * steps
            # Each rank holds its share of the cache (blocks of 4 over a 64-position cache).
            assert r["cache_bytes"] == r["full_cache_bytes"] // world


def test_caches_written_and_masked_as_users_write_them_decode_split(gloo) -> None:
    """index_copy_ / index_put writes at positions (StaticCache), attention over the whole
    cache under its mask, sliding windows and left padding: on 2 ranks, both schemes, every
    attention rewritten and the greedy tokens and logits those of single-process eager."""
    per_rank = dist_workers.pooled(gloo(2), dist_workers.cp_cache_variants, 4)
    for results in per_rank:
        assert len(results) == 4
        assert {r["scheme"] for r in results} == {"gather_partials", "gather_qkv"}
        for r in results:
            assert r["sites"] == 2, r
            assert r["masked"], r  # window or padding: a general mask
            assert r["indexed"] == (r["variant"].get("cache_write", "slice") != "slice"), r
            assert r["same_tokens"], r
            assert r["max_logit_diff"] < 1e-4, r


def test_caches_passed_as_forward_arguments_are_split(gloo) -> None:
    """A decoder taking its KV caches as arguments and writing them in place: the attention
    is rewritten (the caches keyed by their argument names), each rank holds half of the
    positions, and outputs equal eager's on 2 ranks."""
    for r in dist_workers.pooled(gloo(2), dist_workers.cp_cache_arguments, 3):
        assert r["sites"] == 1
        assert r["max_diff"] < 1e-5
        assert r["local_bytes"] == 2 * 2 * 2 * 16 * 8 * 4  # k and v, half of 32 positions


def test_a_cache_grown_by_cat_and_returned_is_split(gloo) -> None:
    """DynamicCache-style growth, cat([past, new], 2) returned by the step: on 2 ranks the
    outputs equal eager's over a prompt and 3 decode steps, the step returns a placeholder of
    the grown shape (stride 0: no memory) that the next step takes back, and a cache other
    than the one returned is refused with what to do."""
    for r in dist_workers.pooled(gloo(2), dist_workers.cp_cat_growth, 3):
        assert r["sites"] == 1 and r["grown"]
        assert r["max_diff"] < 1e-5
        assert r["placeholder_shape"] == [2, 2, 8, 8] and r["placeholder_strides"] == [0, 0, 0, 0]
        assert r["local_positions"] == 8
        assert "pass back the cache this model returned" in r["refused"]


def test_default_compile_with_a_mesh_decodes_cache_parallel(gloo, tmp_path: Path) -> None:
    dist_workers.pooled(gloo(2), dist_workers.cp_default_compile, str(tmp_path))
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["got"] == r["want"]
        assert any("attention site(s) over 2 rank(s)" in line for line in r["log"]), r["log"]


@functools.lru_cache(maxsize=1)
def _llama_graph(batch: int = 2):
    """The ATen inference graph of one decode step of the small Llama (captured once; graphs
    are immutable)."""
    model = build_llama(small=True).eval()
    return aten_graphs.forward_ir(model, torch.zeros(batch, 3, dtype=torch.long), 5, dynamic=True)


def test_pass_plan_on_llama_graph() -> None:
    g = _llama_graph()
    pm = _C.PassManager()
    plan = pm.plan_cache_parallel(g, _C.CacheParallelOptions(world=2))
    assert [s.cache_k for s in plan.sites] == [
        "layers.0.attention.cache_k",
        "layers.1.attention.cache_k",
    ]
    assert all(s.causal and s.capacity == 64 and s.kv_heads == 2 for s in plan.sites)
    assert plan.scheme == "gather_partials"  # no batch split without the wrapper
    assert "site " in repr(plan) and plan.to_dict()["sites"][0]["kv_heads"] == 2
    options = _C.RewriteOptions(cache_parallel=_C.CacheParallelOptions(world=2))
    new, report = pm.run(g, ["cache_parallel"], options)
    assert report.passes[0].changed and "rewrote 2 attention node(s)" in report.passes[0].notes[0]
    ops = [n[1] for n in new.records()[1]]
    assert ops.count("torch_plugin::cp_attention.default") == 2
    assert not any("slice_scatter" in o or "copy_" in o or "scaled_dot" in o for o in ops)


def test_pass_needs_world_and_says_how() -> None:
    with pytest.raises(torch_plugin.PassError, match=r"cache_parallel\(model, mesh\)"):
        _C.PassManager().run(_llama_graph(), ["cache_parallel"])
    with pytest.raises(torch_plugin.PassError, match="valid: auto, gather_partials, gather_qkv"):
        _C.PassManager().plan_cache_parallel(
            _llama_graph(), _C.CacheParallelOptions(world=2, scheme="ring")
        )
    with pytest.raises(TypeError, match="unknown field 'wrold'; fields: world, handle"):
        _C.CacheParallelOptions(wrold=2)


@pytest.mark.parametrize("gqa", ["sdpa", "repeat_interleave", "repeat_kv"])
def test_compile_path_single_process_equals_eager(
    caplog: pytest.LogCaptureFixture, gqa: str
) -> None:
    """Grouped-query heads as models write them: SDPA's enable_gqa, repeat_interleave, and
    transformers' repeat_kv (expand + reshape); every one is a site."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_llama(small=True, gqa=gqa).eval()
    ref = copy.deepcopy(model)
    compiled = torch.compile(
        model, backend="torch_plugin", options={"passes": ["cache_parallel"]}, dynamic=True
    )
    tokens = torch.randint(0, 1000, (2, 5))
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="torch_plugin"):
        torch.testing.assert_close(compiled(tokens, 0), ref(tokens, 0), rtol=1e-5, atol=1e-5)
        for pos in range(5, 9):
            t = tokens[:, :1] + pos
            torch.testing.assert_close(compiled(t, pos), ref(t, pos), rtol=1e-5, atol=1e-5)
    assert "2 attention site(s)" in caplog.text


def test_nothing_to_split_is_loud_and_names_each_attention_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Llama called without its cache (no start position): its attention reads no cache
    buffer. The compile option warns once per model, naming each attention node and why; under
    on_error="raise" (and through cache_parallel(model), which raises) it is an error."""
    model = build_llama(small=True).eval()
    tokens = torch.randint(0, 1000, (2, 5))
    compiled = torch.compile(
        copy.deepcopy(model), backend="torch_plugin", options={"passes": ["cache_parallel"]}
    )
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="torch_plugin"):
        torch.testing.assert_close(compiled(tokens), model(tokens), rtol=1e-5, atol=1e-5)
        compiled(tokens[:1])  # a recompile of the same model: no second warning
    warnings = [r.getMessage() for r in caplog.records if "nothing to split" in r.getMessage()]
    assert len(warnings) == 1, warnings
    # Each of the two attention nodes by name, each with its reason (one mention of SDPA
    # once satisfied a check for both).
    reasons = warnings[0].split("it runs unsplit: ", 1)[1].split(". The pass")[0].split("; ")
    assert len(reasons) == 2, reasons
    names = [r.split(": ", 1)[0] for r in reasons]
    assert len(set(names)) == 2 and all("scaled_dot_product" in n for n in names), names
    assert all("KV-cache buffer" in r.split(": ", 1)[1] for r in reasons), reasons
    assert "KV-cache buffer" in warnings[0], warnings[0]
    torch._dynamo.reset()
    strict = torch.compile(
        copy.deepcopy(model),
        backend="torch_plugin",
        options={"passes": ["cache_parallel"], "on_error": "raise"},
    )
    with torch.no_grad(), pytest.raises(Exception, match="nothing to split in this"):
        strict(tokens)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="nothing to split in this"):
        torch_plugin.cache_parallel(copy.deepcopy(model))(tokens)


def test_kv_cache_placement_is_balanced_and_prefix_ordered() -> None:
    m = KVCacheManager(block_size=4)
    m.world = 3  # placement arithmetic only
    for end in range(0, 100):
        counts = [m.local_length(end, r) for r in range(3)]
        assert sum(counts) == end
        assert max(counts) - min(counts) <= 4  # at most one block apart
    for r in range(3):
        m.rank = r
        pos = m.local_positions(m.local_length(50))
        assert all(m.owner(int(p)) == r for p in pos)
        assert pos.tolist() == sorted(pos.tolist()) and int(pos.max()) < 50
        assert m.local_slots(pos).tolist() == list(range(len(pos)))


def test_kv_cache_capacity_and_bad_options() -> None:
    m = KVCacheManager(block_size=4)
    k = torch.zeros(1, 2, 3, 8)
    m.append("layer.cache_k", k, k, 0, capacity=8)
    with pytest.raises(CacheCapacityError, match="holds 8 positions.*larger cache"):
        m.append("layer.cache_k", k, k, 6, capacity=8)
    with pytest.raises(ValueError, match="valid: auto, gather_partials, gather_qkv"):
        KVCacheManager(scheme="ring")
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(block_size=0)
    with pytest.raises(TypeError, match="1-D torch_plugin.DeviceMesh or torch DeviceMesh"):
        torch_plugin.cache_parallel(build_llama(small=True), mesh="cpu")


def test_cp_attention_refuses_writes_and_masks_it_cannot_split() -> None:
    """What cp_attention is given at run time is checked: index-write positions that are not
    consecutive, a mask over another number of keys than attention reads, and a cat-grown
    cache that is not the one the model returned each fail naming what to change."""
    m = KVCacheManager(block_size=4)
    q, kv = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 2, 8)

    def attend(start: int, end: int, **kw: Any) -> torch.Tensor:
        return m.attention(q, kv, kv, start, end, False, 0.0, "c", 16, "gather_partials", **kw)

    with pytest.raises(RuntimeError, match="not 2 consecutive positions"):
        attend(-1, 16, positions=torch.tensor([3, 5]))
    with pytest.raises(RuntimeError, match="mask covers 5 keys, attention reads 2"):
        attend(0, 2, mask=torch.zeros(1, 1, 2, 5))
    attend(0, -1)  # a cat-grown cache: 2 positions held now
    with pytest.raises(RuntimeError, match="holds 5 positions, the split cache 2"):
        attend(5, -1)


def test_cp_attention_runs_the_scheme_its_node_carries() -> None:
    """The runtime obeys the planned scheme: a batch that does not fit it is an error naming
    both, not a scheme inferred from the batch (checked before any collective, so a manager
    that believes it has 2 ranks needs none here)."""
    m = KVCacheManager(block_size=4)
    m.world, m.global_batch, m.sliced = 2, 4, True  # the wrapper sliced this call
    kv = torch.randn(4, 2, 1, 8)

    def attend(batch: int, scheme: str) -> torch.Tensor:
        q = torch.randn(batch, 4, 1, 8)
        return m.attention(q, kv[:batch], kv[:batch], 0, 1, False, 0.0, "c", 16, scheme)

    with pytest.raises(RuntimeError, match="scheme gather_qkv runs 1/2 of the batch.*holds 4 of"):
        attend(4, "gather_qkv")
    with pytest.raises(RuntimeError, match="gather_partials runs the whole batch.*holds 2 of"):
        attend(2, "gather_partials")
    with pytest.raises(RuntimeError, match="carries scheme 'auto'"):
        attend(4, "auto")


def test_decorator_wraps_instances() -> None:
    from torch_plugin.models.llama import Llama, LlamaConfig

    Wrapped = torch_plugin.cache_parallel(None, scheme="gather_partials")(Llama)
    cp = Wrapped(
        LlamaConfig(
            dim=32,
            n_layers=1,
            n_heads=2,
            n_kv_heads=1,
            ffn_dim=64,
            vocab_size=50,
            max_seq_len=16,
            max_batch=2,
            seq_len=4,
        )
    )
    assert isinstance(cp, torch_plugin.CacheParallel)
    assert cp.manager.requested_scheme == "gather_partials"


@pytest.mark.multirank
def test_dead_rank_fails_the_others_fast(tmp_path: Path) -> None:
    timeout_s, world = 10.0, 3
    dist_workers.spawn(dist_workers.cp_fault, world, timeout_s, str(tmp_path))
    for r in range(world - 1):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert "torch_plugin cache_parallel" in res["message"] and "peer" in res["message"]
        assert res["seconds"] < timeout_s  # from the failing step's start
        assert "all_gather of partials" in res["message"]


# ---- transformers decoders: generate() with the cache split (issue 28) -----------------------


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("llama", "cp_decode"),
        ("mistral", "cp_decode4"),
        ("falcon", "cp_decode"),
        ("gemma2", "helix4"),
        ("phi3", "helix4"),
        ("gpt2", "helix4"),
        ("mixtral", "helix4"),
        ("falcon", "helix4"),
    ],
)
def test_hf_generate_splits_the_cache_and_keeps_the_tokens(gloo, name: str, entry: str) -> None:
    """cache_parallel(hf_model, DeviceMesh(n)).generate(): 32 greedy tokens for a batch of
    prompts of two lengths (left padding) equal eager generate()'s on every rank; each rank
    holds at most 1/n of the single-process cache plus a block per layer; every decode step of
    every layer ran torch_plugin::split_kv_attention. Mistral's window (8) is shorter than the
    prompt: its layers drop what leaves the window, and the kernel starts after it. Falcon
    calls SDPA itself, not through transformers' registry: that call is intercepted. Helix
    (helix4): the attention's output projection and the MLP (Gemma-2's gate/up/down, Phi-3's
    fused gate_up, GPT-2's Conv1D c_fc/c_proj, Mixtral's MoE experts inside each expert)
    split over the 4 ranks, one all-to-all of partials per layer and step (the cell checks
    both), with Gemma-2's softcapping and sliding windows, and through Falcon's own SDPA
    call."""
    from benchmarks import hf_suite as runner

    figures = runner.run_on_pool(gloo(runner.DISTRIBUTED[entry][0]), entry, name)
    assert figures["tokens"] == 32 and figures["kernel_calls"] >= 62
    if entry.startswith("helix"):
        assert figures["split_fraction"] == pytest.approx(0.25)


def test_hf_cache_layers_hold_their_blocks_and_drop_what_leaves_the_window() -> None:
    """One rank's layer of a 3-rank split, block 4: positions [0, 40) are written as a prompt
    of 10 and 30 single tokens; a full layer holds exactly its blocks, a window-6 layer only
    its positions the next query still sees."""
    from torch_plugin.cache_parallelism.hf import _layer_class
    from torch_plugin.runtime.kv_cache import BlockPlacement

    layer_cls = _layer_class()
    placement = BlockPlacement(3, 1, 4)
    full, sliding = layer_cls(placement, 40, None), layer_cls(placement, 40, 6)
    for layer in (full, sliding):
        k = torch.arange(10.0).view(1, 1, 10, 1)
        assert layer.update(k, k) == (k, k) and layer.full  # the prompt: every key
        for p in range(10, 40):
            t = torch.full((1, 1, 1, 1), float(p))
            layer.update(t, t)
            assert not layer.full
    mine = [p for p in range(40) if (p // 4) % 3 == 1]
    assert full.positions(torch.device("cpu")).tolist() == mine
    assert full.keys[0, 0, : full.n, 0].tolist() == [float(p) for p in mine]
    kept = sliding.positions(torch.device("cpu")).tolist()
    assert kept == [p for p in mine if p >= 39 - 5]
    assert sliding.keys[0, 0, : sliding.n, 0].tolist() == [float(p) for p in kept]
    assert sliding.keys.shape[2] <= 4 + 4  # a window's worth of its blocks, plus one


@pytest.mark.parametrize("per_layer", [True, False])
def test_hf_cache_takes_either_form_of_layer_kwargs(monkeypatch, per_layer: bool) -> None:
    """transformers 5.2x gives one kwargs dict per layer, 5.17 (the GPU machines') one dict for
    all: a Mistral-style config with a window gets sliding layers of that window either way."""
    import transformers.cache_utils as cu

    from torch_plugin.cache_parallelism import hf as hf_cache_parallel
    from torch_plugin.runtime.kv_cache import BlockPlacement

    def layer_types_and_kwargs(config):  # type: ignore[no-untyped-def]
        types = ["sliding_attention", "full_attention", "sliding_attention"]
        kw = {"sliding_window": 6}
        return types, [kw] * len(types) if per_layer else kw

    monkeypatch.setattr(cu, "get_layer_types_and_kwargs", layer_types_and_kwargs)
    config = transformers_config_with_layers(3)
    cache = hf_cache_parallel.make_cache(config, BlockPlacement(2, 0, 4), 40)
    assert [layer.sliding_window for layer in cache.layers] == [6, None, 6]


def transformers_config_with_layers(n: int):  # type: ignore[no-untyped-def]
    import transformers

    return transformers.LlamaConfig(num_hidden_layers=n, hidden_size=32, num_attention_heads=2)


def test_helix_refuses_what_it_cannot_split() -> None:
    """Helix splits Llama-style layers and MoE experts stored as 3-D tensors: experts of
    another layout (biases, as GPT-OSS has) are refused, as are heads or MLP widths that do
    not divide over the ranks, naming what to change; nothing is replaced then."""
    from torch_plugin.cache_parallelism.helix import shard_helix
    from torch_plugin.models import hf_suite
    from torch_plugin.runtime.collectives import Collectives

    mixtral, _ = hf_suite.build("mixtral")
    experts = mixtral.model.layers[0].mlp.experts
    experts.gate_up_proj_bias = torch.nn.Parameter(torch.zeros(experts.gate_up_proj.shape[:2]))
    with pytest.raises(
        NotImplementedError, match="0 dense MLPs and 1 MoE expert sets.*without helix"
    ):
        shard_helix(mixtral, Collectives(None, 2, 0))
    assert experts.gate_up_proj.shape == (4, 256, 64)  # nothing replaced
    llama, _ = hf_suite.build("llama")
    with pytest.raises(ValueError, match="4 query heads, which do not split over 3 ranks"):
        shard_helix(llama, Collectives(None, 3, 0))
    assert isinstance(llama.model.layers[0].self_attn.o_proj, torch.nn.Linear)


def test_hf_generate_refuses_what_it_cannot_split() -> None:
    from torch_plugin.models import hf_suite

    model, inputs = hf_suite.build("llama")
    cp = torch_plugin.cache_parallel(model.eval(), None)
    prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    with pytest.raises(NotImplementedError, match="beam search"):
        cp.generate(**prompt, max_new_tokens=2, num_beams=2)
    with pytest.raises(ValueError, match="brings its own split cache"):
        cp.generate(**prompt, max_new_tokens=2, past_key_values=object())
    with pytest.raises(TypeError, match="block_size, num_splits and helix"):
        torch_plugin.cache_parallel(model, None, scheme="gather_qkv")
    assert model.config._attn_implementation == "sdpa"  # left as it was
    # XGLM attends with its own code over what the cache returns: refused, naming why.
    xglm, inputs = hf_suite.build("xglm")
    cp = torch_plugin.cache_parallel(xglm.eval(), None)
    prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    with pytest.raises(NotImplementedError, match="computes its attention itself"):
        cp.generate(**prompt, max_new_tokens=2, pad_token_id=hf_suite.PAD)


# ---- transformers' continuous batching with the paged cache split (issue 41) -----------------


@pytest.mark.parametrize(
    ("name", "world", "requests", "page"),
    [
        ("llama", 2, "dp", 8),
        ("gpt2", 2, "replicated", 8),
        ("phi3", 2, "helix", 8),
        ("qwen2", 4, "dp", 8),
        ("mistral", 2, "dp", 4),
        ("gemma2", 4, "helix", 4),
    ],
)
def test_generate_batch_splits_the_paged_cache_and_keeps_the_tokens(
    gloo, name: str, world: int, requests: str, page: int
) -> None:
    """cache_parallel(model, mesh).generate_batch on a stream of 36 requests of 3 to 40 prompt
    tokens (12 new, an end-of-sequence token that stops some early, a cache of 48 blocks that
    transformers' one process fills, so requests are preempted and recomputed) returns on every
    rank the tokens of transformers' generate_batch in one process. Each rank held at most
    1/world of the one process's peak blocks plus one per request of a batch, and never
    allocated transformers' whole-cache tensor or its packed-batch mask. dp: each rank ran
    the non-attention layers on 1/world of the batch's tokens (the q/k/v all-gather and the
    partials' all-to-all were counted); replicated: every rank ran them all; helix: rows
    replicated, o_proj and the MLP split over the ranks, the partials sent to their head group
    by one all-to-all. Decode batches
    attend with the split-KV kernel over each request's local entries. Sliding-window layers
    (Mistral: all of them; Gemma-2: every other one, beside full-attention layers, with
    softcapping) have a window of 8 positions, 2 ring pages of 4, shorter than most requests:
    each ring page stays on one rank."""
    from benchmarks import cp_serving

    ranks = gloo(world).run(cp_serving.check_decoder, name, requests, page)
    for r in ranks:
        assert r["equal"], f"{name} on {world} ranks: tokens differ from one process"
        assert r["requests"] == 36 and r["early"] >= 1
        slack = r["most_requests"] * r["groups"]  # a partial page per request and group
        assert r["peak_blocks"] <= r["one_process_peak_blocks"] / world + slack
        assert r["peak_blocks"] >= r["one_process_peak_blocks"] / world / 2  # it held pages
        # transformers' whole-cache tensor was made on the meta device: never allocated.
        assert r["transformers_cache_device"] == "meta"
        # Nor its packed-batch mask, which only sdpa / eager read (the split attention does not).
        assert not r["mask_allocated"]
        kind = "helix_partials" if requests == "helix" else "cp_partials"
        assert r["bytes"][kind] > 0
        # Decode batches (most steps of a stream) ran torch_plugin's split-KV kernel per layer.
        assert r["kernel_calls"] > 0 and r["kernel_calls"] % r["layers"] == 0
        assert (r["bytes"].get("cp_logits", 0) > 0) == (requests == "dp")
        # Greedy, no logits processor: dp rows send their token ids, under one row of logits
        # (4 x vocab bytes) per step where they sent every row's logits.
        assert r["ids_only"]
        assert r["bytes"].get("cp_logits", 0) < 4 * r["vocab"] * r["steps"]


def test_generate_batch_refuses_what_it_cannot_split() -> None:
    """Refused before any rank starts: sampling, beam search; refused with its
    size: a request longer than the cache holds; refused with the reason: padded (compiled)
    batches."""
    import cb_workers
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import CompileConfig

    import torch_plugin
    from torch_plugin.models import hf_suite
    from torch_plugin.runtime.kv_cache import CacheCapacityError

    model, _ = hf_suite.build("llama")
    cp = torch_plugin.cache_parallel(model.eval(), None)
    prompts = cb_workers.stream(64, n=3)
    with pytest.raises(NotImplementedError, match="sampling"):
        cp.generate_batch(prompts, GenerationConfig(do_sample=True, max_new_tokens=4))
    with pytest.raises(NotImplementedError, match="beam search"):
        cp.generate_batch(prompts, GenerationConfig(num_beams=2, max_new_tokens=4))
    small = cb_workers.cb_config_small(num_blocks=4, page_size=8)
    with pytest.raises(CacheCapacityError, match=r"request 0 needs \d+ prompt \+ 64 new"):
        cp.generate_batch([list(range(1, 40))], GenerationConfig(max_new_tokens=64), small)
    compiled = cb_workers.cb_config_small(varlen_compile_config=CompileConfig())
    with pytest.raises(NotImplementedError, match="compiled or CUDA-graph batches"):
        cp.generate_batch(prompts, GenerationConfig(max_new_tokens=4), compiled)
    assert model.config._attn_implementation == "sdpa"  # given back after each refusal


def test_continuous_batching_manager_form_keeps_the_tokens(gloo) -> None:
    """cp.init_continuous_batching(): transformers' manager hooked for the split cache; 12
    requests added while the loop runs (rank 0 takes them and broadcasts them), results read
    on both ranks equal one process's; the model's attention is given back after stop()."""
    import cb_workers

    for r in gloo(2).run(cb_workers.manager_form_matches):
        assert r["equal"] and r["attention_restored"] and r["peak_blocks"] > 0
