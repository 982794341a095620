"""Slapo-style schedules: optimisations applied to an unmodified nn.Module, by module path.

    sch = torch_plugin.create_schedule(model, mesh)
    attn = sch["transformer.h.0.attn"]
    attn["c_attn"].shard(["weight", "bias"], axis=1, sections=3)   # packed q|k|v, column-parallel
    attn.sync("bwd_post")                                          # all-reduce the input's grad
    attn["c_proj"].shard("weight", axis=0)                         # row-parallel
    attn["c_proj"].sync("fwd_post")                                # all-reduce the partial sums
    model = torch_plugin.build(sch)

The module tree is kept: the scheduled model has the user's module and parameter names, and
every primitive is checked when it is called (rules), before the model runs (`check`), and
numerically against the unscheduled model (`verify`). Primitives that need a graph (`find`,
`fuse`, `replace`/`checkpoint` of a subgraph) need `trace()` on that module first; the others
work on eager modules, so a module FX cannot trace keeps every non-graph primitive.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import logging
import re
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

from ..cache_parallelism.helix import is_conv1d as _is_conv1d
from ..runtime.collectives import Collectives
from ..runtime.mesh import DeviceMesh
from ..runtime.spmd_ops import _block
from . import comm as tp
from .errors import ScheduleError

log = logging.getLogger("torch_plugin.schedule")

SYNC_MODES = {"fwd_pre", "fwd_post", "bwd_post"}
_MODE_ALIASES = {"forward": "fwd_post", "backward": "bwd_post"}
COMPILERS = ("eager", "inductor", "aot_eager", "placement")


@dataclasses.dataclass(frozen=True)
class Step:
    """One primitive as the user called it (what `verify` names when equivalence breaks)."""

    path: str
    primitive: str
    detail: str

    def __str__(self) -> str:
        return f'sch["{self.path}"].{self.primitive}({self.detail})'


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    path: str  # owner module
    name: str  # parameter name within the owner
    axis: int
    sections: int
    full_shape: tuple[int, ...]
    role: str  # "out" (column-parallel), "in" (row-parallel), or "other"


@dataclasses.dataclass(frozen=True)
class Subgraph:
    """Nodes of one match in a traced module (by name, so it survives re-tracing)."""

    path: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]  # external inputs in the pattern's placeholder order


class _State:
    """What all sub-schedules of one model share."""

    def __init__(self, model: nn.Module, mesh: DeviceMesh | None, axis: str | None) -> None:
        self.model = model
        self.original = copy.deepcopy(model)  # the unscheduled model `verify` compares with
        self.mesh = mesh
        self.comm: Collectives | None = None
        self.world, self.rank = 1, 0
        if mesh is not None:
            if axis is None:
                axis = "tp" if "tp" in mesh.axis_names else mesh.axis_names[-1]
            self.world, self.rank = mesh.size(axis), mesh.local_rank(axis)
            self.comm = Collectives(
                mesh.group(axis), self.world, self.rank, "torch_plugin schedule"
            )
        self.steps: list[Step] = []
        self.shards: list[ShardInfo] = []
        self.syncs: dict[str, list[str]] = {}
        self.traced: set[str] = set()
        self.checkpointed: set[str] = set()
        self.pipeline_splits: list[str] = []
        self.fused = 0

    def hooked_paths(self) -> set[str]:
        """Modules whose hooks or forward the schedule changed (syncs, checkpoints, binds): a
        tracer must keep each a call of itself, or what the schedule put there is lost."""
        binds = {s.path for s in self.steps if s.primitive == "bind"}
        return set(self.syncs) | self.checkpointed | binds


def create_schedule(
    model: nn.Module, mesh: DeviceMesh | None = None, *, axis: str | None = None
) -> Schedule:
    """A schedule over `model` (changed in place as primitives are applied). Distributed
    primitives (`shard`, `sync`) act on `mesh`'s tensor-parallel axis ('tp', or `axis`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"create_schedule needs an nn.Module, got {type(model).__name__}")
    if mesh is not None and not isinstance(mesh, DeviceMesh):
        raise TypeError("mesh must be a torch_plugin.DeviceMesh (DeviceMesh.from_torchrun())")
    return Schedule(_State(model, mesh, axis), "")


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a and b else a or b


