"""Activation checkpointing kept in a captured program: the nodes a checkpointed layer ran
(HF's gradient_checkpointing_enable) are outlined into a submodule that runs under
torch.utils.checkpoint, so the program saves each layer's inputs instead of its activations.

A captured ATen graph is a trace through the checkpoint wrapper: replayed op by op under
autograd, it saved every activation (a 2-layer Llama on 2 ranks: 6.7 MB a rank whether the user
had enabled checkpointing or not, against one process's 1.9 MB with it), so a model that fits
only with checkpointing did not fit once parallelized."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.passes.split_module import split_module
from torch.utils.checkpoint import noop_context_fn

log = logging.getLogger("torch_plugin")

# torch.utils.checkpoint's context_fn: the context managers of the forward and of the
# recomputation.
ContextFn = Callable[[], tuple[Any, Any]]


def checkpointed_layers(model: nn.Module) -> list[str]:
    """The paths of the outermost modules that checkpoint their forward in training: HF's
    GradientCheckpointingLayer with gradient checkpointing enabled (each decoder layer)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # no transformers, or one without per-layer checkpointing
        return []
    found: list[str] = []
    for name, m in model.named_modules():
        if not name or any(name.startswith(f + ".") for f in found):
            continue
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing is True:
            found.append(name)
    return found


def region_of(scope: str, layers: Sequence[str]) -> str | None:
    """The checkpointed layer a node that ran in module `scope` belongs to, or None."""
    for layer in layers:
        if scope == layer or scope.startswith(layer + "."):
            return layer
    return None


def by_module_stack(layers: Sequence[str]) -> Callable[[fx.Node], str | None]:
    """A node's checkpointed layer read off the module stack its capture recorded (the innermost
    module's path, as make_fx names it: "model.layers.0.self_attn"); "" where the node has none
    or ran in the root module."""

    def region(n: fx.Node) -> str | None:
        stack = n.meta.get("nn_module_stack")
        path = str(list(stack.values())[-1][0]) if stack else ""
        return region_of(path, layers) if path else ""

    return region


class Recomputed(nn.Module):
    """A region run under torch.utils.checkpoint while gradients are recorded: its activations
    are computed again in the backward, from the generator state it ran from (its dropout
    draws the same masks), collectives included (every rank recomputes the same regions in the
    same order)."""

    def __init__(self, inner: fx.GraphModule, context_fn: ContextFn | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.context_fn = context_fn or noop_context_fn

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.inner(*args)
        return torch.utils.checkpoint.checkpoint(
            self.inner,
            *args,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=self.context_fn,
        )


def checkpoint_regions(
    gm: fx.GraphModule,
    region: Callable[[fx.Node], str | None],
    context_fn: ContextFn | None = None,
) -> tuple[fx.GraphModule, int]:
    """`gm` with each maximal run of nodes (in graph order) that `region` puts in one
    checkpointed layer outlined into a Recomputed submodule; and how many there are. `region`
    gives a node's layer, None outside every one, or "" where it cannot tell (a node of the
    model's root module, or one the capture did not see): such a node stays in the run it is
    in. A getitem goes with what it reads. Runs are numbered along the graph's order, so none
    depends on a later one. `context_fn` (torch.utils.checkpoint's): state outside the
    graph that a region reads, set back for its recomputation (a pipeline stage's micro-batch
    rows, which its replayed dropout masks are sliced by)."""
    part: dict[str, int] = {}
    layer_of: dict[int, str | None] = {}
    current: str | None = None
    pid = 0  # the run being built; 0 before the first
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n.op == "call_function" and n.target is operator.getitem and n.args[0].name in part:
            part[n.name] = part[n.args[0].name]
            continue
        r = region(n)
        key = current if r == "" else r
        if pid == 0 or key != current:
            pid += 1
            current = key
            layer_of[pid] = key
        part[n.name] = pid
    if not any(layer_of.values()):
        return gm, 0
    split = split_module(gm, None, lambda n: part[n.name], keep_original_order=True)
    count = 0
    for name, sub in list(split.named_children()):
        # split_module names the runs submod_<id>; other children are the graph's own
        # attributes (a pipeline stage's parameters).
        if name.startswith("submod_") and layer_of.get(int(name[len("submod_") :])) is not None:
            setattr(split, name, Recomputed(sub, context_fn))
            count += 1
    return split, count


def recompute_layers(
    gm: fx.GraphModule, layers: Sequence[str], what: str, context_fn: ContextFn | None = None
) -> fx.GraphModule:
    """checkpoint_regions over the module stack for the model's checkpointed `layers`, saying
    what it did: how many regions recompute, or (a WARNING) that none could be found, so the
    program keeps every activation. `what` names the program in the log line."""
    out, regions = checkpoint_regions(gm, by_module_stack(layers), context_fn)
    if regions == 0:
        log.warning(
            "torch_plugin: %s: the model checkpoints %d layer(s) (%s, ...) but none of the "
            "program's nodes recorded them: it keeps every activation",
            what,
            len(layers),
            layers[0],
        )
    else:
        log.info(
            "torch_plugin: %s: %d checkpointed region(s) recompute their activations in the "
            "backward (the model checkpoints %d layers)",
            what,
            regions,
            len(layers),
        )
    return out
