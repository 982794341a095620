"""Automatic sharding (issue 5): one call from a single-device model to its tensor/data-parallel
SPMD program.

    mesh = torch_plugin.DeviceMesh.from_torchrun()
    dist_model = torch_plugin.parallelize(model, mesh, example_inputs)
    loss = loss_fn(dist_model(x), y); loss.backward(); opt = SGD(dist_model.parameters(), ...)

The model's forward is captured as an ATen graph (make_fx over fake tensors); the C++ planner
(`sharding_ilp`, an ILP on CBC) picks a spec per parameter and a strategy per op; the C++ pass
`sharding_materialize` rewrites the graph into the program every rank runs on its local blocks,
with `torch_plugin::reshard` / `grad_sync` / `replicated_output` nodes. Here those nodes become
autograd functions over torch.distributed, and each rank keeps only its blocks of the
parameters. See sharding_materialize.h for the gradient convention that makes plain autograd
on the local graph exact.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

from .. import _C, fx_bridge
from .agreement import check_same, digest, planning_only
from .capture import as_call, describe, label_counter, takes_loss_kwargs, trace_call
from .collectives import Collectives
from .mesh import DeviceMesh

log = logging.getLogger("torch_plugin.sharding")

# Process groups by handle: the graph's reshard nodes carry an int, not a Python object.
_GROUPS: dict[int, Collectives] = {}
_GROUP_IDS = itertools.count(1)
_LOCK = threading.Lock()


def _register_group(comm: Collectives) -> int:
    with _LOCK:
        handle = next(_GROUP_IDS)
        _GROUPS[handle] = comm
    return handle


def _group(handle: int) -> Collectives:
    try:
        return _GROUPS[handle]
    except KeyError:
        raise RuntimeError(
            f"torch_plugin sharding: process group handle {handle} is unknown in this process; "
            "a sharded graph runs only in the process that built it"
        ) from None


def _parse(spec: str) -> tuple[str, int, int]:
    """(kind, dim, sections) of 'R', 'P', 'S(d)' or the strided 'S(d)xN'."""
    if spec in ("R", "P"):
        return spec, -1, 1
    if spec.startswith("S("):
        close = spec.index(")")
        sections = int(spec[close + 2 :]) if spec[close + 1 :].startswith("x") else 1
        if close + 1 < len(spec) and not spec[close + 1 :].startswith("x"):
            raise ValueError(f"bad shard spec {spec!r}")
        return "S", int(spec[2:close]), sections
    raise ValueError(f"bad shard spec {spec!r}")


def _dual(spec: str) -> str:
    """The spec of a value's gradient under the convention of sharding_materialize.h."""
    return {"R": "P", "P": "R"}.get(spec, spec)


def _block(x: torch.Tensor, dim: int, sections: int, world: int, rank: int) -> torch.Tensor:
    """This rank's block of a whole tensor split along `dim` (each of `sections` parts split)."""
    if sections == 1:
        return x.chunk(world, dim)[rank].contiguous()
    parts = x.unflatten(dim, (sections, -1))
    return parts.chunk(world, dim + 1)[rank].flatten(dim, dim + 1).contiguous()


def _whole(blocks: list[torch.Tensor], dim: int, sections: int) -> torch.Tensor:
    """Inverse of _block over every rank's block."""
    if sections == 1:
        return torch.cat(blocks, dim=dim)
    parts = [b.unflatten(dim, (sections, -1)) for b in blocks]
    return torch.cat(parts, dim=dim + 1).flatten(dim, dim + 1)


def _reshard_local(x: torch.Tensor, src: str, dst: str, comm: Collectives) -> torch.Tensor:
    """The value held as `src` on this rank, as `dst` (not differentiable; see _Reshard)."""
    (sk, sd, sn), (dk, dd, dn) = _parse(src), _parse(dst)
    w, r = comm.world, comm.rank
    if src == dst:
        return x
    if sk == "S" and dk == "P":  # zero-padded to the whole shape (local: no traffic)
        shape = list(x.shape)
        shape[sd] *= w
        out = x.new_zeros(shape)
        own = _block(torch.arange(shape[sd], device=x.device), 0, sn, w, r)
        return out.index_copy_(sd, own, x)
    if sk == "S" and dk == "S" and sd != dd:  # one all-to-all, as the ILP prices it
        # Piece k: the part of this rank's block that rank k keeps along dd; what arrives from
        # rank s is rank s's block along sd of this rank's part, joined along sd.
        send = torch.stack([_block(x, dd, dn, w, k) for k in range(w)])
        got = comm.all_to_all(send.flatten(0, 1), "reshard")  # [w, *piece]
        return _whole(list(got.unbind(0)), sd, sn)
    if sk == "S":  # to R, or to another split of the same dim: gather the whole first
        whole = _whole(list(comm.all_gather(x, "reshard").unbind(0)), sd, sn)
        return whole if dk == "R" else _block(whole, dd, dn, w, r)
    if sk == "R" and dk == "S":
        return _block(x, dd, dn, w, r)
    if sk == "R" and dk == "P":  # one rank holds the value, the others zero summands
        return x.clone() if r == 0 else torch.zeros_like(x)
    if sk == "P" and dk == "R":
        return comm.all_reduce(x, "reshard")
    if sk == "P" and dk == "S":
        # Strided: the sections made rank-major, so each rank's block is one contiguous chunk
        # and one reduce-scatter (as priced) delivers it.
        if dn > 1:
            x = x.unflatten(dd, (dn, w, -1)).transpose(dd, dd + 1).flatten(dd, dd + 2)
        return comm.reduce_scatter(x, dd, "reshard")
    raise ValueError(f"no reshard from {src} to {dst}")


class _Reshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src: str, dst: str, handle: int) -> torch.Tensor:
        ctx.spec = (src, dst, handle)
        return _reshard_local(x, src, dst, _group(handle))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        src, dst, handle = ctx.spec
        return _Reshard.apply(grad, _dual(dst), _dual(src), handle), None, None, None


