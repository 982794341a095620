"""FX (ATen level, FakeTensor meta) <-> _C.Graph, both ways. The only code that reads node.meta.

Export turns every FX node into a record of Python primitives; no tensor crosses: parameters
and constants stay in Python and are referred to by placeholder or attribute name. Multi-output
ops (native_layer_norm, split, ...) become one C++ node with several outputs; their FX `getitem`
users become the outputs' names. Anything C++ cannot represent (an exotic Python object, a
non-ATen call target) crosses as an index into the BridgeContext and comes back unchanged.

Record formats (shared with csrc/bindings/module.cc):
  arg    : None | bool | int | float | str | ("v", value_id) | ("list"|"tuple", [arg...])
           | ("dtype"|"device"|"layout"|"memory_format", name) | ("opaque", index)
  type   : ("tensor", shape, stride, dtype, device, requires_grad) where a dim is an int or
           (expr, hint|None) | ("symint"|"symfloat"|"symbool", expr) | ("none",) | ("opaque", note)
  input  : (name, type, kind, source)          kind in user/parameter/buffer/symbol/tangent/saved
  node   : (name, op, args, kwargs, output_types, output_names, tuple_output, scope)
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from . import _C

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_KNOWN_DTYPES = {
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
}
_GET_ATTR, _CALL_MODULE, _CALL_METHOD = "fx::get_attr", "fx::call_module", "fx::call_method"


class BridgeError(RuntimeError):
    """The FX graph cannot be exported, or the IR cannot be imported; names the node."""


@dataclasses.dataclass
class BridgeContext:
    """What export keeps on the Python side so import can rebuild the exact FX graph."""

    gm: fx.GraphModule
    targets: dict[str, Any] = dataclasses.field(default_factory=dict)
    opaques: list[Any] = dataclasses.field(default_factory=list)
    meta: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    ops: dict[str, str] = dataclasses.field(default_factory=dict)  # node name -> op at export
    symbolic_inputs: int = 0  # tensor inputs with at least one symbolic dimension


# ---------------------------------------------------------------- export helpers


def attribute(gm: fx.GraphModule, target: Any) -> Any:
    """The object that a get_attr node's dotted `target` names on `gm` (a constant, a
    parameter, a submodule's buffer)."""
    obj: Any = gm
    for part in str(target).split("."):
        obj = getattr(obj, part)
    return obj


