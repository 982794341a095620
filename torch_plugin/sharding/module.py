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
import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from .. import _C, fx_bridge
from ..checkpoint.layout import Layout
from ..checkpoint.pretrained import count_parameters, embedding_weights, save_pretrained_as_hf
from ..runtime.agreement import check_same, digest, planning_only
from ..runtime.capture import (
    as_call,
    check_batch_agrees,
    describe,
    model_label_counter,
    takes_loss_kwargs,
)
from ..runtime.collectives import Collectives
from ..runtime.ddp_guard import RefusesDDP
from ..runtime.generation import GeneratesOnGatheredCopy
from ..runtime.grad_norm import GradGroup, NormShare, count_gradients
from ..runtime.mesh import DeviceMesh
from ..runtime.recompute import checkpointed_layers, recompute
from ..runtime.spmd_ops import (
    _TARGETS,
    _BatchLoss,
    _block,
    _parse,
    _register_group,
    _whole,
    global_dropout_masks,
    grad_sync,
    replicated_output,
    reshard,
    uneven_batch_gather,
)
from .capture import (
    _capture,
    _init_blocks_like_constructor,
    _meta_copy,
    _refuse_batch_coupling,
    _refuse_batch_statistics,
    capture_graph,
    scalar_outputs_are_sums,
)
from .optim import ShardedOptimizer, _Zero2Shard
from .report import ShardingPlan

__all__ = [
    "ShardedModule",
    "ShardedOptimizer",
    "ShardingPlan",
    "capture_graph",
    "search_mesh_shape",
    "shard_model",
]

log = logging.getLogger("torch_plugin.sharding")


def _plan_digest(plan: _C.ShardingPlan) -> str:
    """What every rank must agree on: specs, strategies and collectives (not the solver's status
    or objective, which a rank that hit the time limit with the same plan may report apart)."""
    return digest([plan.spec, plan.strategy, [c.to_dict() for c in plan.collectives]])


@dataclasses.dataclass(frozen=True)
class ShardOptions:
    """What sharding takes besides the model, the mesh and the inputs: validated once where the
    user's keywords come in (parallelize, shard_model, ShardedModule), then passed as one.

    constraints: spec pins by parameter name or graph node ({"mlp.fc1.weight": "S(0)"});
    memory_budget_gb: per rank, parameters x optimizer state (+ activations when training);
    device: the cost model's device profile; training: None follows model.training;
    level: the ILP's "exact", "fast" or "auto"; zero: the highest ZeRO stage offered (0-2);
    init_seed: a meta-device model's blocks are initialised as its constructor would with this
    seed; pretrained: a save_pretrained directory read into each rank's blocks (a `meta` model
    needs no init_seed then; tensors the checkpoint lacks, such as rotary tables, are
    initialised as the constructor would); mesh_shape: "auto" searches the (dp, tp) shape of
    a 1-D mesh; memory_slack: among
    plans modelled within this fraction of the fastest, the one minimising time + parameter
    state per rank, each relative to the fastest plan's (0: the fastest, whatever it holds)."""

    constraints: dict[str, str] = dataclasses.field(default_factory=dict)
    memory_budget_gb: float | None = None
    device: str = "a100"
    training: bool | None = None
    time_limit_s: float = 30.0
    level: str = "auto"
    zero: int = 1
    init_seed: int | None = None
    mesh_shape: str | None = None
    memory_slack: float = 0.1
    pretrained: str | None = None

    @classmethod
    def of(cls, options: ShardOptions | None = None, **kwargs: Any) -> ShardOptions:
        """`options` updated by keywords; an unknown keyword is a clear error (the planner
        names a bad level or ZeRO stage)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(
                f"torch_plugin sharding: unknown option(s) {unknown}; options: "
                + ", ".join(sorted(names))
            )
        out = dataclasses.replace(options or cls(), **kwargs)
        if out.constraints is None:
            out = dataclasses.replace(out, constraints={})
        if out.mesh_shape not in (None, "auto"):
            raise ValueError(f"mesh_shape {out.mesh_shape!r}: None (the mesh as given) or 'auto'")
        if not out.memory_slack >= 0:
            raise ValueError(
                f"memory_slack {out.memory_slack!r}: a fraction >= 0 of the fastest plan's step "
                "time (0: the fastest plan, whatever it holds)"
            )
        return out

    def ilp(self, world: int, dp: int, training: bool, reduce_scatter: bool) -> _C.ShardingOptions:
        """The C++ planner's options for `world` tp ranks and `dp` replicas."""
        return _C.ShardingOptions(
            world=world,
            dp=dp,
            training=training,
            reduce_scatter=reduce_scatter,
            device=self.device,
            time_limit_s=self.time_limit_s,
            memory_budget_bytes=0.0
            if self.memory_budget_gb is None
            else self.memory_budget_gb * 1e9,
            pinned=dict(self.constraints),
            level=self.level,
            max_zero_stage=self.zero,
            memory_slack=self.memory_slack,
        )


