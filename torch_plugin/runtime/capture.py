"""Capturing a model's call as one ATen graph, for the passes that split it across ranks
(sharding, graph pipelines): the model's own calling convention (positional and keyword
arguments, non-tensor arguments as constants, pytree outputs such as ModelOutput), traced
with make_fx over fake tensors, and the HF conventions the runtimes need (how many labels the
loss averages over, whether the model takes num_items_in_batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from .recompute import tag_checkpointed_calls

log = logging.getLogger("torch_plugin.capture")


@dataclasses.dataclass
class TracedCall:
    """make_fx's graph of model(*args, **kwargs) over (parameters, buffers, tensor leaves)."""

    gm: fx.GraphModule
    pnames: list[str]
    bnames: list[str]
    in_spec: pytree.TreeSpec  # of the call's (args, kwargs)
    tensor_at: list[int]  # leaf index of each tensor placeholder after the state
    constants: dict[int, Any]  # leaf index -> a non-tensor argument, fixed in the graph
    out_spec: pytree.TreeSpec
    unused_inputs: set[str]  # keyword arguments the graph does not read


def as_call(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of a call: a dict of example inputs is the keyword arguments (as HF
    models are called), anything else the positional ones. Keywords are sorted so that the
    order a caller writes them in does not matter."""
    if isinstance(example_inputs, dict):
        return (), dict(sorted(example_inputs.items()))
    return tuple(example_inputs), {}


def label_counter(model: nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    """For data parallelism over a batch with ignored labels (-100, padding): a function
    counting the labels the model's loss averages over, so that replicas whose slices hold
    different shares of padding combine into one process's loss exactly. None without
    `labels`."""
    labels = call[1].get("labels")
    if not isinstance(labels, torch.Tensor):
        return None
    return model_label_counter(model)


def model_label_counter(model: nn.Module) -> Any:
    """label_counter for any call of `model` that passes labels."""
    # Causal LMs predict token t+1 from t: their loss sees the labels shifted by one.
    shifted = getattr(model, "loss_type", None) == "ForCausalLM" or type(model).__name__.endswith(
        ("ForCausalLM", "LMHeadModel")
    )

    def count(labels: torch.Tensor) -> torch.Tensor:
        seen = labels[..., 1:] if shifted and labels.dim() > 1 else labels
        return (seen != -100).sum()

    return count


# Keyword inputs that run along the batch with input_ids / inputs_embeds in HF models.
_BATCH_KEYWORDS = ("attention_mask", "labels", "position_ids", "token_type_ids")


def check_batch_agrees(kwargs: dict[str, Any]) -> None:
    """A mask, label or position tensor whose batch (dim 0) differs from the input ids' is
    named here; the model would fail deep inside with a broadcast error, or, for labels,
    a loss over mismatched rows."""
    lead = next(
        (
            (k, kwargs[k])
            for k in ("input_ids", "inputs_embeds")
            if isinstance(kwargs.get(k), torch.Tensor) and kwargs[k].dim() > 0
        ),
        None,
    )
    if lead is None:
        return
    name, ref = lead
    for k in _BATCH_KEYWORDS:
        x = kwargs.get(k)
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] == ref.shape[0]:
            continue
        if k == "position_ids" and x.shape[0] == 1:  # broadcast over the batch, as HF allows
            continue
        raise ValueError(
            f"`{k}` has a batch of {x.shape[0]} rows (shape {list(x.shape)}) but `{name}` "
            f"has {ref.shape[0]} (shape {list(ref.shape)}): every batch tensor of one call "
            "must hold the same rows"
        )


def takes_loss_kwargs(model: nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]]) -> bool:
    """Whether HF's num_items_in_batch can be passed (as HF's Trainer decides)."""
    if "num_items_in_batch" in call[1]:
        return False
    params = inspect.signature(model.forward).parameters.values()
    return any(p.kind is p.VAR_KEYWORD or p.name == "num_items_in_batch" for p in params)


def without_cache(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keywords with the model's KV cache turned off. Every HF causal LM ships with
    `config.use_cache=True` and then builds and returns a cache object even in training; that
    cache is no tensor of the training program (capture failed on it with "argument of type
    DynamicCache"), and attention computes the same numbers without it. The user's config is
    left as it is: only the captured call passes use_cache=False, and `past_key_values` is
    None in the program's outputs."""
    if kwargs.get("use_cache") is False:
        return kwargs
    try:
        accepts = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepts = False
    if not accepts:
        return kwargs
    asked = kwargs.get("use_cache", getattr(getattr(model, "config", None), "use_cache", None))
    if asked:
        log.info(
            "torch_plugin: %s's KV cache (use_cache=True) is not part of the captured program: "
            "captured with use_cache=False, past_key_values is None in its outputs",
            type(model).__name__,
        )
    return {**kwargs, "use_cache": False}


def _data_dependent(e: BaseException) -> bool:
    """Whether a capture failed on a branch or shape that depends on a tensor's values."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    kinds: tuple[type[BaseException], ...] = (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        kinds += (GuardOnDataDependentSymNode,)
    except ImportError:  # pragma: no cover - older torch
        pass
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def leaf_name(path: Any) -> str:
    """A leaf of a call's (args, kwargs), from its pytree path, in a user's words: `input_ids`,
    or positional argument 0."""
    if len(path) >= 2 and getattr(path[0], "idx", None) == 1:
        return f"`{getattr(path[1], 'key', path[1])}`"
    if len(path) >= 2 and getattr(path[0], "idx", None) == 0:
        return f"positional argument {getattr(path[1], 'idx', path[1])}"
    return pytree.keystr(path)


def describe(spec: pytree.TreeSpec) -> str:
    """A call structure in a user's words: its positional count and keyword names."""
    try:
        args, kwargs = pytree.tree_unflatten([0] * spec.num_leaves, spec)
        return f"{len(args)} positional argument(s) and keywords {sorted(kwargs) or '[]'}"
    except Exception:  # noqa: BLE001 - only a message
        return str(spec)


