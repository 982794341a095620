"""Capturing a model for sharding: its forward as one ATen graph over fake tensors, a meta copy
to capture again under autocast, and blocks initialised as the model's constructor would."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from .. import _C, fx_bridge
from ..runtime.capture import as_call, trace_call
from ..runtime.recompute import checkpointed_layers
from ..runtime.spmd_ops import draws_along_batch

log = logging.getLogger("torch_plugin.sharding")


@dataclasses.dataclass
class _Captured:
    graph: _C.Graph  # over (parameters, buffers, tensor leaves of the call)
    ctx: fx_bridge.BridgeContext
    pnames: list[str]
    bnames: list[str]
    in_spec: pytree.TreeSpec  # of the call's (args, kwargs)
    constants: dict[int, Any]  # leaf index -> a non-tensor argument, fixed in the graph
    out_spec: pytree.TreeSpec
    unused_inputs: set[str]  # keyword arguments the graph does not read
    gm: Any = None  # the traced ATen graph (fake tensors in each node's "val")


_ATEN = torch.ops.aten
# Loss ops whose `reduction` argument (2: sum) says how they reduce, and where it sits.
_REDUCTION_ARG = {
    _ATEN.nll_loss_forward.default: 3,
    _ATEN.nll_loss2d_forward.default: 3,
    _ATEN.mse_loss.default: 2,
    _ATEN.l1_loss.default: 2,
    _ATEN.smooth_l1_loss.default: 2,
    _ATEN.huber_loss.default: 2,
    _ATEN.binary_cross_entropy.default: 3,
    _ATEN.binary_cross_entropy_with_logits.default: 4,
    _ATEN.kl_div.default: 2,
}


def _is_full_sum(node: Any) -> bool:
    """Whether a traced node is a sum of everything it reduces: aten.sum over all dims, or a
    loss op with reduction="sum" (through the getitem of a multi-output loss)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _is_full_sum(node.args[0])
    if node.target is _ATEN.sum.default:
        return True
    if node.target is _ATEN.sum.dim_IntList:
        src = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
        dims = node.args[1] if len(node.args) > 1 else None
        return isinstance(src, torch.Tensor) and (not dims or len(set(dims)) == src.dim())
    i = _REDUCTION_ARG.get(node.target)
    if i is None:
        return False
    reduction = node.args[i] if len(node.args) > i else node.kwargs.get("reduction", 1)
    return reduction == 2