@dataclasses.dataclass
class _Program:
    """The rank-local program for one kind of call (signature, shapes, dtypes, non-tensor
    arguments, autocast state, train/eval): all run on the same parameter blocks."""

    module: fx.GraphModule
    random_ops: bool
    out_spec: pytree.TreeSpec
    summed_loss: bool  # the model's loss read num_items_in_batch (a sum over the batch)


def _structure(graph: _C.Graph) -> tuple[Any, ...]:
    """A graph's inputs (name, kind, source, rank, dtype) and nodes (name, op): equal for
    captures of one program at other sizes."""
    inputs, nodes, _ = graph.records()
    return (
        tuple(
            (r[0], r[2], r[3], len(r[1][1]), r[1][3]) if r[1][0] == "tensor" else (r[0], r[2])
            for r in inputs
        ),
        tuple((r[0], r[1]) for r in nodes),
    )


def _batch_rows(call: Any) -> int:
    """The batch of a call: dim 0 of its first tensor with a dimension (0 when none)."""
    return next(
        (
            int(x.shape[0])
            for x in pytree.tree_leaves(call)
            if isinstance(x, torch.Tensor) and x.dim() > 0
        ),
        0,
    )


def _constant_key(x: Any) -> Any:
    try:
        hash(x)
        return (type(x).__name__, x)
    except TypeError:
        return (type(x).__name__, repr(x))


def _reduce_grad_norm(module: ShardedModule, t: torch.Tensor, op: Any) -> torch.Tensor:
    return module.comm.all_reduce(t, "grad_norm", op)


def _zero2_grads_elsewhere(module: ShardedModule) -> str | None:
    held = [name for name, z in module._zero2.items() if z.shard.grad is not None]
    if not held:
        return None
    return (
        f"torch_plugin sharding: {len(held)} ZeRO-2 block(s) ({', '.join(held[:3])}"
        f"{' ...' if len(held) > 3 else ''}) keep their gradients as 1/dp flat shards that "
        "the parameters' .grad does not show, so a norm over dist_model.parameters() leaves "
        "them out and clipping would not scale them; call dist_model.clip_grad_norm_(max_norm)"
    )