class _GradSync(torch.autograd.Function):
    """Identity on the replicated parameters; the backward sums their gradient summands over
    ranks in one flat all-reduce (one bucket rather than a collective per parameter)."""

    @staticmethod
    def forward(
        ctx: Any, handle: int, pending: list[Any] | None, *params: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.handle = handle
        ctx.pending = pending
        return tuple(p.view_as(p) for p in params)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        if ctx.pending is not None:  # gradients accumulated under no_sync() join this sum
            grads = tuple(
                g if q is None else g + q for g, q in zip(grads, ctx.pending, strict=True)
            )
        # Low-precision gradients are summed in float32 (bf16 sums over many ranks lose bits).
        flat = torch.cat(
            [g.reshape(-1).to(torch.promote_types(g.dtype, torch.float32)) for g in grads]
        )
        summed = _group(ctx.handle).all_reduce(flat, "grad_sync")
        out, at = [], 0
        for g in grads:
            out.append(summed[at : at + g.numel()].view(g.shape).to(g.dtype))
            at += g.numel()
        return (None, None, *out)


class _ReplicatedOutput(torch.autograd.Function):
    """Identity; every rank seeds the same loss gradient, so each holds 1/world of it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: int) -> torch.Tensor:
        ctx.world = _group(handle).world
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad / ctx.world, None


class _BatchLoss(torch.autograd.Function):
    """A scalar of one dp replica's batch slice (its loss) made the whole batch's:
    sum over replicas of weight * x. The weight is 1 when the model divided by the whole
    batch's label count (HF's num_items_in_batch), the slice's share of the labels when its
    loss is a mean over them, 1/dp without labels. Every rank seeds the same gradient and the
    dp gradient sync sums the replicas, so the backward scales as the forward did."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: int, weight: float) -> torch.Tensor:
        ctx.weight = weight
        return _group(handle).all_reduce(x.detach() * weight, "batch loss")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad * ctx.weight, None, None


def reshard(x: torch.Tensor, src: str, dst: str, group: int) -> torch.Tensor:
    return _Reshard.apply(x, src, dst, group)


def grad_sync(
    params: list[torch.Tensor], group: int, pending: list[Any] | None = None
) -> tuple[torch.Tensor, ...]:
    """pending: per parameter, a gradient accumulated locally (under no_sync) to add to this
    backward's before the sum over ranks, or None."""
    return _GradSync.apply(group, pending, *params)


def replicated_output(x: torch.Tensor, group: int) -> torch.Tensor:
    return _ReplicatedOutput.apply(x, group)


def vocab_embedding(
    weight: torch.Tensor, indices: torch.Tensor, padding_idx: int, group: int
) -> torch.Tensor:
    """Megatron's vocabulary-parallel lookup: `weight` is this rank's rows of the vocabulary;
    lookups outside them give zeros, so the sum over ranks is the whole embedding (spec P).
    Plain ops, so autograd gives each rank its rows' gradient."""
    comm = _group(group)
    rows = weight.shape[0]
    local = indices - comm.rank * rows
    mine = (local >= 0) & (local < rows)
    pad = padding_idx - comm.rank * rows
    own_pad = pad if padding_idx >= 0 and 0 <= pad < rows else None
    out = F.embedding(local.clamp(0, rows - 1), weight, padding_idx=own_pad)
    return out * mine.unsqueeze(-1).to(out.dtype)


_TARGETS: dict[str, Callable[..., Any]] = {
    "torch_plugin::vocab_embedding.default": vocab_embedding,
    "torch_plugin::reshard.default": reshard,
    "torch_plugin::grad_sync.default": grad_sync,
    "torch_plugin::replicated_output.default": replicated_output,
}