def _split_parent(path: str) -> tuple[str, str]:
    return (path.rsplit(".", 1)[0], path.rsplit(".", 1)[1]) if "." in path else ("", path)


class Schedule:
    """The schedule of one sub-module: `sch["a.b"]` is a child's; primitives act on this one."""

    def __init__(self, state: _State, path: str) -> None:
        self._state = state
        self.path = path

    # ---- navigation ----------------------------------------------------------------------

    @property
    def module(self) -> nn.Module:
        """The sub-module now at this path (a replaced or traced one after those primitives)."""
        return self._state.model.get_submodule(self.path) if self.path else self._state.model

    @property
    def parent(self) -> Schedule | None:
        return None if not self.path else Schedule(self._state, _split_parent(self.path)[0])

    @property
    def world_size(self) -> int:
        return self._state.world

    @property
    def rank(self) -> int:
        return self._state.rank

    @property
    def steps(self) -> list[Step]:
        return list(self._state.steps)

    def __getitem__(self, key: str) -> Schedule | ScheduleGroup:
        """A descendant by relative dotted path; `*` matches one path component and gives a
        group whose primitives apply to every match."""
        if not isinstance(key, str) or not key:
            raise ScheduleError(f"sub-schedule paths are non-empty strings, got {key!r}")
        if "*" in key or "?" in key:
            prefix = f"{self.path}." if self.path else ""
            pattern = prefix + key
            depth = pattern.count(".")
            paths = [
                n
                for n, _ in self._state.model.named_modules()
                if n and n.count(".") == depth and fnmatch.fnmatchcase(n, pattern)
            ]
            if not paths:
                raise ScheduleError(f"no sub-module matches {pattern!r}; {self._children_hint()}")
            return ScheduleGroup([Schedule(self._state, p) for p in paths])
        here = self
        for part in key.split("."):
            if part not in dict(here.module.named_children()):
                raise ScheduleError(
                    f"{here._where()} has no sub-module {part!r}; {here._children_hint()}"
                )
            here = Schedule(self._state, _join(here.path, part))
        return here

    def named_schedules(self) -> Iterator[tuple[str, Schedule]]:
        for name, _ in self.module.named_modules():
            yield name, Schedule(self._state, _join(self.path, name))

    def _where(self) -> str:
        return f'sch["{self.path}"] ({type(self.module).__name__})' if self.path else "the model"

    def _children_hint(self) -> str:
        names = [n for n, _ in self.module.named_children()]
        return f"its children: {', '.join(names[:12]) or '(none)'}"

    def _record(self, primitive: str, detail: str) -> None:
        self._state.steps.append(Step(self.path, primitive, detail))

    def _need_mesh(self, primitive: str) -> Collectives:
        if self._state.comm is None:
            raise ScheduleError(
                f"{self._where()}.{primitive}: a distributed primitive needs a mesh; create the "
                "schedule with create_schedule(model, torch_plugin.DeviceMesh.from_torchrun())"
            )
        return self._state.comm

    def _need_trace(self, primitive: str) -> fx.GraphModule:
        module = self.module
        if self.path not in self._state.traced or not isinstance(module, fx.GraphModule):
            raise ScheduleError(
                f"{self._where()}.{primitive} rewrites the module's graph: call "
                f'sch["{self.path}"].trace() first'
            )
        return module

    def _set_module(self, new: nn.Module) -> None:
        if not self.path:
            self._state.model = new
            return
        parent, name = _split_parent(self.path)
        setattr(self._state.model.get_submodule(parent) if parent else self._state.model, name, new)

    # ---- module-level primitives (no graph needed) ----------------------------------------

    def replace(
        self, new_mod_or_fn: nn.Module | Callable[..., Any], subgraphs: Any = None
    ) -> Schedule:
        """Swaps this module for `new_mod` (same call signature), or, with `subgraphs` from
        `find`, replaces each matched subgraph by a call of `new_mod_or_fn` on its inputs."""
        if subgraphs is None:
            if not isinstance(new_mod_or_fn, nn.Module):
                raise ScheduleError(
                    f"{self._where()}.replace(new_mod) needs an nn.Module (a function replaces "
                    "a subgraph: replace(fn, sch.find(...)))"
                )
            if self.path in self._state.traced:
                self._state.traced.discard(self.path)
            self._set_module(new_mod_or_fn)
            self._record("replace", type(new_mod_or_fn).__name__)
            return self
        gm = self._need_trace("replace")
        matches = _as_subgraphs(subgraphs, self.path, "replace")
        for k, sg in enumerate(matches):
            target = new_mod_or_fn
            if isinstance(target, nn.Module):
                name = f"replaced_{len(self._state.steps)}_{k}"
                gm.add_submodule(name, copy.deepcopy(target) if k else target)
                _rewrite_subgraph(gm, sg, lambda g, args, n=name: g.call_module(n, args))
            else:
                _rewrite_subgraph(gm, sg, lambda g, args, f=target: g.call_function(f, args))
        gm.recompile()
        what = getattr(new_mod_or_fn, "__name__", type(new_mod_or_fn).__name__)
        self._record("replace", f"{what}, {len(matches)} subgraph(s)")
        return self

    def shard(self, names: str | Sequence[str], axis: int, sections: int = 1) -> Schedule:
        """Keeps this rank's block of each named parameter along `axis` (`sections` > 1 splits
        each of that many equal parts, e.g. 3 for a packed q|k|v weight). The module's own
        size attributes follow (nn.Linear, HF Conv1D, nn.Embedding). A row-parallel layer's
        bias is added once, after its `sync("fwd_post")` sums the partial outputs."""
        self._need_mesh("shard")
        names = [names] if isinstance(names, str) else list(names)
        if not names:
            raise ScheduleError(f"{self._where()}.shard needs at least one parameter name")
        if sections < 1:
            raise ScheduleError(f"{self._where()}.shard: sections must be >= 1, got {sections}")
        module, st = self.module, self._state
        planned: list[tuple[str, nn.Module, str, nn.Parameter, int, tuple[int, ...]]] = []
        for name in names:
            owner_rel, pname = _split_parent(name)
            owner_path = _join(self.path, owner_rel)
            owner = module.get_submodule(owner_rel) if owner_rel else module
            param = owner._parameters.get(pname)
            if param is None:
                have = [n for n, _ in module.named_parameters()]
                raise ScheduleError(
                    f"{self._where()} has no parameter {name!r}; its parameters: "
                    f"{', '.join(have[:12]) or '(none)'}"
                )
            if any(s.path == owner_path and s.name == pname for s in st.shards):
                raise ScheduleError(f"{self._where()}: {name!r} is already sharded")
            full = tuple(param.shape)
            param_axis = axis
            if pname == "bias" and len(full) == 1 and _linear_like(owner):
                owner_is_row = _param_role(owner, "weight", axis % 2) == "in" or any(
                    s.path == owner_path and s.name == "weight" and s.role == "in"
                    for s in st.shards
                )
                # A bias follows its layer's outputs: sharded with a column-parallel weight
                # (Linear axis 0, Conv1D axis 1); a row-parallel layer's bias stays whole.
                if owner_is_row:
                    raise ScheduleError(
                        f"{self._where()}.shard({name!r}, axis={axis}): axis {axis} splits the "
                        "layer's inputs (row-parallel); its bias stays whole (shard only "
                        "'weight' and sync('fwd_post'))"
                    )
                param_axis = 0
            if not -len(full) <= param_axis < len(full):
                raise ScheduleError(
                    f"{self._where()}.shard({name!r}, axis={axis}): axis out of range for a "
                    f"parameter of shape {full}"
                )
            dim = param_axis % len(full)
            if full[dim] % (st.world * sections):
                raise ScheduleError(
                    f"{self._where()}.shard({name!r}, axis={axis}): size {full[dim]} is not "
                    f"divisible by {st.world} ranks x {sections} sections"
                )
            planned.append((owner_path, owner, pname, param, dim, full))
        # Every name was checked before any is changed: a refused call changes nothing.
        touched = []
        for _path, _owner, _pname, param, dim, full in planned:
            block = _block(param.detach(), dim, sections, st.world, st.rank).clone()
            new = nn.Parameter(block, requires_grad=param.requires_grad)
            _replace_everywhere(st.model, param, new)  # tied weights stay tied
            # Every module holding it (a tied LM head too) now computes on a block.
            for path, m in st.model.named_modules():
                for k, p in m._parameters.items():
                    if p is new:
                        role = _param_role(m, k, dim)
                        st.shards.append(ShardInfo(path, k, dim, sections, full, role))
                        _resize_attributes(m, k, dim, st.world)
                        touched.append((path, m, k, dim))
        for path, m, k, dim in touched:
            if isinstance(m, nn.Embedding) and k == "weight" and dim == 0:
                _vocab_parallel_embedding(st, path, m, sections)
        for owner_path in {t[0] for t in touched}:
            _defer_row_parallel_bias(st, owner_path)
        self._record(
            "shard", f"{names!r}, axis={axis}" + (f", sections={sections}" * (sections > 1))
        )
        return self

    def sync(self, mode: str, sync_op_or_fn: str | Callable[..., Any] = "all_reduce") -> Schedule:
        """Inserts communication at this module's boundary: `fwd_pre` (on its inputs),
        `fwd_post` (on its outputs: all_reduce sums a row-parallel layer's partial outputs,
        all_gather joins a column-parallel layer's last dim) or `bwd_post` (all-reduces the
        gradient of its inputs, after a column-parallel region). A callable is a hook:
        fn(module, args) for fwd_pre, fn(module, args, output) for fwd_post,
        fn(module, grad_input, grad_output) for bwd_post."""
        comm = self._need_mesh("sync")
        mode = _MODE_ALIASES.get(mode, mode)
        if mode not in SYNC_MODES:
            raise ScheduleError(
                f"{self._where()}.sync: unknown mode {mode!r}; modes: fwd_pre, fwd_post, "
                "bwd_post (or forward / backward)"
            )
        if not any(
            s.path == self.path or s.path.startswith(self.path + ".") or not self.path
            for s in self._state.shards
        ):
            raise ScheduleError(
                f"{self._where()}.sync({mode!r}): nothing in this module is sharded, so there is "
                "nothing to synchronise; shard a parameter of it (or of a child) first"
            )
        module, what = self.module, f"{mode} sync of {self.path or 'model'}"
        if callable(sync_op_or_fn):
            fn = sync_op_or_fn
            if mode == "fwd_pre":
                module.register_forward_pre_hook(lambda m, args: fn(m, args))
            elif mode == "fwd_post":
                module.register_forward_hook(lambda m, args, out: fn(m, args, out))
            else:
                module.register_full_backward_hook(lambda m, gi, go: fn(m, gi, go))
            op_name = getattr(fn, "__name__", "fn")
        else:
            op_name = sync_op_or_fn
            if op_name not in tp.SYNC_OPS:
                raise ScheduleError(
                    f"{self._where()}.sync: unknown op {op_name!r}; ops: all_reduce, all_gather, "
                    "or a hook function"
                )
            if mode == "bwd_post" and op_name != "all_reduce":
                raise ScheduleError(f"{self._where()}.sync('bwd_post') supports all_reduce only")
            _register_sync(module, mode, op_name, comm, what)
        self._state.syncs.setdefault(self.path, []).append(f"{mode}:{op_name}")
        self._record("sync", f"{mode!r}, {op_name!r}")
        return self

    def checkpoint(self, subgraph: Any = None) -> Schedule:
        """Recomputes this module's activations in backward instead of keeping them (or only
        those of a traced subgraph from `find`)."""
        if subgraph is not None:
            gm = self._need_trace("checkpoint")
            matches = _as_subgraphs(subgraph, self.path, "checkpoint")
            for k, sg in enumerate(matches):
                name = f"checkpointed_{len(self._state.steps)}_{k}"
                sub = _outline(gm, sg, name)
                _wrap_checkpoint(sub)
            self._record("checkpoint", f"{len(matches)} subgraph(s)")
            return self
        if self.path in self._state.checkpointed:
            raise ScheduleError(f"{self._where()} is already checkpointed")
        _wrap_checkpoint(self.module)
        self._state.checkpointed.add(self.path)
        self._record("checkpoint", "")
        return self

    def decompose(self) -> Schedule:
        """Splits an nn.Linear's bias add from its matmul, so that a traced parent sees the add
        and can fuse it with what follows (parameters keep their names)."""
        module = self.module
        if type(module) is not nn.Linear or module.bias is None:
            raise ScheduleError(f"{self._where()}.decompose() applies to an nn.Linear with a bias")
        self._set_module(DecomposedLinear(module))
        self._record("decompose", "")
        return self

    def bind(self, kernel: str | Callable[..., Any]) -> Schedule:
        """Runs this module with `kernel(module, *args, **kwargs)` instead of its forward; a
        name binds one of ours ('layer_norm': torch_plugin::add_layer_norm, inference)."""
        module = self.module
        if isinstance(kernel, str):
            if kernel not in _KERNELS:
                raise ScheduleError(f"unknown kernel {kernel!r}; kernels: {', '.join(_KERNELS)}")
            cls, fn = _KERNELS[kernel]
            if not isinstance(module, cls):
                raise ScheduleError(
                    f"{self._where()}.bind({kernel!r}) needs a {cls.__name__} module"
                )
            kernel = fn
        elif not callable(kernel):
            raise ScheduleError(f"{self._where()}.bind needs a callable or a kernel name")
        bound = kernel
        module.forward = types.MethodType(lambda m, *a, **k: bound(m, *a, **k), module)
        self._record("bind", getattr(kernel, "__name__", "kernel"))
        return self

    # ---- graph-level primitives ------------------------------------------------------------

    def trace(
        self,
        leaves: Sequence[str | type] = (),
        flatten: bool = False,
        concrete_args: dict[str, Any] | None = None,
    ) -> Schedule:
        """FX-traces this module's forward into a graph (per module, as Slapo does). Children
        stay calls of themselves (the hierarchy is kept) unless `flatten`; `leaves` (paths
        relative to this module, or classes) are never traced into, nor are modules that carry
        syncs, checkpoints or binds (their hooks live on them)."""
        st = self._state
        if self.path in st.checkpointed:
            raise ScheduleError(f"{self._where()}: trace() before checkpoint(), not after")
        module = self.module
        keep = {
            _rel(p, self.path)
            for p in st.hooked_paths()
            if p != self.path and (not self.path or p.startswith(self.path + "."))
        }
        leaf_paths = {x for x in leaves if isinstance(x, str)} | keep
        leaf_types = tuple(x for x in leaves if isinstance(x, type))

        class Tracer(fx.Tracer):
            def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
                if qualname in leaf_paths or (leaf_types and isinstance(m, leaf_types)):
                    return True
                if not flatten:
                    return True  # every child is one call: the hierarchy stays
                return super().is_leaf_module(m, qualname)

        try:
            graph = Tracer().trace(module, concrete_args)
        except Exception as e:  # noqa: BLE001 - FX raises many kinds; all mean "untraceable"
            raise ScheduleError(
                f"{self._where()} cannot be traced ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); it stays eager: primitives "
                "that need no graph (shard, sync, checkpoint, replace of the module) still "
                "apply, or trace a child, or pass its untraceable children as leaves"
            ) from None
        gm = fx.GraphModule(module, graph, class_name=type(module).__name__)
        # Hooks registered on the module (syncs) move with it.
        for attr in (
            "_forward_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs",
            "_backward_hooks",
            "_backward_pre_hooks",
        ):
            if hasattr(module, attr):
                setattr(gm, attr, getattr(module, attr))
        gm.training = module.training
        self._set_module(gm)
        st.traced.add(self.path)
        self._record("trace", f"flatten={flatten}" + (f", leaves={list(leaves)}" if leaves else ""))
        return self

    def find(self, regex_or_pattern_fn: str | Callable[..., Any]) -> list[Subgraph]:
        """Every match in this traced module: a regex matches nodes by name or target (one node
        per match); a function is traced and matched as a dataflow pattern (all matches)."""
        gm = self._need_trace("find")
        nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
        if isinstance(regex_or_pattern_fn, str):
            rx = re.compile(regex_or_pattern_fn)
            out = []
            for n in nodes:
                target = (
                    n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
                )
                if rx.search(n.name) or rx.search(str(target)):
                    ins = tuple(a.name for a in n.all_input_nodes)
                    out.append(Subgraph(self.path, (n.name,), ins))
            return out
        if not callable(regex_or_pattern_fn):
            raise ScheduleError("find needs a regex string or a pattern function")
        from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

        try:
            pattern = fx.symbolic_trace(regex_or_pattern_fn)
        except Exception as e:  # noqa: BLE001
            raise ScheduleError(f"find: the pattern function cannot be traced: {e}") from None
        _normalise_calls(pattern.graph)
        _normalise_calls(gm.graph)
        matcher = SubgraphMatcher(pattern.graph, match_output=False, match_placeholder=False)
        out = []
        pattern_inputs = [n for n in pattern.graph.nodes if n.op == "placeholder"]
        for m in matcher.match(gm.graph):
            body = [
                m.nodes_map[p].name
                for p in pattern.graph.nodes
                if p.op not in ("placeholder", "output", "get_attr")
            ]
            ins = tuple(m.nodes_map[p].name for p in pattern_inputs if p in m.nodes_map)
            out.append(Subgraph(self.path, tuple(body), ins))
        return out

    def fuse(self, subgraphs: Any, compiler: str = "inductor", name: str = "fused") -> Schedule:
        """Moves each matched subgraph into a sub-module `name_k` compiled by `compiler`:
        'inductor', 'aot_eager', 'eager' (no compile: a named region), 'placement' (our
        Collage placement; inference, or training forward and backward) or any torch.compile
        backend name."""
        gm = self._need_trace("fuse")
        matches = _as_subgraphs(subgraphs, self.path, "fuse")
        if not isinstance(name, str) or not name.isidentifier():
            raise ScheduleError(f"fuse: name must be an identifier, got {name!r}")
        for sg in matches:
            k = self._state.fused
            self._state.fused += 1
            sub = _outline(gm, sg, f"{name}_{k}")
            if compiler == "eager":
                continue
            if compiler == "placement":
                sub.compile(backend="torch_plugin", options={"passes": ["placement"]})
            else:
                sub.compile(backend=compiler)
        self._record("fuse", f"{len(matches)} subgraph(s), compiler={compiler!r}, name={name!r}")
        return self

    def pipeline_split(self) -> Schedule:
        """Marks a pipeline stage boundary after this module."""
        if not self.path:
            raise ScheduleError(
                "pipeline_split() marks a boundary after a sub-module, not the model"
            )
        if self.path in self._state.pipeline_splits:
            raise ScheduleError(f"{self._where()} already ends a pipeline stage")
        self._state.pipeline_splits.append(self.path)
        self._record("pipeline_split", "")
        return self

    # ---- checks ------------------------------------------------------------------------------

    def check(self) -> None:
        """Static rules over the whole schedule (also run by `build` and `verify`): every
        row-parallel layer's partial output is summed, every column-parallel region's input
        gradient is summed."""
        from .verify import static_check

        static_check(self._state)

    def verify(self, example_inputs: Sequence[Any], **kw: Any) -> dict[str, Any]:
        """Differential test against the unscheduled model on `example_inputs` (the same on
        every rank): outputs and gradients (sharded ones against the matching block). Raises
        ScheduleError naming the first module that differs and the primitives applied there."""
        from .verify import verify

        return verify(self._state, tuple(example_inputs), **kw)


