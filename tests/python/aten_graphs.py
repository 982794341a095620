"""Captures the ATen forward graph of a model as `_C.Graph`, exactly as the backend sees it."""

from __future__ import annotations

from typing import Any

import torch
from functorch.compile import min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd

from torch_plugin import _C, fx_bridge
from torch_plugin.backend import _dynamo_input_kinds


def forward_graph(
    model: torch.nn.Module, *inputs: Any, dynamic: bool = False
) -> tuple[torch.fx.GraphModule, Any]:
    """The first forward (inference) ATen graph of `model(*inputs)` under no_grad, as the
    backend's compiler gets it, and its inputs' kinds."""
    graphs: list[tuple[torch.fx.GraphModule, Any]] = []

    def capture(gm, example_inputs):  # type: ignore[no-untyped-def]
        kinds = _dynamo_input_kinds(gm, example_inputs)

        def fw(fx_g, _inputs):  # type: ignore[no-untyped-def]
            graphs.append((fx_g, kinds))
            return fx_g

        return aot_autograd(
            fw_compiler=fw,
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture, dynamic=dynamic)(*inputs)
    return graphs[0]


def forward_ir(model: torch.nn.Module, *inputs: Any, dynamic: bool = False) -> _C.Graph:
    """forward_graph's graph as `_C.Graph`."""
    return fx_bridge.to_ir(*forward_graph(model, *inputs, dynamic=dynamic))[0]
