"""Schedule language (Slapo): optimise an unmodified model by module path, then `build` it.

sch = torch_plugin.create_schedule(model, mesh)
sch["layers.*.mlp.fc1"].shard(["weight", "bias"], axis=0)
sch["layers.*.mlp"].sync("bwd_post")
sch["layers.*.mlp.fc2"].shard("weight", axis=1)
sch["layers.*.mlp.fc2"].sync("fwd_post")
sch["layers.*"].checkpoint()
model = torch_plugin.build(sch)
sch.verify(example_inputs)            # differential test against the unscheduled model
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch.nn as nn

from ..pipeline.parallel import PipelineParallel, plan_pipeline
from ..runtime.agreement import check_same
from ..runtime.collectives import Collectives
from ..runtime.graph import cost_records
from ..runtime.mesh import DeviceMesh
from ..sharding.module import ShardedModule
from .data_parallel import DataParallelSchedule
from .errors import ScheduleError
from .schedule import DecomposedLinear, Schedule, ScheduleGroup, Step, Subgraph, create_schedule
from .tune import Space, TuneResult, tune


def build(
    sch: Schedule,
    mesh: DeviceMesh | None = None,
    *,
    example_inputs: Sequence[Any] | None = None,
    verify: bool = False,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    auto: str | None = None,
    **pipeline_options: Any,
) -> nn.Module | PipelineParallel | ShardedModule:
    """The runnable scheduled model. Runs the static check; with `verify=True` (and
    `example_inputs`) also the differential test. `mesh`, if given, must be the schedule's.

    On a mesh with a 'pp' axis (e.g. DeviceMesh.from_torchrun((2, 2), ("pp", "tp"))) the
    scheduled model is also cut into pipeline stages by the graph-pipeline partitioner (the
    automatic pass decides what the schedule does not pin): one pipeline per tensor-parallel
    rank, whose stages run the schedule's shards and syncs. That returns a PipelineParallel;
    it needs `example_inputs` and `loss_fn`, and `pipeline_options` go to it, among them
    `placement={...}` (PlacementOptions): the placement pass then picks the backends of each
    stage's compute between the schedule's syncs, forward and backward.

    On a ("dp", "tp") mesh the scheduled model is replicated over 'dp': each replica runs on
    its slice of the batch, outputs are gathered, gradients summed (DataParallelSchedule).

    `auto="shard"`: the schedule's `shard` calls are pins and the sharding ILP plans every
    other parameter and inserts the collectives (nnScaler-style constraints); returns the
    ShardedModule. Such a schedule holds only `shard` calls (the planner places the syncs)."""
    if not isinstance(sch, Schedule) or sch.path:
        raise ScheduleError("build takes the model's schedule (create_schedule(model)), not a part")
    st = sch._state
    if mesh is not None and mesh is not st.mesh:
        raise ScheduleError(
            "build(sch, mesh): the schedule was created on another mesh; pass the mesh to "
            "create_schedule(model, mesh) and call build(sch)"
        )
    if auto is not None:
        if auto != "shard":
            raise ScheduleError(f"unknown auto pass {auto!r}; auto passes: 'shard'")
        return _auto_shard(st, example_inputs)
    sch.check()
    if verify:
        if example_inputs is None:
            raise ScheduleError("build(..., verify=True) needs example_inputs")
        sch.verify(example_inputs)
    pipelined = st.mesh is not None and "pp" in st.mesh.axis_names and st.mesh.size("pp") > 1
    if st.pipeline_splits and not pipelined:
        raise ScheduleError(
            f"pipeline_split at {st.pipeline_splits} needs a mesh with a 'pp' axis of "
            f"{len(st.pipeline_splits) + 1} ranks: DeviceMesh.from_torchrun((pp, tp), ('pp', 'tp'))"
        )
    if not pipelined:
        if loss_fn is not None or pipeline_options:
            raise ScheduleError(
                "loss_fn and pipeline options apply to a mesh with a 'pp' axis of size > 1"
            )
        if st.mesh is not None and "dp" in st.mesh.axis_names and st.mesh.size("dp") > 1:
            dp = Collectives(
                st.mesh.group("dp"),
                st.mesh.size("dp"),
                st.mesh.local_rank("dp"),
                "torch_plugin schedule (dp)",
            )
            return DataParallelSchedule(st.model, dp)
        return st.model
    if example_inputs is None or loss_fn is None:
        raise ScheduleError("building a pipeline (mesh axis 'pp') needs example_inputs and loss_fn")
    # Modules whose hooks or forward the schedule changed stay whole in the pipeline's graph.
    leaves = st.hooked_paths() - {""}
    if st.pipeline_splits:
        pipeline_options["plan"] = _pinned_plan(st, tuple(example_inputs), leaves, pipeline_options)
    pipeline = PipelineParallel(
        st.model,
        tuple(example_inputs),
        loss_fn=loss_fn,
        group=st.mesh.group("pp"),
        leaf_modules=leaves,
        **pipeline_options,
    )
    # Every tensor-parallel rank must cut the model the same way (its own pipeline).
    check_same(
        st.comm.group,
        "pipeline plans of the tensor-parallel ranks",
        pipeline.plan.digest(),
        st.world,
        "every rank must run the same schedule on the same model",
    )
    return pipeline


def _auto_shard(st: Any, example_inputs: Sequence[Any] | None) -> ShardedModule:
    others = [str(s) for s in st.steps if s.primitive != "shard"]
    if others:
        raise ScheduleError(
            "build(sch, auto='shard') plans the collectives itself from the shard pins; the "
            f"schedule also has {others[:4]}: leave those out, or build the schedule by hand"
        )
    if st.mesh is None or example_inputs is None:
        raise ScheduleError("build(sch, auto='shard') needs a mesh and example_inputs")
    pins = {}
    for s in st.shards:
        spec = f"S({s.axis})" + (f"x{s.sections}" if s.sections > 1 else "")
        pins[f"{s.path}.{s.name}" if s.path else s.name] = spec
    # The unscheduled model, whole: the planner captures it and keeps each rank's blocks.
    return ShardedModule(st.original, st.mesh, tuple(example_inputs), constraints=pins)


def _pinned_plan(
    st: Any, example_inputs: tuple[Any, ...], leaves: set[str], options: dict[str, Any]
) -> Any:
    """A chain of stages cut after each `pipeline_split` module: every node up to the last one
    of that module goes before the cut. The partitioner then sees one block per stage, so its
    only choice left is the micro-batch size."""
    if options.pop("strategy", "spp") != "spp":
        raise ScheduleError("pipeline_split marks make a chain of stages: strategy must be 'spp'")
    traced = cost_records(st.model, example_inputs, leaves)
    cuts = []
    for path in st.pipeline_splits:
        inside = [
            i
            for i, r in enumerate(traced.records)
            if r["scope"] == path or r["scope"].startswith(path + ".")
        ]
        if not inside:
            raise ScheduleError(
                f'sch["{path}"].pipeline_split(): no operation of the traced model belongs to '
                "this module (is it called in forward?)"
            )
        cuts.append(max(inside))
    cuts.sort()
    stages = len(cuts) + 1
    if stages != st.mesh.size("pp"):
        raise ScheduleError(
            f"{len(cuts)} pipeline_split marks make {stages} stages but the mesh's 'pp' axis has "
            f"{st.mesh.size('pp')} ranks; mark {st.mesh.size('pp') - 1} boundaries"
        )
    stage = 0
    for i, r in enumerate(traced.records):
        r["scope"] = f"pipeline_stage_{stage}"
        stage += i in cuts
    plan, _ = plan_pipeline(
        traced,
        num_devices=stages,
        strategy="spp",
        scope_depth=1,
        schedule=options.pop("schedule", "1f1b"),
        micro_batch_sizes=options.pop("micro_batch_sizes", None),
        device=options.pop("device_profile", "cpu"),
    )
    if plan.num_stages != stages:
        raise ScheduleError(
            f"the partitioner made {plan.num_stages} stages of the {stages} the pipeline_split "
            "marks ask for; report this with the model"
        )
    return plan


def schedule(
    fn: Callable[[Schedule], Any], mesh: DeviceMesh | None = None
) -> Callable[[type], type]:
    """`@torch_plugin.schedule(fn)` on an nn.Module class: every instance is scheduled by
    `fn(sch)` at the end of its constructor (module-level primitives: the instance is changed
    in place, so `replace` of the whole model is refused)."""
    if isinstance(fn, type):
        raise TypeError("use @torch_plugin.schedule(fn) with a schedule function")

    def wrap(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@torch_plugin.schedule applies to nn.Module classes, not {cls!r}")
        init = cls.__init__

        def __init__(self: nn.Module, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if type(self) is not cls:  # a subclass schedules itself when its __init__ ends
                return
            sch = create_schedule(self, mesh)
            fn(sch)
            if sch._state.model is not self:
                raise ScheduleError(f"{fn.__name__}: a decorator schedule cannot replace the model")
            sch.check()
            self._schedule = sch  # noqa: SLF001  (kept for verify())

        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return wrap


__all__ = [
    "DecomposedLinear",
    "Schedule",
    "ScheduleError",
    "Space",
    "TuneResult",
    "ScheduleGroup",
    "Step",
    "Subgraph",
    "build",
    "create_schedule",
    "schedule",
    "tune",
]


class _CallableModule(types.ModuleType):
    """`torch_plugin.schedule` is this package and, called, the class decorator
    (`@torch_plugin.schedule(fn)`), as the issue's API names both."""

    def __call__(self, fn: Callable[[Schedule], Any], mesh: DeviceMesh | None = None) -> Any:
        return schedule(fn, mesh)


sys.modules[__name__].__class__ = _CallableModule
