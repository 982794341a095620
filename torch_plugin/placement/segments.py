"""Placement of a module-level graph around the calls that must stay eager.

A pipeline stage is an fx graph over the model's modules. Some of its calls must not be
compiled, run twice or timed alone: modules with hooks (a schedule's `sync` runs collectives
there, which every rank must call in the same order), checkpointed or replaced forwards, and
modules already compiled. `place_segments` cuts the graph at those calls and compiles each
maximal run of nodes between them with torch.compile(backend="torch_plugin") and the placement
pass. A run's ATen graphs (forward and backward under AOTAutograd) hold no collective, so the
placement pass can measure them on one rank; the run's parameters stay the model's own
(shared, under their names), so optimizers and gradient all-reduces see no change.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from .planner import PlacementOptions

log = logging.getLogger("torch_plugin")

# Calls that cost nothing worth a compile on their own.
_FREE_FUNCTIONS = {operator.getitem, getattr}
_FREE_METHODS = {"size", "dim"}


def must_stay_eager(mod: nn.Module) -> str | None:
    """Why `mod` (with its sub-modules) must run eagerly, or None."""
    if hasattr(mod, "_orig_mod") or getattr(mod, "_compiled_call_impl", None) is not None:
        return "already compiled"
    for name, m in mod.named_modules():
        where = f" (sub-module {name!r})" if name else ""
        if m._forward_hooks or m._forward_pre_hooks:
            return f"forward hooks{where}"
        if m._backward_hooks or m._backward_pre_hooks:
            return f"backward hooks{where}"
        if "forward" in m.__dict__:
            return f"its forward is replaced (checkpoint / replace){where}"
    return None


def _is_collective(n: fx.Node) -> bool:
    if n.op != "call_function":
        return False
    return (getattr(n.target, "__module__", "") or "").startswith("torch.distributed")


@dataclasses.dataclass
class Segment:
    """A run of nodes compiled with the placement pass."""

    name: str
    nodes: list[str]
    inputs: list[str]
    outputs: list[str]


class _PlacedSegment(nn.Module):
    """Calls a compiled run. The compiled module is kept outside the module tree: its
    parameters are the stage's own, registered once, under the model's names."""

    def __init__(self, compiled: Any, nodes: int) -> None:
        super().__init__()
        self.__dict__["compiled"] = compiled
        self.nodes = nodes

    def forward(self, *args: Any) -> Any:
        return self.compiled(*args)

    def extra_repr(self) -> str:
        return f"nodes={self.nodes}, placement"


def _worth_placing(nodes: list[fx.Node]) -> bool:
    for n in nodes:
        if n.op == "call_module":
            return True
        if n.op == "call_function" and n.target not in _FREE_FUNCTIONS:
            return True
        if n.op == "call_method" and n.target not in _FREE_METHODS:
            return True
    return False


def _run_graph(inputs: list[fx.Node], members: list[fx.Node], outputs: list[fx.Node]) -> fx.Graph:
    """A graph of one run: its outside inputs become placeholders."""
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for a in inputs:
        env[a] = sub.placeholder(a.name)
        env[a].meta = dict(a.meta)
    for m in members:
        env[m] = sub.node_copy(m, lambda x: env[x])
    sub.output(tuple(env[o] for o in outputs))
    return sub


def place_segments(
    gm: fx.GraphModule, placement: Any = None, on_error: str = "fallback"
) -> list[Segment]:
    """Rewrites `gm` in place: each maximal run of nodes between calls that must stay eager
    becomes one call of a module compiled with the placement pass (`placement`: a dict of
    PlacementOptions or one). Returns the runs; their decisions are made on their first call
    (collect them with torch_plugin.placement.record())."""
    opts = PlacementOptions.from_user(placement)
    nodes = list(gm.graph.nodes)
    run_of: dict[fx.Node, int] = {}
    run, open_run = 0, False
    reasons: dict[str, str] = {}
    for n in nodes:
        eager = n.op in ("placeholder", "output", "get_attr") or _is_collective(n)
        if n.op == "call_module":
            reason = must_stay_eager(gm.get_submodule(str(n.target)))
            if reason is not None:
                reasons[str(n.target)] = reason
                eager = True
        if eager:
            if open_run:
                run, open_run = run + 1, False
            continue
        run_of[n] = run
        open_run = True
    runs: dict[int, list[fx.Node]] = {}
    for n, r in run_of.items():
        runs.setdefault(r, []).append(n)
    runs = {r: ns for r, ns in runs.items() if _worth_placing(ns)}
    for target, reason in reasons.items():
        log.info("torch_plugin placement: %s stays eager: %s", target, reason)

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    segments: list[Segment] = []
    emitted: set[int] = set()
    for n in nodes:
        r = run_of.get(n)
        if r is None or r not in runs:
            env[n] = graph.node_copy(n, lambda x: env[x])
            continue
        if r in emitted:
            continue
        emitted.add(r)
        members = runs[r]
        inside = set(members)
        inputs: list[fx.Node] = []
        for m in members:
            for a in m.all_input_nodes:
                if a not in inside and a not in inputs:
                    inputs.append(a)
        outputs = [m for m in members if any(u not in inside for u in m.users)]
        # Shares the stage's sub-modules (and so its parameters) by reference.
        seg_gm = fx.GraphModule(
            gm, _run_graph(inputs, members, outputs), class_name=f"PlacedSegment{len(segments)}"
        )
        compiled = torch.compile(
            seg_gm,
            backend="torch_plugin",
            options={"passes": ["placement"], "placement": opts, "on_error": on_error},
        )
        name = f"placed_segment_{len(segments)}"
        gm.add_submodule(name, _PlacedSegment(compiled, len(members)))
        call = graph.call_module(name, tuple(env[a] for a in inputs))
        for k, o in enumerate(outputs):
            env[o] = graph.call_function(operator.getitem, (call, k))
            env[o].meta = dict(o.meta)
        segments.append(Segment(name, *([n.name for n in ns] for ns in (members, inputs, outputs))))
    gm.graph = graph
    gm.recompile()
    return segments