@contextlib.contextmanager
def static_experts(model: nn.Module) -> Iterator[None]:
    """HF mixture-of-experts layers traced with static shapes. Their default grouped matmul
    has no float32 fake kernel (capture failed with "Expected inputs of BF16 type") and the
    eager loop indexes tokens by their routing (data-dependent shapes): `batched_mm` gathers
    each token's experts with fixed shapes, the same numbers."""
    config = getattr(model, "config", None)
    setter = getattr(model, "set_experts_implementation", None)
    current = getattr(config, "_experts_implementation", None)
    if setter is None or current not in (None, "grouped_mm"):
        yield
        return
    try:
        setter("batched_mm")
    except Exception as e:  # noqa: BLE001 - a model without experts: nothing to switch
        log.debug("torch_plugin: no experts implementation to set (%s)", e)
        yield
        return
    log.info("torch_plugin: %s's experts captured as batched_mm", type(model).__name__)
    try:
        yield
    finally:
        setter(current if current is not None else "grouped_mm")


@contextlib.contextmanager
def _without_saved_tensors_hooks() -> Iterator[None]:
    """The user's saved-tensor hooks (torch.autograd.graph.save_on_cpu around a training step)
    set aside while the call is traced: the trace is of the model, and its hooks ran into it
    (a `detach` per saved tensor), so a step under them that traced a new batch length was
    refused as a graph that "differs at node 'detach'". The captured program runs under them
    as eager does (they are restored before it runs)."""
    autograd = torch._C._autograd
    hooks = []
    top = getattr(autograd, "_top_saved_tensors_default_hooks", None)
    if top is not None:
        while (pair := top(True)) is not None:
            hooks.append(pair)
            autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(hooks):
            autograd._push_saved_tensors_default_hooks(pack, unpack)


def trace_call(
    model: nn.Module,
    call: tuple[tuple[Any, ...], dict[str, Any]],
    *,
    record_module_stack: bool = False,
) -> TracedCall:
    """ATen forward graph of model(*args, **kwargs) over (params, buffers, the call's tensors),
    on fake tensors. Non-tensor arguments (return_loss=True, a mode string) are constants of
    the graph. record_module_stack: each node's `nn_module_stack` names the modules it ran in
    (the pipeline partitioner groups nodes by it). Nodes traced inside a torch.utils.checkpoint
    call of the forward are tagged with it (runtime/recompute.py)."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    pnames, bnames = list(params), list(buffers)
    with_paths, in_spec = pytree.tree_flatten_with_path(call)
    leaves = [x for _, x in with_paths]
    tensor_at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    constants = {i: x for i, x in enumerate(leaves) if not isinstance(x, torch.Tensor)}
    flat = [leaves[i] for i in tensor_at]
    out_spec: list[pytree.TreeSpec] = []
    n_state = len(pnames) + len(bnames)

    def forward(*args: Any) -> tuple[Any, ...]:
        state = dict(zip(pnames + bnames, args[:n_state], strict=True))
        call = list(leaves)
        for i, x in zip(tensor_at, args[n_state:], strict=True):
            call[i] = x
        cargs, ckwargs = pytree.tree_unflatten(call, in_spec)
        ckwargs = without_cache(model, ckwargs)
        out = torch.func.functional_call(model, state, tuple(cargs), ckwargs)
        out_leaves, spec = pytree.tree_flatten(out)
        out_spec.append(spec)
        return tuple(out_leaves)

    if record_module_stack:
        forward._orig_mod = model  # type: ignore[attr-defined]  # make_fx's module-stack root

    args = [*params.values(), *buffers.values(), *flat]
    if any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
        # A model too big to build: trace on fake CPU tensors (no storage) so the graph has the
        # CPU kernels' ops (e.g. flash SDPA) rather than meta decompositions.
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        converted = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_meta:
                with mode:
                    a = torch.empty_strided(
                        a.shape, a.stride(), dtype=a.dtype, device="cpu"
                    ).requires_grad_(a.requires_grad)  # kernel choices depend on it (SDPA)
            elif isinstance(a, torch.Tensor):
                a = mode.from_tensor(a)
            converted.append(a)
        args = converted
    try:
        with static_experts(model), _without_saved_tensors_hooks(), tag_checkpointed_calls():
            gm = make_fx(forward, tracing_mode="fake", record_module_stack=record_module_stack)(
                *args
            )
    except Exception as e:
        if not _data_dependent(e):
            # The model's own error (a keyword it does not take, mismatched sizes): raised as
            # the model raised it, with where it happened.
            e.add_note(
                f"torch_plugin: raised by the forward of {type(model).__name__} while capturing "
                f"it for {describe(in_spec)}"
            )
            raise
        raise RuntimeError(
            f"torch_plugin: the forward of {type(model).__name__} could not be captured as one "
            f"graph for {describe(in_spec)} ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}). Data-dependent "
            "control flow (a Python branch on a tensor's values) cannot be split across ranks: "
            "make the branch static, or keep that module out of the distributed model"
        ) from e
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"][n_state:]
    unused = {  # keyword leaves sit at path (SequenceKey(1), MappingKey(name), ...)
        with_paths[i][0][1].key
        for i, node in zip(tensor_at, placeholders, strict=True)
        if not node.users and with_paths[i][0][0].idx == 1
    }
    return TracedCall(gm, pnames, bnames, in_spec, tensor_at, constants, out_spec[-1], unused)
