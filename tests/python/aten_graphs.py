"""Captures the ATen forward graph of a model as `_C.Graph`, exactly as the backend sees it."""

from __future__ import annotations

from typing import Any

import torch
from functorch.compile import min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd

from torch_plugin import _C, fx_bridge
from torch_plugin.backend import _dynamo_input_kinds


def forward_ir(model: torch.nn.Module, *inputs: Any, dynamic: bool = False) -> _C.Graph:
    """The first forward (inference) ATen graph of `model(*inputs)` under no_grad."""
    graphs: list[_C.Graph] = []

    def capture(gm, example_inputs):  # type: ignore[no-untyped-def]
        kinds = _dynamo_input_kinds(gm, example_inputs)

        def fw(fx_g, _inputs):  # type: ignore[no-untyped-def]
            graphs.append(fx_bridge.to_ir(fx_g, kinds)[0])
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