class ShardedModule(RefusesDDP, GeneratesOnGatheredCopy, nn.Module):
    """The rank-local program of a sharded model: this rank's parameter blocks and the graph.

    The parameter layout is planned once, on the example call. A call of another signature
    (other keywords, positional instead of keyword), other sequence length or batch size, or
    under another autocast state gets its own program: the model captured again from a meta
    copy of its structure and materialised with every parameter's spec pinned to the plan,
    cached by the call's kind (one log line each, with its capture time)."""

    def __init__(
        self,
        model: nn.Module,
        mesh: DeviceMesh,
        example_inputs: Sequence[Any] | dict[str, Any],
        options: ShardOptions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        opts = ShardOptions.of(options, **kwargs)
        training, level, time_limit_s, init_seed = (
            opts.training,
            opts.level,
            opts.time_limit_s,
            opts.init_seed,
        )
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
        self._count_labels = model_label_counter(model) if self.dp > 1 else None
        self._takes_count = self.dp > 1 and takes_loss_kwargs(model, ((), {}))
        check_batch_agrees(call[1])
        call = self._with_count(call)
        full_call = call
        rows = _batch_rows(call)
        if self.dp > 1 and rows % self.dp:
            # Every replica plans the same layout on its slice of the example: equal slices.
            raise ValueError(
                f"the example batch of {rows} rows does not split over the mesh's {self.dp} dp "
                "replicas; give parallelize an example batch divisible by the dp size (later "
                f"calls may have any batch of at least {self.dp} rows)"
            )
        call = pytree.tree_map(self._dp_slice, call)
        comm = Collectives(mesh.group(tp_axis), self.world, self.rank, "torch_plugin sharding")
        self.comm = comm
        self._handle = _register_group(comm)

        # The program runs as captured, autocast state included: under another autocast
        # state (a training loop's torch.autocast) the model is captured again from a copy
        # of its structure on the meta device, and planned with every spec pinned to this
        # plan's (the blocks stay the same tensors).
        # (not a sub-module: its meta parameters are no parameters of this one)
        object.__setattr__(self, "_skeleton", _meta_copy(model))
        self._autocast_device = next(
            (t.device.type for t in model.parameters() if not t.is_meta), "cpu"
        )
        # The plan prices what this backend runs (a reduce-scatter, or an all-reduce without).
        self._options = opts.ilp(self.world, self.dp, training, comm.has_reduce_scatter)
        captured = _capture(model, call)
        # Per random draw, whether it runs along the batch (None: not traced, guessed).
        self._draws_along: list[bool] | None = None
        if self.dp > 1 and training and not any(p.is_meta for p in model.parameters()):
            self._draws_along = _refuse_batch_coupling(model, full_call, captured)
        graph, ctx = captured.graph, captured.ctx
        pnames, bnames = captured.pnames, captured.bnames
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
            _plan_digest(plan),
            self.world,
            "every rank must capture the same model with the same options; if the ILP hit its "
            "time limit (see the log), raise time_limit_s or use level='fast'",
        )
        ctx.targets.update(_TARGETS)
        self.graph_module = fx_bridge.from_ir(sharded.graph, ctx)
        self._random_ops = fx_bridge.has_random_ops(sharded.graph)
        if self._random_ops:
            self._replica_masks(self.graph_module, rows)
        # The layers the model checkpoints (HF's gradient_checkpointing_enable), outlined again.
        self._layers = checkpointed_layers(model) if training else []
        self.local_graph = sharded.graph
        state_names = set(pnames) | set(bnames)
        # plan.spec is converted from C++ on every read: read once (read per record, it cost
        # Llama-3-8B's planning 5.8 s of 11).
        spec = plan.spec
        self._pinned = {n: sp for n, sp in spec.items() if n in state_names}
        # The example's node specs by (name, op): a capture of another length has the same
        # nodes, and pinning their specs too leaves the ILP little to search (see _new_program).
        self._node_specs = {(r[0], r[1]): spec[r[0]] for r in graph.records()[1] if r[0] in spec}
        # A capture with the same inputs and nodes (the same program at another size) takes
        # the example's strategies as they are: no ILP is solved for it.
        self._structure = _structure(graph)
        self._fixed = {
            **plan.strategy,
            **{r[0]: spec[r[0]] for r in graph.records()[0] if r[0] in spec},
        }
        self._fixed_zero = dict(plan.zero_stage)
        self._programs: dict[Any, _Program] = {
            self._call_key(
                pytree.tree_flatten(full_call),
                model.training,
                next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32),
            ): _Program(
                self._recomputing(self.graph_module, model.training),
                self._random_ops,
                captured.out_spec,
                self._summed(call, captured),
            )
        }
        self.capture_times_s: dict[str, float] = {}  # a new program's capture and plan, by call
        # How each new program was planned: "fixed" (the example's strategies read off, no
        # ILP: the same program at another size) or the ILP's status.
        self.program_plans: dict[str, str] = {}

        # This rank's blocks, in placeholder order; the model's own tensors are not kept.
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
            if init_seed is None and opts.pretrained is None:
                raise ValueError(
                    "the model is on the meta device: pass init_seed (the seed it would be built "
                    "with) so each rank initialises its blocks as one process would, or "
                    "pretrained= (a save_pretrained directory) to read them"
                )
            skip = frozenset()
            if opts.pretrained is not None:
                from ..checkpoint.pretrained import stored_names

                skip = stored_names(model, opts.pretrained)
            blocks = dict(
                _init_blocks_like_constructor(
                    model, init_seed or 0, lambda n, t: self.shard(t, specs[n]), skip
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
        self.generation_config = getattr(model, "generation_config", None)
        self.train(training)
        self.plan = ShardingPlan(
            world=self.world,
            device=opts.device,
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
        zero_stage = plan.zero_stage  # converted from C++ on every read
        for name, p in zip(pnames, self.local_params, strict=True):
            if zero_stage.get(name) == 2 and p.requires_grad:
                self._zero2[name] = _Zero2Shard(p, self.dp_comm, name, lambda: self._syncing)
        self._zero2_ids = {id(z.param) for z in self._zero2.values()}
        # torch.nn.utils.clip_grad_norm_(dist_model.parameters(), ...) clips by the whole
        # model's norm: blocks of sharded tensors add up over tp, replicated ones count once.
        grads = GradGroup(
            self, _reduce_grad_norm, "a sharded module", self.rank == 0, _zero2_grads_elsewhere
        )
        count_gradients(
            (p, NormShare(grads, spec.startswith("S") or self.rank == 0))
            for p, spec in zip(self.local_params, self.param_specs, strict=True)
            if id(p) not in self._zero2_ids
        )
        self.mesh_search: list[dict[str, Any]] = []  # shard_model(mesh_shape="auto") fills it
        self.pretrained_report: dict[str, Any] | None = None
        if opts.pretrained is not None:
            from ..checkpoint.pretrained import load_pretrained

            self.pretrained_report = load_pretrained(self, opts.pretrained)
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
        rank = dist.get_rank() if dist.is_initialized() else 0
        names = [name for name, _, _ in self._stored_tensors()]
        whole = {n: t.clone() for n, t in zip(names, self._whole_tensors(), strict=True)}
        out = {key: whole[name] for key, name in self.state_keys}
        return {} if rank0_only and rank != 0 else out

    # What a checkpoint stores (checkpoint_layout.model_tensors and its twins read it).

    def _specs(self) -> dict[str, str]:
        """Every parameter's and buffer's spec, by name."""
        return dict(
            zip(
                self.param_names + self.buffer_names,
                self.param_specs + self.buffer_specs,
                strict=True,
            )
        )

    def _local_tensors(self) -> dict[str, torch.Tensor]:
        """This rank's block of every parameter and buffer, by name (the buffers a state dict
        leaves out, such as rotary inv_freq, included)."""
        local = dict(zip(self.param_names, self.local_params, strict=True))
        local.update(
            (n, owner._buffers[attr])
            for n, (owner, attr) in zip(self.buffer_names, self._buffer_slots, strict=True)
        )
        return local

    def _stored_tensors(self) -> Iterator[tuple[str, torch.Tensor, Layout]]:
        specs = self._specs()
        local = self._local_tensors()
        seen = set()
        for _, name in self.state_keys:
            if name not in seen:
                seen.add(name)
                shape = self.global_shapes[name]
                yield name, local[name], Layout(shape, specs[name], self.world, self.rank)

    def _parameter_layouts(
        self, known: dict[int, tuple[str, Layout]]
    ) -> dict[int, tuple[str, Layout]]:
        """Layouts of what an optimizer may hold besides the stored tensors (`known`, by id):
        blocks not stored under their own name (frozen tied aliases) and ZeRO-2 flat shards."""
        out: dict[int, tuple[str, Layout]] = {}
        if not all(id(p) in known for p in self.local_params):
            out.update(
                (id(p), (n, Layout(self.global_shapes[n], s, self.world, self.rank)))
                for n, p, s in self.named_local_parameters()
            )
        merged = {**known, **out}
        for name, z in self._zero2.items():
            block = merged[id(z.param)][1]
            lo = z.shard.data_ptr() - z.param.data_ptr()
            lo //= z.param.element_size()
            flat = Layout(
                block.shape, block.spec, block.world, block.rank, (lo, lo + z.shard.numel())
            )
            out[id(z.shard)] = (name, flat)
        return out

    def _state_aliases(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for key, name in self.state_keys:
            out.setdefault(name, []).append(key)
        return out

    def _whole_tensors(self) -> Iterator[torch.Tensor]:
        """Each stored tensor whole, gathered one at a time (every rank gets it)."""
        for _, t, lay in self._stored_tensors():
            yield self._gathered(t, lay.spec)

    def _gathered(self, t: torch.Tensor, spec: str) -> torch.Tensor:
        """This rank's block of a tensor of this spec, whole (a collective where sharded)."""
        kind, dim, sections = _parse(spec)
        t = t.detach()
        if kind == "S" and self.world > 1:
            blocks = self.comm.all_gather(t.contiguous(), "export")
            t = _whole(list(blocks.unbind(0)), dim, sections)
        return t

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

    def _with_count(self, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        """The call with HF's num_items_in_batch where dp replicas need the whole batch's label
        count (a placeholder 0 here; forward passes the real count)."""
        if not self._takes_count or "num_items_in_batch" in call[1]:
            return call
        if not isinstance(call[1].get("labels"), torch.Tensor):
            return call
        return (
            call[0],
            dict(sorted({**call[1], "num_items_in_batch": torch.tensor(0)}.items())),
        )

    @staticmethod
    def _summed(call: tuple[tuple[Any, ...], dict[str, Any]], captured: Any) -> bool:
        """Whether the replicas' scalar outputs add up to one process's: the captured loss read
        the batch's label count (HF's num_items_in_batch), or every floating scalar the model
        returns is a sum over the batch (`x.sum()`, a loss with reduction="sum"). Otherwise a
        scalar is taken for a mean, and so is the replicas' combination."""
        if "num_items_in_batch" in call[1] and "num_items_in_batch" not in (captured.unused_inputs):
            return True
        return captured.gm is not None and scalar_outputs_are_sums(captured.gm)

    def _recomputing(self, gm: fx.GraphModule, training: bool) -> fx.GraphModule:
        """The program with each region the model checkpoints (its torch.utils.checkpoint calls,
        HF's checkpointed layers) run under torch.utils.checkpoint in training
        (runtime/recompute.py); as it is otherwise."""
        if not training:
            return gm
        return recompute(gm, self._layers, "sharding")

    def _replica_masks(self, gm: fx.GraphModule, total: int) -> None:
        """dp replicas: each dropout mask becomes the replica's rows of the whole batch's mask
        (`total` rows), so that with one seed the losses equal one process's (see
        replica_bernoulli_)."""
        if self.dp == 1:
            return
        offset, batch = self._dp_rows(total)
        n = global_dropout_masks(gm, total, offset, batch, self._draws_along)
        log.info(
            "torch_plugin sharding: %d dropout draw(s) take the replica's rows of the whole "
            "batch's mask",
            n,
        )

    def _call_key(
        self,
        flat: tuple[list[Any], pytree.TreeSpec],
        training: bool,
        dtype: torch.dtype | None = None,
    ) -> Any:
        """What selects a program: the call's structure, each tensor's shape and dtype, each
        other argument's value, the autocast state, the train/eval mode and the parameters'
        dtype (`dtype`, before the blocks exist)."""
        leaves, spec = flat
        return (
            repr(spec),
            tuple(
                (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else _constant_key(x)
                for x in leaves
            ),
            self._autocast_state(),
            training,
            dtype or self.dtype,  # model.to(torch.bfloat16) after parallelize: captured again
        )

    def _apply(self, fn: Any, recurse: bool = True) -> ShardedModule:
        """nn.Module's .to / .half / .bfloat16 / .float on the blocks; where the parameters'
        dtype changes, the model's meta copy is cast alike, so the next call of each kind
        captures its program at the new dtype (the old programs ran the old one)."""
        if "local_params" not in self.__dict__:  # still being built
            return super()._apply(fn, recurse)
        before = self.dtype
        if self.__dict__.get("_zero2") and self.dp > 1:
            probe = fn(torch.empty(0, dtype=before, device=self.device))
            if probe.dtype != before:
                raise ValueError(
                    "torch_plugin sharding: casting a model with ZeRO-2 gradient shards (dp "
                    f"{self.dp}) from {before} to {probe.dtype} after parallelize would leave "
                    "the shards on the old storage; cast the model before parallelize"
                )
        super()._apply(fn, recurse)
        self._forget_generation_copy()
        after = self.dtype
        if after != before and self._skeleton is not None:
            self._skeleton.to(after)
            log.info(
                "torch_plugin sharding: parameters cast from %s to %s; each kind of call is "
                "captured again at %s",
                before,
                after,
                after,
            )
        return self

    def _new_program(self, call: tuple[tuple[Any, ...], dict[str, Any]], total: int) -> _Program:
        """The program for a new kind of call (`call`: this dp replica's slice of a batch of
        `total` rows): captured from the model's meta copy in this module's mode, planned with
        every parameter's spec pinned to the plan, materialised."""
        what = f"{describe(pytree.tree_flatten(call)[1])}, shapes " + ", ".join(
            str(list(x.shape)) for x in pytree.tree_leaves(call) if isinstance(x, torch.Tensor)
        )
        state = self._autocast_state()
        if state is not None:
            what += f", autocast {state}"
        if self._skeleton is None:
            raise RuntimeError(
                f"torch_plugin sharding: a call with {what} needs a new program, and the model "
                "could not be copied to capture it again (see the log): call parallelize with "
                "example inputs like this call, under the autocast state it runs in"
            )
        t0 = time.perf_counter()
        self._skeleton.train(self.training)
        captured = _capture(self._skeleton, call)
        t1 = time.perf_counter()
        options = self._options.to_dict()
        options.update(memory_budget_bytes=0.0, pinned=self._pinned)
        nodes = {
            r[0]: self._node_specs[(r[0], r[1])]
            for r in captured.graph.records()[1]
            if (r[0], r[1]) in self._node_specs
        }
        try:
            # The same inputs and nodes: the example's strategies, read off without an ILP
            # (one that the new sizes do not allow is left to it). Otherwise the example's
            # specs where this graph has the same node, unless a spec does not fit the new
            # sizes (then only the parameters stay pinned and the ILP plans the rest).
            if _structure(captured.graph) == self._structure:
                every = _C.ShardingOptions(
                    **{
                        **options,
                        "fixed_strategies": self._fixed,
                        "fixed_zero": self._fixed_zero,
                    }
                )
            else:
                every = _C.ShardingOptions(**{**options, "pinned": {**nodes, **self._pinned}})
            plan, sharded = self._shard(captured.graph, every)
        except _C.PlanError as e:
            log.info("torch_plugin sharding: the example's node specs do not fit (%s)", e)
            plan, sharded = self._shard(captured.graph, _C.ShardingOptions(**options))
        changed = {n: s for n, s in plan.spec.items() if self._pinned.get(n, s) != s}
        if changed:
            raise RuntimeError(
                f"torch_plugin sharding: for a call with {what} the plan moved {changed}; call "
                "parallelize with example inputs like this call"
            )
        check_same(
            self.comm.group,
            "sharding plans of a new call",
            _plan_digest(plan),
            self.world,
            "every rank must make the same call (signature, shapes, autocast state)",
        )
        t2 = time.perf_counter()
        captured.ctx.targets.update(_TARGETS)
        program = _Program(
            fx_bridge.from_ir(sharded.graph, captured.ctx),
            fx_bridge.has_random_ops(sharded.graph),
            captured.out_spec,
            self._summed(call, captured),
        )
        if program.random_ops:
            self._replica_masks(program.module, total)
        program.module = self._recomputing(program.module, self.training)
        took = time.perf_counter() - t0
        log.debug("capture %.2f plan %.2f fx %.2f", t1 - t0, t2 - t1, took - (t2 - t0))
        self.capture_times_s[what] = took
        self.program_plans[what] = plan.status
        log.info(
            "torch_plugin sharding: new program for a call with %s (%s mode): captured and "
            "planned %s in %.2f s",
            what,
            "train" if self.training else "eval",
            "with the example's strategies (no ILP)"
            if plan.status == "fixed"
            else "with the parameter specs pinned",
            took,
        )
        return program

    def _generation_parts(self) -> tuple[nn.Module | None, Any, list[torch.Tensor], Any, str]:
        local = self._local_tensors()
        specs = self._specs()

        def whole() -> dict[str, torch.Tensor]:
            out = {n: self._gathered(t, specs[n]) for n, t in local.items()}
            for name, keys in self._state_aliases().items():  # a tied lm_head.weight
                out.update((k, out[name]) for k in keys if k not in out and name in out)
            return out

        return self._skeleton, whole, list(local.values()), None, "sharded model"

    def _ddp_refusal(self) -> tuple[str, str, int]:
        return f"sharded model (on {self.mesh})", "runs sharded", self.world * self.dp

    # What training loops read off an HF model, on the model it wraps (FSDP2 keeps the model).

    @property
    def device(self) -> torch.device:
        return next((t.device for t in self.local_params), torch.device("cpu"))

    @property
    def dtype(self) -> torch.dtype:
        return next((t.dtype for t in self.local_params if t.is_floating_point()), torch.float32)

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """HF's num_parameters: the whole model's, not this rank's blocks."""
        embeddings = embedding_weights(self._skeleton) if self._skeleton is not None else set()
        named = (
            (n, self.global_shapes[n], p.requires_grad)
            for n, p in zip(self.param_names, self.local_params, strict=True)
        )
        return count_parameters(named, embeddings, only_trainable, exclude_embeddings)

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """nn.Module.load_state_dict, which also takes the plain model's state dict (a
        checkpoint a script saved before parallelize, or `full_state_dict()`): a whole tensor
        is cut to this rank's block, and a tied alias (lm_head.weight) is read as the tensor it
        aliases where that one is not given."""
        if assign:
            raise ValueError(
                "torch_plugin sharding: load_state_dict(assign=True) would swap in tensors the "
                "planned program does not run on; load with assign=False (the default)"
            )
        canonical = dict(self.state_keys)
        specs = self._specs()
        own = super().state_dict(keep_vars=True)
        out: dict[str, Any] = {}
        for key, t in state_dict.items():
            name = canonical.get(key, key)
            if key not in own and name in own:
                if name in state_dict:
                    continue  # the alias of a tensor given under its own name
                key = name
            if (
                name in specs
                and key in own
                and isinstance(t, torch.Tensor)
                and tuple(t.shape) == self.global_shapes[name]
                and t.shape != own[key].shape
            ):
                t = self.shard(t, specs[name])
            out[key] = t
        result = super().load_state_dict(out, strict=False, assign=assign)
        # Buffers the model keeps out of its state dict (rotary inv_freq) are ours to have.
        missing = [k for k in result.missing_keys if k in canonical.values()]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(
                "torch_plugin sharding: error(s) loading a state dict: missing "
                f"{missing}, unexpected {result.unexpected_keys}"
            )
        return type(result)(missing, result.unexpected_keys)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> list[str]:
        """HF's save_pretrained for the whole model (safetensors shards, index, config),
        gathered a tensor at a time: every rank calls it, rank 0 writes; from_pretrained
        loads it as the plain model."""
        return save_pretrained_as_hf(self, save_directory, **kwargs)

    def local_parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.local_params)

    # torch.compile(dist_model) runs the planned program as it is: Dynamo inside it broke its
    # graph at every collective and hit its recompile limit on the autograd functions around
    # them (27-65 s for the 2-layer test Llama on tp 2, then 0.047 s a step against 0.044 s).
    @torch.compiler.disable
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        check_batch_agrees(kwargs)
        call = self._with_count((args, dict(sorted(kwargs.items()))))
        labels = call[1].get("labels") if self._count_labels is not None else None
        if not isinstance(labels, torch.Tensor):
            labels = None
        total = None if labels is None else self._count_labels(labels)
        if (
            total is not None
            and "num_items_in_batch" in call[1]
            and "num_items_in_batch" not in kwargs
        ):
            call[1]["num_items_in_batch"] = total  # _with_count's placeholder: the real count
        leaves, spec = pytree.tree_flatten(call)
        key = self._call_key((leaves, spec), self.training)
        program = self._programs.get(key)
        rows = _batch_rows(call)
        if program is None:
            program = self._new_program(pytree.tree_map(self._dp_slice, call), rows)
            self._programs[key] = program
        flat = [x for x in leaves if isinstance(x, torch.Tensor)]
        graph_module, random_ops = program.module, program.random_ops
        if random_ops and self.dp > 1:
            self.dp_comm.share_rng_state()  # tp rank 0 of each replica: dp rank 0's state
        if random_ops and self.world > 1:
            # Random ops (dropout masks) stay replicated: every tp rank draws the whole mask
            # and uses its block, one process's dropout only if all draw from one state.
            self.comm.share_rng_state()
        buffers = [owner._buffers[attr] for owner, attr in self._buffer_slots]
        params: list[torch.Tensor] = list(self.local_params)
        if self.dp == 1:
            outs = graph_module(*params, *buffers, *flat)
            return pytree.tree_unflatten(list(outs), program.out_spec)
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
        # A mean over the batch: each replica's share of the rows (1/dp for an even batch).
        weight = self._dp_rows(rows)[1] / rows
        if program.summed_loss:  # a sum over the batch: the replicas' sums add up
            weight = 1.0
        elif total is not None and int(total) > 0:
            weight = int(self._count_labels(self._dp_slice(labels))) / int(total)
        sizes = tuple(self._dp_rows(rows, r)[1] for r in range(self.dp))
        whole = [
            self._gather_batch(o, sizes)
            if isinstance(o, torch.Tensor) and o.dim() > 0 and o.is_floating_point()
            else _BatchLoss.apply(o, self._dp_handle, weight)
            if isinstance(o, torch.Tensor) and o.is_floating_point()
            else o
            for o in outs
        ]
        return pytree.tree_unflatten(whole, program.out_spec)

    def _gather_batch(self, o: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
        """An output of this replica's rows, made the whole batch's on every rank."""
        if len(set(sizes)) == 1:
            return replicated_output(reshard(o, "S(0)", "R", self._dp_handle), self._dp_handle)
        if o.shape[0] != sizes[self.dp_rank]:
            raise RuntimeError(
                f"torch_plugin sharding: an output of shape {list(o.shape)} does not run along "
                f"the batch (this dp replica has {sizes[self.dp_rank]} of its "
                f"{sum(sizes)} rows), so it cannot be gathered over an uneven split; use a "
                f"batch divisible by the dp size ({self.dp})"
            )
        return uneven_batch_gather(o, self._dp_handle, sizes)

    def _dp_rows(self, total: int, replica: int | None = None) -> tuple[int, int]:
        """(offset, rows) of a dp replica's slice of a batch of `total` rows: as
        torch.tensor_split cuts it, the first total % dp replicas one row more (the last,
        short batch of an epoch)."""
        if total < self.dp:
            raise ValueError(
                f"a batch of {total} rows leaves some of the mesh's {self.dp} dp replicas "
                f"without a row; use a batch of at least {self.dp} rows"
            )
        r = self.dp_rank if replica is None else replica
        base, extra = divmod(total, self.dp)
        return r * base + min(r, extra), base + (1 if r < extra else 0)

    def _dp_slice(self, x: Any) -> Any:
        """This dp replica's rows (dim 0) of a batch tensor."""
        if self.dp == 1 or not isinstance(x, torch.Tensor) or x.dim() == 0:
            return x
        offset, rows = self._dp_rows(int(x.shape[0]))
        return x.narrow(0, offset, rows)


def search_mesh_shape(
    model: nn.Module,
    world: int,
    example_inputs: Sequence[Any] | dict[str, Any],
    options: ShardOptions | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Every (dp, tp) shape of `world` ranks whose dp divides the batch, each planned by the
    ILP (one dp replica's batch slice, the dp axis's gradient sync and ZeRO-1 inside it):
    [{"dp", "tp", "objective" (modelled step s, None if no plan fits), "why"}], fastest first.
    Pure data parallelism is the (world, 1) shape; no process group is needed."""
    opts = ShardOptions.of(options, **kwargs)
    call = as_call(example_inputs)
    flat = [x for x in pytree.tree_leaves(call) if isinstance(x, torch.Tensor)]
    batch = next((int(x.shape[0]) for x in flat if x.dim() > 0), 1)
    training = model.training if opts.training is None else opts.training
    # Priced for the backend that will run it.
    reduce_scatter = not dist.is_initialized() or dist.get_backend() in ("nccl", "gloo", "fake")
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
            ilp = opts.ilp(world // dp, dp, training, reduce_scatter)
            row["objective"] = _C.PassManager().plan_sharding(graph, ilp).objective
        except _C.PlanError as e:
            row["why"] = str(e)
        shapes.append(row)
    shapes.sort(key=lambda r: (r["objective"] is None, r["objective"] or 0.0, -r["tp"]))
    return shapes


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    example_inputs: Sequence[Any] | dict[str, Any],
    options: ShardOptions | None = None,
    **kwargs: Any,
) -> ShardedModule:
    """The sharded form of `model` on `mesh` (see ShardedModule and ShardOptions).
    mesh_shape="auto" on a 1-D mesh: the (dp, tp) shape of its ranks with the least modelled
    step (search_mesh_shape) becomes a 2-D ("dp", "tp") mesh over the same ranks;
    `.mesh_search` lists every shape."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised; build a DeviceMesh first")
    opts = ShardOptions.of(options, **kwargs)
    search: list[dict[str, Any]] = []
    if opts.mesh_shape == "auto":
        if len(mesh.shape) != 1:
            raise ValueError(f"mesh_shape='auto' reshapes a 1-D mesh; {mesh} is already 2-D")
        search = search_mesh_shape(model, mesh.size(), example_inputs, opts)
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
    sharded = ShardedModule(model, mesh, example_inputs, opts)
    sharded.mesh_search = search
    return sharded
