"""Activation checkpointing kept in a captured program: the nodes a checkpointed call ran
(torch.utils.checkpoint in the model's own forward, HF's gradient_checkpointing_enable) are
outlined into a submodule that runs under torch.utils.checkpoint, so the program saves each
region's inputs instead of its activations.

A captured ATen graph is a trace through the checkpoint wrapper: replayed op by op under
autograd, it saved every activation (a 2-layer Llama on 2 ranks: 6.7 MB a rank whether the user
had enabled checkpointing or not, against one process's 1.9 MB with it), so a model that fits
only with checkpointing did not fit once parallelized."""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
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

# A traced node's meta keys: the index of the torch.utils.checkpoint call it was traced in,
# and that call's context_fn where it passed one (selective checkpointing's policy).
CHECKPOINTED = "torch_plugin_checkpointed"
CHECKPOINT_CONTEXT = "torch_plugin_checkpoint_context"
# A module-level graph's meta key: the checkpoint calls its torch.fx trace ran through.
CHECKPOINT_CALLS = "torch_plugin_checkpoint_calls"


@contextlib.contextmanager
def tag_checkpointed_calls() -> Iterator[list[int]]:
    """While make_fx traces a model's call: each node traced inside a torch.utils.checkpoint
    call of the forward (the outermost where calls nest) gets meta[CHECKPOINTED], the call's
    index, and the call's `context_fn` where it passed one (selective checkpointing's policy)
    meta[CHECKPOINT_CONTEXT]. A trace runs through checkpoint as through any function, so
    nothing in its graph said where the user had checkpointed (a model calling checkpoint
    itself, not through HF's layers, kept every activation once parallelized, without a
    word). The two ways in are watched, whatever the grad mode: the non-reentrant path drives
    the generator `_checkpoint_without_reentrant_generator` (looked up at each call) around
    the function, the reentrant one runs it in CheckpointFunction.forward. Both are set back
    on exit; contexts nest, but the patch is process-wide, so traces must not run in threads
    side by side. Yields [how many outermost calls ran], under any tracer or none (torch.fx's
    module-level trace runs through them too, and tags nothing)."""
    import torch.fx.traceback as fx_traceback
    import torch.utils.checkpoint as tuc
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    function = getattr(tuc, "CheckpointFunction", None)
    forward = vars(function).get("forward") if function is not None else None
    generator = getattr(tuc, "_checkpoint_without_reentrant_generator", None)
    if not isinstance(forward, staticmethod) or generator is None:
        # Another torch: left untagged (HF layers' module stacks remain).
        log.debug("torch_plugin: this torch's checkpoint internals are unknown: not tagged")
        yield [0]
        return
    depth = [0]
    calls = [0]
    open_at: list[tuple[fx.Graph, fx.Node | None, Any] | None] = [None]

    def enter(context: Any) -> None:
        depth[0] += 1
        if depth[0] > 1:
            return
        calls[0] += 1
        mode = get_proxy_mode()
        graph = getattr(getattr(mode, "tracer", None), "graph", None)
        if graph is not None:
            open_at[0] = (graph, next(reversed(graph.nodes), None), context)

    def leave() -> None:
        depth[0] -= 1
        if depth[0] > 0 or open_at[0] is None:
            return
        graph, last, context = open_at[0]
        open_at[0] = None
        for n in reversed(graph.nodes):  # make_fx appends: the call's nodes are the tail
            if n is last:
                break
            n.meta[CHECKPOINTED] = calls[0] - 1  # the call's index
            if context is not None and context is not noop_context_fn:
                n.meta[CHECKPOINT_CONTEXT] = context

    def starts(fn: Any, *args: Any, **kwargs: Any) -> Any:
        # checkpoint() passes (fn, preserve_rng_state, context_fn, ...) positionally, then
        # drives the generator: next() before the function, next() after, throw() on error.
        context = args[1] if len(args) > 1 else kwargs.get("context_fn")
        inner = generator(fn, *args, **kwargs)

        def around() -> Iterator[Any]:
            enter(context)
            try:
                yield from inner
            finally:
                leave()

        return around()

    def function_forward(ctx: Any, *args: Any) -> Any:
        enter(None)
        try:
            return forward.__func__(ctx, *args)
        finally:
            leave()

    # Selective checkpointing's caching mode, run under a trace, writes its recompute tags
    # into torch.fx.traceback.current_meta and nothing takes them out: the process's next
    # torch.compile tagged its nodes with them and its partitioner failed ("'>' not supported
    # between instances of 'NoneType'", on ac_graph_id). Set back as it was.
    meta_before = fx_traceback.current_meta.copy()
    function.forward = staticmethod(function_forward)  # type: ignore[union-attr]
    tuc._checkpoint_without_reentrant_generator = starts
    try:
        yield calls
    finally:
        tuc._checkpoint_without_reentrant_generator = generator
        function.forward = forward  # type: ignore[union-attr]
        fx_traceback.current_meta = meta_before


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
    contexts: Mapping[str, ContextFn] | None = None,
) -> tuple[fx.GraphModule, int]:
    """`gm` with each maximal run of nodes (in graph order) that `region` puts in one
    checkpointed layer outlined into a Recomputed submodule; and how many there are. `region`
    gives a node's layer, None outside every one, or "" where it cannot tell (a node of the
    model's root module, or one the capture did not see): such a node stays in the run it is
    in. A getitem goes with what it reads. Runs are numbered along the graph's order, so none
    depends on a later one. `context_fn` (torch.utils.checkpoint's): state outside the
    graph that a region reads, set back for its recomputation (a pipeline stage's micro-batch
    rows, which its replayed dropout masks are sliced by). `contexts`: a region's own
    context_fn, by its key (the model's selective-checkpointing policy), entered inside
    `context_fn`'s."""
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
        key = layer_of.get(int(name[len("submod_") :])) if name.startswith("submod_") else None
        if key is not None:
            own = (contexts or {}).get(key)
            setattr(split, name, Recomputed(sub, _nested(context_fn, own) if own else context_fn))
            count += 1
    return split, count


