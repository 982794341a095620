"""Graph pipeline parallelism (GraphPipe): plan in C++, run stages over torch.distributed P2P.

    plan = torch_plugin.plan_pipeline(model, example_inputs, num_devices=4)       # any machine
    pp = torch_plugin.PipelineParallel(model, example_inputs, loss_fn=loss_fn)    # under torchrun
    loss = pp.step(inputs, target); optimizer.step()

The C++ partitioner picks the stages (a DAG for "gpp", a chain for the "spp" baseline), their
micro-batch sizes and data-parallel degrees; the scheduler orders each stage's forward and
backward passes; the runtime below executes that order on every rank. Activations move at
sample granularity, so neighbouring stages may use different micro-batch sizes and replica
counts. Every receive is bounded by the process group's timeout: a dead rank fails the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from .. import _C
from ..checkpoint.layout import Layout
from ..checkpoint.pretrained import count_parameters, embedding_weights, save_pretrained_as_hf
from ..runtime.agreement import check_same
from ..runtime.capture import as_call, describe, label_counter, leaf_name, takes_loss_kwargs
from ..runtime.collectives import hold_groups
from ..runtime.ddp_guard import RefusesDDP
from ..runtime.generation import GeneratesOnGatheredCopy
from ..runtime.grad_norm import GradGroup, NormShare, as_block, count_gradients
from ..runtime.graph import TracedModel, _batch_of, _module_params, cost_graph, cost_records
from ..runtime.recompute import CHECKPOINT_CALLS, checkpointed_layers, recompute
from ..runtime.spmd_ops import is_draw
from . import autocast as pipeline_autocast
from . import capture as pipeline_capture
from .capture import AtenPipelineGraph, same_graph
from .draws import (
    DrawPlan,
    StepDraws,
    draws_of,
    module_level_draws,
    module_level_evaluation,
    replace_draws,
    to_evaluation,
)

log = logging.getLogger("torch_plugin.pipeline")

STRATEGIES = ("gpp", "spp")


@dataclasses.dataclass
class PipelinePlan:
    """A stage graph with micro-batch sizes, replicas, a schedule and its simulation."""

    raw: _C.PipelinePlan  # the C++ plan (csrc/passes/pipeline_plan.h)
    stage_nodes: list[list[str]]  # FX node names per stage

    @property
    def stages(self) -> list[_C.PipelineStage]:
        return self.raw.stages

    @property
    def num_stages(self) -> int:
        return len(self.raw.stages)

    def digest(self) -> str:
        """Hash of everything the ranks must agree on (stages, configs, schedule)."""
        key = json.dumps(
            [
                self.stage_nodes,
                [(s.micro_batch, s.replicas, s.devices) for s in self.stages],
                self.raw.schedule,
            ],
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def summary(self) -> str:
        sim = self.raw.sim
        lines = [self.raw.text.rstrip()]
        if sim:
            lines.append(
                f"simulated ({self.raw.schedule_kind}): iteration "
                f"{sim.iteration_time * 1e3:.3f} ms, {sim.throughput:.1f} samples/s, "
                f"bubble {sim.bubble_fraction:.1%}"
            )
        st = self.raw.stats
        lines.append(
            f"search: {st.search_seconds:.3f} s, {st.iterations} binary-search steps, "
            f"{st.dp_states} DP states over {st.blocks} blocks"
        )
        return "\n".join(lines)

    def save_png(self, prefix: str) -> tuple[str, str]:
        """Writes `<prefix>_stages.png` (the stage DAG) and `<prefix>_gantt.png` (timeline)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = self.num_stages
        level = [0] * n
        for a, b, _, _ in sorted(self.raw.edges, key=lambda e: e[1]):
            level[b] = max(level[b], level[a] + 1)
        rows: dict[int, int] = {}
        pos = {}
        for s in range(n):
            pos[s] = (level[s], rows.get(level[s], 0))
            rows[level[s]] = rows.get(level[s], 0) + 1
        fig, ax = plt.subplots(figsize=(2 + 2.2 * (max(level) + 1), 1 + 1.1 * max(rows.values())))
        for a, b, _, data in self.raw.edges:
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ax.annotate(
                "",
                (x1 - 0.32, y1),
                (x0 + 0.32, y0),
                arrowprops=dict(arrowstyle="->", ls="-" if data else ":"),
            )
        for s, (x, y) in pos.items():
            st = self.stages[s]
            label = f"S{s}  b={st.micro_batch} d={st.replicas}\n{len(self.stage_nodes[s])} nodes"
            ax.text(
                x,
                y,
                label,
                ha="center",
                va="center",
                fontsize=8,
                bbox=dict(boxstyle="round", fc="#dde8f5"),
            )
        ax.set_xlim(-0.6, max(level) + 0.6)
        ax.set_ylim(-0.6, max(rows.values()) - 0.4)
        ax.invert_yaxis()
        ax.axis("off")
        ax.set_title(f"{self.raw.kind.upper()} stage graph, depth {self.raw.depth}")
        dag = f"{prefix}_stages.png"
        fig.savefig(dag, dpi=110, bbox_inches="tight")
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(10, 0.5 + 0.35 * n))
        for s, _mb, bw, start, end in self.raw.sim.events if self.raw.sim else []:
            ax.barh(
                s,
                (end - start) * 1e3,
                left=start * 1e3,
                color="#c44" if bw else "#48c",
                edgecolor="white",
                linewidth=0.3,
            )
        ax.set_yticks(range(n), [f"S{s} ({len(self.stages[s].devices)} dev)" for s in range(n)])
        ax.invert_yaxis()
        ax.set_xlabel("ms (forward blue, backward red)")
        ax.set_title(f"{self.raw.kind.upper()} {self.raw.schedule_kind} schedule")
        gantt = f"{prefix}_gantt.png"
        fig.savefig(gantt, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return dag, gantt


def plan_pipeline(
    model: nn.Module | TracedModel,
    example_inputs: tuple[Any, ...] = (),
    num_devices: int = 2,
    *,
    strategy: str = "gpp",
    schedule: str = "1f1b",
    device: str = "cpu",
    mini_batch: int | None = None,
    micro_batch_sizes: list[int] | None = None,
    memory_limit_bytes: float = 0.0,
    max_blocks: int = 256,
    scope_depth: int = -1,
    k_values: list[int] | None = None,
    time_limit_s: float = 0.0,
) -> tuple[PipelinePlan, TracedModel]:
    """Partitions, schedules and simulates. `model` may be an already traced model."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown pipeline strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    traced = model if isinstance(model, TracedModel) else cost_records(model, example_inputs)
    options = _C.PipelineOptions(
        mini_batch=mini_batch or traced.batch,
        num_devices=int(num_devices),
        device=device,
        memory_limit=float(memory_limit_bytes),
        micro_batch_sizes=micro_batch_sizes or [],
        k_values=k_values or [1],
        sequential=strategy == "spp",
        schedule=schedule,
        max_blocks=max_blocks,
        scope_depth=scope_depth,
        time_limit_s=time_limit_s,
    )
    raw = _C.PassManager().plan_pipeline(traced.records, options)
    names = [[traced.nodes[i].name for i in nodes] for nodes in raw.stage_nodes]
    return PipelinePlan(raw=raw, stage_nodes=names), traced


def _shapes(sig: tuple[Any, ...]) -> list[list[int]]:
    """A call signature's tensor shapes (per sample), for messages."""
    return [list(x) for x in sig if isinstance(x, tuple)]


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if r < total % parts else 0) for r in range(parts)]


def _reduce_grad_norm(pipe: PipelineParallel, t: torch.Tensor, op: Any) -> torch.Tensor:
    if not pipe._in_norm_group:
        raise RuntimeError(
            f"torch_plugin pipeline: stage S{pipe.my_stage} (rank {pipe.rank}) had no trainable "
            "parameter when the pipeline was built, so its ranks take no part in the gradient "
            "norm torch.nn.utils.clip_grad_norm_(pp.parameters()) reduces over; it has "
            "gradients now (a parameter unfrozen later). Set requires_grad before parallelize, "
            "or clip with pp.clip_grad_norm_, which every rank calls"
        )
    out = t.clone()
    dist.all_reduce(out, op=op, group=pipe._norm_group)
    return out


