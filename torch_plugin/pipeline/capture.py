"""The ATen-level graph a graph pipeline splits when the model is called the HF way.

Module-level tracing (graph.py) needs a model torch.fx can trace symbolically and a
positional call; `transformers` models are neither. Here the call (keyword arguments, labels,
a ModelOutput back) is captured with make_fx over fake tensors, like the sharding planner's,
with each node's module path recorded so the partitioner can keep a layer in one stage.
Parameters and buffers become get_attr nodes on a root that holds the model as `m`, so a
stage's GraphModule owns the very parameters it reads under the model's own names.

Two kinds of values need care when a graph is cut into stages:
  - values that do not depend on the batch (parameters, rotary tables, causal masks built
    from positions) are "free": every stage that reads one recomputes it (a parameter read in
    two stages, such as an embedding tied to the LM head, is then held by both, and their
    gradients are summed);
  - the graph's shapes are concrete, so a stage that runs n samples runs a graph traced for n
    samples; traces of one model at different batch sizes are matched node by node by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from ..runtime.capture import TracedCall, trace_call


class _Root(nn.Module):
    """The model as `m` (its parameters are m.<name>, as under the module-level trace's
    wrapper) plus the graph's tensor constants."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model


@dataclasses.dataclass
class AtenPipelineGraph:
    gm: fx.GraphModule  # placeholders: the call's tensor leaves
    traced: TracedCall
    batch: int
    batch_major: list[bool]  # per placeholder: dim 0 is the batch (sliced per micro-batch)
    free: frozenset[fx.Node]  # nodes that do not depend on the batch


def _slice_call(call: Any, batch: int, n: int) -> Any:
    return pytree.tree_map(
        lambda x: x[:n] if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == batch else x,
        call,
    )


def capture(
    model: nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]], batch: int, n: int | None = None
) -> AtenPipelineGraph:
    """The call's ATen graph at `n` samples (the whole batch by default)."""
    if n is not None and n != batch:
        call = _slice_call(call, batch, n)
    size = batch if n is None else n
    traced = trace_call(model, call, record_module_stack=True)
    gm = traced.gm
    g = gm.graph
    root = _Root(model)
    placeholders = [node for node in g.nodes if node.op == "placeholder"]
    n_state = len(traced.pnames) + len(traced.bnames)
    first = next(node for node in g.nodes if node.op != "placeholder")
    with g.inserting_before(first):
        for node, name in zip(placeholders[:n_state], traced.pnames + traced.bnames, strict=True):
            attr = g.get_attr(f"m.{name}")
            attr.meta.update(node.meta)
            node.replace_all_uses_with(attr)
            g.erase_node(node)
    for node in g.nodes:
        if node.op == "get_attr" and not str(node.target).startswith("m."):
            value = getattr(gm, str(node.target))
            if isinstance(value, torch._subclasses.FakeTensor):
                raise RuntimeError(
                    f"torch_plugin pipeline: the model creates tensor {node.target} in its "
                    "forward from data the trace could not see; build it in __init__ as a buffer"
                )
            setattr(root, str(node.target), value)
    user = placeholders[n_state:]
    batch_major = [
        isinstance(v := p.meta.get("val"), torch.Tensor) and v.dim() > 0 and v.shape[0] == size
        for p in user
    ]
    dependent = {p for p, major in zip(user, batch_major, strict=True) if major}
    for node in g.nodes:
        if node.op not in ("placeholder", "output") and any(
            a in dependent for a in node.all_input_nodes
        ):
            dependent.add(node)
    free = frozenset(
        node
        for node in g.nodes
        if node.op not in ("placeholder", "output") and node not in dependent
    )
    new = fx.GraphModule(root, g)
    new.graph.lint()
    return AtenPipelineGraph(new, traced, size, batch_major, free)


def same_graph(a: AtenPipelineGraph, b: AtenPipelineGraph) -> str | None:
    """None when the two traces have the same nodes (name, op, target) in the same order,
    else the first node that differs. They differ where a size changes what an op decomposes
    into (a reshape of a contiguous batch of one is a view, of more a copy)."""
    na, nb = list(a.gm.graph.nodes), list(b.gm.graph.nodes)
    for x, y in zip(na, nb, strict=False):
        if (x.name, x.op, x.target) != (y.name, y.op, y.target):
            return x.name
    return None if len(na) == len(nb) else (na[min(len(na), len(nb)) - 1].name)
