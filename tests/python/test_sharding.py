"""Sharding ILP (issue 5, first slice) on the ATen graph of a real model."""

from __future__ import annotations

import pytest
import torch
from functorch.compile import min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd

import torch_plugin
from torch_plugin import _C, fx_bridge, models
from torch_plugin.backend import _dynamo_input_kinds


def _forward_graph(name: str) -> _C.Graph:
    graphs = []

    def capture(gm, example_inputs):  # type: ignore[no-untyped-def]
        kinds = _dynamo_input_kinds(gm, example_inputs)

        def fw(fx_g, inputs):  # type: ignore[no-untyped-def]
            graphs.append(fx_bridge.to_ir(fx_g, kinds)[0])
            return fx_g

        return aot_autograd(
            fw_compiler=fw,
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )(gm, example_inputs)

    torch._dynamo.reset()
    model, inputs = models.build(name, small=True, batch=8)
    with torch.no_grad():
        torch.compile(model.eval(), backend=capture)(*inputs)
    return graphs[0]


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
