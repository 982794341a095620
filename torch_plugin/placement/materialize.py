"""Materialising a placement: each group as its own subgraph, compiled by its backend, called
from a host `fx.GraphModule` in the groups' order with eager's strides kept."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._prims_common import is_non_overlapping_and_dense_or_false

from ..fx_bridge import attribute
from .backends import Backend
from .result import Group

log = logging.getLogger("torch_plugin")


def build_subgraph(
    gm: fx.GraphModule,
    nodes: Sequence[str],
    inputs: Sequence[str],
    outputs: Sequence[str],
    constants: dict[str, torch.Tensor] | None = None,
) -> fx.GraphModule:
    """The group as its own GraphModule: placeholders for its inputs, a tuple of its outputs.
    Tuple-producing nodes bring their getitem users along (the IR folds them into outputs).
    Inputs named in `constants` (frozen parameters) become attributes of the module instead,
    so a graph compiler sees them as weights it may fold and prepack."""
    by_name = {n.name: n for n in gm.graph.nodes}
    group = set(nodes)
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    root: dict[str, Any] = {}
    constants = constants or {}
    for name in inputs:
        if name in constants:
            continue
        p = g.placeholder(name)
        p.meta = dict(by_name[name].meta)
        env[name] = p
    for name in inputs:
        if name in constants:
            attr = f"_frozen_{name}"
            root[attr] = constants[name].detach()
            env[name] = g.get_attr(attr)
            env[name].meta = dict(by_name[name].meta)
    for n in gm.graph.nodes:
        inside = n.name in group or (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
            and n.args[0].name in group
        )
        if inside:
            env[n.name] = g.node_copy(n, lambda a: env[a.name])
    g.output(tuple(env[o] for o in outputs))
    for n in g.nodes:
        if n.op == "get_attr" and str(n.target) not in root:
            root[str(n.target)] = attribute(gm, n.target)
    return fx.GraphModule(root, g)


class _GroupCall(torch.nn.Module):
    """A group compiled by a backend, called from the host graph."""

    def __init__(self, fn: Callable[..., Any], backend: str, nodes: int) -> None:
        super().__init__()
        self.fn = fn
        self.backend = backend
        self.num_nodes = nodes

    def forward(self, *args: Any) -> Any:
        return tuple(self.fn(*args))

    def extra_repr(self) -> str:
        return f"backend={self.backend}, nodes={self.num_nodes}"


def single_group_call(
    gm: fx.GraphModule, is_group: Callable[[fx.Node], bool]
) -> tuple[fx.Node, list[int], list[int]] | None:
    """(the call, the placeholder index of each of its arguments, the item of its result each
    output is) when the graph only hands some of its placeholders to one group call (a node
    `is_group` accepts) and returns items of that call's result: a whole graph placed on one
    compiler, the usual outcome on CPU. None for any other graph. Items of the result that
    nothing uses are allowed (dead code elimination may leave them)."""
    nodes = list(gm.graph.nodes)
    placeholders = {n: i for i, n in enumerate(n for n in nodes if n.op == "placeholder")}
    calls = [
        n
        for n in nodes
        if n.op not in ("placeholder", "output")
        and not (n.op == "call_function" and n.target is operator.getitem)
    ]
    if len(calls) != 1 or calls[0].kwargs or not is_group(calls[0]):
        return None
    call, out = calls[0], nodes[-1]
    if not all(isinstance(a, fx.Node) and a in placeholders for a in call.args):
        return None
    # Every other node is an item (operator.getitem) of some result: it must be the call's.
    items = {n for n in nodes if n.op == "call_function" and n is not call}
    if any(n.args[0] is not call or not isinstance(n.args[1], int) for n in items):
        return None
    if not isinstance(out.args[0], (tuple, list)) or not all(o in items for o in out.args[0]):
        return None
    order = [o.args[1] for o in out.args[0]]
    return call, [placeholders[a] for a in call.args], order


def boxed_single_group(gm: fx.GraphModule) -> Callable[[list[Any]], Any] | None:
    """The placed graph as a boxed callable (AOTAutograd's convention: one list of arguments,
    emptied by the callee) when it is one compiled group fed by some of its placeholders
    (single_group_call). None for any other graph.

    The graph's own code unpacks every argument first: with frozen weights, ResNet-50's 268
    (one used) cost 80 us a call, 150 us right after an OpenVINO inference has evicted the
    caches. This calls the group with the arguments it takes and nothing else."""
    found = single_group_call(
        gm,
        lambda n: n.op == "call_module" and type(gm.get_submodule(str(n.target))) is _GroupCall,
    )
    if found is None:
        return None
    call, index, order = found
    group = gm.get_submodule(str(call.target))
    # group.fn read per call, as _GroupCall.forward reads it.
    if len(index) == 1 and len(order) == 1:
        (i,), (k,) = index, order

        def run_one(args: list[Any]) -> Any:
            x = args[i]
            args.clear()
            return (group.fn(x)[k],)

        run_one._boxed_call = True  # type: ignore[attr-defined]
        return run_one

    def run(args: list[Any]) -> Any:
        xs = [args[i] for i in index]
        args.clear()
        res = group.fn(*xs)
        return tuple([res[k] for k in order])

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _eager_stride(n: fx.Node) -> tuple[int, ...] | None:
    """The strides of a node's eager value where they are not the contiguous ones (None
    otherwise): ATen ops after it may depend on them. SDPA's output, for one, is laid out so
    that its transpose is contiguous and the `view` after it works; a backend returns it
    contiguous, and the view then fails."""
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    # Symbolic strides (a dynamic graph): reading them as ints would specialise the graph to
    # the sizes it was traced at, and Dynamo would compile it again for every other size.
    if any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
        return None
    try:
        stride = tuple(int(s) for s in val.stride())
        # Only a dense layout can be rebuilt with empty_strided (not an expand's zero strides).
        dense = is_non_overlapping_and_dense_or_false(val)
        contiguous = bool(val.is_contiguous())
    except Exception:  # noqa: BLE001 - symbolic strides: nothing to enforce
        return None
    return stride if dense and not contiguous else None


def _restride(t: Any, stride: tuple[int, ...]) -> Any:
    """`t` with the given strides (a copy only where they differ)."""
    if not isinstance(t, torch.Tensor) or t.stride() == stride:
        return t
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def materialize(
    gm: fx.GraphModule, groups: Sequence[Group], compiled: Sequence[Callable[..., Any] | None]
) -> fx.GraphModule:
    """The host GraphModule: aten groups inline, others as call_module of their callables, in
    the groups' order (a valid execution order, from the DP)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    getitems: dict[str, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
        ):
            getitems.setdefault(n.args[0].name, []).append(n)
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    root: dict[str, Any] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n.name] = g.node_copy(n, lambda a: env[a.name])
        elif n.op == "get_attr":  # lifted constants: the new module needs them too
            root[str(n.target)] = attribute(gm, n.target)
    for gi, (group, fn) in enumerate(zip(groups, compiled, strict=True)):
        if fn is None:
            for name in sorted(group.nodes, key=list(by_name).index):
                n = by_name[name]
                env[name] = g.node_copy(n, lambda a: env[a.name])
                for gitem in getitems.get(name, []):
                    env[gitem.name] = g.node_copy(gitem, lambda a: env[a.name])
            continue
        sub = f"group{gi}_{group.backend}"
        root[sub] = _GroupCall(fn, group.backend, len(group.nodes))
        call = g.call_module(sub, tuple(env[i] for i in group.arguments()))
        for k, o in enumerate(group.outputs):
            item = g.call_function(operator.getitem, (call, k))
            item.meta = dict(by_name[o].meta)
            stride = _eager_stride(by_name[o])
            if stride is not None:
                item = g.call_function(_restride, (item, stride))
                item.meta = dict(by_name[o].meta)
            env[o] = item
    out = next(n for n in gm.graph.nodes if n.op == "output")
    g.node_copy(out, lambda a: env[a.name])
    return fx.GraphModule(root, g)


