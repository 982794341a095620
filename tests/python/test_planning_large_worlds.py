"""The planning tier: distributed entry points planning large worlds in one process, rank 0 of
torch's fake process group (FakeStore + the "fake" backend). Real parameter shapes on the meta
device; nothing is allocated and no collective carries data. Numerics live in the gloo tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import torch_plugin

# Llama-3-8B: 32 layers, hidden 4096, 32 query / 8 KV heads, MLP 14336, vocabulary 128256.
LLAMA3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    use_cache=False,
)
SEQ = 128


@pytest.fixture
def fake_world(request: pytest.FixtureRequest) -> Iterator[int]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = request.param
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield world
    finally:
        dist.destroy_process_group()


def _llama3_8b() -> torch.nn.Module:
    import transformers

    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA3_8B))


@pytest.mark.parametrize(
    "fake_world, shape", [(256, (32, 8)), (64, (8, 8))], indirect=["fake_world"]
)
def test_llama3_8b_plans_on_a_large_mesh(fake_world: int, shape: tuple[int, int]) -> None:
    dp, tp = shape
    model = _llama3_8b()
    total = sum(p.numel() * 4 for p in model.parameters())
    ids = torch.zeros(dp, SEQ, dtype=torch.long)
    t0 = time.perf_counter()
    mesh = torch_plugin.DeviceMesh(shape, ("dp", "tp"))
    dm = torch_plugin.parallelize(model, mesh, {"input_ids": ids, "labels": ids}, level="fast")
    seconds = time.perf_counter() - t0
    plan = dm.plan
    print(
        f"Llama-3-8B on {fake_world} ranks ({dp} dp x {tp} tp): planned in {seconds:.1f} s, "
        f"{plan.param_bytes_per_rank / 1e9:.2f} GB of parameters per rank "
        f"({plan.param_bytes_per_rank / total:.3f} of {total / 1e9:.1f} GB)"
    )
    assert plan.dp == dp and mesh.shape == shape
    spec = dict(zip(dm.param_names, dm.param_specs, strict=True))
    # Megatron's layout on every one of the 32 layers, found by the ILP (fast level: one
    # layer's variables shared by its repeats).
    for i in range(LLAMA3_8B["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        for col in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            assert spec[f"{layer}.{col}.weight"] == "S(0)", (layer, col, spec)
        for row in ("self_attn.o_proj", "mlp.down_proj"):
            assert spec[f"{layer}.{row}.weight"] == "S(1)", (layer, row, spec)
    # The vocabulary-sized blocks are split too: each rank holds about 1/tp of the model.
    assert spec["lm_head.weight"].startswith("S(")
    assert plan.param_bytes_per_rank <= total / tp * 1.01
    # This rank's blocks have their local shapes, on the meta device.
    local = dict(dm.named_parameters())
    q = local["model.layers.0.self_attn.q_proj.weight"]
    assert q.is_meta and tuple(q.shape) == (4096 // tp, 4096)
    assert seconds < 60
