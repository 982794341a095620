"""Module-level tracing and costing for the pipeline passes.

The model is traced with torch.fx at module level (leaf modules keep their parameters, so a
stage is a GraphModule that owns the user's own sub-modules under their original names).
Modules whose forward cannot be traced symbolically become leaves. Every node is costed by
running it once on the example inputs (real or `meta` tensors) under a dispatch mode that counts
FLOPs, kernels and bytes; the costs go to C++ as plain records.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..fx_bridge import attribute
from .recompute import CHECKPOINT_CALLS, tag_checkpointed_calls


class _FlatInputs(nn.Module):
    """Calls the model with its inputs rebuilt from a flat tuple (so lists trace)."""

    def __init__(self, model: nn.Module, spec: pytree.TreeSpec):
        super().__init__()
        self.m = model
        self._spec = spec

    def forward(self, *flat: Any) -> Any:
        args = pytree.tree_unflatten(list(flat), self._spec)
        return self.m(*args)


class _Tracer(fx.Tracer):
    def __init__(self, leaves: set[type], leaf_paths: frozenset[str] = frozenset()):
        super().__init__()
        self._leaves = leaves
        self._leaf_paths = leaf_paths

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return (
            type(m) in self._leaves
            or qualname.removeprefix("m.") in self._leaf_paths
            or super().is_leaf_module(m, qualname)
        )


def _untraceable_classes(model: nn.Module) -> set[type]:
    out: set[type] = set()
    for _, m in model.named_modules():
        if type(m) in out or m is model:
            continue
        try:
            fx.symbolic_trace(m)
        except Exception:  # noqa: BLE001 - any failure means "keep it whole"
            out.add(type(m))
    return out


def trace_module_level(
    model: nn.Module, example_inputs: tuple[Any, ...], leaf_modules: Any = ()
) -> fx.GraphModule:
    """Module-level FX graph whose placeholders are the flattened example inputs. Modules at
    `leaf_modules` (paths) stay calls of themselves, e.g. those that carry hooks.
    meta[CHECKPOINT_CALLS]: how many torch.utils.checkpoint calls the trace ran through
    (their modules are calls of the graph, which no longer recompute); calls inside leaf
    modules are not counted (a leaf runs as the model wrote it)."""
    flat, spec = pytree.tree_flatten(tuple(example_inputs))
    wrapper = _FlatInputs(model, spec)
    tracer = _Tracer(_untraceable_classes(model), frozenset(leaf_modules))
    with tag_checkpointed_calls() as checkpoints:
        graph = tracer.trace(wrapper, concrete_args=tuple(fx.PH for _ in flat))
    gm = fx.GraphModule(wrapper, graph)
    gm.meta[CHECKPOINT_CALLS] = checkpoints[0]
    return gm


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.kernels += 1
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.bytes += t.numel() * t.element_size()
        return out


@dataclasses.dataclass
class TracedModel:
    gm: fx.GraphModule
    nodes: list[fx.Node]  # the costed (call) nodes, in order; records index into this
    records: list[dict[str, Any]]
    batch: int


def _batch_of(flat: list[Any]) -> int:
    for x in flat:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    raise ValueError("pipeline parallelism needs a tensor input with the batch as dim 0")


def _module_params(gm: fx.GraphModule, node: fx.Node) -> list[tuple[str, nn.Parameter]]:
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        return [(f"{node.target}.{n}", p) for n, p in mod.named_parameters()]
    if node.op == "get_attr":
        obj = attribute(gm, node.target)
        if isinstance(obj, nn.Parameter):
            return [(str(node.target), obj)]
    return []


def _scope(node: fx.Node) -> str:
    """The module path a node belongs to, without the wrapper's "m." prefix."""
    if node.op == "call_module":
        path = str(node.target)
    else:
        stack = node.meta.get("nn_module_stack") or {}
        path = ""
        for value in stack.values():
            path = value[0] if isinstance(value, tuple) else str(value)
    path = path.removeprefix("m.")
    return "" if path == "m" else path