def _nested(outer: ContextFn | None, inner: ContextFn) -> ContextFn:
    """One context_fn entering `outer`'s contexts, then `inner`'s (forward and recompute)."""
    if outer is None:
        return inner

    def both() -> tuple[Any, Any]:
        (f1, r1), (f2, r2) = outer(), inner()
        return _stacked(f1, f2), _stacked(r1, r2)

    return both


@contextlib.contextmanager
def _stacked(first: Any, second: Any) -> Iterator[None]:
    with first, second:
        yield


def _call_region(call: int) -> str:
    return f"checkpoint call {call}"


def by_checkpoint_call(n: fx.Node) -> str | None:
    """A node's region read off the checkpoint call it was traced in (tag_checkpointed_calls);
    None for a traced node outside every call, "" for one the trace did not make (a collective
    the sharding added): it stays in the run it is in."""
    call = n.meta.get(CHECKPOINTED)
    if call is not None:
        return _call_region(call)
    return None if "val" in n.meta or "nn_module_stack" in n.meta else ""


def recompute(
    gm: fx.GraphModule, layers: Sequence[str], what: str, context_fn: ContextFn | None = None
) -> fx.GraphModule:
    """A training program with the activations its model checkpoints recomputed in the
    backward: the regions its trace tagged as torch.utils.checkpoint calls, or failing those
    the model's checkpointed `layers` read off the module stack. Says what it did: how many
    regions recompute, or (a WARNING) that the model checkpoints layers but no node of the
    program recorded them, so it keeps every activation. `what` names the program in the log
    line. `gm` as it is where the model checkpoints nothing."""
    if any(CHECKPOINTED in n.meta for n in gm.graph.nodes):
        own = {
            _call_region(n.meta[CHECKPOINTED]): n.meta[CHECKPOINT_CONTEXT]
            for n in gm.graph.nodes
            if CHECKPOINT_CONTEXT in n.meta
        }
        out, regions = checkpoint_regions(gm, by_checkpoint_call, context_fn, own)
        log.info(
            "torch_plugin: %s: %d checkpointed region(s) (the torch.utils.checkpoint calls of "
            "the model's forward) recompute their activations in the backward%s",
            what,
            regions,
            f", {len(own)} with the call's own context_fn (selective)" if own else "",
        )
        return out
    if not layers:
        return gm
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
