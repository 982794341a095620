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

from ..distributed.mesh import DeviceMesh
from .schedule import (
    DecomposedLinear,
    Schedule,
    ScheduleError,
    ScheduleGroup,
    Step,
    Subgraph,
    create_schedule,
)
from .tune import Space, TuneResult, tune


def build(
    sch: Schedule,
    mesh: DeviceMesh | None = None,
    *,
    example_inputs: Sequence[Any] | None = None,
    verify: bool = False,
) -> nn.Module:
    """The runnable scheduled model. Runs the static check; with `verify=True` (and
    `example_inputs`) also the differential test. `mesh`, if given, must be the schedule's."""
    if not isinstance(sch, Schedule) or sch.path:
        raise ScheduleError("build takes the model's schedule (create_schedule(model)), not a part")
    st = sch._state
    if mesh is not None and mesh is not st.mesh:
        raise ScheduleError(
            "build(sch, mesh): the schedule was created on another mesh; pass the mesh to "
            "create_schedule(model, mesh) and call build(sch)"
        )
    if st.pipeline_splits:
        raise ScheduleError(
            f"pipeline_split at {st.pipeline_splits}: building stages from a schedule is not "
            "implemented yet; use torch_plugin.parallelize(model, strategy='pipeline') for "
            "graph pipelines"
        )
    sch.check()
    if verify:
        if example_inputs is None:
            raise ScheduleError("build(..., verify=True) needs example_inputs")
        sch.verify(example_inputs)
    return st.model


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