def cost_records(
    model: nn.Module, example_inputs: tuple[Any, ...], leaf_modules: Any = ()
) -> TracedModel:
    """Traces and costs the model; records are what `_C.pipeline_plan` reads."""
    gm = trace_module_level(model, example_inputs, leaf_modules)
    flat, _ = pytree.tree_flatten(tuple(example_inputs))
    return cost_graph(gm, flat, _batch_of(flat))


def _param_inputs(gm: fx.GraphModule, node: fx.Node) -> list[tuple[str, nn.Parameter]]:
    """Parameters an ATen node reads through get_attr inputs (which are not costed nodes)."""
    out = []
    for a in node.all_input_nodes:
        if a.op == "get_attr":
            out += _module_params(gm, a)
    return out


def cost_graph(
    gm: fx.GraphModule,
    flat: list[Any],
    batch: int,
    free: frozenset[fx.Node] = frozenset(),
    aten: bool = False,
) -> TracedModel:
    """Costs every node of `gm` but those in `free` (values each stage recomputes for itself:
    parameters read through get_attr, masks and positions that do not depend on the batch) by
    running it once on `flat`, its placeholders' values; records each tensor value's shape
    and dtype as `tensor_meta` on the way, as ShapeProp would. A module-level graph's parameters
    belong to one node each (a module call); an ATen graph's are charged to the nodes that
    read them, and may be read in several stages (tied weights)."""
    env: dict[fx.Node, Any] = {}
    nodes: list[fx.Node] = []
    records: list[dict[str, Any]] = []
    index: dict[fx.Node, int] = {}
    owner: dict[int, str] = {}
    charged: set[int] = set()
    it = iter(flat)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
            continue
        if node.op == "output":
            for arg in pytree.tree_leaves(node.args[0]):
                if isinstance(arg, fx.Node) and arg in index:
                    records[index[arg]]["is_output"] = True
            continue
        args = pytree.tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, node.args)
        kwargs = pytree.tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, node.kwargs)
        counter = _OpCounter()
        flops = FlopCounterMode(display=False)
        with torch.no_grad(), flops, counter:
            if node.op == "call_module":
                out = gm.get_submodule(str(node.target))(*args, **kwargs)
            elif node.op == "call_function":
                out = node.target(*args, **kwargs)
            elif node.op == "call_method":
                out = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            else:  # get_attr
                out = attribute(gm, node.target)
        env[node] = out
        if isinstance(out, torch.Tensor):  # what ShapeProp would record: values' shapes
            node.meta["tensor_meta"] = _extract_tensor_metadata(out)
        if node in free:
            continue
        if aten:
            params = [(n, p) for n, p in _param_inputs(gm, node) if id(p) not in charged]
            charged.update(id(p) for _, p in params)
        else:
            params = _module_params(gm, node)
            for name, p in params:
                if id(p) in owner and owner[id(p)] != node.name:
                    raise ValueError(
                        f"parameter {name} is used by nodes {owner[id(p)]!r} and {node.name!r}; "
                        "shared parameters across pipeline stages are not supported by the "
                        "module-level pipeline: tie them inside one module, or pass the example "
                        "inputs as a dict (a keyword call), which takes the ATen-level pipeline "
                        "that keeps tied weights in sync"
                    )
                owner[id(p)] = node.name
        out_bytes = sum(
            t.numel() * t.element_size()
            for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter)
        )
        inputs = sorted(
            {index[a] for a in node.all_input_nodes if a in index}  # placeholders are free
        )
        index[node] = len(records)
        nodes.append(node)
        fwd = float(flops.get_total_flops()) / batch
        records.append(
            {
                "name": node.name,
                "scope": _scope(node),
                "inputs": inputs,
                "fwd_flops": fwd,
                "bwd_flops": 2 * fwd,
                "io_bytes": counter.bytes / batch,
                "act_bytes": counter.bytes / batch,
                "out_bytes": out_bytes / batch,
                "param_bytes": float(sum(p.numel() * p.element_size() for _, p in params)),
                "kernels": float(counter.kernels),
                "is_output": False,
            }
        )
    return TracedModel(gm=gm, nodes=nodes, records=records, batch=batch)