@dataclasses.dataclass
class ShardingPlan:
    """What the planner chose, for people: `print(plan)` shows the table, `save_png` a chart."""

    world: int
    device: str
    params: list[tuple[str, tuple[int, ...], str, int]]  # name, shape, spec, bytes on this rank
    collectives: list[dict[str, Any]]
    compute_s: float
    comm_s: float
    grad_sync_s: float
    param_bytes_per_rank: float
    solve_status: str
    variables: int
    constraints: int
    level: str
    raw: _C.ShardingPlan | None = dataclasses.field(repr=False, default=None)  # the C++ plan
    # Training: activations the forward keeps for the backward, per rank (example batch).
    activation_bytes_per_rank: float = 0.0
    # Training: parameters + gradients + optimizer state per rank, after ZeRO.
    state_bytes_per_rank: float = 0.0
    # Parameters whose optimizer state is sharded (ZeRO-1) -> over how many copies.
    zero_copies: dict[str, int] = dataclasses.field(default_factory=dict)
    zero_stage: dict[str, int] = dataclasses.field(default_factory=dict)  # 1 or 2
    zero_gather_s: float = 0.0
    dp: int = 1

    def table(self) -> str:
        lines = [
            f"sharding plan on {f'{self.dp} dp x ' if self.dp > 1 else ''}{self.world} tp ranks "
            f"(modelled on {self.device}; {self.level} ILP, "
            f"{self.variables} variables, {self.constraints} constraints, {self.solve_status})",
            f"{'parameter':<52} {'shape':<16} {'spec':<6} {'bytes/rank':>12} "
            f"{'optimizer state':>16}",
        ]
        for name, shape, spec, nbytes in self.params:
            copies = self.zero_copies.get(name)
            stage = self.zero_stage.get(name, 1)
            state = f"1/{copies} (ZeRO-{stage})" if copies else "whole"
            lines.append(f"{name:<52} {str(list(shape)):<16} {spec:<6} {nbytes:>12,} {state:>16}")
        lines.append(f"{'collective':<16} {'value':<36} {'from->to':<10} {'bytes':>12} {'ms':>8}")
        for c in self.collectives:
            lines.append(
                f"{c['kind']:<16} {c['value']:<36} {c['from_spec'] + '->' + c['to_spec']:<10} "
                f"{int(c['bytes']):>12,} {c['seconds'] * 1e3:>8.3f}"
            )
        lines.append(
            f"modelled per step: compute {self.compute_s * 1e3:.3f} ms, collectives "
            f"{self.comm_s * 1e3:.3f} ms, gradient sync {self.grad_sync_s * 1e3:.3f} ms"
            + (f" (and over {self.dp} dp replicas)" if self.dp > 1 else "")
            + (f", ZeRO collectives {self.zero_gather_s * 1e3:.3f} ms" if self.zero_copies else "")
            + f"; parameters {self.param_bytes_per_rank / 2**20:.2f} MiB per rank, with gradients "
            f"and optimizer state {self.state_bytes_per_rank / 2**20:.2f} MiB, saved "
            f"activations {self.activation_bytes_per_rank / 2**20:.2f} MiB per rank"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def save_png(self, path: str) -> None:
        """A bar chart of parameter bytes per rank by spec and of modelled time by kind."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        by_spec: dict[str, int] = {}
        for _, _, spec, nbytes in self.params:
            by_spec[spec] = by_spec.get(spec, 0) + nbytes
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        a.bar(list(by_spec), [v / 2**20 for v in by_spec.values()])
        a.set_title("parameter MiB per rank by spec")
        kinds = {
            "compute": self.compute_s,
            "collectives": self.comm_s,
            "grad sync": self.grad_sync_s,
        }
        b.bar(list(kinds), [v * 1e3 for v in kinds.values()])
        b.set_title(f"modelled ms per step ({self.device}, {self.world} ranks)")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


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
    on fake tensors, as the planner's IR."""
    traced = trace_call(model, call)
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
    )


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
    model: nn.Module, seed: int, block_of: Callable[[str, torch.Tensor], torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's blocks of a `meta` model's tensors, initialised as a single process building
    the model after `torch.manual_seed(seed)` would: module by module in registration order
    (the constructor's order), each module's tensors made whole on the CPU, reset, cut to this
    rank's block and dropped, so peak memory is one module's tensors, not the model's."""
    rng = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        for mod_name, mod in model.named_modules():
            direct = [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]
            if not direct:
                continue
            if not hasattr(mod, "reset_parameters"):
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
                whole.reset_parameters()
            prefix = f"{mod_name}." if mod_name else ""
            for name, _ in direct:
                t = getattr(whole, name)
                yield prefix + name, block_of(prefix + name, t.detach()).clone()
            del whole
    finally:
        torch.set_rng_state(rng)


class ShardedModule(nn.Module):
    """The rank-local program of a sharded model: this rank's parameter blocks and the graph."""

    def __init__(
        self,
        model: nn.Module,
        mesh: DeviceMesh,
        example_inputs: Sequence[Any] | dict[str, Any],
        *,
        constraints: dict[str, str] | None = None,
        memory_budget_gb: float | None = None,
        device: str = "a100",
        training: bool | None = None,
        time_limit_s: float = 30.0,
        level: str = "auto",
        init_seed: int | None = None,
        zero: int = 1,
    ) -> None:
        super().__init__()
        if len(mesh.shape) == 2 and mesh.axis_names != ("dp", "tp"):
            raise NotImplementedError(
                f"{mesh}: a 2-D mesh must have axes ('dp', 'tp'): data parallel over 'dp', the "
                "planned tensor parallelism over 'tp'"
            )
        call = as_call(example_inputs)
        self.mesh = mesh
        tp_axis = "tp" if len(mesh.shape) == 2 else mesh.axis_names[0]
        self.world = mesh.size(tp_axis)
        self.rank = mesh.local_rank(tp_axis)
        # Data parallelism over 'dp' composes outside the plan: each dp replica runs the
        # tensor-parallel program on its slice of the batch (dim 0 of every tensor input).
        self.dp = mesh.size("dp") if len(mesh.shape) == 2 else 1
        self.dp_rank = mesh.local_rank("dp") if self.dp > 1 else 0
        self._dp_handle = 0
        if self.dp > 1:
            dp_comm = Collectives(mesh.group("dp"), self.dp, self.dp_rank, "torch_plugin sharding")
            self._dp_handle = _register_group(dp_comm)
            self.dp_comm = dp_comm
        training = model.training if training is None else training
        if self.dp > 1 and training:
            _refuse_batch_statistics(model)
        # dp replicas over labels with padding: the whole batch's label count goes in as HF's
        # num_items_in_batch, so each replica's loss is its share of one process's loss.
        self._count_labels = label_counter(model, call) if self.dp > 1 else None
        self._pass_count = self._count_labels is not None and takes_loss_kwargs(model, call)
        if self._pass_count:
            call = (
                call[0],
                dict(sorted({**call[1], "num_items_in_batch": torch.tensor(0)}.items())),
            )
        full_call = call
        call = pytree.tree_map(self._dp_slice, call)
        comm = Collectives(mesh.group(tp_axis), self.world, self.rank, "torch_plugin sharding")
        self.comm = comm
        self._handle = _register_group(comm)

        # The program runs as captured, autocast state included: under another autocast
        # state (a training loop's torch.autocast) the model is captured again from a copy
        # of its structure on the meta device, and planned with every spec pinned to this
        # plan's (the blocks stay the same tensors).
        self._capture_call = call
        # (not a sub-module: its meta parameters are no parameters of this one)
        object.__setattr__(self, "_skeleton", _meta_copy(model))
        self._autocast_device = next(
            (t.device.type for t in model.parameters() if not t.is_meta), "cpu"
        )
        self._options = _C.ShardingOptions(
            reduce_scatter=comm.has_reduce_scatter,  # the plan prices what this backend runs
            world=self.world,
            device=device,
            training=training,
            time_limit_s=time_limit_s,
            pinned=dict(constraints or {}),
            level=level,
            dp=self.dp,
            max_zero_stage=zero,
        )
        captured = _capture(model, call)
        graph, ctx = captured.graph, captured.ctx
        pnames, bnames = captured.pnames, captured.bnames
        self._in_spec, self._out_spec = captured.in_spec, captured.out_spec
        self._constants = captured.constants
        # The model's loss read the count (a sum over the batch); otherwise its loss is a
        # mean, and so is the replicas' combination.
        self._summed_loss = self._pass_count and "num_items_in_batch" not in captured.unused_inputs
        self._options.memory_budget_bytes = (
            0.0 if memory_budget_gb is None else memory_budget_gb * 1e9
        )
        log.info(
            "torch_plugin sharding: planning %d ATen nodes on %d ranks (%s level, %.0f s limit)",
            len(graph.records()[1]),
            self.world,
            level,
            time_limit_s,
        )
        t0 = time.perf_counter()
        plan, sharded = self._shard(graph, self._options)
        log.info(
            "torch_plugin sharding: %s plan in %.2f s (%d decision units, %d ILP variables)",
            plan.status,
            time.perf_counter() - t0,
            plan.classes,
            plan.variables,
        )
        # The solver stops at its time limit, so a loaded rank could stop at another plan;
        # mismatched plans would meet in mismatched collectives. Compare before any runs.
        check_same(
            comm.group,
            "sharding plans",
            digest(str(plan)),
            self.world,
            "every rank must capture the same model with the same options; if the ILP hit its "
            "time limit (see the log), raise time_limit_s or use level='fast'",
        )
        ctx.targets.update(_TARGETS)
        self.graph_module = fx_bridge.from_ir(sharded.graph, ctx)
        self._random_ops = fx_bridge.has_random_ops(sharded.graph)
        self.local_graph = sharded.graph
        state_names = set(pnames) | set(bnames)
        self._pinned = {n: sp for n, sp in plan.spec.items() if n in state_names}
        self._programs: dict[Any, tuple[fx.GraphModule, bool]] = {
            self._autocast_state(): (self.graph_module, self._random_ops)
        }

        # This rank's blocks, in placeholder order; the model's own tensors are not kept.
        spec = plan.spec
        self.param_names = pnames
        self.param_specs = [spec.get(n, "R") for n in pnames]
        self.buffer_names = bnames
        self.buffer_specs = [spec.get(n, "R") for n in bnames]
        all_params = dict(model.named_parameters())
        all_buffers = dict(model.named_buffers())
        specs = dict(zip(pnames + bnames, self.param_specs + self.buffer_specs, strict=True))
        meta = any(t.is_meta for t in [*all_params.values(), *all_buffers.values()])
        if meta and init_seed is None and planning_only(comm.group):
            # Planning a large world in one process (torch's fake backend): the blocks keep
            # their local shapes on the meta device; nothing runs.
            blocks = {
                n: self.shard(t.detach(), specs[n])
                for n, t in [*all_params.items(), *all_buffers.items()]
            }
        elif meta:
            if init_seed is None:
                raise ValueError(
                    "the model is on the meta device: pass init_seed (the seed it would be built "
                    "with) so each rank initialises its blocks as one process would"
                )
            blocks = dict(
                _init_blocks_like_constructor(
                    model, init_seed, lambda n, t: self.shard(t, specs[n])
                )
            )
        else:
            blocks = {
                n: self.shard(t.detach(), specs[n]).clone()
                for n, t in [*all_params.items(), *all_buffers.items()]
            }
        # The blocks live under the model's own names (model.layers.0.mlp.up_proj.weight), so
        # named_parameters(), state_dict() and name-based optimizer groups read as the model's.
        self.local_params = [
            nn.Parameter(blocks[n], requires_grad=all_params[n].requires_grad) for n in pnames
        ]
        for n, p in zip(pnames, self.local_params, strict=True):
            owner, attr = self._owner(n)
            owner.register_parameter(attr, p)
        self._buffer_slots = []
        for n in bnames:
            owner, attr = self._owner(n)
            owner.register_buffer(attr, blocks[n])
            self._buffer_slots.append((owner, attr))
        # Checkpoints and exports speak of whole tensors under the model's state_dict keys
        # (tied aliases such as lm_head.weight -> model.embed_tokens.weight included).
        self.global_shapes = {
            n: tuple(t.shape) for n, t in [*all_params.items(), *all_buffers.items()]
        }
        canonical = {id(t): n for n, t in [*all_params.items(), *all_buffers.items()]}
        self.state_keys = [
            (k, canonical[id(t)])
            for k, t in model.state_dict(keep_vars=True).items()
            if id(t) in canonical
        ]
        self.config = getattr(model, "config", None)
        self._captured_training = training
        self.train(training)
        self._input_shapes = [
            tuple(x.shape) if isinstance(x, torch.Tensor) else None
            for x in pytree.tree_leaves(full_call)
        ]
        self.plan = ShardingPlan(
            world=self.world,
            device=device,
            params=[
                (n, tuple(all_params[n].shape), s, p.numel() * p.element_size())
                for n, s, p in zip(pnames, self.param_specs, self.local_params, strict=True)
            ],
            collectives=[c.to_dict() for c in plan.collectives],
            compute_s=plan.compute_s,
            comm_s=plan.comm_s,
            grad_sync_s=plan.grad_sync_s,
            param_bytes_per_rank=plan.param_bytes_per_rank,
            solve_status=plan.status,
            variables=plan.variables,
            constraints=plan.constraints,
            level=plan.level,
            raw=plan,
            activation_bytes_per_rank=plan.activation_bytes_per_rank,
            state_bytes_per_rank=plan.state_bytes_per_rank,
            zero_copies=dict(plan.zero_copies),
            zero_stage=dict(plan.zero_stage),
            zero_gather_s=plan.zero_gather_s,
            dp=self.dp,
        )
        # ZeRO-2 blocks: each keeps a flat 1/dp shard (a view of the block) whose gradient the
        # backward reduce-scatters into as soon as the block's own is accumulated (then freed).
        self._syncing = True  # False inside no_sync()
        self._unsynced = False  # .grad holds micro-steps not yet summed over dp
        self._zero2: dict[str, _Zero2Shard] = {}
        for name, p in zip(pnames, self.local_params, strict=True):
            if plan.zero_stage.get(name) == 2 and p.requires_grad:
                self._zero2[name] = _Zero2Shard(p, self.dp_comm, name, lambda: self._syncing)
        self._zero2_ids = {id(z.param) for z in self._zero2.values()}
        self.mesh_search: list[dict[str, Any]] = []  # shard_model(mesh_shape="auto") fills it
        log.info(
            "torch_plugin sharding: %d reshards, %d grad syncs",
            sharded.reshards,
            sharded.grad_syncs,
        )

    def _owner(self, name: str) -> tuple[nn.Module, str]:
        """The (sub)module of this one that holds `name` under the model's path, made as
        needed; a path whose first part is one of this module's own attributes goes under
        `.module` instead (as DDP names it)."""
        *path, attr = name.split(".")
        owner: nn.Module = self
        if path and path[0] in self.__dict__ and path[0] not in self._modules:
            path = ["module", *path]
        elif not path and (attr in self.__dict__ or hasattr(type(self), attr)):
            path = ["module"]
        for part in path:
            child = owner._modules.get(part)
            if child is None:
                child = nn.Module()
                owner.add_module(part, child)
            owner = child
        return owner, attr

    def shard(self, full: torch.Tensor, spec: str) -> torch.Tensor:
        """This rank's block of a whole tensor held as `spec` (R and P: the whole tensor)."""
        kind, dim, sections = _parse(spec)
        if kind != "S":
            return full
        return _block(full, dim, sections, self.world, self.rank)

    def named_local_parameters(self) -> list[tuple[str, nn.Parameter, str]]:
        """(name in the original model, this rank's block, spec) per parameter."""
        return list(zip(self.param_names, self.local_params, self.param_specs, strict=True))

    def optimizer(
        self,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        master_weights: bool = False,
        **defaults: Any,
    ) -> ShardedOptimizer:
        """An optimizer over this rank's blocks that follows the plan's ZeRO choices: the
        parameters in `plan.zero_copies` keep 1/copies of their optimizer state on each copy
        (torch's ZeroRedundancyOptimizer over the ranks holding that block), the others a
        plain `optimizer_class`. Use it in place of `optimizer_class(dist_model.parameters())`;
        without ZeRO choices it is exactly that. master_weights: bf16 / fp16 blocks are stepped
        as float32 copies (their gradients cast up before the step), and the blocks get the
        rounded result, as mixed-precision training keeps its master weights."""
        return ShardedOptimizer(self, optimizer_class, master_weights=master_weights, **defaults)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation without a collective per micro-step, as with DDP / FSDP:
        backwards inside the block sum gradients locally; the first backward after it sums
        them over the dp replicas with its own. Tensor-parallel collectives are part of the
        computation and still run. A no-op without a dp axis."""
        previous = self._syncing
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = previous

    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ for the whole model: the norm over every parameter's
        whole gradient, each block and each replica counted exactly once (tp-replicated
        blocks on tp rank 0 only, dp replicas once, ZeRO-2 shards summed over dp); every rank
        gets the same norm and scales its blocks by the same factor. Returns the norm."""
        p = float(norm_type)
        inf = p == float("inf")
        local: list[torch.Tensor] = []
        zero2: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        for name, param, spec in self.named_local_parameters():
            z = self._zero2.get(name)
            g = z.shard.grad if z is not None else param.grad
            if g is None:
                continue
            grads.append(g)
            if spec.startswith("S") or self.rank == 0 or inf:
                part = g.detach().float().abs()
                part = part.max() if inf else part.pow(p).sum()
                (zero2 if z is not None else local).append(part)

        op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM

        def combine(parts: list[torch.Tensor]) -> torch.Tensor:
            if not parts:
                return torch.zeros(())
            stacked = torch.stack(parts)
            return stacked.max() if inf else stacked.sum()

        part = combine(local)
        if zero2:
            part = combine([part, self.dp_comm.all_reduce(combine(zero2), "grad_norm", op)])
        total = self.comm.all_reduce(part, "grad_norm", op)
        norm = total if inf else total.pow(1.0 / p)
        if error_if_nonfinite and not torch.isfinite(norm):
            raise RuntimeError(
                f"the total norm of order {norm_type} of the gradients is non-finite; set "
                "error_if_nonfinite=False to clip anyway"
            )
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        with torch.no_grad():
            for g in grads:
                g.mul_(coef.to(g.dtype))
        return norm

    def full_state_dict(self, rank0_only: bool = True) -> dict[str, torch.Tensor]:
        """The unwrapped model's state_dict (its own keys, whole tensors), gathered tensor by
        tensor; on rank 0 only unless rank0_only=False. model.load_state_dict(...) and HF
        save_pretrained take it."""
        from .checkpoint import full_state_dict

        return full_state_dict(self, rank0_only)

    def _autocast_state(self) -> Any:
        dev = self._autocast_device
        if not torch.is_autocast_enabled(dev):
            return None
        return (dev, torch.get_autocast_dtype(dev))

    def _shard(
        self, graph: _C.Graph, options: _C.ShardingOptions
    ) -> tuple[_C.ShardingPlan, _C.ShardedGraph]:
        """Plans the graph's sharding and materialises the SPMD graph this rank runs."""
        pm = _C.PassManager()
        plan = pm.plan_sharding(graph, options)
        sharded = pm.materialize_sharding(
            graph,
            plan,
            _C.MaterializeOptions(
                world=options.world, group=self._handle, training=options.training
            ),
        )
        return plan, sharded

    def _program(self) -> tuple[fx.GraphModule, bool]:
        """The local program for the current autocast state (captured and planned once)."""
        state = self._autocast_state()
        program = self._programs.get(state)
        if program is not None:
            return program
        log.info(
            "torch_plugin sharding: first call under autocast %s; capturing the model again "
            "with its specs pinned",
            state,
        )
        if self._skeleton is None:
            raise RuntimeError(
                f"torch_plugin sharding: the model was captured with autocast "
                f"{next(iter(self._programs))} and runs under {state}; call parallelize "
                "inside the autocast context the model trains in"
            )
        captured = _capture(self._skeleton, self._capture_call)
        pinned = self._options.to_dict()
        pinned.update(memory_budget_bytes=0.0, pinned=self._pinned)
        plan, sharded = self._shard(captured.graph, _C.ShardingOptions(**pinned))
        changed = {n: s for n, s in plan.spec.items() if self._pinned.get(n, s) != s}
        if changed:
            raise RuntimeError(
                f"torch_plugin sharding: under autocast {state} the plan moved {changed}; "
                "call parallelize inside the autocast context the model trains in"
            )
        check_same(
            self.comm.group,
            "sharding plans under autocast",
            digest(str(plan)),
            self.world,
            "every rank must run the same autocast state",
        )
        captured.ctx.targets.update(_TARGETS)
        program = (
            fx_bridge.from_ir(sharded.graph, captured.ctx),
            fx_bridge.has_random_ops(sharded.graph),
        )
        self._programs[state] = program
        return program

    def local_parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.local_params)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        labels = kwargs.get("labels") if self._count_labels is not None else None
        if not isinstance(labels, torch.Tensor):
            labels = None
        total = None if labels is None else self._count_labels(labels)
        if self._pass_count and total is not None:
            kwargs["num_items_in_batch"] = total
        leaves, spec = pytree.tree_flatten((args, dict(sorted(kwargs.items()))))
        if spec != self._in_spec:
            raise ValueError(
                f"called with {describe(spec)}; the sharded program was captured for "
                f"{describe(self._in_spec)}: call parallelize with example inputs like these"
            )
        flat = []
        for i, (x, shape) in enumerate(zip(leaves, self._input_shapes, strict=True)):
            if i in self._constants:
                if x is not self._constants[i] and x != self._constants[i]:
                    raise ValueError(
                        f"argument {i} is {x!r}; the sharded program was captured with "
                        f"{self._constants[i]!r} (non-tensor arguments are fixed per plan)"
                    )
                continue
            if shape is not None and tuple(x.shape) != shape:
                raise ValueError(
                    f"input {i} has shape {tuple(x.shape)}; the sharded program was captured for "
                    f"{shape} (shapes are static per plan): call parallelize with example inputs "
                    "of this shape"
                )
            flat.append(x)
        graph_module, random_ops = self._program()
        if random_ops and self.world > 1:
            # Random ops (dropout masks) stay replicated: every tp rank draws the whole mask
            # and uses its block, one process's dropout only if all draw from one state.
            self.comm.share_rng_state()
        if random_ops and self.training != self._captured_training:
            raise ValueError(
                "the sharded program was captured in "
                f"{'train' if self._captured_training else 'eval'} mode and has random ops "
                "(dropout): call parallelize on the model in the mode it runs in"
            )
        buffers = [owner._buffers[attr] for owner, attr in self._buffer_slots]
        params: list[torch.Tensor] = list(self.local_params)
        if self.dp == 1:
            outs = graph_module(*params, *buffers, *flat)
            return pytree.tree_unflatten(list(outs), self._out_spec)
        # dp replicas: every gradient block is summed over 'dp' (one bucket); the batch slice
        # runs through the tp program; outputs are gathered back along the batch. Every rank
        # seeds the same loss gradient, so the gathered output scales it by 1/dp (the program
        # itself scales by 1/tp), keeping the gradient convention of sharding_materialize.h.
        # ZeRO-2 blocks are not in the bucket: their hooks reduce-scatter them one by one.
        trainable = [
            i for i, p in enumerate(params) if p.requires_grad and id(p) not in self._zero2_ids
        ]
        if trainable and torch.is_grad_enabled() and self._syncing:
            pending = None
            if self._unsynced:
                # Micro-steps under no_sync() left local sums in .grad: this backward's
                # all-reduce carries them, and .grad receives the whole batch's gradient.
                pending = [params[i].grad for i in trainable]
                for i in trainable:
                    params[i].grad = None
                self._unsynced = False
            synced = grad_sync([params[i] for i in trainable], self._dp_handle, pending)
            for i, t in zip(trainable, synced, strict=True):
                params[i] = t
        elif trainable and torch.is_grad_enabled():
            self._unsynced = True
        local = [self._dp_slice(x) for x in flat]
        outs = graph_module(*params, *buffers, *local)
        weight = 1.0 / self.dp
        if total is not None:
            if self._summed_loss:
                weight = 1.0
            elif int(total) > 0:
                weight = int(self._count_labels(self._dp_slice(labels))) / int(total)
        whole = [
            replicated_output(reshard(o, "S(0)", "R", self._dp_handle), self._dp_handle)
            if isinstance(o, torch.Tensor) and o.dim() > 0 and o.is_floating_point()
            else _BatchLoss.apply(o, self._dp_handle, weight)
            if isinstance(o, torch.Tensor) and o.is_floating_point()
            else o
            for o in outs
        ]
        return pytree.tree_unflatten(whole, self._out_spec)

    def _dp_slice(self, x: Any) -> Any:
        """This dp replica's rows (dim 0) of a batch tensor."""
        if self.dp == 1 or not isinstance(x, torch.Tensor) or x.dim() == 0:
            return x
        if x.shape[0] % self.dp:
            raise ValueError(
                f"a batch of {x.shape[0]} rows does not split over the mesh's {self.dp} dp "
                "replicas; use a batch divisible by the dp size"
            )
        return x.chunk(self.dp, 0)[self.dp_rank]


class _Zero2Shard:
    """A ZeRO-2 block's flat 1/dp shard: `shard` is a Parameter viewing this dp rank's part of
    the flattened block (its update writes the block in place). A hook on the block reduce-
    scatters each accumulated gradient over dp into shard.grad and frees the whole one, so a
    rank keeps 1/dp of this block's gradient and optimizer state; `gather` rebuilds the block
    from every rank's updated shard after the step."""

    def __init__(
        self, param: nn.Parameter, comm: Collectives, name: str, syncing: Callable[[], bool]
    ) -> None:
        self.param, self.comm, self.name = param, comm, name
        self.syncing = syncing
        n = param.numel()
        self.chunk = -(-n // comm.world)  # ceil: the last rank's part is zero-padded
        lo = min(n, comm.rank * self.chunk)
        hi = min(n, lo + self.chunk)
        self.shard = nn.Parameter(param.detach().view(-1)[lo:hi])
        param.register_post_accumulate_grad_hook(self._reduce_scatter)

    def _padded(self, flat: torch.Tensor) -> torch.Tensor:
        extra = self.chunk * self.comm.world - flat.numel()
        return F.pad(flat, (0, extra)) if extra else flat

    def _reduce_scatter(self, param: torch.Tensor) -> None:
        if not self.syncing():  # no_sync(): the whole block's gradient accumulates here
            return
        grad = param.grad
        param.grad = None
        mine = self.comm.reduce_scatter(self._padded(grad.reshape(-1)), 0, "zero2_grad")
        mine = mine[: self.shard.numel()]
        self.shard.grad = mine if self.shard.grad is None else self.shard.grad + mine

    def gather(self) -> None:
        with torch.no_grad():
            part = self.shard.detach().reshape(-1)
            if part.numel() < self.chunk:  # the last ranks' parts are short (or empty)
                part = F.pad(part, (0, self.chunk - part.numel()))
            whole = self.comm.all_gather(part.contiguous(), "zero2_param")
            self.param.view(-1).copy_(whole.reshape(-1)[: self.param.numel()])


# Optimizers whose update of an element reads only that element's gradient and state: stepping
# a flat slice of a block is then stepping the block (ZeRO-2's shards need this).
_ELEMENTWISE_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adamax", "Adagrad", "RMSprop", "NAdam", "RAdam")


class ShardedOptimizer(torch.optim.Optimizer):
    """One step over a ShardedModule's blocks: a plain optimizer for the blocks whose state
    stays whole, one ZeroRedundancyOptimizer per group of ranks that share copies of the
    other blocks (the whole mesh for tp-replicated blocks, the dp axis for tp-sharded ones).
    The gradients are already summed over those copies when backward returns (the graph's
    grad_sync and the dp bucket), so each ZeRO rank steps its part of the blocks and broadcasts
    the result: ZeRO-1. ZeRO-2 blocks step their flat 1/dp shards (gradients reduce-scattered
    by the backward) with a plain `optimizer_class`, then all-gather the blocks; that needs an
    elementwise optimizer (SGD, Adam, AdamW, ...).

    It is a torch.optim.Optimizer whose `param_groups` are its parts' own group dicts, so LR
    schedulers (CosineAnnealingLR, LambdaLR, ...) drive every part; its state is checkpointed
    by torch_plugin.save_checkpoint (each rank its part), not by state_dict()."""

    def __init__(
        self,
        module: ShardedModule,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        master_weights: bool = False,
        **defaults: Any,
    ) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # Master weights: float32 copies of the low-precision blocks are what the parts step.
        self.masters: list[tuple[nn.Parameter, nn.Parameter]] = []
        master_of: dict[int, nn.Parameter] = {}
        if master_weights:
            if module._zero2:
                raise NotImplementedError(
                    "master_weights with ZeRO-2 blocks: parallelize with zero=1 (ZeRO-1 parts "
                    "and plain parts keep float32 masters)"
                )
            for _, p, _ in module.named_local_parameters():
                if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16):
                    m = nn.Parameter(p.detach().float().clone())
                    self.masters.append((p, m))
                    master_of[id(p)] = m

        whole_mesh = module.dp * module.world
        by_copies: dict[int, list[nn.Parameter]] = {}
        plain: list[nn.Parameter] = []
        self.zero2 = list(module._zero2.values())
        if self.zero2 and optimizer_class.__name__ not in _ELEMENTWISE_OPTIMIZERS:
            raise ValueError(
                f"{optimizer_class.__name__}: the plan uses ZeRO-2 for "
                f"{', '.join(z.name for z in self.zero2[:3])}..., whose flat shards need an "
                f"elementwise optimizer ({', '.join(_ELEMENTWISE_OPTIMIZERS)}); use one, or "
                "parallelize with zero=1"
            )
        for name, p, _ in module.named_local_parameters():
            if id(p) in module._zero2_ids:
                continue
            copies = module.plan.zero_copies.get(name)
            p = master_of.get(id(p), p)
            if copies is None or not p.requires_grad:
                plain.append(p)
            else:
                by_copies.setdefault(copies, []).append(p)
        self.optimizers: list[torch.optim.Optimizer] = []
        if plain:
            self.optimizers.append(optimizer_class(plain, **defaults))
        if self.zero2:
            self.optimizers.append(optimizer_class([z.shard for z in self.zero2], **defaults))
        for copies, params in sorted(by_copies.items()):
            if copies == whole_mesh:
                group = module.comm.group if module.dp == 1 else dist.group.WORLD
            elif copies == module.dp and module.dp > 1:
                group = module.dp_comm.group
            else:
                raise RuntimeError(
                    f"the plan shards optimizer state over {copies} copies, but this mesh has "
                    f"{module.dp} dp x {module.world} tp ranks; plan and mesh disagree"
                )
            self.optimizers.append(
                ZeroRedundancyOptimizer(
                    params, optimizer_class=optimizer_class, process_group=group, **defaults
                )
            )
        # The base class's bookkeeping (hooks, defaults) over every local block; then its
        # groups become the parts' (a scheduler's lr edits reach them).
        local = [master_of.get(id(p), p) for _, p, _ in module.named_local_parameters()]
        local += [z.shard for z in self.zero2]
        super().__init__(local, dict(defaults))
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError(
            "a ShardedOptimizer's state is split over ranks: save it with "
            "torch_plugin.save_checkpoint(path, model, optimizer) (each rank writes its part; "
            "it loads into any mesh)"
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError(
            "load a ShardedOptimizer with torch_plugin.load_checkpoint(path, model, optimizer)"
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)
        for p, _ in self.masters:
            p.grad = None

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("ShardedOptimizer.step takes no closure (its parts step separately)")
        for p, m in self.masters:
            m.grad = None if p.grad is None else p.grad.float()
        for o in self.optimizers:
            o.step()
        with torch.no_grad():
            for p, m in self.masters:
                p.copy_(m)
        for z in self.zero2:
            z.gather()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (for the ZeRO parts: its partition)."""
        total = 0
        for o in self.optimizers:
            inner = getattr(o, "optim", o)
            for st in inner.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor) and v.dim() > 0:
                        total += v.numel() * v.element_size()
        return total


def search_mesh_shape(
    model: nn.Module,
    world: int,
    example_inputs: Sequence[Any] | dict[str, Any],
    *,
    constraints: dict[str, str] | None = None,
    memory_budget_gb: float | None = None,
    device: str = "a100",
    training: bool | None = None,
    time_limit_s: float = 30.0,
    level: str = "auto",
    zero: int = 1,
) -> list[dict[str, Any]]:
    """Every (dp, tp) shape of `world` ranks whose dp divides the batch, each planned by the
    ILP (one dp replica's batch slice, the dp axis's gradient sync and ZeRO-1 inside it):
    [{"dp", "tp", "objective" (modelled step s, None if no plan fits), "why"}], fastest first.
    Pure data parallelism is the (world, 1) shape; no process group is needed."""
    call = as_call(example_inputs)
    flat = [x for x in pytree.tree_leaves(call) if isinstance(x, torch.Tensor)]
    batch = next((int(x.shape[0]) for x in flat if x.dim() > 0), 1)
    training = model.training if training is None else training
    budget = 0.0 if memory_budget_gb is None else memory_budget_gb * 1e9
    shapes = []
    for dp in (d for d in range(1, world + 1) if world % d == 0 and batch % d == 0):
        sliced = pytree.tree_map(
            lambda x, dp=dp: (
                x[: x.shape[0] // dp] if isinstance(x, torch.Tensor) and x.dim() > 0 else x
            ),
            call,
        )
        graph = _capture(model, sliced).graph
        row: dict[str, Any] = {"dp": dp, "tp": world // dp, "objective": None, "why": ""}
        try:
            plan = _C.PassManager().plan_sharding(
                graph,
                _C.ShardingOptions(
                    # Priced for the backend that will run it (gloo has no reduce-scatter).
                    reduce_scatter=not dist.is_initialized()
                    or dist.get_backend() in ("nccl", "fake"),
                    world=world // dp,
                    device=device,
                    training=training,
                    memory_budget_bytes=budget,
                    time_limit_s=time_limit_s,
                    pinned=dict(constraints or {}),
                    level=level,
                    dp=dp,
                    max_zero_stage=zero,
                ),
            )
            row["objective"] = plan.objective
        except _C.PlanError as e:
            row["why"] = str(e)
        shapes.append(row)
    shapes.sort(key=lambda r: (r["objective"] is None, r["objective"] or 0.0, -r["tp"]))
    return shapes


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    example_inputs: Sequence[Any] | dict[str, Any],
    *,
    constraints: dict[str, str] | None = None,
    memory_budget_gb: float | None = None,
    mesh_shape: str | None = None,
    **options: Any,
) -> ShardedModule:
    """The sharded form of `model` on `mesh` (see ShardedModule); `constraints` pins specs by
    parameter name or graph node, e.g. {"mlp.fc1.weight": "S(0)"}. mesh_shape="auto" on a 1-D
    mesh: the (dp, tp) shape of its ranks with the least modelled step (search_mesh_shape)
    becomes a 2-D ("dp", "tp") mesh over the same ranks; `.mesh_search` lists every shape."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised; build a DeviceMesh first")
    search: list[dict[str, Any]] = []
    if mesh_shape not in (None, "auto"):
        raise ValueError(f"mesh_shape {mesh_shape!r}: None (the mesh as given) or 'auto'")
    if mesh_shape == "auto":
        if len(mesh.shape) != 1:
            raise ValueError(f"mesh_shape='auto' reshapes a 1-D mesh; {mesh} is already 2-D")
        keys = ("device", "training", "time_limit_s", "level", "zero")
        search = search_mesh_shape(
            model,
            mesh.size(),
            example_inputs,
            constraints=constraints,
            memory_budget_gb=memory_budget_gb,
            **{k: options[k] for k in keys if k in options},
        )
        best = search[0]
        if best["objective"] is None:
            raise _C.PlanError(
                f"no (dp, tp) shape of {mesh.size()} ranks has a plan: "
                + "; ".join(f"{r['dp']}x{r['tp']}: {r['why']}" for r in search)
            )
        log.info(
            "torch_plugin sharding: mesh shapes (dp x tp: modelled ms) %s; using %dx%d",
            ", ".join(
                f"{r['dp']}x{r['tp']}: "
                + (f"{r['objective'] * 1e3:.3f}" if r["objective"] is not None else "no plan")
                for r in search
            ),
            best["dp"],
            best["tp"],
        )
        if best["dp"] > 1:
            mesh = DeviceMesh(
                (best["dp"], best["tp"]),
                ("dp", "tp"),
                timeout_s=mesh.timeout_s,
                backend=mesh.backend,
            )
    sharded = ShardedModule(
        model,
        mesh,
        example_inputs,
        constraints=constraints,
        memory_budget_gb=memory_budget_gb,
        **options,
    )
    sharded.mesh_search = search
    return sharded
