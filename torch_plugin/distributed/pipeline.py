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

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.fx.passes.shape_prop import ShapeProp

from .. import _C
from .agreement import check_same
from .collectives import hold_groups
from .graph import TracedModel, cost_records

STRATEGIES = ("gpp", "spp")


@dataclasses.dataclass
class PipelinePlan:
    """A stage graph with micro-batch sizes, replicas, a schedule and its simulation."""

    raw: dict[str, Any]
    stage_nodes: list[list[str]]  # FX node names per stage

    @property
    def stages(self) -> list[dict[str, Any]]:
        return self.raw["stages"]

    @property
    def num_stages(self) -> int:
        return len(self.raw["stages"])

    def digest(self) -> str:
        """Hash of everything the ranks must agree on (stages, configs, schedule)."""
        key = json.dumps(
            [
                self.stage_nodes,
                [(s["micro_batch"], s["replicas"], s["devices"]) for s in self.stages],
                self.raw["schedule"],
            ],
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def summary(self) -> str:
        sim = self.raw.get("sim", {})
        lines = [self.raw["text"].rstrip()]
        if sim:
            lines.append(
                f"simulated ({self.raw['schedule_kind']}): iteration "
                f"{sim['iteration_time'] * 1e3:.3f} ms, {sim['throughput']:.1f} samples/s, "
                f"bubble {sim['bubble_fraction']:.1%}"
            )
        st = self.raw["stats"]
        lines.append(
            f"search: {st['search_seconds']:.3f} s, {st['iterations']} binary-search steps, "
            f"{st['dp_states']} DP states over {st['blocks']} blocks"
        )
        return "\n".join(lines)

    def save_png(self, prefix: str) -> tuple[str, str]:
        """Writes `<prefix>_stages.png` (the stage DAG) and `<prefix>_gantt.png` (timeline)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = self.num_stages
        level = [0] * n
        for a, b, _, _ in sorted(self.raw["edges"], key=lambda e: e[1]):
            level[b] = max(level[b], level[a] + 1)
        rows: dict[int, int] = {}
        pos = {}
        for s in range(n):
            pos[s] = (level[s], rows.get(level[s], 0))
            rows[level[s]] = rows.get(level[s], 0) + 1
        fig, ax = plt.subplots(figsize=(2 + 2.2 * (max(level) + 1), 1 + 1.1 * max(rows.values())))
        for a, b, _, data in self.raw["edges"]:
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ax.annotate(
                "",
                (x1 - 0.32, y1),
                (x0 + 0.32, y0),
                arrowprops=dict(arrowstyle="->", ls="-" if data else ":"),
            )
        for s, (x, y) in pos.items():
            st = self.stages[s]
            label = (
                f"S{s}  b={st['micro_batch']} d={st['replicas']}\n{len(self.stage_nodes[s])} nodes"
            )
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
        ax.set_title(f"{self.raw['kind'].upper()} stage graph, depth {self.raw['depth']}")
        dag = f"{prefix}_stages.png"
        fig.savefig(dag, dpi=110, bbox_inches="tight")
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(10, 0.5 + 0.35 * n))
        for s, _mb, bw, start, end in self.raw.get("sim", {}).get("events", []):
            ax.barh(
                s,
                (end - start) * 1e3,
                left=start * 1e3,
                color="#c44" if bw else "#48c",
                edgecolor="white",
                linewidth=0.3,
            )
        ax.set_yticks(range(n), [f"S{s} ({len(self.stages[s]['devices'])} dev)" for s in range(n)])
        ax.invert_yaxis()
        ax.set_xlabel("ms (forward blue, backward red)")
        ax.set_title(f"{self.raw['kind'].upper()} {self.raw['schedule_kind']} schedule")
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
    options = {
        "mini_batch": mini_batch or traced.batch,
        "num_devices": int(num_devices),
        "device": device,
        "memory_limit": float(memory_limit_bytes),
        "micro_batch_sizes": micro_batch_sizes,
        "k_values": k_values or [1],
        "sequential": strategy == "spp",
        "schedule": schedule,
        "max_blocks": max_blocks,
        "scope_depth": scope_depth,
        "time_limit_s": time_limit_s,
    }
    raw = _C.pipeline_plan(traced.records, options)
    names = [[traced.nodes[i].name for i in st["nodes"]] for st in raw["stages"]]
    return PipelinePlan(raw=raw, stage_nodes=names), traced


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if r < total % parts else 0) for r in range(parts)]


class PipelineParallel:
    """Runs this rank's share of a pipeline plan: its stage, on its replica's samples.

    Call `step(inputs, target)` with the whole mini-batch on every rank (each rank slices what
    it needs); it runs the static schedule, all-reduces gradients among the stage's replicas and
    returns the mini-batch loss (the same on every rank). Then step your optimizer over
    `parameters()`. `loss_fn(output, target)` must average over the samples it is given.
    `scope_depth` groups nodes into blocks by the first components of their module path
    (3: "branches.0.1", a layer of a branch) so that no stage boundary cuts inside a layer.
    `placement` (PlacementOptions or their dict) runs the placement pass on the stage's
    compute, forward and backward, around the modules that must stay eager (see
    torch_plugin.placement.segments); its decisions are made on the first step.
    """

    def __init__(
        self,
        model: nn.Module,
        example_inputs: tuple[Any, ...],
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
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
    ):
        if not dist.is_initialized():
            raise RuntimeError(
                "PipelineParallel needs torch.distributed initialised (run under torchrun and "
                "call torch.distributed.init_process_group first)"
            )
        # Ranks in the plan are ranks of `group` (the world by default). A group lets several
        # pipelines run side by side, e.g. one per tensor-parallel rank.
        self.group = group
        hold_groups(self)
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.loss_fn = loss_fn
        traced = cost_records(model, example_inputs, leaf_modules)
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
        self.gm = traced.gm
        self.batch = traced.batch
        flat, _ = pytree.tree_flatten(tuple(example_inputs))
        ShapeProp(self.gm).propagate(*flat)
        self._build(traced)
        # Backend placement of this stage's compute between the calls that must stay eager.
        self.placed_segments: list[Any] = []
        if placement is not None and self.my_stage >= 0:
            from ..placement.segments import place_segments

            self.placed_segments = place_segments(self.module, placement)

    # ---- setup ----------------------------------------------------------------------------

    def _check_same_plan(self) -> None:
        check_same(
            self.group,
            "pipeline plans",
            self.plan.digest(),
            self.world,
            "every rank must trace the same model with the same options",
        )
        used = sum(s["replicas"] for s in self.plan.stages)
        if used != self.world:
            raise RuntimeError(f"plan uses {used} devices but the world has {self.world} ranks")

    def _build(self, traced: TracedModel) -> None:
        graph_nodes = list(self.gm.graph.nodes)
        self.placeholders = [n for n in graph_nodes if n.op == "placeholder"]
        out_node = next(n for n in graph_nodes if n.op == "output")
        outs = out_node.args[0]
        if not isinstance(outs, fx.Node):
            raise ValueError("pipeline parallelism needs a model that returns one tensor")
        self.output_value = outs
        stage_of: dict[fx.Node, int] = {}
        for s, names in enumerate(self.plan.stage_nodes):
            for name in names:
                stage_of[next(n for n in traced.nodes if n.name == name)] = s
        self.stage_of = stage_of
        self.stages = self.plan.stages
        self.value_id = {n: i for i, n in enumerate(graph_nodes)}
        # Which stage and replica this rank runs.
        self.my_stage, self.my_replica = -1, -1
        for st in self.stages:
            if self.rank in st["devices"]:
                self.my_stage, self.my_replica = st["id"], st["devices"].index(self.rank)
        # Inputs / outputs per stage.
        self.stage_inputs: list[list[fx.Node]] = [[] for _ in self.stages]
        self.stage_outputs: list[list[fx.Node]] = [[] for _ in self.stages]
        self.consumers: dict[fx.Node, list[int]] = {}
        for node in graph_nodes:
            if node not in stage_of:
                continue
            s = stage_of[node]
            for a in node.all_input_nodes:
                if stage_of.get(a) != s and a not in self.stage_inputs[s]:
                    self.stage_inputs[s].append(a)
                    if a in stage_of:
                        self.consumers.setdefault(a, [])
                        if s not in self.consumers[a]:
                            self.consumers[a].append(s)
        for a in self.consumers:
            self._check_crossing(a)
            if a not in self.stage_outputs[stage_of[a]]:
                self.stage_outputs[stage_of[a]].append(a)
        last = stage_of[self.output_value]
        if self.output_value not in self.stage_outputs[last]:
            self.stage_outputs[last].append(self.output_value)
        self.loss_stage = last
        # Replica groups for the gradient all-reduce (every rank creates every group).
        self.replica_group = None
        for st in self.stages:
            if st["replicas"] > 1:
                members = [self._global(r) for r in st["devices"]]
                if self.group is None:
                    g = dist.new_group(members)
                elif st["id"] == self.my_stage:
                    # Other pipelines create other groups: only the members take part.
                    g = dist.new_group(members, use_local_synchronization=True)
                else:
                    continue
                if st["id"] == self.my_stage:
                    self.replica_group = g
        if self.my_stage < 0:
            self.module = nn.Module()
            return
        s = self.my_stage
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for v in self.stage_inputs[s]:
            env[v] = g.placeholder(v.name)
        for node in graph_nodes:
            if stage_of.get(node) == s:
                env[node] = g.node_copy(node, lambda x: env[x])
        g.output(tuple(env[o] for o in self.stage_outputs[s]))
        self.module = fx.GraphModule(self.gm, g)

    def _release_groups(self) -> None:
        self.group = self.replica_group = None

    def _global(self, rank: int) -> int:
        """The global rank of a rank of the plan (point-to-point calls take global ranks)."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def _check_crossing(self, v: fx.Node) -> None:
        meta = v.meta.get("tensor_meta")
        if (
            meta is None
            or not hasattr(meta, "shape")
            or len(meta.shape) == 0
            or (meta.shape[0] != self.batch)
        ):
            raise ValueError(
                f"value {v.name!r} crosses pipeline stages but is not a tensor with the batch "
                f"({self.batch}) as dim 0; keep it inside one stage (coarser blocks: a smaller "
                "scope_depth)"
            )

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters (its stage's), under the model's own names."""
        return list(self.module.parameters())

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n.removeprefix("m."), p) for n, p in self.module.named_parameters()]

    def full_state_dict(self, rank0_only: bool = True) -> dict[str, torch.Tensor]:
        """Every stage's parameters and buffers under the model's names, on rank 0 (or on
        every rank with rank0_only=False)."""
        from .checkpoint import full_state_dict

        return full_state_dict(self, rank0_only)

    # ---- sample ranges -----------------------------------------------------------------------

    def _range(self, s: int, j: int, r: int) -> tuple[int, int]:
        st = self.stages[s]
        sizes = _split(st["micro_batch"], st["replicas"])
        start = j * st["micro_batch"] + sum(sizes[:r])
        return start, start + sizes[r]

    def _pieces(self, s: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(rank, start, end) of stage s's replica shares overlapping samples [lo, hi)."""
        st = self.stages[s]
        b = st["micro_batch"]
        out = []
        for j in range(lo // b, (hi - 1) // b + 1):
            for r in range(st["replicas"]):
                a, e = self._range(s, j, r)
                a, e = max(a, lo), min(e, hi)
                if a < e:
                    out.append((st["devices"][r], a, e))
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
        meta = v.meta["tensor_meta"]
        return torch.empty((n, *meta.shape[1:]), dtype=meta.dtype, device=self._device)

    # ---- one iteration ---------------------------------------------------------------------

    def step(self, inputs: tuple[Any, ...], target: torch.Tensor) -> float:
        flat, _ = pytree.tree_flatten(tuple(inputs))
        if len(flat) != len(self.placeholders):
            raise ValueError(f"expected {len(self.placeholders)} input tensors, got {len(flat)}")
        local = dict(zip(self.placeholders, flat, strict=True))
        # Buffers live where the inputs live: CPU with gloo, the rank's GPU with NCCL.
        self._device = next(
            (x.device for x in flat if isinstance(x, torch.Tensor)), torch.device("cpu")
        )
        sends: list[Any] = []
        loss_total = torch.zeros((), device=self._device)
        if self.my_stage >= 0:
            s = self.my_stage
            saved: dict[int, tuple[list[Any], list[Any], torch.Tensor | None]] = {}
            for j, backward in self.plan.raw["schedule"][s]:
                lo, hi = self._range(s, j, self.my_replica)
                if not backward:
                    saved[j] = self._forward(s, j, lo, hi, local, target, sends)
                    if saved[j][2] is not None:
                        loss_total += saved[j][2].detach()
                else:
                    self._backward(s, lo, hi, *saved.pop(j), sends)
            for work in sends:
                work.wait()
            if self.replica_group is not None:
                for p in self.module.parameters():
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    dist.all_reduce(p.grad, group=self.replica_group)
        dist.all_reduce(loss_total, group=self.group)
        return float(loss_total)

    def _forward(self, s, j, lo, hi, local, target, sends):  # type: ignore[no-untyped-def]
        args = []
        for v in self.stage_inputs[s]:
            if v.op == "placeholder":
                args.append(local[v][lo:hi])
                continue
            buf = self._buffer(v, hi - lo)
            for rank, a, e in self._pieces(self.stage_of[v], lo, hi):
                piece = buf[a - lo : e - lo]
                recv = torch.empty_like(piece)
                self._recv(recv, rank, self._tag(v, s, a, False), f"{v.name} (forward)")
                piece.copy_(recv)
            if buf.is_floating_point():
                buf.requires_grad_(True)
            args.append(buf)
        outs = list(self.module(*args))
        for v, out in zip(self.stage_outputs[s], outs, strict=True):
            for q in self.consumers.get(v, []):
                for rank, a, e in self._pieces(q, lo, hi):
                    sends.append(
                        dist.isend(
                            out[a - lo : e - lo].detach().contiguous(),
                            self._global(rank),
                            group=self.group,
                            tag=self._tag(v, q, a, False),
                        )
                    )
        loss = None
        if s == self.loss_stage:
            out = outs[self.stage_outputs[s].index(self.output_value)]
            loss = self.loss_fn(out, target[lo:hi]) * ((hi - lo) / self.batch)
        return args, outs, loss

    def _backward(self, s, lo, hi, args, outs, loss, sends):  # type: ignore[no-untyped-def]
        tensors, grads = [], []
        for v, out in zip(self.stage_outputs[s], outs, strict=True):
            if not out.is_floating_point() or not self.consumers.get(v):
                continue
            grad = torch.zeros_like(out)
            for q in self.consumers[v]:
                for rank, a, e in self._pieces(q, lo, hi):
                    recv = torch.empty_like(grad[a - lo : e - lo])
                    self._recv(recv, rank, self._tag(v, q, a, True), f"grad of {v.name}")
                    grad[a - lo : e - lo] += recv
            if out.requires_grad:
                tensors.append(out)
                grads.append(grad)
        if loss is not None:
            tensors.append(loss)
            grads.append(None)
        if tensors:
            torch.autograd.backward(tensors, grads)
        for v, arg in zip(self.stage_inputs[s], args, strict=True):
            if v.op == "placeholder" or not arg.is_floating_point():
                continue
            grad = arg.grad if arg.grad is not None else torch.zeros_like(arg)
            for rank, a, e in self._pieces(self.stage_of[v], lo, hi):
                sends.append(
                    dist.isend(
                        grad[a - lo : e - lo].contiguous(),
                        self._global(rank),
                        group=self.group,
                        tag=self._tag(v, s, a, True),
                    )
                )