def op_name(target: Any) -> str:
    """Qualified op string for a call_function target: 'aten::mm.default', ..."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order::{target.name()}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"packet::{target._qualified_op_name}"
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return f"python::{module}.{qualname}"


def has_random_ops(graph: _C.Graph) -> bool:
    """Whether the IR graph draws random numbers (the op registry's class "random": dropout's
    bernoulli_, rand, ...)."""
    return any(cls == "random" for _, _, cls, *_ in graph.estimate())


def mutates_inputs(gm: fx.GraphModule) -> bool:
    """Whether a node writes into a graph input (AOTAutograd keeps an inference graph's input
    mutations, such as a KV cache's copy_, as ops on its placeholders)."""
    return bool(written_inputs(gm))


def written_inputs(gm: fx.GraphModule) -> list[int]:
    """The index of each placeholder some node writes into (an op whose schema marks that
    argument written: copy_, index_copy_, add_ ...), in placeholder order."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    written: set[int] = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        schema = n.target._schema
        for arg, value in zip(schema.arguments, n.args, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write and value in placeholders:
                written.add(placeholders[value])
    return sorted(written)


def is_saved_rng_state(n: fx.Node) -> bool:
    """Whether `n` is a generator state a forward saves for a random op its backward recomputes
    (AOTAutograd's functionalised RNG under activation checkpointing: element 0 of
    run_and_save_rng_state)."""
    src = n.args[0] if n.op == "call_function" and n.target is operator.getitem else None
    return (
        isinstance(src, fx.Node)
        and n.args[1] == 0
        and src.target is torch.ops.higher_order.run_and_save_rng_state
    )


def rng_state_inputs(gm: fx.GraphModule) -> set[str]:
    """The placeholders a graph runs a random op from as a generator state (a backward's
    recomputed dropout: run_with_rng_state's first argument)."""
    return {
        n.args[0].name
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is torch.ops.higher_order.run_with_rng_state
        and isinstance(n.args[0], fx.Node)
        and n.args[0].op == "placeholder"
    }


def _dim(d: Any) -> Any:
    if isinstance(d, torch.SymInt):
        as_int = d.node.maybe_as_int()
        if as_int is not None:
            return int(as_int)
        hint = d.node.hint if d.node.has_hint() else None
        return (str(d), None if hint is None else int(hint))
    return int(d)


def type_record(val: Any) -> tuple:
    """Type record of a node's meta['val'] (FakeTensor, SymInt, ...)."""
    if isinstance(val, torch.Tensor):
        dtype = str(val.dtype).removeprefix("torch.")
        if dtype not in _KNOWN_DTYPES or val.layout != torch.strided:
            return ("opaque", f"tensor:{dtype}:{val.layout}")
        try:
            stride = [_dim(s) for s in val.stride()]
        except (RuntimeError, NotImplementedError):
            stride = []
        return (
            "tensor",
            [_dim(s) for s in val.shape],
            stride,
            dtype,
            str(val.device),
            bool(val.requires_grad),
        )
    if isinstance(val, (torch.SymBool, bool)):
        return ("symbool", str(val))
    if isinstance(val, (torch.SymInt, int)):
        return ("symint", str(val))
    if isinstance(val, (torch.SymFloat, float)):
        return ("symfloat", str(val))
    if val is None:
        return ("none",)
    return ("opaque", type(val).__name__)


_CONTAINER_ATTRS = ("self", "_modules", "_parameters", "_buffers")


def module_path(source: str) -> str:
    """Dynamo's name for a module or tensor -> its dotted path in the model.

    "L['self']._modules['fc']._parameters['weight']" -> "fc.weight",
    "L['self'].layers[0].attn" -> "layers.0.attn", "L__self___fc" -> "fc". make_fx's module
    stacks (the sharding and pipeline captures) already hold the path, "model.layers.0.mlp":
    kept whole (its first component was dropped, so a pipeline's scope_depth of 3 grouped
    "layers.0.mlp", half a decoder layer, instead of "model.layers.0").
    """
    if source.startswith("L__self__"):
        return source.removeprefix("L__self__").lstrip("_")
    if re.fullmatch(r"\w+(\.\w+)*", source):
        return ".".join(p for p in source.split(".") if p not in _CONTAINER_ATTRS)
    parts = re.findall(r"\[['\"]?([^\]'\"]+)['\"]?\]|\.(\w+)", source)
    return ".".join(p for a, b in parts if (p := a or b) not in _CONTAINER_ATTRS)


def _scope(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    return module_path(str(list(stack.values())[-1][0]))


def _default_input_kind(node: fx.Node) -> tuple[str, str]:
    val = node.meta.get("val")
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("symbol", "")
    if node.name.startswith("tangents"):
        return ("tangent", "")
    return ("user", "")


def _foldable_users(node: fx.Node) -> dict[int, fx.Node] | None:
    """getitem users by index when `node` returns a flat tuple/list used only through getitem."""
    val = node.meta.get("val")
    if not isinstance(val, (tuple, list)) or not node.users:
        return None
    by_index: dict[int, fx.Node] = {}
    for user in node.users:
        if not (
            user.op == "call_function"
            and user.target is operator.getitem
            and user.args[0] is node
            and len(user.args) == 2
            and isinstance(user.args[1], int)
            and 0 <= user.args[1] < len(val)
            and user.args[1] not in by_index
        ):
            return None
        by_index[user.args[1]] = user
    return by_index


class _Exporter:
    def __init__(self, gm: fx.GraphModule):
        self.ctx = BridgeContext(gm=gm)
        self.value_of: dict[fx.Node, int] = {}
        self.next_value = 0

    def new_value(self, node: fx.Node) -> int:
        v = self.next_value
        self.next_value += 1
        self.value_of[node] = v
        return v

    def opaque(self, obj: Any) -> tuple[str, int]:
        self.ctx.opaques.append(obj)
        return ("opaque", len(self.ctx.opaques) - 1)

    def arg(self, a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a not in self.value_of:
                raise BridgeError(f"node '{a.name}' is used before it is defined or is a tuple")
            return ("v", self.value_of[a])
        if a is None or isinstance(a, (bool, str, float)):
            return a
        if isinstance(a, int):
            return a if _INT64_MIN <= a <= _INT64_MAX else self.opaque(a)
        if isinstance(a, list):
            return ("list", [self.arg(x) for x in a])
        if type(a) is tuple:
            return ("tuple", [self.arg(x) for x in a])
        if isinstance(a, torch.dtype):
            return ("dtype", str(a).removeprefix("torch."))
        if isinstance(a, torch.device):
            return ("device", str(a))
        if isinstance(a, torch.layout):
            return ("layout", str(a).removeprefix("torch."))
        if isinstance(a, torch.memory_format):
            return ("memory_format", str(a).removeprefix("torch."))
        return self.opaque(a)


def to_ir(
    gm: fx.GraphModule, input_kinds: Sequence[tuple[str, str]] | None = None
) -> tuple[_C.Graph, BridgeContext]:
    """Exports an ATen-level FX graph to a verified _C.Graph (raises GraphError/BridgeError).

    input_kinds: optional (kind, source) per placeholder, e.g. ("parameter", "fc.weight").
    """
    ex = _Exporter(gm)
    ctx = ex.ctx
    inputs: list[tuple] = []
    nodes: list[tuple] = []
    output: Any = ("tuple", [])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if input_kinds is not None and len(input_kinds) != len(placeholders):
        input_kinds = None
    folded: set[fx.Node] = set()

    for node in gm.graph.nodes:
        ctx.meta[node.name] = node.meta
        if node.op == "placeholder":
            if node.args:
                raise BridgeError(f"placeholder '{node.name}' has a default value; not supported")
            kind, source = (
                input_kinds[len(inputs)] if input_kinds is not None else _default_input_kind(node)
            )
            ex.new_value(node)
            rec = type_record(node.meta.get("val"))
            if rec[0] == "tensor" and any(isinstance(d, tuple) for d in rec[1]):
                ctx.symbolic_inputs += 1
            inputs.append((node.name, rec, kind, source))
            continue
        if node.op == "output":
            output = ex.arg(node.args[0])
            continue
        if node in folded:
            continue
        args, kwargs = list(node.args), dict(node.kwargs)
        if node.op == "call_function":
            op = op_name(node.target)
            ctx.targets.setdefault(op, node.target)
        elif node.op == "get_attr":
            op, args = _GET_ATTR, [node.target]
        elif node.op == "call_module":
            op, args = _CALL_MODULE, [node.target, *args]
        elif node.op == "call_method":
            op, args = _CALL_METHOD, [node.target, *args]
        else:
            raise BridgeError(f"node '{node.name}' has unsupported FX op kind '{node.op}'")
        ctx.ops[node.name] = op
        try:
            enc_args = [ex.arg(a) for a in args]
            enc_kwargs = [(k, ex.arg(v)) for k, v in kwargs.items()]
        except BridgeError as e:
            raise BridgeError(f"node '{node.name}': {e}") from None
        getitems = _foldable_users(node)
        if getitems is not None:
            val = node.meta["val"]
            types, names = [], []
            for i, elem in enumerate(val):
                types.append(type_record(elem))
                user = getitems.get(i)
                names.append(user.name if user is not None else "")
                if user is not None:
                    folded.add(user)
            for i in range(len(val)):
                user = getitems.get(i)
                if user is not None:
                    ex.new_value(user)
                else:
                    ex.next_value += 1
            nodes.append((node.name, op, enc_args, enc_kwargs, types, names, True, _scope(node)))
        else:
            ex.new_value(node)
            types = [type_record(node.meta.get("val"))]
            nodes.append(
                (node.name, op, enc_args, enc_kwargs, types, [node.name], False, _scope(node))
            )
    graph = _C.Graph.from_records(inputs, nodes, output)
    return graph, ctx


# ---------------------------------------------------------------- import


def resolve_op(op: str, ctx: BridgeContext) -> Any:
    """Call target of an op string: the exported target, or torch.ops.ns.name.overload."""
    if op in ctx.targets:
        return ctx.targets[op]
    m = re.fullmatch(r"(\w+)::(\w+)(?:\.(\w+))?", op)
    if m is None:
        raise BridgeError(f"cannot resolve op '{op}': expected 'namespace::name.overload'")
    ns, name, overload = m.group(1), m.group(2), m.group(3) or "default"
    try:
        if ns == "higher_order":
            return getattr(torch.ops.higher_order, name)
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError) as e:
        raise BridgeError(f"cannot resolve op '{op}': {e}") from None


def from_ir(graph: _C.Graph, ctx: BridgeContext) -> fx.GraphModule:
    """Rebuilds an fx.GraphModule from the (possibly rewritten) IR; root attributes from ctx.gm."""
    inputs, nodes, output = graph.records()
    g = fx.Graph()
    g._codegen = ctx.gm.graph._codegen
    env: dict[int, fx.Node] = {}

    def dec(r: Any) -> Any:
        if r is None or isinstance(r, (bool, int, float, str)):
            return r
        tag, payload = r
        if tag == "v":
            return env[payload]
        if tag == "list":
            return [dec(x) for x in payload]
        if tag == "tuple":
            return tuple(dec(x) for x in payload)
        if tag == "dtype" or tag == "layout" or tag == "memory_format":
            return getattr(torch, payload)
        if tag == "device":
            return torch.device(payload)
        if tag == "opaque":
            return ctx.opaques[payload]
        raise BridgeError(f"unknown argument tag {tag!r}")

    def copy_meta(new: fx.Node, name: str, op: str | None = None) -> None:
        meta = ctx.meta.get(name)
        if meta is not None and (op is None or ctx.ops.get(name) == op):
            new.meta = dict(meta)

    for value_id, (name, _type, _kind, _source) in enumerate(inputs):
        ph = g.placeholder(name)
        copy_meta(ph, name)
        env[value_id] = ph

    used: set[int] = set()

    def collect(r: Any) -> None:
        if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str):
            if r[0] == "v":
                used.add(r[1])
            elif r[0] in ("list", "tuple"):
                for x in r[1]:
                    collect(x)

    for rec in nodes:
        for a in rec[2]:
            collect(a)
        for _, a in rec[3]:
            collect(a)
    collect(output)

    for name, op, args, kwargs, _, out_names, tuple_output, _, out_ids in nodes:
        try:
            a = [dec(x) for x in args]
            kw = {k: dec(v) for k, v in kwargs}
        except (KeyError, IndexError) as e:
            raise BridgeError(f"node '{name}': argument refers to unknown value {e}") from None
        if op == _GET_ATTR:
            new = g.create_node("get_attr", a[0], (), {}, name=name)
        elif op == _CALL_MODULE:
            new = g.create_node("call_module", a[0], tuple(a[1:]), kw, name=name)
        elif op == _CALL_METHOD:
            new = g.create_node("call_method", a[0], tuple(a[1:]), kw, name=name)
        else:
            new = g.create_node("call_function", resolve_op(op, ctx), tuple(a), kw, name=name)
        copy_meta(new, name, op)
        if not tuple_output:
            env[out_ids[0]] = new
            continue
        for i, (out_name, out_id) in enumerate(zip(out_names, out_ids, strict=True)):
            if not out_name and out_id not in used:
                continue
            item = g.create_node(
                "call_function", operator.getitem, (new, i), {}, name=out_name or f"{name}_{i}"
            )
            copy_meta(item, out_name)
            env[out_id] = item

    out = g.output(dec(output))
    copy_meta(out, "output")
    new_gm = fx.GraphModule(ctx.gm, g, class_name=type(ctx.gm).__name__)
    new_gm.meta = dict(getattr(ctx.gm, "meta", {}))
    return new_gm