def scalar_outputs_are_sums(gm: Any) -> bool:
    """Whether every floating scalar a traced forward returns is a sum over its batch (dp
    replicas then add theirs up; a mean is weighed by each replica's share of the rows). A
    forward that returns a sum and a mean is left to the mean rule, with a warning."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    scalars = [
        a
        for a in pytree.tree_leaves(out.args[0])
        if hasattr(a, "meta")
        and isinstance(a.meta.get("val"), torch.Tensor)
        and a.meta["val"].dim() == 0
        and a.meta["val"].is_floating_point()
    ]
    sums = [a for a in scalars if _is_full_sum(a)]
    if sums and len(sums) < len(scalars):
        log.warning(
            "torch_plugin sharding: the model returns sums over the batch (%s) and other "
            "scalars (%s); dp replicas combine them all as means",
            ", ".join(a.name for a in sums),
            ", ".join(a.name for a in scalars if a not in sums),
        )
    return bool(scalars) and len(sums) == len(scalars)


def _refuse_batch_statistics(model: nn.Module) -> None:
    """Batch norm in training normalises by statistics over the whole batch: dp replicas
    would each use their slice's (ResNet on a (2, 2) mesh trained 1.0% away from one
    process), so a dp axis is refused rather than run with other numbers."""
    from torch.nn.modules.batchnorm import _BatchNorm

    for name, mod in model.named_modules():
        if isinstance(mod, _BatchNorm) and mod.training:
            raise NotImplementedError(
                f"module '{name}' ({type(mod).__name__}) normalises over the batch in training, "
                "and a dp axis would split its statistics: use a 1-D (tensor-parallel) mesh, "
                "or call parallelize on the model in eval mode"
            )


def _capture(model: nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]]) -> _Captured:
    """ATen forward graph of model(*args, **kwargs) over (params, buffers, the call's tensors),
    on fake tensors, as the planner's IR. Where layers checkpoint their activations in training,
    each node records the modules it ran in (the program outlines those layers again:
    runtime/recompute.py)."""
    recompute = model.training and bool(checkpointed_layers(model))
    traced = trace_call(model, call, record_module_stack=recompute)
    n_user = len(traced.tensor_at)
    kinds = (
        [("parameter", n) for n in traced.pnames]
        + [("buffer", n) for n in traced.bnames]
        + [("user", "")] * n_user
    )
    graph, ctx = fx_bridge.to_ir(traced.gm, kinds)
    return _Captured(
        graph,
        ctx,
        traced.pnames,
        traced.bnames,
        traced.in_spec,
        traced.constants,
        traced.out_spec,
        traced.unused_inputs,
        traced.gm,
    )


def _shapes(gm: Any) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            out.append((n.name, tuple(int(d) for d in val.shape)))
    return out


def _refuse_batch_coupling(model: nn.Module, full_call: Any, local: _Captured) -> Any:
    """A dp replica runs the program on its slice of the batch; where the model combines
    samples with each other (CLIP's contrastive logits [batch, batch], a loss over them),
    the slices would compute other numbers than one process (CLIP's loss was 0 on a (2, 2)
    mesh: one sample per replica, nothing to contrast). The forward traced at the whole
    batch against the slice's: a tensor whose size changes outside dim 0 carries the batch
    in another dimension, and a dp axis is refused, naming the node. Returns which random
    draws run along the batch (draws_along_batch), for the replicas' dropout masks."""
    whole = trace_call(model, full_call)
    a, b = _shapes(whole.gm), _shapes(local.gm)
    along = draws_along_batch(whole.gm, local.gm)
    if len(a) != len(b):  # another program at another batch (data-dependent)
        log.warning(
            "torch_plugin sharding: %s traces to %d nodes at the whole batch and %d at a dp "
            "replica's slice; whether it combines samples across the batch was not checked",
            type(model).__name__,
            len(a),
            len(b),
        )
        return along
    for (name, full), (_, part) in zip(a, b, strict=True):
        if len(full) == len(part) and any(x != y for x, y in zip(full[1:], part[1:], strict=True)):
            raise NotImplementedError(
                f"{type(model).__name__}: node '{name}' has shape {list(full)} for the whole "
                f"batch but {list(part)} for a dp replica's slice: the batch runs along "
                "another dimension there, as where samples are combined with each other (a "
                "contrastive loss), so a dp axis could change the numbers; use a 1-D "
                "(tensor-parallel) mesh"
            )
    return along


def capture_graph(model: nn.Module, example_inputs: Any) -> _C.Graph:
    """The ATen forward graph the sharding planner sees (no process group needed; a model on
    the `meta` device works, so plans of models too big for this machine can be modelled).
    example_inputs: positional arguments, or a dict of keyword arguments."""
    return _capture(model, as_call(example_inputs)).graph


def _meta_copy(model: nn.Module) -> nn.Module:
    """The model's structure with its parameters and buffers on the meta device (no copy of
    their data): what a second capture traces."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) not in memo:
            meta = torch.empty_like(t, device="meta")
            memo[id(t)] = (
                nn.Parameter(meta, requires_grad=t.requires_grad)
                if isinstance(t, nn.Parameter)
                else meta
            )
    try:
        return copy.deepcopy(model, memo)
    except Exception as e:  # noqa: BLE001 - only a second capture needs it
        log.info(
            "torch_plugin sharding: no meta copy of the model (%s); autocast is then "
            "taken as captured",
            e,
        )
        return None  # type: ignore[return-value]


def _init_blocks_like_constructor(
    model: nn.Module,
    seed: int,
    block_of: Callable[[str, torch.Tensor], torch.Tensor],
    skip: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's blocks of a `meta` model's tensors, initialised as a single process building
    the model after `torch.manual_seed(seed)` would: module by module in registration order
    (the constructor's order), each module's tensors made whole on the CPU, reset, cut to this
    rank's block and dropped, so peak memory is one module's tensors, not the model's. A module
    without reset_parameters() is initialised by the model's own `_init_weights` where it has
    one (HF models: norms, rotary tables). Tensors named in `skip` (read from a checkpoint
    next) get uninitialised blocks; a module whose tensors are all skipped is not built."""
    rng = torch.get_rng_state()
    torch.manual_seed(seed)
    hf_init = getattr(model, "_init_weights", None)
    # A tied tensor (lm_head.weight is embed_tokens.weight) is yielded once, under the name
    # named_parameters() gives it: by the module that registered it first.
    canonical = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    try:
        for mod_name, mod in model.named_modules():
            prefix = f"{mod_name}." if mod_name else ""
            direct = [
                (name, t)
                for name, t in [
                    *mod.named_parameters(recurse=False),
                    *mod.named_buffers(recurse=False),
                ]
                if canonical.get(id(t)) == prefix + name
            ]
            if not direct:
                continue
            if all(prefix + name in skip for name, _ in direct):
                for name, t in direct:
                    yield (
                        prefix + name,
                        torch.empty_like(block_of(prefix + name, t.detach()), device="cpu"),
                    )
                continue
            if not hasattr(mod, "reset_parameters") and hf_init is None:
                raise ValueError(
                    f"module '{mod_name}' ({type(mod).__name__}) is on the meta device and has no "
                    "reset_parameters(); build it on the CPU, or give it one"
                )
            whole = copy.copy(mod)  # shallow: materialise its own tensors, not the model's
            whole._parameters = dict(mod._parameters)
            whole._buffers = dict(mod._buffers)
            whole._modules = {}
            whole.to_empty(device="cpu", recurse=False)
            with torch.no_grad():
                if hasattr(whole, "reset_parameters"):
                    whole.reset_parameters()
                else:
                    hf_init(whole)
            for name, _ in direct:
                t = getattr(whole, name)
                yield prefix + name, block_of(prefix + name, t.detach()).clone()
            del whole
    finally:
        torch.set_rng_state(rng)