class ScheduleGroup:
    """Sub-schedules matched by a wildcard path: a primitive applies to each, in order."""

    def __init__(self, schedules: list[Schedule]) -> None:
        self.schedules = schedules

    def __len__(self) -> int:
        return len(self.schedules)

    def __iter__(self) -> Iterator[Schedule]:
        return iter(self.schedules)

    def __getitem__(self, key: str) -> ScheduleGroup:
        out: list[Schedule] = []
        for s in self.schedules:
            got = s[key]
            out.extend(got.schedules if isinstance(got, ScheduleGroup) else [got])
        return ScheduleGroup(out)

    def __getattr__(self, primitive: str) -> Callable[..., ScheduleGroup]:
        if primitive.startswith("_") or not hasattr(Schedule, primitive):
            raise AttributeError(primitive)

        def apply(*args: Any, **kwargs: Any) -> ScheduleGroup:
            for s in self.schedules:
                getattr(s, primitive)(*args, **kwargs)
            return self

        return apply


# ---- helpers ---------------------------------------------------------------------------------


def _rel(path: str, base: str) -> str:
    return path[len(base) + 1 :] if base else path


def _replace_everywhere(model: nn.Module, old: nn.Parameter, new: nn.Parameter) -> None:
    for m in model.modules():
        for k, p in list(m._parameters.items()):
            if p is old:
                m._parameters[k] = new


