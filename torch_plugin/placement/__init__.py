"""Backend placement (Collage): run each part of a model on the backend that is fastest for it.

fast = torch.compile(model, backend="torch_plugin", options={"passes": ["placement"]})
placed = torch_plugin.place(model, example_inputs)       # the same, plus the decision
print(placed.placement.table()); placed.placement.save_png("placement.png")
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.nn.modules.module import (
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

from .backends import BACKENDS, DEFAULT_BACKENDS, Backend, BackendError, get_backends
from .cache import ProfileCache
from .materialize import single_group_call
from .planner import PlacementOptions, PlacementResult, place_graph

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKENDS",
    "Backend",
    "BackendError",
    "PlacedModule",
    "PlacementOptions",
    "PlacementResult",
    "ProfileCache",
    "get_backends",
    "place",
    "place_graph",
    "record",
]


@contextlib.contextmanager
def record() -> Iterator[list[PlacementResult]]:
    """Collects the PlacementResult of every graph placed inside the block."""
    from ..backend import _PLACEMENT_SINKS, _remove_sink

    sink: list[PlacementResult] = []
    _PLACEMENT_SINKS.append(sink)
    try:
        yield sink
    finally:
        _remove_sink(_PLACEMENT_SINKS, sink)


class _DirectCall:
    """The placed graph called without Dynamo and AOTAutograd in front of it.

    For a fixed-weight inference module whose forward compiled to one graph, Dynamo's guards
    and AOTAutograd's wrapper only re-derive, on every call, the same flat argument list from
    the same parameters and the user's tensors: 0.2-0.8 ms on a zoo model, the order of its
    whole latency. This records, once, where each argument of the placed graph comes from (a
    user's positional tensor or one of the module's parameters and buffers, by identity) and
    where each leaf of the returned structure comes from, then replays that. It is used only
    for calls whose tensors match the recorded shapes, dtypes and devices, with the same
    non-tensor arguments; anything else goes through the compiled module (and its guards).

    Keyword arguments (an HF model's `input_ids=..., attention_mask=...`) are the arguments
    after the positional ones, in the recorded names' order: a call must pass the same names."""

    def __init__(
        self,
        graph: Any,
        sources: list[tuple[str, Any]],
        signature: tuple[Any, ...],
        out_spec: Any,
        out_leaves: list[tuple[str, Any]],
        kw_names: tuple[str, ...] = (),
        aliases: Sequence[tuple[int, ...]] = (),
    ) -> None:
        self.graph = graph
        self.kw_names = kw_names
        # Arguments that were one tensor in the example (`labels=input_ids`): Dynamo gave the
        # graph one input for them, so a call must pass one tensor there too.
        self.aliases = list(aliases)
        self.positional = len(signature) - len(kw_names)
        self.sources = sources
        self.signature = signature
        self.out_spec = out_spec
        self.out_leaves = out_leaves
        gm = getattr(graph, "graph_module", None)
        self.lean = _lean_module(gm, sources) if isinstance(gm, fx.GraphModule) else None
        self.input_index = [v for kind, v in sources if kind == "input"]
        self.single = _single_call(self.lean) if self.lean is not None else None
        # What matches() compares, per positional argument: a tensor's shape, dtype, device
        # and requires_grad, or a value's type and value.
        self._checks = [
            (True, torch.Size(s[0]), s[1], s[2], s[3]) if len(s) == 4 else (False, s[1], s[2])
            for s in signature
        ]
        self.run = self._fastest_run()
        if not kw_names and len(self._checks) == 1 and self._checks[0][0]:  # one tensor
            _, shape, dtype, device, requires_grad = self._checks[0]
            tensor = torch.Tensor

            def matches_one(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
                if kwargs or len(args) != 1:
                    return False
                a = args[0]
                try:
                    return (
                        isinstance(a, tensor)
                        and a.shape == shape
                        and a.dtype == dtype
                        and a.device == device
                        and a.requires_grad == requires_grad
                    )
                except Exception:  # noqa: BLE001 - a tensor without sizes (nested): not ours
                    return False

            self.matches = matches_one  # type: ignore[method-assign]

    def _fastest_run(self) -> Callable[..., Any]:
        """__call__, or for the usual outcome (one compiled region, one tensor returned) a
        closure with nothing else in it: after a call into a runtime whose threads still
        spin, each line of Python here costs about three times what it does alone."""
        if (
            self.single is None
            or len(self.out_leaves) != 1
            or self.out_leaves[0][0] != "output"
            or not self.out_spec.is_leaf()
        ):
            return self.__call__
        fn, order = self.single
        k = order[self.out_leaves[0][1]]
        if self.input_index == list(range(len(self.signature))):
            return lambda *args: fn(*args)[k]
        index = self.input_index
        return lambda *args: fn(*[args[i] for i in index])[k]

    @staticmethod
    def signature_of(args: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(
            (tuple(a.shape), a.dtype, a.device, a.requires_grad)
            if isinstance(a, torch.Tensor)
            else ("value", type(a), a)
            for a in args
        )

    def flat(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The call's arguments as the recorded flat list (keyword arguments after the rest)."""
        return (*args, *(kwargs[n] for n in self.kw_names)) if self.kw_names else tuple(args)

    def matches(self, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        if len(kwargs) != len(self.kw_names) or len(args) != self.positional:
            return False
        if kwargs:
            if any(n not in kwargs for n in self.kw_names):
                return False
            args = self.flat(args, kwargs)
        for group in self.aliases:
            if any(args[i] is not args[group[0]] for i in group[1:]):
                return False
        try:
            for a, check in zip(args, self._checks):  # noqa: B905 - lengths compared above
                if check[0]:
                    _, shape, dtype, device, requires_grad = check
                    if not (
                        isinstance(a, torch.Tensor)
                        and a.shape == shape
                        and a.dtype == dtype
                        and a.device == device
                        and a.requires_grad == requires_grad
                    ):
                        return False
                elif isinstance(a, torch.Tensor) or type(a) is not check[1] or a != check[2]:
                    return False
            return True
        except Exception:  # noqa: BLE001 - an argument that cannot be compared: not ours
            return False

    def __call__(self, *args: Any) -> Any:
        if self.single is not None:  # one compiled region: call it, pick its outputs
            fn, order = self.single
            res = fn(*[args[i] for i in self.input_index])
            outs: Any = [res[k] for k in order]
        elif self.lean is not None:
            # forward, not __call__: our own module, no hooks to run.
            outs = self.lean.forward(*[args[i] for i in self.input_index])
        else:  # the graph takes its arguments boxed (one list, which it empties)
            outs = self.graph([args[v] if kind == "input" else v for kind, v in self.sources])
        leaves = [outs[v] if kind == "output" else v for kind, v in self.out_leaves]
        return torch.utils._pytree.tree_unflatten(leaves, self.out_spec)


def _single_call(lean: fx.GraphModule) -> tuple[Any, list[int]] | None:
    """(fn, output order) when the lean graph only passes its placeholders, in order, to one
    compiled group and returns items of its result (materialize.single_group_call): the
    whole model placed as one region, the usual outcome on CPU. Calling fn straight skips
    the graph's own frame."""
    found = single_group_call(
        lean,
        lambda n: n.op == "call_function" and getattr(n.target, "__name__", "") == "call_group",
    )
    if found is None:
        return None
    call, index, order = found
    if index != list(range(sum(n.op == "placeholder" for n in lean.graph.nodes))):
        return None
    return getattr(call.target, "fn", call.target), order


def _group_caller(fn: Any) -> Any:
    """fn under a name of our own: FX code refers to a function from a torch module (an
    Inductor-compiled `forward`, say) by its import path, which a closure does not have."""

    def call_group(*args: Any) -> Any:
        return fn(*args)

    call_group.fn = fn  # type: ignore[attr-defined]  # _single_call calls it straight
    return call_group


def _lean_module(gm: fx.GraphModule, sources: list[tuple[str, Any]]) -> fx.GraphModule | None:
    """The placed graph with the module's own tensors bound as attributes (a placeholder
    that only a frozen subgraph read disappears) and each compiled group called as a plain
    function: the user's tensors are its only arguments. On a ResNet placed as one ONNX
    Runtime region, this is most of the 15-20 us the host graph added per call."""
    from .planner import _GroupCall

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(sources):
        return None
    g = fx.Graph()
    root = torch.nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    for n, (kind, _) in zip(placeholders, sources, strict=True):
        if kind == "input":
            env[n] = g.placeholder(n.name)
    for k, (n, (kind, value)) in enumerate(zip(placeholders, sources, strict=True)):
        if kind != "input" and n.users:
            root.register_buffer(f"_const{k}", value, persistent=False)
            env[n] = g.get_attr(f"_const{k}")
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "call_module" and isinstance(gm.get_submodule(n.target), _GroupCall):
            target = _group_caller(gm.get_submodule(n.target).fn)
            env[n] = g.call_function(target, fx.node.map_arg(n.args, lambda a: env[a]))
            continue
        if n.op in ("call_module", "get_attr"):
            obj: Any = gm
            *path, last = str(n.target).split(".")
            holder: Any = root
            for part in path:
                obj = getattr(obj, part)
                if not hasattr(holder, part):
                    holder.add_module(part, torch.nn.Module())
                holder = getattr(holder, part)
            attr = getattr(obj, last)
            if isinstance(attr, torch.nn.Module):
                holder.add_module(last, attr)
            elif isinstance(attr, torch.Tensor) and not isinstance(attr, torch.nn.Parameter):
                holder.register_buffer(last, attr, persistent=False)
            else:
                setattr(holder, last, attr)
        env[n] = g.node_copy(n, lambda a: env[a])
    return fx.GraphModule(root, g)


def _immutable(v: Any) -> bool:
    """None, a number, a string, or a tuple of them: what compares (and replays) by value."""
    if isinstance(v, tuple):
        return all(_immutable(x) for x in v)
    return v is None or type(v) in (bool, int, float, str)


def _direct_call(
    model: torch.nn.Module,
    compiled: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
) -> _DirectCall | None:
    """Records a _DirectCall from one call of `compiled`, or None where it cannot be made
    exactly (several graphs, an argument or output of unknown origin, other numbers)."""
    from ..backend import recording_calls

    kwargs = kwargs or {}
    kw_names = tuple(kwargs)
    example_inputs = (*args, *(kwargs[n] for n in kw_names))

    # A non-tensor argument is compared with the recorded one by value: only immutable values
    # can be (an object compares by identity, and Dynamo guards on what it holds).
    if not all(isinstance(a, torch.Tensor) or _immutable(a) for a in example_inputs):
        return None
    with recording_calls() as calls, torch.no_grad():
        out = compiled(*args, **kwargs)
    if len(calls) != 1:
        return None
    graph, flat_in, flat_out = calls[0]
    owned = {id(t): t for t in (*model.parameters(), *model.buffers())}
    # Each tensor argument's positions: more than one when the example passed it twice.
    positions: dict[int, list[int]] = {}
    for i, a in enumerate(example_inputs):
        if isinstance(a, torch.Tensor):
            positions.setdefault(id(a), []).append(i)
    aliases = [tuple(g) for g in positions.values() if len(g) > 1]
    sources: list[tuple[str, Any]] = []
    for a in flat_in:
        if isinstance(a, torch.Tensor) and id(a) in positions:
            sources.append(("input", positions[id(a)][0]))
        elif isinstance(a, torch.Tensor) and id(a) in owned:
            sources.append(("const", owned[id(a)]))
        else:
            return None
    # The returned structure's tensors by identity with the graph's outputs (Dynamo hands
    # them through). A non-tensor leaf is replayed as a constant only when it is an immutable
    # value: another object (a KV cache, say) may hold this call's tensors.
    by_id = {id(t): i for i, t in enumerate(flat_out) if isinstance(t, torch.Tensor)}
    leaves, spec = torch.utils._pytree.tree_flatten(out)
    out_leaves: list[tuple[str, Any]] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) not in by_id:
                return None
            out_leaves.append(("output", by_id[id(leaf)]))
        elif _immutable(leaf):
            out_leaves.append(("const", leaf))
        else:
            return None
    signature = _DirectCall.signature_of(example_inputs)
    direct = _DirectCall(graph, sources, signature, spec, out_leaves, kw_names, aliases)
    with torch.no_grad():
        again = torch.utils._pytree.tree_leaves(direct(*example_inputs))
    same = len(again) == len(leaves) and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        for a, b in zip(again, leaves, strict=True)
    )
    return direct if same else None


class PlacedModule(torch.nn.Module):
    """A model compiled with the placement pass; `.placement` holds the decision per graph."""

    def __init__(
        self, compiled: Any, results: list[PlacementResult], direct: _DirectCall | None = None
    ) -> None:
        super().__init__()
        self.compiled = compiled
        self.results = results
        self.__dict__["direct"] = direct

    @property
    def placement(self) -> PlacementResult:
        if not self.results:
            raise RuntimeError(
                "torch_plugin.place: no graph was placed (did the model fall back? see the log)"
            )
        return self.results[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Module.__call__ costs a few microseconds of hook bookkeeping, a few percent of a
        # sub-millisecond model: skipped on the direct path when no hook is registered.
        direct = self.direct
        if (
            direct is not None
            and not (self._forward_pre_hooks or self._forward_hooks)
            and not (_global_forward_pre_hooks or _global_forward_hooks)
            and direct.matches(args, kwargs)
        ):
            if kwargs:
                args = direct.flat(args, kwargs)
            if not torch.is_grad_enabled():
                return direct.run(*args)
            # torch.no_grad() without the context manager object (a microsecond a call).
            torch._C._set_grad_enabled(False)
            try:
                return direct.run(*args)
            finally:
                torch._C._set_grad_enabled(True)
        return super().__call__(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            if self.direct is not None and self.direct.matches(args, kwargs):
                return self.direct(*self.direct.flat(args, kwargs))
            return self.compiled(*args, **kwargs)


def place(
    model: torch.nn.Module,
    example_inputs: Sequence[Any] | dict[str, Any],
    on_error: str = "raise",
    direct: bool = True,
    **placement_options: Any,
) -> PlacedModule:
    """Compiles `model` for inference with the placement pass and runs it once on the example
    inputs (which triggers the search). Options: see PlacementOptions. The weights are frozen
    into graph compilers' subgraphs unless freeze=False: update them and place again.

    example_inputs: the positional arguments, or a dict of keyword arguments as an HF model
    is called (`place(model, {"input_ids": ids, "attention_mask": mask})`).

    direct: calls with the example inputs' shapes, dtypes and devices skip Dynamo's guards and
    AOTAutograd's wrapper and call the placed graph itself (see _DirectCall), when the model
    compiled to one graph whose arguments and outputs could all be traced to their origin
    (keyword calls too, with the example's names; an output holding an object such as a KV
    cache cannot be replayed and keeps the compiled path)."""
    placement_options.setdefault("freeze", True)
    opts = {
        "passes": ["placement"],
        "placement": PlacementOptions.from_user(placement_options),
        "on_error": on_error,
    }
    if isinstance(example_inputs, dict):
        args: tuple[Any, ...] = ()
        kwargs = dict(example_inputs)
    else:
        args, kwargs = tuple(example_inputs), {}
    compiled = torch.compile(model, backend="torch_plugin", options=opts)
    with record() as results, torch.no_grad():
        compiled(*args, **kwargs)
        if not results:
            # Dynamo served the graph an earlier place() of this model compiled with equal
            # options (its cache is per code object): compile again, so that this call
            # measures and reports a placement of its own.
            torch._dynamo.reset_code(type(model).forward.__code__)
            compiled(*args, **kwargs)
    fast = _direct_call(model, compiled, args, kwargs) if direct else None
    return PlacedModule(compiled, list(results), fast)
