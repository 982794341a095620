"""The model zoo: every model builds offline with random weights, shapes are the published
ones by default, and the Llama KV cache reproduces the full-sequence forward."""

from __future__ import annotations

import pytest
import torch

from torch_plugin import models


@pytest.mark.parametrize("name", models.names())
def test_small_models_run_forward_and_backward(name: str) -> None:
    model, inputs = models.build(name, small=True)
    again, _ = models.build(name, small=True)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{name}: seeded build is not deterministic at {n}"
    out = model(*inputs)
    models.loss_of(out).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "name, params_millions",
    [
        ("resnet50", 25.6),
        ("resnext50", 25.0),
        ("bert", 108.9),
        ("gpt2", 124.4),
        ("mlp", 24.1),
        ("mmt", 404.0),
        ("candle_uno", 637.7),
    ],
)
def test_default_shapes_are_the_published_ones(name: str, params_millions: float) -> None:
    with torch.device("meta"):
        model = models.ZOO[name].build(small=False)
    n = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(n - params_millions) / params_millions < 0.02, f"{name}: {n:.1f}M parameters"


def test_thesis_shapes_of_multibranch_models() -> None:
    with torch.device("meta"):
        mmt = models.ZOO["mmt"].build()
        dlrm = models.ZOO["dlrm"].build()
        uno = models.ZOO["candle_uno"].build()
    assert len(mmt.branches) == 4 and len(mmt.branches[0]) == 8 and mmt.seq_len == 256
    assert mmt.branches[0][0].fc1.out_features == 4096 and mmt.branches[0][0].heads == 16
    assert len(dlrm.dense) == 7 and len(dlrm.sparse) == 7
    assert dlrm.sparse[0].num_embeddings == 1_000_000 and dlrm.sparse[0].embedding_dim == 64
    assert dlrm.bag_size == 100 and dlrm.dense[0][-2].out_features == 4096
    assert (
        len(uno.branches) == 7 and sum(isinstance(m, torch.nn.Linear) for m in uno.branches[0]) == 4
    )


def test_llama_kv_cache_matches_full_sequence() -> None:
    model, _ = models.build("llama", small=True)
    tokens = torch.randint(0, model.vocab_size, (2, 7))
    with torch.no_grad():
        full = model(tokens)
        steps = [model(tokens[:, :4], 0)] + [model(tokens[:, i : i + 1], i) for i in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_llama_cache_capacity_error() -> None:
    model, _ = models.build("llama", small=True)
    with pytest.raises(ValueError, match="exceeds the cache capacity max_seq_len=64"):
        model(torch.zeros(1, 2, dtype=torch.long), 63)


def test_unknown_model_lists_available() -> None:
    with pytest.raises(ValueError, match="available: mlp, resnet50"):
        models.build("alexnet")