def _linear_like(m: nn.Module) -> bool:
    return isinstance(m, (nn.Linear, DecomposedLinear)) or _is_conv1d(m)


def _param_role(owner: nn.Module, pname: str, dim: int) -> str:
    """'out' when the block splits the layer's outputs, 'in' when it splits its inputs."""
    if isinstance(owner, (nn.Linear, DecomposedLinear)) and pname == "weight":
        return "out" if dim == 0 else "in"
    if _is_conv1d(owner) and pname == "weight":
        return "out" if dim == 1 else "in"
    if pname == "bias" and (isinstance(owner, (nn.Linear, DecomposedLinear)) or _is_conv1d(owner)):
        return "out"
    if isinstance(owner, nn.Embedding) and pname == "weight" and dim == 0:
        return "in"  # vocabulary-parallel: each rank looks up its rows, the rest are zeros
    return "other"


def _resize_attributes(owner: nn.Module, pname: str, dim: int, world: int) -> None:
    if pname != "weight":
        return
    if isinstance(owner, nn.Linear):
        attr = "out_features" if dim == 0 else "in_features"
    elif _is_conv1d(owner):
        attr = "nf" if dim == 1 else "nx"
    elif isinstance(owner, nn.Embedding):
        attr = "num_embeddings" if dim == 0 else "embedding_dim"
    else:
        return
    setattr(owner, attr, getattr(owner, attr) // world)


def _defer_row_parallel_bias(st: _State, owner_path: str) -> None:
    """A row-parallel layer computes partial sums; its bias must be added once, after they are
    summed, so the layer runs without it and its fwd_post all-reduce adds it (Megatron's
    RowParallelLinear does the same)."""
    owner = st.model.get_submodule(owner_path) if owner_path else st.model
    rows = [s for s in st.shards if s.path == owner_path and s.name == "weight" and s.role == "in"]
    bias = getattr(owner, "bias", None)
    if not rows or bias is None or getattr(owner, "_tp_deferred_bias", False):
        return
    if any(s.path == owner_path and s.name == "bias" for s in st.shards):
        raise ScheduleError(
            f'sch["{owner_path}"]: a row-parallel layer\'s bias stays whole (do not shard it)'
        )
    if isinstance(owner, (nn.Linear, DecomposedLinear)):

        def forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, m.weight)

    elif _is_conv1d(owner):

        def forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
            out = x.reshape(-1, x.size(-1)) @ m.weight
            return out.view(*x.shape[:-1], m.nf)

    else:
        raise ScheduleError(
            f'sch["{owner_path}"]: shard of a {type(owner).__name__} weight along its inputs '
            "with a bias is supported for nn.Linear and Conv1D"
        )
    owner.forward = types.MethodType(forward, owner)
    owner._tp_deferred_bias = True