class PipelineParallel(RefusesDDP, GeneratesOnGatheredCopy):
    """Runs this rank's share of a pipeline plan: its stage, on its replica's samples.

    Call `step(inputs, target)` with the whole mini-batch on every rank (each rank slices what
    it needs; a batch bigger than the example's runs as chunks of the example's); it runs the
    static schedule, all-reduces gradients among the ranks that hold a parameter (a stage's
    replicas; the stages that share a tied weight) and returns the mini-batch loss (the same
    on every rank). Then step your optimizer over `parameters()`.

    `example_inputs` is the model's call: positional arguments, or a dict of keyword
    arguments (an HF model's `input_ids`, `attention_mask`, `labels`, ...). `loss_fn(output,
    target)` receives what the model returns for a micro-batch (a ModelOutput, a tuple, a
    tensor) and must average over its samples; HF models given `labels` are passed the whole
    mini-batch's label count as `num_items_in_batch`, so `lambda out, _: out.loss` sums to one
    process's loss exactly, padding included.

    Models that torch.fx traces symbolically, called positionally, are split at module level
    (a stage owns the user's sub-modules, `placement` can place its compute); others, keyword
    calls and HF models, at ATen level (pipeline/capture.py). `scope_depth` groups nodes into
    blocks by the first components of their module path (3: "branches.0.1" or
    "model.layers.0") so that no stage boundary cuts inside a layer. `placement`
    (PlacementOptions or their dict) runs the placement pass on a module-level stage's compute,
    forward and backward, around the modules that must stay eager (see
    torch_plugin.placement.segments); its decisions are made on the first step.
    """

    def __init__(
        self,
        model: nn.Module,
        example_inputs: tuple[Any, ...] | dict[str, Any],
        *,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        strategy: str = "gpp",
        schedule: str = "1f1b",
        micro_batch_sizes: list[int] | None = None,
        device_profile: str = "cpu",
        scope_depth: int = 3,
        plan: PipelinePlan | None = None,
        memory_limit_bytes: float = 0.0,
        group: Any = None,
        leaf_modules: Any = (),
        placement: Any = None,
        capture: str = "auto",
    ):
        if not dist.is_initialized():
            raise RuntimeError(
                "PipelineParallel needs torch.distributed initialised (run under torchrun and "
                "call torch.distributed.init_process_group first)"
            )
        if capture not in ("auto", "module", "aten"):
            raise ValueError(f"capture must be 'auto', 'module' or 'aten', got {capture!r}")
        # Ranks in the plan are ranks of `group` (the world by default). A group lets several
        # pipelines run side by side, e.g. one per tensor-parallel rank.
        self.group = group
        hold_groups(self)
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.loss_fn = loss_fn
        self.model_ref = model
        # The mode the graph is traced in (later traces too); eval() rewrites it (see step).
        self._traced_training = model.training
        self.config = getattr(model, "config", None)
        call = as_call(example_inputs)
        self._count_labels = None  # HF labels: the whole mini-batch's count goes in per step
        self._summed_loss = False
        self.aten: AtenPipelineGraph | None = None
        self._sig0: Any = None
        self._sig: Any = None
        # Where autocast is read: a call's autocast state is part of its signature.
        self._autocast_device = next(
            (p.device.type for p in model.parameters() if not p.is_meta), "cpu"
        )
        self._calls: dict[Any, Any] = {}
        # A stage's capture at a step's new shapes (ATen-level pipelines), by what it ran.
        self.capture_times_s: dict[str, float] = {}
        # One process's random draws, replayed each step (pipeline/draws.py).
        self._draws = StepDraws()
        self._eval_module: fx.GraphModule | None = None  # module-level stage in eval mode
        # The loss stage's outputs by the sample each micro-batch starts at (see __call__).
        self._outputs: dict[int, tuple[int, list[Any]]] | None = None
        traced = None
        if capture != "aten" and not isinstance(example_inputs, dict):
            try:
                traced = cost_records(model, tuple(example_inputs), leaf_modules)
            except Exception as e:
                if capture == "module":
                    raise
                log.info(
                    "torch_plugin pipeline: %s does not trace at module level (%s: %s); "
                    "splitting its ATen graph instead",
                    type(model).__name__,
                    type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "",
                )
        checkpoints = traced.gm.meta.get(CHECKPOINT_CALLS, 0) if traced is not None else 0
        if checkpoints and model.training:
            # torch.fx ran through the calls: the stages would call the modules directly and
            # keep every activation. At ATen level each call's nodes recompute (recompute.py).
            if capture == "auto" and placement is None:
                log.info(
                    "torch_plugin pipeline: %s calls torch.utils.checkpoint in its forward "
                    "(%d call(s)); splitting its ATen graph, where each call recomputes",
                    type(model).__name__,
                    checkpoints,
                )
                traced = None
            else:
                log.warning(
                    "torch_plugin pipeline: %s calls torch.utils.checkpoint in its forward, "
                    "and a module-level split (%s) runs through the calls: its stages keep "
                    "every activation; capture='auto' without `placement` recomputes them",
                    type(model).__name__,
                    "capture='module'" if capture == "module" else "for `placement`",
                )
        if traced is not None:
            drawn = module_level_draws(traced.gm)
            if drawn and capture == "auto" and placement is None:
                # Split at ATen level, each step replays one process's draws (draws.py); at
                # module level each stage would draw per micro-batch.
                log.info(
                    "torch_plugin pipeline: %s draws random numbers in training (%s); "
                    "splitting its ATen graph, where each step draws what one process draws",
                    type(model).__name__,
                    ", ".join(drawn[:4]) + (" ..." if len(drawn) > 4 else ""),
                )
                traced = None
            elif drawn:
                log.warning(
                    "torch_plugin pipeline: %s is split at module level (%s) and draws random "
                    "numbers in training (%s): each stage draws them per micro-batch, so "
                    "losses differ from one process's with the same seed; capture='auto' "
                    "without `placement` splits its ATen graph and replays one process's draws",
                    type(model).__name__,
                    "capture='module'" if capture == "module" else "for `placement`",
                    ", ".join(drawn[:4]) + (" ..." if len(drawn) > 4 else ""),
                )
        if traced is None:
            if placement is not None:
                raise NotImplementedError(
                    "torch_plugin pipeline: `placement` needs a module-level split (a model "
                    "torch.fx traces, called positionally); this model is split at ATen level"
                )
            traced, call = self._capture_aten(model, call)
            if micro_batch_sizes is None and plan is None:
                micro_batch_sizes = self._traceable_sizes()
        self._in_spec = pytree.tree_flatten(call)[1]
        if plan is None:
            plan, _ = plan_pipeline(
                traced,
                num_devices=self.world,
                strategy=strategy,
                schedule=schedule,
                device=device_profile,
                micro_batch_sizes=micro_batch_sizes,
                scope_depth=scope_depth,
                memory_limit_bytes=memory_limit_bytes,
            )
        self.plan = plan
        self._check_same_plan()
        if self.aten is not None:
            self._check_sizes()
        self.gm = traced.gm
        self.batch = traced.batch
        self._step_rows = self.batch  # this step's samples (a last batch may have fewer)
        self._chunk = (0, self.batch)  # the step's samples the schedule is running (see step)
        self._failure: Exception | None = None  # this step's, on this rank (see _forward)
        self._prepared = {(self._sig0, self.batch, model.training)}
        self._build(traced)
        # Which draws run along the batch and which this rank's stage reads, before any step.
        self._draw_plan = self._plan_draws() if self.replayed_draws else None
        self._my_draws = (
            frozenset(node.name for node in self.members[self.my_stage] if is_draw(node))
            if self._draw_plan is not None and self.my_stage >= 0
            else frozenset()
        )
        # Backend placement of this stage's compute between the calls that must stay eager.
        self.placed_segments: list[Any] = []
        if placement is not None and self.my_stage >= 0:
            from ..placement.segments import place_segments

            self.placed_segments = place_segments(self.module, placement)

    # ---- setup ----------------------------------------------------------------------------

    def _capture_aten(self, model: nn.Module, call: Any) -> tuple[TracedModel, Any]:
        flat = [x for x in pytree.tree_leaves(call) if isinstance(x, torch.Tensor)]
        batch = _batch_of(flat)
        self.batch = batch
        count = label_counter(model, call)
        if count is not None and takes_loss_kwargs(model, call):
            self._count_labels = count
            call = (
                call[0],
                dict(sorted({**call[1], "num_items_in_batch": count(call[1]["labels"])}.items())),
            )
        aten = pipeline_capture.capture(model, call, batch)
        # The model's loss read the count (a sum over the mini-batch); otherwise its loss is a
        # mean over each micro-batch, weighed by the micro-batch's share.
        self._summed_loss = (
            self._count_labels is not None and "num_items_in_batch" not in aten.traced.unused_inputs
        )
        self.aten = aten
        # Calls by their tensors' shapes: the example's, then each other length a step brings
        # (a stage runs a graph traced at its shapes; see _stage_module).
        self._sig0 = self._sig = self._signature(call)
        self._calls[self._sig0] = call
        self._traces: dict[tuple[Any, int], AtenPipelineGraph] = {(self._sig0, batch): aten}
        self._by_name: dict[tuple[Any, int], dict[str, fx.Node]] = {}
        flat_tensors = self._flat_tensors(call)
        return cost_graph(aten.gm, flat_tensors, batch, aten.free, aten=True), call

    def _signature(self, call: Any) -> tuple[Any, ...]:
        """The call's tensor shapes per sample (a batch-major tensor's without its dim 0) and
        the autocast state it runs under: what a stage's graph at n samples depends on."""
        assert self.aten is not None
        shapes = tuple(
            (tuple(x.shape[1:]) if major else tuple(x.shape))
            if isinstance(x, torch.Tensor)
            else None
            for x, major in zip(self._flat_tensors(call), self.aten.batch_major, strict=True)
        )
        state = pipeline_autocast.current(self._autocast_device)
        return shapes if state is None else (*shapes, state)

    def _rows_in(self, call: Any) -> int:
        """Samples in a call: dim 0 of its batch-major tensors."""
        assert self.aten is not None
        return next(
            int(x.shape[0])
            for x, major in zip(self._flat_tensors(call), self.aten.batch_major, strict=True)
            if major and isinstance(x, torch.Tensor)
        )

    def _trace(self, n: int, sig: Any = None) -> AtenPipelineGraph:
        """The model's graph at n samples of the call with shapes `sig` (the example's by
        default)."""
        key = (self._sig0 if sig is None else sig, n)
        trace = self._traces.get(key)
        if trace is None:
            t0 = time.perf_counter()
            call = self._calls[key[0]]
            mode = self.model_ref.training
            self.model_ref.train(self._traced_training)  # the plan's graph, in any mode
            try:
                # And in gradient mode: an evaluation runs under no_grad or inference_mode.
                state = pipeline_autocast.of(key[0])
                with (
                    torch.inference_mode(False),
                    torch.enable_grad(),
                    pipeline_autocast.tracing_under(state, self._autocast_device),
                ):
                    call = pytree.tree_map_only(
                        torch.Tensor, lambda x: x.clone() if x.is_inference() else x, call
                    )
                    trace = pipeline_capture.capture(self.model_ref, call, self._rows_in(call), n)
            finally:
                self.model_ref.train(mode)
            self._traces[key] = trace
            if key[0] != self._sig0:
                took = time.perf_counter() - t0
                what = f"{n} samples of per-sample shapes {_shapes(key[0])}"
                if self._through_casts(key[0]):
                    what += f" under {state}" if state else " without autocast"
                self.capture_times_s[what] = took
                log.info(
                    "torch_plugin pipeline: stage S%d captured for %s in %.2f s (the plan's "
                    "stages and micro-batches kept)",
                    self.my_stage,
                    what,
                    took,
                )
        return trace

    def _rows_of(self, v: fx.Node) -> int:
        """Rows of dim 0 per sample of crossing value v at this step's shapes: a view that
        merged the batch with the sequence (OPT's [batch * seq, ffn]) has as many rows per
        sample as the step has positions, read off the graph traced at these shapes."""
        rows = self._rows.get(v, 1)
        if rows == 1 or self._sig == self._sig0:
            return rows
        return int(self._meta(v).shape[0]) // self._step_trace()[1]

    def _step_trace(self) -> tuple[Any, int]:
        """The key of a trace at this step's shapes (the stage's, made before any buffer)."""
        return next(k for k in self._traces if k[0] == self._sig)

    def _named(self, key: tuple[Any, int]) -> dict[str, fx.Node]:
        """The plan's node names -> their nodes in the graph traced as `key` says: the same
        names, or, under another autocast state, matched through its casts."""
        by_name = self._by_name.get(key)
        if by_name is None:
            graph = self._traces[key].gm.graph
            if self._through_casts(key[0]):
                state = pipeline_autocast.of(key[0])
                where = f"under {state}" if state else "without autocast"
                by_name = pipeline_autocast.twins(self.gm.graph, graph, where)
            else:
                by_name = {node.name: node for node in graph.nodes}
            self._by_name[key] = by_name
        return by_name

    def _through_casts(self, sig: Any) -> bool:
        """Whether calls of signature `sig` run under another autocast state than the plan's
        (their graphs are matched to the plan's through its casts)."""
        return pipeline_autocast.of(sig) != pipeline_autocast.of(self._sig0)

    def _meta(self, v: fx.Node) -> Any:
        """Shape and dtype of crossing value v at this step's shapes: its own at the example's,
        else its twin's in a graph traced at this step's shapes (the stage's, already made)."""
        if self._sig == self._sig0:
            return v.meta["tensor_meta"]
        twin = self._named(self._step_trace()).get(v.name)
        val = twin.meta.get("val") if twin is not None else None
        if not isinstance(val, torch.Tensor):
            raise RuntimeError(
                f"torch_plugin pipeline: value {v.name!r} crosses stages, and the model's graph "
                f"at per-sample shapes {_shapes(self._sig)} has no tensor of "
                "that name; pad each batch to the example's length"
            )
        return val

    def _traceable_sizes(self) -> list[int]:
        """The micro-batch sizes (powers of two dividing the batch, as the partitioner
        considers) at which the model's graph is the whole batch's, node for node."""
        assert self.aten is not None
        sizes = []
        n = 1
        while n <= self.batch:
            if self.batch % n == 0:
                differs = same_graph(self.aten, self._trace(n))
                if differs is None:
                    sizes.append(n)
                else:
                    log.info(
                        "torch_plugin pipeline: micro-batches of %d left out: the graph at that "
                        "size differs from the whole batch's at node %s",
                        n,
                        differs,
                    )
            n *= 2
        return sizes

    def _check_sizes(self) -> None:
        """Every share of a micro-batch a stage runs must have a graph like the whole batch's
        (a stage's micro-batch split over its replicas may give sizes not planned for)."""
        for st in self.plan.stages:
            for n in set(_split(st.micro_batch, st.replicas)):
                differs = same_graph(self.aten, self._trace(n)) if n != self.batch else None
                if differs is not None:
                    raise RuntimeError(
                        f"torch_plugin pipeline: stage S{st.id} runs {n} sample(s) per "
                        f"replica, where the model's graph differs from the whole batch's (at "
                        f"node {differs!r}); pass micro_batch_sizes (or num_microbatches) so "
                        "every replica runs at least 2 samples"
                    )

    def _flat_tensors(self, call: Any) -> list[Any]:
        leaves = pytree.tree_leaves(call)
        if self.aten is None:
            return leaves
        return [leaves[i] for i in self.aten.traced.tensor_at]

    def _check_same_plan(self) -> None:
        check_same(
            self.group,
            "pipeline plans",
            self.plan.digest(),
            self.world,
            "every rank must trace the same model with the same options",
        )
        used = sum(s.replicas for s in self.plan.stages)
        if used != self.world:
            raise RuntimeError(f"plan uses {used} devices but the world has {self.world} ranks")

    def _members(self, s: int, planned: list[fx.Node], free: frozenset[fx.Node]) -> list[fx.Node]:
        """Stage s's nodes in graph order: its planned ones and the free values they read
        (recomputed here rather than received)."""
        members = set(planned)
        todo = list(planned)
        while todo:
            for a in todo.pop().all_input_nodes:
                if a in free and a not in members:
                    members.add(a)
                    todo.append(a)
        return [n for n in self.gm.graph.nodes if n in members]

    def _build(self, traced: TracedModel) -> None:
        graph_nodes = list(self.gm.graph.nodes)
        self.placeholders = [n for n in graph_nodes if n.op == "placeholder"]
        out_node = next(n for n in graph_nodes if n.op == "output")
        self.out_leaves, self._out_spec = pytree.tree_flatten(out_node.args[0])
        if self.aten is not None:
            self._out_spec = self.aten.traced.out_spec
        by_name = {n.name: n for n in traced.nodes}
        stage_of: dict[fx.Node, int] = {}
        for s, names in enumerate(self.plan.stage_nodes):
            for name in names:
                stage_of[by_name[name]] = s
        self.stage_of = stage_of
        self.stages = self.plan.stages
        self.value_id = {n: i for i, n in enumerate(graph_nodes)}
        free = self.aten.free if self.aten is not None else frozenset()
        self._batch_major = (
            dict(zip(self.placeholders, self.aten.batch_major, strict=True))
            if self.aten is not None
            else {p: True for p in self.placeholders}
        )
        # Which stage and replica this rank runs.
        self.my_stage, self.my_replica = -1, -1
        for st in self.stages:
            if self.rank in st.devices:
                self.my_stage, self.my_replica = st.id, st.devices.index(self.rank)
        # The loss stage: where the model's last output is computed; every other output is
        # sent there, so loss_fn sees the whole output of a micro-batch.
        computed = [v for v in self.out_leaves if isinstance(v, fx.Node) and v in stage_of]
        if not computed:
            raise ValueError("pipeline parallelism needs a model whose output is computed")
        self.loss_stage = stage_of[max(computed, key=lambda v: self.value_id[v])]
        planned: list[list[fx.Node]] = [[] for _ in self.stages]
        for node in graph_nodes:
            if node in stage_of:
                planned[stage_of[node]].append(node)
        for v in self.out_leaves:
            if isinstance(v, fx.Node) and v in free:
                planned[self.loss_stage].append(v)
        self.members = [self._members(s, planned[s], free) for s in range(len(self.stages))]
        # Inputs / outputs per stage.
        self.stage_inputs: list[list[fx.Node]] = [[] for _ in self.stages]
        self.stage_outputs: list[list[fx.Node]] = [[] for _ in self.stages]
        self.consumers: dict[fx.Node, list[int]] = {}
        listed: list[set[fx.Node]] = [set() for _ in self.stages]

        def needs(s: int, a: fx.Node) -> None:
            if a in listed[s]:
                return
            listed[s].add(a)
            self.stage_inputs[s].append(a)
            if a in stage_of:
                self.consumers.setdefault(a, [])
                if s not in self.consumers[a]:
                    self.consumers[a].append(s)

        for s, members in enumerate(self.members):
            inside = set(members)
            for node in members:
                for a in node.all_input_nodes:
                    if a not in inside:
                        needs(s, a)
        for v in self.out_leaves:
            if isinstance(v, fx.Node) and v not in self.members[self.loss_stage]:
                needs(self.loss_stage, v)
        self._rows: dict[fx.Node, int] = {}
        for a in self.consumers:
            self._check_crossing(a)
            if a not in self.stage_outputs[stage_of[a]]:
                self.stage_outputs[stage_of[a]].append(a)
        self.params_of = [self._stage_params(s) for s in range(len(self.stages))]
        self._groups_for_shared_parameters()
        self._group_for_gradient_norms()
        if self.my_stage < 0:
            self.module = nn.Module()
            return
        # torch.nn.utils.clip_grad_norm_(pp.parameters(), ...) clips by every stage's norm:
        # a parameter counts in the first stage that reads it, on its replica 0.
        # The lead counts what every rank holds alike: the first rank that totals norms.
        grads = GradGroup(self, _reduce_grad_norm, "a pipeline", self.rank == self._norm_lead)
        first = {}
        for s, names in enumerate(self.params_of):
            for name in names:
                first.setdefault(name, s)
        self._norm_shares = {
            name: NormShare(grads, first[name] == self.my_stage and self.my_replica == 0)
            for name in self.params_of[self.my_stage]
        }
        count_gradients(
            (p, self._norm_shares[name]) for name, p in self.params_of[self.my_stage].items()
        )
        self._modules: dict[tuple[Any, int], fx.GraphModule] = {}
        self.module = self._stage_module(self.batch)

    def _stage_params(self, s: int) -> dict[str, nn.Parameter]:
        out: dict[str, nn.Parameter] = {}
        for node in self.members[s]:
            if node.op in ("call_module", "get_attr"):
                for name, p in _module_params(self.gm, node):
                    out[name.removeprefix("m.")] = p
        return out

    def _groups_for_shared_parameters(self) -> None:
        """Every parameter's gradient is summed over the ranks that hold it: the replicas of
        its stage, and the replicas of every other stage that reads it (a tied weight). One
        process group per distinct set of ranks; every rank creates every group, in one order."""
        holders: dict[str, set[int]] = {}
        for st in self.stages:
            for name in self.params_of[st.id]:
                holders.setdefault(name, set()).update(st.devices)
        self.tied = sorted(name for name in holders if sum(name in ps for ps in self.params_of) > 1)
        if self.tied:
            log.info(
                "torch_plugin pipeline: %d parameter(s) read in several stages (tied): %s; "
                "their gradients are summed across those stages",
                len(self.tied),
                ", ".join(self.tied[:4]) + (" ..." if len(self.tied) > 4 else ""),
            )
        sets = sorted({tuple(sorted(r)) for r in holders.values() if len(r) > 1})
        self.grad_groups: list[tuple[Any, list[str]]] = []
        mine = self.params_of[self.my_stage] if self.my_stage >= 0 else {}
        for ranks in sets:
            members = [self._global(r) for r in ranks]
            if self.group is None:
                g = dist.new_group(members)
            elif self.rank in ranks:
                # Other pipelines create other groups: only the members take part.
                g = dist.new_group(members, use_local_synchronization=True)
            else:
                continue
            if self.rank in ranks:
                names = [n for n in mine if tuple(sorted(holders[n])) == ranks]
                self.grad_groups.append((g, names))

    def _group_for_gradient_norms(self) -> None:
        """torch.nn.utils.clip_grad_norm_(pp.parameters()) on a rank whose stage trains nothing
        (frozen embeddings and first layers) finds no gradient and returns 0 before any
        collective, so the norm of the other stages' gradients is reduced over the ranks of the
        stages that train (decided here, from requires_grad), in a group every rank creates."""
        trains = [any(p.requires_grad for p in ps.values()) for ps in self.params_of]
        ranks = sorted({r for st in self.stages if trains[st.id] for r in st.devices})
        self._in_norm_group = self.rank in ranks
        self._norm_lead = ranks[0] if ranks else 0
        self._norm_group = self.group
        if 0 < len(ranks) < self.world:
            members = [self._global(r) for r in ranks]
            if self.group is None:
                self._norm_group = dist.new_group(members)
            elif self._in_norm_group:
                self._norm_group = dist.new_group(members, use_local_synchronization=True)
            log.info(
                "torch_plugin pipeline: stage(s) %s train no parameter; torch's "
                "clip_grad_norm_ over pp.parameters() reduces its norm over ranks %s only "
                "(returning 0 on the others, whose gradients are None)",
                ", ".join(f"S{st.id}" for st in self.stages if not trains[st.id]),
                ranks,
            )

    def _stage_module(self, n: int) -> fx.GraphModule:
        """This rank's stage as a GraphModule for micro-batches of n samples (module-level
        graphs take any n; ATen graphs are traced at n)."""
        key = (self._sig, n, self.training)
        module = self._modules.get(key) if hasattr(self, "_modules") else None
        if module is not None:
            return module
        s = self.my_stage
        if self.aten is None or (n == self.batch and self._sig == self._sig0):
            source = self.gm
            by_name = None
        else:
            source = self._trace(n, self._sig).gm
            by_name = self._named((self._sig, n))
            # Under another autocast state _named matched and checked the twins already.
            same_state = not self._through_casts(self._sig)
            for node in [*self.members[s], *self.stage_inputs[s]] if same_state else []:
                twin = by_name.get(node.name)
                if twin is None or twin.op != node.op or twin.target != node.target:
                    other = (
                        f"at {n} samples"
                        if self._sig == self._sig0
                        else f"at {n} samples of per-sample shapes {_shapes(self._sig)}"
                    )
                    raise RuntimeError(
                        f"torch_plugin pipeline: the model's graph {other} differs from its "
                        f"graph at the example's {self.batch} at node {node.name!r} (where a "
                        "size changes what an op decomposes into); "
                        + (
                            f"this batch of {self._step_rows} leaves {n} sample(s) to a "
                            "micro-batch"
                            + (
                                f" (it runs as chunks of the example's {self.batch})"
                                if self._step_rows > self.batch
                                else ""
                            )
                            + ": drop a last batch this short (DataLoader(drop_last=True)) or "
                            "pad it to a multiple of the example's batch"
                            if self._chunk[1] < self.batch
                            else "pass micro_batch_sizes (or num_microbatches) so every stage "
                            "runs one size, or pad each batch to the example's length"
                        )
                    )

        def twin(node: fx.Node) -> fx.Node:
            return node if by_name is None else by_name[node.name]

        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for v in self.stage_inputs[s]:
            env[twin(v)] = g.placeholder(v.name)
        where = f"stage S{s} under {pipeline_autocast.of(self._sig)}"

        def read(x: fx.Node) -> fx.Node:
            # Under another autocast state, the casts added before this stage's ops join it.
            return pipeline_autocast.pull(x, g, env, where) if by_name is not None else env[x]

        for node in self.members[s]:
            if twin(node) not in env:  # (a plan's cast that is a no-op now is its input)
                env[twin(node)] = g.node_copy(twin(node), read)
        outs = [env[twin(o)] for o in self.stage_outputs[s]]
        if s == self.loss_stage:
            outs += [env[twin(v)] if isinstance(v, fx.Node) else v for v in self.out_leaves]
        g.output(tuple(outs))
        module = fx.GraphModule(source, g)
        if self.aten is not None and not self.training and self._traced_training:
            to_evaluation(module, f"stage S{s}")
        elif self.aten is not None:
            drawn = {env[twin(node)]: node.name for node in self.members[s] if is_draw(node)}
            replace_draws(module, drawn, self._draws)
            module = self._recomputing(module)
        self._modules[key] = module
        return module

    def _recomputing(self, module: fx.GraphModule) -> fx.GraphModule:
        """The stage with the nodes of each region the model checkpoints (its
        torch.utils.checkpoint calls, HF's gradient_checkpointing_enable) run under
        torch.utils.checkpoint: replayed op by op, the stage saved every activation whether
        the user had checkpointed or not."""
        if not self.model_ref.training:
            return module
        layers = checkpointed_layers(self.model_ref)
        draws = self._draws

        def rows_of_the_forward() -> tuple[Any, Any]:
            # Replayed dropout slices this step's masks by the rows of the micro-batch
            # running; the backward recomputes a micro-batch after others ran forward.
            return contextlib.nullcontext(), draws.rows_set(draws.rows)

        return recompute(module, layers, f"pipeline stage S{self.my_stage}", rows_of_the_forward)

    def _release_groups(self) -> None:
        self.group = None
        self.grad_groups = []
        self._norm_group = None

    def _global(self, rank: int) -> int:
        """The global rank of a rank of the plan (point-to-point calls take global ranks)."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def _rows_per_sample(self, v: fx.Node) -> int | None:
        """Rows of dim 0 per sample of a value crossing stages: 1 for a batch-major tensor; k
        for a view that merged the batch with the next dims into batch * k rows (BLOOM's ALiBi,
        [batch * heads, 1, seq]), whose samples are still contiguous row blocks; None else."""
        meta = v.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape") or len(meta.shape) == 0:
            return None
        if meta.shape[0] == self.batch:
            return 1
        aten = torch.ops.aten
        views = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
        src = v.args[0] if v.op == "call_function" and v.args else None
        src_meta = src.meta.get("tensor_meta") if isinstance(src, fx.Node) else None
        if v.target not in views or src_meta is None or len(src_meta.shape) == 0:
            return None
        if src_meta.shape[0] != self.batch:
            return None
        rows = 1
        for d in src_meta.shape[1:]:
            rows *= int(d)
            if self.batch * rows == meta.shape[0]:
                return rows
        return None

    def _check_crossing(self, v: fx.Node) -> None:
        rows = self._rows_per_sample(v)
        if rows is not None:
            self._rows[v] = rows
            return
        meta = v.meta.get("tensor_meta")
        if (
            meta is None
            or not hasattr(meta, "shape")
            or len(meta.shape) == 0
            or (meta.shape[0] != self.batch)
        ):
            where = ""
            if self.aten is not None:
                stack = v.meta.get("nn_module_stack") or {}
                path = next(reversed(stack.values()), ("",))[0] if stack else ""
                where = f" (in module '{path}')" if path else ""
            raise ValueError(
                f"value {v.name!r}{where} crosses pipeline stages but is not a tensor with the "
                f"batch ({self.batch}) as dim 0; keep it inside one stage (coarser blocks: a "
                "smaller scope_depth)"
            )

    def _generation_parts(self) -> tuple[nn.Module | None, Any, list[torch.Tensor], Any, str]:
        local = [t for _, t, _ in self._stored_tensors()] if self.my_stage >= 0 else []

        def whole() -> dict[str, torch.Tensor]:
            return self.full_state_dict(rank0_only=False)

        return self.model_ref, whole, local, self.group, "pipeline"

    def _ddp_refusal(self) -> tuple[str, str, int]:
        return "pipeline", "runs its stages", self.world

    @property
    def training(self) -> bool:
        """The model's mode, as nn.Module has it: pp.eval() or model.eval() turn it off."""
        return self.model_ref.training

    def to(self, *args: Any, **kwargs: Any) -> PipelineParallel:
        """nn.Module.to, as a script calls it on its model (model.to(device)): the device and
        dtype the stages already run on. Another dtype or device is refused by name, since the
        stages run the graph captured at the model's; cast or move the model before
        parallelize."""
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        here = self.device
        to = torch.device(device) if device is not None else here
        moved = to.type != here.type or to.index not in (None, here.index)
        if moved or (dtype is not None and dtype != self.dtype):
            raise ValueError(
                f"torch_plugin pipeline: pp.to({', '.join(map(str, (*args, *kwargs.values())))}) "
                f"would move or cast stages that run the graph captured on {self.device} at "
                f"{self.dtype}; call model.to(...) before parallelize instead"
            )
        return self

    def train(self, mode: bool = True) -> PipelineParallel:
        """Sets the model's mode (as nn.Module.train does). In eval mode the stages compute
        what the model computes in eval mode (dropout off, batch norm on running statistics),
        read off the graph traced for training; `step()` under torch.no_grad() then runs the
        forwards only and returns the loss."""
        if mode and not self._traced_training:
            log.warning(
                "torch_plugin pipeline: the model was captured in eval mode, so its stages train "
                "without dropout; call model.train() before parallelize to train with it"
            )
        self.model_ref.train(mode)
        return self

    def eval(self) -> PipelineParallel:
        return self.train(False)

    # What training loops read off an HF model, on the model a pipeline runs.

    @property
    def device(self) -> torch.device:
        return next((p.device for p in self.parameters()), torch.device("cpu"))

    @property
    def dtype(self) -> torch.dtype:
        return next((p.dtype for p in self.parameters() if p.is_floating_point()), torch.float32)

    @property
    def generation_config(self) -> Any:
        return getattr(self.model_ref, "generation_config", None)

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """HF's num_parameters: the whole model's, every stage's."""
        named = ((n, tuple(p.shape), p.requires_grad) for n, p in self.model_ref.named_parameters())
        embeddings = embedding_weights(self.model_ref)
        return count_parameters(named, embeddings, only_trainable, exclude_embeddings)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As nn.Module.zero_grad, over this rank's parameters."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's stage's parameters and buffers under the model's names (the rank's
        part of the model: full_state_dict() gathers the whole one)."""
        keys = self.model_ref.state_dict(keep_vars=True).keys()
        return {n: t.detach() for n, t, _ in self._stored_tensors() if n in keys}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> Any:
        """Loads a state dict of the model (the plain model's, or any rank's part) into the
        model every rank holds; strict: this rank's stage must find all its tensors, and every
        key must name one of the model's."""
        result = self.model_ref.load_state_dict(state_dict, strict=False)
        mine = {n for n, _, _ in self._stored_tensors()}
        missing = [k for k in result.missing_keys if k in mine]
        bad = torch.tensor([int(strict and bool(missing or result.unexpected_keys))])
        dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=self.group)  # every rank raises
        if bad.item() and not (missing or result.unexpected_keys):
            raise RuntimeError(
                "torch_plugin pipeline: another rank's stage did not find its tensors in the "
                "state dict (its error says which); this rank loaded its own"
            )
        if bad.item():
            raise RuntimeError(
                "torch_plugin pipeline: error(s) loading a state dict into stage "
                f"S{self.my_stage}: missing {missing}, unexpected {result.unexpected_keys}"
            )
        return type(result)(missing, result.unexpected_keys)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> list[str]:
        """HF's save_pretrained for the whole model (every stage's tensors, gathered to rank
        0, which writes); every rank calls it."""
        return save_pretrained_as_hf(self, save_directory, **kwargs)

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters (its stage's), under the model's own names."""
        return list(self.module.parameters())

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n.removeprefix("m."), p) for n, p in self.module.named_parameters()]

    def full_state_dict(self, rank0_only: bool = True) -> dict[str, torch.Tensor]:
        """Every stage's parameters and buffers under the model's names, on rank 0 (or on
        every rank with rank0_only=False)."""
        mine = {n: t.detach().clone() for n, t, _ in self._stored_tensors()}
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, mine, group=self.group)
        out: dict[str, torch.Tensor] = {}
        for part in parts:
            out.update(part)
        return {} if rank0_only and dist.get_rank() != 0 else out

    # What a checkpoint stores (checkpoint_layout.model_tensors and its twins read it).

    def _stored_tensors(self) -> Iterator[tuple[str, torch.Tensor, Layout]]:
        named = list(self.named_parameters()) + [
            (n.removeprefix("m."), b) for n, b in self.module.named_buffers()
        ]
        for n, t in named:
            yield n, t, Layout(tuple(t.shape))

    def _state_aliases(self) -> dict[str, list[str]]:
        return {n: [n] for n, _, _ in self._stored_tensors()}

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips every stage's gradients by the global norm (each parameter counted once,
        tied ones by their first stage; replicas hold equal gradients after the step's sum).
        Call after step(); returns the total norm, the same on every rank."""
        if norm_type != 2.0:
            raise NotImplementedError("torch_plugin pipeline: clip_grad_norm_ supports norm 2")
        total = torch.zeros((), dtype=torch.float64)
        if self.my_stage >= 0:
            shares = self._norm_shares  # counted: its first stage's, on replica 0
            for name, p in self.named_parameters():
                if name in shares and shares[name].counted and p.grad is not None:
                    total += p.grad.detach().double().pow(2).sum()
        dist.all_reduce(total, group=self.group)
        norm = total.sqrt().to(torch.float32)
        coef = max_norm / (float(norm) + 1e-6)
        if coef < 1.0:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    # ---- sample ranges -----------------------------------------------------------------------

    def _range(self, s: int, j: int, r: int) -> tuple[int, int]:
        """Samples [lo, hi) of micro-batch j that stage s's replica r runs, counted from the
        running chunk's first: the plan's, cut at the chunk's samples (a short last batch leaves
        micro-batches partial or empty)."""
        st = self.stages[s]
        sizes = _split(st.micro_batch, st.replicas)
        start = j * st.micro_batch + sum(sizes[:r])
        rows = self._chunk[1]
        return min(start, rows), min(start + sizes[r], rows)

    def _pieces(self, s: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(rank, start, end) of stage s's replica shares overlapping samples [lo, hi)."""
        st = self.stages[s]
        b = st.micro_batch
        out = []
        for j in range(lo // b, (hi - 1) // b + 1):
            for r in range(st.replicas):
                a, e = self._range(s, j, r)
                a, e = max(a, lo), min(e, hi)
                if a < e:
                    out.append((st.devices[r], a, e))
        return out

    def _tag(self, v: fx.Node, consumer: int, start: int, backward: bool) -> int:
        tag = ((self.value_id[v] * len(self.stages) + consumer) * self.batch + start) * 2 + int(
            backward
        )
        if tag >= 2**31:
            raise ValueError("pipeline message tag overflow; use fewer nodes or a smaller batch")
        return tag

    def _recv(self, buf: torch.Tensor, src: int, tag: int, what: str) -> None:
        """A receive bounded by the process group's timeout that names the peer on failure."""
        try:
            dist.recv(buf, self._global(src), group=self.group, tag=tag)
        except RuntimeError as e:
            raise RuntimeError(
                f"pipeline rank {self.rank} (stage S{self.my_stage}) waited for {what} from "
                f"rank {src}, which died or stalled past the process group timeout: {e}"
            ) from e

    def _buffer(self, v: fx.Node, n: int) -> torch.Tensor:
        """Room for n samples of crossing value v (at this step's shapes)."""
        meta = self._meta(v)
        rows = n * self._rows_of(v)
        return torch.empty((rows, *meta.shape[1:]), dtype=meta.dtype, device=self._device)

    def _samples(self, v: fx.Node, x: torch.Tensor, a: int, e: int) -> torch.Tensor:
        """Samples [a, e) (relative to x's first) of crossing value v's tensor x."""
        k = self._rows_of(v)
        return x[a * k : e * k]

    def _dtype(self, v: fx.Node) -> torch.dtype:
        """Crossing value v's dtype at this step (the receiver's buffer's): the plan's, or
        under another autocast state its twin's in the graph traced under it."""
        return self._meta(v).dtype

    # ---- one iteration ---------------------------------------------------------------------

    def _inputs(self, inputs: Any) -> list[Any]:
        """The step's placeholder values from the call (positional tuple or keyword dict)."""
        call = as_call(inputs)
        if self._count_labels is not None:
            labels = call[1].get("labels")
            if not isinstance(labels, torch.Tensor):
                raise ValueError("the pipeline was built with labels; pass labels every step")
            count = self._count_labels(labels)
            call = (call[0], dict(sorted({**call[1], "num_items_in_batch": count}.items())))
        spec = pytree.tree_flatten(call)[1]
        if spec != self._in_spec:
            raise ValueError(
                f"called with {describe(spec)}; the pipeline was built for "
                f"{describe(self._in_spec)}: call step with inputs like the example inputs"
            )
        flat = self._flat_tensors(call)
        names = self._flat_tensors(
            [leaf_name(path) for path, _ in pytree.tree_flatten_with_path(call)[0]]
        )
        rows: tuple[str, int] | None = None
        for p, x, name in zip(self.placeholders, flat, names, strict=False):
            if self._batch_major.get(p) and isinstance(x, torch.Tensor) and x.dim():
                if rows is None:
                    rows = (name, int(x.shape[0]))
                elif x.shape[0] != rows[1]:
                    raise ValueError(
                        f"input {name} has {x.shape[0]} samples but {rows[0]} has {rows[1]}: "
                        "every batch-major input of a step needs the same batch"
                    )
                if self.aten is None and x.shape[0] % self.batch:
                    # A module-level stage runs the example's micro-batches only; a bigger
                    # batch runs as whole chunks of the example's (see step).
                    raise ValueError(
                        f"input {name} has {x.shape[0]} samples; a pipeline split at module "
                        f"level runs batches of {self.batch} samples (the example inputs') "
                        "or a multiple of it: drop a last batch this short "
                        "(DataLoader(drop_last=True)) or pad it"
                    )
            meta = p.meta.get("tensor_meta")
            traced = tuple(meta.shape[1:]) if meta is not None else None
            if (
                self.aten is None  # ATen stages are traced again at a step's other shapes
                and traced is not None
                and isinstance(x, torch.Tensor)
                and x.dim()
                and (tuple(x.shape[1:]) != traced)
            ):
                # Checked before anything runs: a stage would otherwise fail mid-schedule and
                # leave its peers waiting on a message that never comes.
                raise ValueError(
                    f"input {name} has shape {list(x.shape)}; the pipeline's stages were "
                    f"captured for [{self.batch}, {', '.join(map(str, traced))}]: a pipeline "
                    "split at module level runs the example's shapes only, so pad each batch "
                    "to them (HF models and keyword calls, split at ATen level, take any "
                    "length)"
                )
        self._step_rows = rows[1] if rows is not None else self.batch
        if self.aten is not None:
            # Another length: each stage runs its part of the model traced at these shapes
            # (the plan, its stages and micro-batches, and the parameters stay). The call kept
            # for tracing is the one with the most samples, so every micro-batch size slices.
            self._sig = self._signature(call)
            kept = self._calls.get(self._sig)
            if kept is None or self._rows_in(kept) < self._step_rows:
                self._calls[self._sig] = call
        return flat

    def step(self, inputs: tuple[Any, ...] | dict[str, Any], target: Any = None) -> float:
        """One step of the plan's schedule on a batch: returns the batch's loss (the same on
        every rank), having accumulated this rank's gradients and summed them over the ranks
        that share them. Under torch.no_grad() (an evaluation loop) only the forwards run and
        no gradient is touched; in eval mode (pp.eval()) without dropout."""
        flat = self._inputs(inputs)
        if len(flat) != len(self.placeholders):
            raise ValueError(f"expected {len(self.placeholders)} input tensors, got {len(flat)}")
        local = dict(zip(self.placeholders, flat, strict=True))
        # Buffers live where the inputs live: CPU with gloo, the rank's GPU with NCCL.
        self._device = next(
            (x.device for x in flat if isinstance(x, torch.Tensor)), torch.device("cpu")
        )
        backward = torch.is_grad_enabled()
        self._prepare()
        if self._draw_plan is not None and self.training:
            self._replay_draws()
        loss_total = torch.zeros((), device=self._device)
        self._failure = None
        # Gradients of parameters shared with other ranks that earlier steps left (a loop
        # accumulating over steps): summed over those ranks already, so only this step's are
        # summed below and these added after; summing them again multiplied them by the ranks.
        earlier: dict[str, torch.Tensor] = {}
        mine = dict(self.named_parameters()) if self.my_stage >= 0 else {}
        if self.my_stage >= 0 and backward:
            for _, names in self.grad_groups:
                for name in names:
                    if mine[name].grad is not None:
                        earlier[name], mine[name].grad = mine[name].grad, None
        if self.my_stage >= 0:
            # A batch bigger than the example's runs as chunks of the example's, each the
            # plan's schedule, gradients accumulated (summed over ranks once, after the last):
            # each micro-batch's loss is weighed by its share of the whole batch, HF's label
            # count is the whole batch's and the draws are one process's over the whole batch,
            # so the step equals one process's on the whole batch.
            try:
                for off, rows in self._chunks():
                    self._chunk = (off, rows)
                    part = local if rows == self._step_rows else self._slice(local, off, rows)
                    piece = (
                        target[off : off + rows]
                        if isinstance(target, torch.Tensor) and rows != self._step_rows
                        else target
                    )
                    loss_total += self._run_schedule(part, piece, backward)
            except BaseException:
                for name, g in earlier.items():  # the earlier steps' gradients stay
                    mine[name].grad = g
                raise
            finally:
                self._chunk = (0, self.batch)
                self._draws.kept = {}  # this step's masks, held until its last backward
        self._raise_if_any_failed(backward)
        if self.my_stage >= 0 and backward:
            for g, names in self.grad_groups:
                for name in names:
                    p = mine[name]
                    if not p.requires_grad:
                        if name in earlier:
                            p.grad = earlier[name]
                        continue
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                        as_block(self._norm_shares[name], p)
                    dist.all_reduce(p.grad, group=g)
                    if name in earlier:
                        p.grad.add_(earlier[name])
        dist.all_reduce(loss_total, group=self.group)
        return float(loss_total)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's output on a batch, as the model returns it (a ModelOutput for HF), on
        every rank: for evaluation loops that read logits, under torch.no_grad(). The forwards
        run as in step(); the loss stage's outputs are gathered to every rank and put together
        along the batch (a scalar such as HF's loss: summed over micro-batches where the model
        counted the whole batch's labels, else weighed by their samples)."""
        if torch.is_grad_enabled():
            raise RuntimeError(
                "torch_plugin pipeline: calling a pipeline runs its forwards only, for the "
                "model's outputs: call it under torch.no_grad() (an evaluation loop); a training "
                "step's forwards and backwards run together in pp.step(batch)"
            )
        if args and kwargs:
            raise ValueError(
                "torch_plugin pipeline: call it with the example's positional inputs or its "
                "keyword inputs, not both"
            )
        self._outputs = {}
        try:
            self.step(kwargs if kwargs else args)
            mine = {
                off: (rows, [x.cpu() if isinstance(x, torch.Tensor) else x for x in leaves])
                for off, (rows, leaves) in self._outputs.items()
            }
        finally:
            self._outputs = None
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, mine, group=self.group)
        pieces = sorted((off, piece) for part in parts for off, piece in part.items())
        leaves = []
        for i in range(len(pieces[0][1][1]) if pieces else 0):
            values = [leaves_of[i] for _, (_, leaves_of) in pieces]
            rows = [n for _, (n, _) in pieces]
            first = values[0]
            if not isinstance(first, torch.Tensor):
                leaves.append(first)
            elif first.dim() == 0:
                leaves.append(
                    sum(values)
                    if self._summed_loss
                    else sum(v * (n / self._step_rows) for v, n in zip(values, rows, strict=True))
                )
            else:
                leaves.append(torch.cat(values))
        leaves = [x.to(self._device) if isinstance(x, torch.Tensor) else x for x in leaves]
        return pytree.tree_unflatten(leaves, self._out_spec)

    def _raise_if_any_failed(self, backward: bool = True) -> None:
        """After the schedule: every rank learns whether one failed mid-schedule (its loss_fn
        or its stage raised). A failed rank kept sending zeros where its results were due and
        kept receiving (see _forward, _backward), so no peer waited out the process group's
        timeout; now every rank raises, the failed one its own error. The step's gradients are
        discarded on every rank (they were computed from zeros)."""
        error, self._failure = self._failure, None
        failed = self._failed_rank(error)
        if failed is None:
            return
        if backward:
            for p in self.parameters():
                p.grad = None
        if error is not None:
            raise error
        raise RuntimeError(
            f"torch_plugin pipeline: rank {failed} failed during this step (its error "
            "says why); this rank finished the schedule on zeros"
            + (
                " and discarded the step's gradients (those accumulated before it too). "
                "Nothing was all-reduced."
                if backward
                else " (forwards only, under no_grad: no gradient was touched)."
            )
        )

    def _failed_rank(self, error: Exception | None) -> int | None:
        """One all-reduce: the highest rank of the group whose `error` is set, None if none."""
        failed = torch.tensor([0 if error is None else self.rank + 1], device=self._device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.group)
        return int(failed) - 1 if int(failed) else None

    def _chunks(self) -> list[tuple[int, int]]:
        """(first sample, samples) of each chunk of the step's batch the schedule runs."""
        return [
            (off, min(self.batch, self._step_rows - off))
            for off in range(0, max(self._step_rows, 1), self.batch)
        ]

    def _slice(self, local: dict[fx.Node, Any], off: int, rows: int) -> dict[fx.Node, Any]:
        """The placeholders' values for samples [off, off + rows) of the step."""
        return {
            p: x[off : off + rows]
            if self._batch_major[p] and isinstance(x, torch.Tensor) and x.dim()
            else x
            for p, x in local.items()
        }

    def _run_schedule(
        self, local: dict[fx.Node, Any], target: Any, backward: bool = True
    ) -> torch.Tensor:
        """This rank's part of the plan's schedule on one chunk (its forwards only, in their
        order, without `backward`: a stage never waits on a later one then); returns its loss
        share."""
        s = self.my_stage
        sends: list[Any] = []
        loss_total = torch.zeros((), device=self._device)
        saved: dict[int, tuple[list[Any], list[Any], torch.Tensor | None]] = {}
        for j, is_backward in self.plan.raw.schedule[s]:
            lo, hi = self._range(s, j, self.my_replica)
            if lo >= hi:  # past a short last batch's samples: nothing to run or send
                continue
            if not is_backward:
                saved[j] = self._forward(s, j, lo, hi, local, target, sends)
                if saved[j][2] is not None:
                    loss_total += saved[j][2].detach()
                if not backward:
                    del saved[j]
            elif backward:
                self._backward(s, lo, hi, *saved.pop(j), sends)
        # Before the next chunk, whose messages reuse these tags.
        for work in sends:
            work.wait()
        return loss_total

    def _prepare(self) -> None:
        """Before the first message of a step at new shapes or a new batch: this rank's stage
        for every micro-batch size it runs, and every rank told whether all ranks have theirs.
        A stage whose graph differs at these shapes would otherwise fail mid-schedule and leave
        its peers waiting for the process group's timeout."""
        key = (self._sig, self._step_rows, self.training)
        if self.aten is None or key in self._prepared:
            return
        error: Exception | None = None
        if self.my_stage >= 0:
            try:
                # A full chunk and the last, if shorter (their offsets do not matter here).
                for rows in sorted({rows for _, rows in self._chunks()}, reverse=True):
                    self._chunk = (0, rows)
                    for j, backward in self.plan.raw.schedule[self.my_stage]:
                        lo, hi = self._range(self.my_stage, j, self.my_replica)
                        if not backward and hi > lo:
                            self._stage_module(hi - lo)
                if self._draw_plan is not None and self.training:
                    if not any(k[0] == self._sig for k in self._traces):
                        # No micro-batch for this replica in a short batch; it still replays
                        # the step's draws, at these shapes.
                        self._trace(min(self._step_rows, self.batch), self._sig)
                    graph, n = self._draw_graph()
                    self._draw_plan.check(
                        graph, n, f"at {n} samples of per-sample shapes {_shapes(self._sig)}"
                    )
            except Exception as e:  # told to the others first, raised below
                error = e
            finally:
                self._chunk = (0, self.batch)
        failed = self._failed_rank(error)
        if error is not None:
            raise error
        if failed is not None:
            raise RuntimeError(
                f"torch_plugin pipeline: rank {failed} cannot run its stage on this "
                f"batch ({self._step_rows} samples of per-sample shapes {_shapes(self._sig)}); "
                "its error says why. Nothing of this step ran."
            )
        self._prepared.add(key)

    @property
    def replayed_draws(self) -> int:
        """How many random draws (dropout masks, per-sample draws) each step replays as one
        process draws them (ATen-level pipelines; see pipeline/draws.py)."""
        return 0 if self.aten is None else len(draws_of(self.gm.graph))

    def _plan_draws(self) -> DrawPlan:
        """Which draws run along the batch, from the example's graph and the model's graph at
        half its samples (every rank reads the same two)."""
        assert self.aten is not None
        half = self.batch // 2
        other = self._trace(half).gm.graph if half else None
        free = frozenset(node.name for node in self.aten.free)
        return DrawPlan.of(self.gm.graph, self.batch, other, half, free)

    def _draw_graph(self) -> tuple[fx.Graph, int]:
        """The whole model's graph at this step's shapes, and its samples."""
        if self._sig == self._sig0:
            return self.gm.graph, self.batch
        key = self._step_trace()
        return self._traces[key].gm.graph, key[1]

    def _replay_draws(self) -> None:
        """One process's draws for this step, kept where this rank's stage reads them (see
        pipeline/draws.py)."""
        assert self._draw_plan is not None
        graph, n = self._draw_graph()
        self._draws.replay(self._draw_plan, graph, n, self._step_rows, self._my_draws, self._device)

    def _forward(self, s, j, lo, hi, local, target, sends):  # type: ignore[no-untyped-def]
        # The stage's module first: at a new length it is traced now, and the receive buffers
        # below take their shapes from that trace.
        if self.aten is not None:
            module = self._stage_module(hi - lo)
        elif self.training or not self._traced_training:
            module = self.module
        else:
            if self._eval_module is None:
                self._eval_module = module_level_evaluation(self.module, f"stage S{s}")
            module = self._eval_module
        args = []
        for v in self.stage_inputs[s]:
            if v.op == "placeholder":
                x = local[v]
                args.append(x[lo:hi] if self._batch_major[v] else x)
                continue
            buf = self._buffer(v, hi - lo)
            for rank, a, e in self._pieces(self.stage_of[v], lo, hi):
                piece = self._samples(v, buf, a - lo, e - lo)
                recv = torch.empty_like(piece)
                self._recv(recv, rank, self._tag(v, s, a, False), f"{v.name} (forward)")
                piece.copy_(recv)
            if buf.is_floating_point():
                buf.requires_grad_(True)
            args.append(buf)
        off = self._chunk[0]
        self._draws.rows = (off + lo, off + hi)
        loss = None
        if self._failure is None:
            try:
                outs = list(module(*args))
                n_cross = len(self.stage_outputs[s])
                outs, model_out = outs[:n_cross], outs[n_cross:]
                if s == self.loss_stage and self._outputs is not None:
                    self._outputs[off + lo] = (
                        hi - lo,
                        [x.detach() if isinstance(x, torch.Tensor) else x for x in model_out],
                    )
                if s == self.loss_stage and (self._outputs is None or target is not None):
                    output = pytree.tree_unflatten(model_out, self._out_spec)
                    piece = target[lo:hi] if isinstance(target, torch.Tensor) else target
                    loss = self.loss_fn(output, piece)
                    if not self._summed_loss:  # a mean over the micro-batch: its share
                        loss = loss * ((hi - lo) / self._step_rows)
            except Exception as e:  # noqa: BLE001 - told to every rank after the schedule
                self._failure = e
        if self._failure is not None:
            # Failed here or earlier: zeros where this stage's results are due, so the
            # consumers' receives complete and the schedule runs to its end on every rank.
            outs, loss = [self._buffer(v, hi - lo).zero_() for v in self.stage_outputs[s]], None
        for v, out in zip(self.stage_outputs[s], outs, strict=True):
            for q in self.consumers.get(v, []):
                for rank, a, e in self._pieces(q, lo, hi):
                    # In the traced dtype, which the receiver's buffer has: under autocast a
                    # module-level stage may compute in bf16 where the trace saw float32.
                    sends.append(
                        dist.isend(
                            self._samples(v, out, a - lo, e - lo)
                            .detach()
                            .to(self._dtype(v))
                            .contiguous(),
                            self._global(rank),
                            group=self.group,
                            tag=self._tag(v, q, a, False),
                        )
                    )
        return args, outs, loss

    def _backward(self, s, lo, hi, args, outs, loss, sends):  # type: ignore[no-untyped-def]
        tensors, grads = [], []
        for v, out in zip(self.stage_outputs[s], outs, strict=True):
            if not out.is_floating_point() or not self.consumers.get(v):
                continue
            # Gradients cross in the value's traced dtype (see _forward), added in its own.
            grad = torch.zeros_like(out)
            for q in self.consumers[v]:
                for rank, a, e in self._pieces(q, lo, hi):
                    recv = self._buffer(v, e - a)
                    self._recv(recv, rank, self._tag(v, q, a, True), f"grad of {v.name}")
                    self._samples(v, grad, a - lo, e - lo).add_(recv)
            if out.requires_grad:
                tensors.append(out)
                grads.append(grad)
        if loss is not None:
            tensors.append(loss)
            grads.append(None)
        if tensors and self._failure is None:
            try:
                torch.autograd.backward(tensors, grads)
            except Exception as e:  # noqa: BLE001 - told to every rank after the schedule
                self._failure = e
        for v, arg in zip(self.stage_inputs[s], args, strict=True):
            if v.op == "placeholder" or not arg.is_floating_point():
                continue
            # Zeros where a failed rank's gradients are due (see _forward).
            ok = self._failure is None and arg.grad is not None
            grad = arg.grad if ok else torch.zeros_like(arg)
            for rank, a, e in self._pieces(self.stage_of[v], lo, hi):
                sends.append(
                    dist.isend(
                        self._samples(v, grad, a - lo, e - lo).contiguous(),
                        self._global(rank),
                        group=self.group,
                        tag=self._tag(v, s, a, True),
                    )
                )
