"""Sharding ILP (issue 5, first slice) on the ATen graph of a real model."""

from __future__ import annotations

import aten_graphs
import pytest

import torch_plugin
from torch_plugin import _C, models


def _forward_graph(name: str) -> _C.Graph:
    model, inputs = models.build(name, small=True, batch=8)
    return aten_graphs.forward_ir(model.eval(), *inputs)


def test_gpt2_mlp_is_megatron() -> None:
    plan = _C.plan_sharding(_forward_graph("gpt2"), 4, "a100", True)
    assert plan["status"] == "optimal"
    spec = plan["spec"]
    layers = sorted({k.split(".mlp.")[0] for k in spec if ".mlp.c_fc.weight" in k})
    assert layers
    for layer in layers:  # HF Conv1D weights are [in, out]: column-parallel splits dim 1
        assert spec[f"{layer}.mlp.c_fc.weight"] == "S(1)"
        assert spec[f"{layer}.mlp.c_proj.weight"] == "S(0)"
    assert sum(c["kind"] == "all_reduce" for c in plan["collectives"]) >= len(layers)


def test_bad_sharding_input_is_a_clear_error() -> None:
    g = _forward_graph("mlp")
    with pytest.raises(torch_plugin.PlanError, match="need at least") as info:
        _C.plan_sharding(g, 2, "a100", True, memory_budget_bytes=1.0)
    assert info.value.min_memory_bytes > 1.0
    with pytest.raises(ValueError, match="bad shard spec"):
        _C.plan_sharding(g, 2, pinned={"x": "S[0]"})
    with pytest.raises(torch_plugin.PlanError, match="names no parameter"):
        _C.plan_sharding(g, 2, pinned={"no.such.weight": "R"})