def _vocab_parallel_embedding(st: _State, path: str, emb: nn.Embedding, sections: int) -> None:
    """Megatron's VocabParallelEmbedding: a rank looks up the ids in its block of rows and
    returns zeros for the others; its fwd_post all-reduce sums the ranks' partial lookups."""
    if sections != 1 or emb.padding_idx is not None or emb.max_norm is not None:
        raise ScheduleError(
            f'sch["{path}"]: a vocabulary-parallel embedding needs sections=1, no padding_idx '
            "and no max_norm"
        )
    start = st.rank * emb.weight.shape[0]

    def forward(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        local = ids - start
        outside = (local < 0) | (local >= m.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), m.weight)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)

    emb.forward = types.MethodType(forward, emb)


def _register_sync(module: nn.Module, mode: str, op: str, comm: Collectives, what: str) -> None:
    def on_tensors(fn: Callable[[torch.Tensor], torch.Tensor], value: Any) -> Any:
        return pytree.tree_map(
            lambda t: fn(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, value
        )

    if mode == "fwd_post":
        fwd = tp.AllReduceForward if op == "all_reduce" else tp.AllGatherLast

        def post(m: nn.Module, args: Any, out: Any) -> Any:
            out = on_tensors(lambda t: fwd.apply(t, comm, what), out)
            if getattr(m, "_tp_deferred_bias", False):
                out = on_tensors(lambda t: t + m.bias, out)
            return out

        module.register_forward_hook(post)
        return
    if mode == "fwd_pre":
        fwd = tp.AllReduceForward if op == "all_reduce" else tp.AllGatherLast

        def pre(m: nn.Module, args: Any, kwargs: Any) -> Any:
            return on_tensors(lambda t: fwd.apply(t, comm, what), (args, kwargs))

        module.register_forward_pre_hook(pre, with_kwargs=True)
        return

    def grad_sync(m: nn.Module, args: Any, kwargs: Any) -> Any:
        return on_tensors(lambda t: tp.AllReduceBackward.apply(t, comm, what), (args, kwargs))

    module.register_forward_pre_hook(grad_sync, with_kwargs=True)


def _wrap_checkpoint(module: nn.Module) -> None:
    from torch.utils.checkpoint import checkpoint

    inner = module.forward

    def forward(m: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = types.MethodType(forward, module)


def _as_subgraphs(subgraphs: Any, path: str, primitive: str) -> list[Subgraph]:
    items = [subgraphs] if isinstance(subgraphs, Subgraph) else list(subgraphs or [])
    if not items:
        raise ScheduleError(f'sch["{path}"].{primitive}: find(...) matched nothing')
    for sg in items:
        if not isinstance(sg, Subgraph):
            raise ScheduleError(f"{primitive} takes subgraphs from sch.find(...), got {sg!r}")
        if sg.path != path:
            raise ScheduleError(
                f'{primitive}: the subgraph was found in sch["{sg.path}"], not sch["{path}"]'
            )
    return items


def _nodes_by_name(gm: fx.GraphModule, sg: Subgraph) -> list[fx.Node]:
    by_name = {n.name: n for n in gm.graph.nodes}
    missing = [n for n in sg.nodes if n not in by_name]
    if missing:
        raise ScheduleError(
            f'sch["{sg.path}"]: nodes {missing} of this subgraph are gone (an earlier primitive '
            "rewrote them); call find again"
        )
    return [by_name[n] for n in sg.nodes]


def _outline(gm: fx.GraphModule, sg: Subgraph, name: str) -> fx.GraphModule:
    """Moves the subgraph's nodes into a child GraphModule `name` called in their place."""
    from torch.fx.passes.tools_common import legalize_graph
    from torch.fx.passes.utils.fuser_utils import (
        erase_nodes,
        fuse_as_graphmodule,
        insert_subgm,
        validate_partition,
    )

    nodes = _nodes_by_name(gm, sg)
    if not validate_partition(nodes):
        raise ScheduleError(
            f'sch["{sg.path}"]: the subgraph {list(sg.nodes)} is not convex (a path leaves it '
            "and comes back); it cannot become one module"
        )
    sub, ins, outs = fuse_as_graphmodule(gm, nodes, name)
    insert_subgm(gm, sub, ins, outs)
    erase_nodes(gm, nodes)
    legalize_graph(gm)
    gm.graph.lint()
    gm.recompile()
    return sub


def _rewrite_subgraph(
    gm: fx.GraphModule, sg: Subgraph, make: Callable[[fx.Graph, tuple[fx.Node, ...]], fx.Node]
) -> None:
    """Replaces the subgraph (one output) by make(graph, inputs) on its pattern inputs."""
    nodes = _nodes_by_name(gm, sg)
    inside = set(nodes)
    outs = [n for n in nodes if any(u not in inside for u in n.users)]
    if len(outs) != 1:
        raise ScheduleError(
            f'sch["{sg.path}"].replace: a subgraph replaced by one call must have one output '
            f"used outside it; {[n.name for n in outs]} are"
        )
    by_name = {n.name: n for n in gm.graph.nodes}
    args = tuple(by_name[i] for i in sg.inputs)
    with gm.graph.inserting_after(outs[0]):
        new = make(gm.graph, args)
    outs[0].replace_all_uses_with(new)
    for n in reversed(nodes):
        if not n.users:
            gm.graph.erase_node(n)
    gm.graph.lint()


def _normalise_calls(graph: fx.Graph) -> None:
    """Method calls that have a function twin become that function (x.add(y) -> torch.add)."""
    for n in graph.nodes:
        if n.op == "call_method" and n.target in ("add", "mul", "sub", "div", "matmul"):
            n.op, n.target = "call_function", getattr(torch, n.target)


class DecomposedLinear(nn.Module):
    """nn.Linear as matmul, then a separate bias add (the parameters keep their names)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + self.bias


def _layer_norm_kernel(m: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad):
        # Our fused kernel is inference-only: training keeps ATen's (with its backward).
        return F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)
    return torch.ops.torch_plugin.add_layer_norm(x, None, m.weight, m.bias, m.eps)[1]


_KERNELS: dict[str, tuple[type, Callable[..., Any]]] = {
    "layer_norm": (nn.LayerNorm, _layer_norm_kernel),
}