def frozen_inputs(
    gm: fx.GraphModule, inputs: Sequence[Any], input_kinds: Sequence[tuple[str, str]]
) -> dict[str, torch.Tensor]:
    """The graph's parameter and buffer inputs by placeholder name: what graph compilers'
    subgraphs take as constants when weights are frozen."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return {
        name: x
        for name, (kind, _), x in zip(placeholders, input_kinds, inputs, strict=False)
        if kind in ("parameter", "buffer") and isinstance(x, torch.Tensor)
    }


def compile_region(
    gm: fx.GraphModule,
    nodes: Sequence[str],
    backend: Backend,
    values: dict[str, Any],
    consts: dict[str, torch.Tensor],
    rule: str,
) -> tuple[Group, Callable[..., Any]]:
    """`nodes` (a convex stretch of `gm`) as one region of `backend`, compiled with the
    recorded values of its inputs; `consts` inputs become constants of the region. Raises
    what the backend raises."""
    inputs, outputs = _region(gm, nodes)
    call_inputs = [x for x in inputs if x not in consts]
    sub = build_subgraph(gm, nodes, inputs, outputs, consts)
    fn = backend.compile(sub, [values[x] for x in call_inputs], rule)
    return Group(backend.name, "region", list(nodes), inputs, outputs, 0.0, [], call_inputs), fn


def _frozen_for(backend: Backend, frozen: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return frozen if backend.graph_level else {}


def _region(gm: fx.GraphModule, nodes: Sequence[str]) -> tuple[list[str], list[str]]:
    """Inputs and outputs (by value name) of a set of nodes, as the IR names them."""
    group = set(nodes)
    for n in gm.graph.nodes:
        if (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
            and n.args[0].name in group
        ):
            group.add(n.name)
    inputs: list[str] = []
    outputs: list[str] = []
    for n in gm.graph.nodes:
        if n.name not in group:
            continue
        for a in n.all_input_nodes:
            if a.name not in group and a.name not in inputs:
                inputs.append(a.name)
        tuple_node = any(u.target is operator.getitem for u in n.users)
        if not tuple_node and any(u.name not in group for u in n.users):
            outputs.append(n.name)
    return inputs, outputs


class _LazyCompiled(Sequence):
    """Each non-ATen group's callable (None for ATen), compiled on first access. Compiling
    sets the group's call_inputs (its inputs less frozen ones); a group that fails to compile
    now (it measured fine once) runs on ATen, with a warning."""

    def __init__(
        self,
        gm: fx.GraphModule,
        groups: Sequence[Group],
        backends: dict[str, Backend],
        values: dict[str, Any],
        frozen: dict[str, torch.Tensor],
    ) -> None:
        self._gm, self._groups, self._backends = gm, groups, backends
        self._values, self._frozen = values, frozen
        self._fns: dict[int, Callable[..., Any] | None] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - int or slice, as a list's
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        if i not in self._fns:
            self._fns[i] = self._compile(self._groups[i])
        return self._fns[i]

    def __iter__(self) -> Iterator[Callable[..., Any] | None]:
        # Explicit: Sequence's own __iter__ would end silently on an IndexError from a compile.
        for i in range(len(self)):
            yield self[i]

    def compile_all(self) -> None:
        for _ in self:
            pass

    def _compile(self, g: Group) -> Callable[..., Any] | None:
        if g.backend == "aten":
            return None
        consts = _frozen_for(self._backends[g.backend], self._frozen)
        g.call_inputs = [i for i in g.inputs if i not in consts]
        sub = build_subgraph(self._gm, g.nodes, g.inputs, g.outputs, consts)
        try:
            args = [self._values[i] for i in g.call_inputs]
            return self._backends[g.backend].compile(sub, args, g.rule)
        except Exception as e:  # noqa: BLE001 - measured fine once; if not now, ATen runs it
            log.warning(
                "torch_plugin placement: %s failed to compile group %s (%s); it runs on aten",
                g.backend,
                g.nodes[:4],
                e,
            )
            g.backend, g.rule, g.call_inputs = "aten", "op", None
            return None
