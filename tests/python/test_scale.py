"""The layout planner for clusters we cannot run (torch_plugin.scale): model sizes read off real
HF models built on the meta device, plans on fixed cluster profiles. The cost model's own cases
(and two published rows) are GoogleTests in tests/cpp/passes/layout_plan_test.cc."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import transformers

import torch_plugin
from torch_plugin import _C, scale

ROOT = Path(__file__).resolve().parents[2]

LLAMA3_405B = dict(
    vocab_size=128256,
    hidden_size=16384,
    intermediate_size=53248,
    num_hidden_layers=126,
    num_attention_heads=128,
    num_key_value_heads=8,
)


def _meta(cls: type, config: object) -> torch.nn.Module:
    with torch.device("meta"):
        return cls(config)


@pytest.fixture(scope="module")
def llama_405b() -> torch.nn.Module:
    return _meta(transformers.LlamaForCausalLM, transformers.LlamaConfig(**LLAMA3_405B))


def test_a_spec_counts_the_parameters_the_model_has(llama_405b: torch.nn.Module) -> None:
    spec = scale.transformer_spec(llama_405b)
    assert spec.params == sum(p.numel() for p in llama_405b.parameters()) == 405_853_388_800
    gpt = _meta(
        transformers.GPT2LMHeadModel, transformers.GPT2Config(n_layer=4, n_embd=256, n_head=8)
    )
    g = scale.transformer_spec(gpt)
    assert g.params == sum(p.numel() for p in gpt.parameters())
    assert not g.gated_mlp and g.tied_embeddings and g.biases and g.positions == 1024


def test_a_model_with_parts_the_layout_model_does_not_price_is_refused() -> None:
    config = transformers.MixtralConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_local_experts=4,
        vocab_size=1000,
    )
    model = _meta(transformers.MixtralForCausalLM, config)
    with pytest.raises(ValueError, match="'mixtral' model is not one the layout model describes"):
        scale.transformer_spec(model)
    with pytest.raises(ValueError, match="'mixtral' model is not one"):
        scale.transformer_spec(config)
    # A module whose parameters the spec does not reproduce is refused by its count.
    llama = _meta(
        transformers.LlamaForCausalLM,
        transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=1000,
        ),
    )
    llama.model.extra = torch.nn.Linear(256, 4096, device="meta")
    with pytest.raises(ValueError, match="prices .* parameters but LlamaForCausalLM has"):
        scale.transformer_spec(llama)
    with pytest.raises(TypeError, match="transformers model or config"):
        scale.transformer_spec(torch.nn.Linear(2, 2))


def test_405b_on_16384_ranks_gets_a_3d_plan_that_fits(llama_405b: torch.nn.Module) -> None:
    plan = torch_plugin.plan_at_scale(llama_405b, 16384, seq_len=8192, global_batch=2048)
    layout, est = plan.layout, plan.estimate
    print(plan)
    assert layout.tp * layout.cp * layout.pp * layout.dp == 16384
    assert layout.pp > 1 and layout.tp > 1, "a 405B model needs model parallelism in two dims"
    profile = scale.cluster_profile("h100-roce")
    assert est.feasible and est.memory_bytes <= profile.memory_bytes * profile.usable_memory
    assert plan.evaluated > 1000 and 0 < plan.feasible <= plan.evaluated
    assert 0 < est.mfu < 1
    # The runners-up are slower, and each is a layout that tiles the job.
    times = [c.estimate.step_time for c in plan.best]
    assert times == sorted(times) and times[0] == est.step_time


def test_pins_and_published_layouts_are_priced_as_given(llama_405b: torch.nn.Module) -> None:
    spec = scale.transformer_spec(llama_405b)
    pinned = scale.plan_at_scale(
        spec, 8192, seq_len=8192, global_batch=2048, tp=8, cp=1, pp=16, zero=2, recompute="none"
    )
    lay = pinned.layout
    assert (lay.tp, lay.cp, lay.pp, lay.dp, lay.zero) == (8, 1, 16, 64, 2)
    again = scale.estimate_training_step(
        spec, lay.to_dict(), seq_len=8192, global_batch=2048, cluster="h100-roce"
    )
    assert again.step_time == pytest.approx(pinned.estimate.step_time, rel=1e-12)
    free = scale.plan_at_scale(spec, 8192, seq_len=8192, global_batch=2048)
    assert free.estimate.step_time <= pinned.estimate.step_time
    with pytest.raises(ValueError, match="tp x cp x pp x dp"):
        _C.estimate_training_step(
            spec,
            _C.TrainingJob(world=100, seq_len=8192, global_batch=2048),
            _C.TrainingLayout(tp=8, pp=16, dp=64),
            scale.cluster_profile(),
        )


def test_cluster_overrides_change_the_modelled_step(llama_405b: torch.nn.Module) -> None:
    layout = dict(tp=8, pp=16, dp=64, chunks=2, recompute="full")
    kw = dict(seq_len=8192, global_batch=2048)
    base = scale.estimate_training_step(llama_405b, layout, **kw)
    slow_net = scale.estimate_training_step(
        llama_405b, layout, **kw, cluster=scale.cluster_profile(inter_bandwidth=5e9)
    )
    assert slow_net.dp_exposed_time > base.dp_exposed_time
    assert slow_net.step_time > base.step_time
    with pytest.raises(ValueError, match="unknown cluster profile 'tpu'; valid: h100-roce"):
        scale.cluster_profile("tpu")


def _benchmark_rows() -> list[dict]:
    """benchmarks/scale_model.py's rows, loaded without leaving benchmarks/ on sys.path: gloo
    pools spawned later inherit sys.path, and benchmarks/user_programs.py would then shadow
    tests/python/user_programs.py in their workers."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(
            "scale_model_rows", ROOT / "benchmarks" / "scale_model.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module.ROWS


def test_the_benchmark_rows_cite_a_source_and_tile_their_jobs() -> None:
    before = list(sys.path)
    rows = _benchmark_rows()
    assert sys.path == before
    assert len({r["source"] for r in rows}) >= 3 and len(rows) >= 8
    calibration = [r for r in rows if r.get("calibration")]
    # One calibration row per cluster device: the rest are held out.
    assert len(calibration) == 3
    for r in rows:
        pin = r["pin"]
        inner = pin["tp"] * pin["cp"] * pin.get("pp", 1)
        assert r["world"] % inner == 0 and r["batch"] % (r["world"] // inner) == 0, r["id"]
        assert r["published"][0] in ("tflops", "tps", "step")
