"""A pipeline step under another autocast state than the plan's (a training loop's
torch.autocast, HF Trainer's bf16=True): the model's graph traced under it, matched to the plan.

The plan (stages, crossing values, parameters) is made on the example's graph. Traced under
autocast, the same model's ATen graph has the same ops under the same names plus dtype casts
(`_to_copy`) before the ops autocast runs in another precision, and before ops that it keeps
in f32 (a loss over `logits.float()`, a no-op the f32 trace leaves out). Running the f32 graph
under autocast instead is not the user's program: the decomposed ops miss autocast's rules
(a loss comes out in bf16). So each stage runs its own part of the graph traced under the
step's state: every op is matched to the plan's op of its name (checked: same op, same inputs
once casts are seen through), each of the plan's casts to the new graph's cast of the same
input to the same dtype (or to that input, where the new graph makes no such cast), and the
casts autocast added join the stage of the op they feed. A pipeline built under autocast and
stepped without is matched the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

_CASTS = {torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default}


@dataclass(frozen=True)
class Autocast:
    """The autocast state a call's graph is traced under (part of a call's signature)."""

    device: str
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"torch.autocast({self.device!r}, dtype={self.dtype})"


def current(device: str) -> Autocast | None:
    """The autocast state on `device` now, or None where it is off."""
    if not torch.is_autocast_enabled(device):
        return None
    return Autocast(device, torch.get_autocast_dtype(device))


def of(sig: tuple[Any, ...] | None) -> Autocast | None:
    """The autocast state in a call's signature (None: off, or a module-level pipeline's)."""
    return next((x for x in sig or () if isinstance(x, Autocast)), None)


def tracing_under(state: Autocast | None, device: str) -> Any:
    """A context that sets autocast on `device` as `state` says (off where None)."""
    if state is None:
        return torch.autocast(device, enabled=False)
    return torch.autocast(state.device, dtype=state.dtype)


def is_cast(node: Any) -> bool:
    """A dtype cast of one tensor (device and layout kept)."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in _CASTS:
        return False
    if len(node.args) != 1 or not isinstance(node.args[0], fx.Node):
        return False
    return set(node.kwargs) <= {"dtype", "device", "layout"}


def _root(node: Any) -> Any:
    while is_cast(node):
        node = node.args[0]
    return node


def _dtype(node: fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype
    meta = node.meta.get("tensor_meta")
    return getattr(meta, "dtype", None)


def _nodes_or_none(node: fx.Node) -> list[fx.Node | None]:
    """The node's arguments, flattened: each a node, or None for a constant."""
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return [x if isinstance(x, fx.Node) else None for x in leaves]


def twins(plan: fx.Graph, new: fx.Graph, where: str) -> dict[str, fx.Node]:
    """Each plan node's name -> its counterpart in `new`, the same model traced under another
    autocast state; raises, naming the node, where the two differ beyond dtype casts."""
    by_name = {n.name: n for n in new.nodes}
    out: dict[str, fx.Node] = {}

    def differ(p: fx.Node, why: str) -> RuntimeError:
        return RuntimeError(
            f"torch_plugin pipeline: the model's graph {where} differs from the plan's at node "
            f"{p.name!r} ({p.target}): {why}, beyond the dtype casts autocast adds. Build the "
            "pipeline under the autocast state its steps run under (call parallelize inside "
            "the same torch.autocast)"
        )

    def seen_through(x: Any, mapped: bool) -> Any:
        if not isinstance(x, fx.Node):
            return x
        r = _root(x)
        return out.get(r.name) if mapped else r

    for p in plan.nodes:
        if is_cast(p):
            continue
        q = by_name.get(p.name)
        if q is None or q.op != p.op or q.target != p.target:
            raise differ(p, "no op of that kind and name there")
        # The same nodes in, every cast seen through on both sides (a root twins first);
        # sizes may differ (a step's other length).
        want = [seen_through(x, True) for x in _nodes_or_none(p)]
        got = [seen_through(x, False) for x in _nodes_or_none(q)]
        if want != got:
            raise differ(p, "its inputs differ")
        out[p.name] = q
    for p in plan.nodes:
        if not is_cast(p):
            continue
        root = out[_root(p).name]
        dtype = _dtype(p)
        same = [c for c in root.users if is_cast(c) and _dtype(c) == dtype]
        # None: a cast the other state does not make (autocast's, or one it makes a no-op);
        # the ops that read it read its input there (checked above).
        out[p.name] = same[0] if same else root
    return out


def pull(node: fx.Node, g: fx.Graph, env: dict[fx.Node, fx.Node], where: str) -> fx.Node:
    """`node`'s copy in stage graph `g`: copied there (with the casts it reads) if it is a cast
    autocast added before an op of this stage."""
    if node in env:
        return env[node]
    if not is_cast(node):
        raise RuntimeError(
            f"torch_plugin pipeline: {where}, value {node.name!r} is neither computed in the "
            "stage that reads it nor sent to it; build the pipeline under the autocast state "
            "its steps run under"
        )
    env[node] = g.node_copy(node, lambda x: pull(x, g, env, where))
    return env[node]
