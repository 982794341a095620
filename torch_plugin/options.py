"""User options of the torch_plugin backend, validated once into a frozen dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from . import _C

_ON_ERROR = ("fallback", "raise")

# Passes driven from Python because they measure backends; they run after the C++ pipeline.
PYTHON_PASSES = {
    "placement": "backend placement (Collage) of inference and training graphs: patterns, "
    "measured costs, DP and evolutionary search in C++; aten/inductor/openvino/onnxruntime/fused",
}


def registered_passes() -> dict[str, str]:
    """Pass name -> one-line summary: the C++ pipeline's passes and the measured ones."""
    rewrites = {p.name: p.summary for p in _C.registered_passes() if p.rewrite}
    return {**rewrites, **PYTHON_PASSES}


@dataclasses.dataclass(frozen=True)
class Options:
    """Options of `torch.compile(model, backend="torch_plugin", options={...})`.

    passes: None (the default) decides per graph: inference graphs are placed whole-graph-first
      with their weights frozen, training graphs run on the measured-best of eager and
      Inductor, and with a mesh the cache_parallel pass runs. Otherwise the passes to run, in
      order; [] is the identity pipeline (verify only), bit-identical to aot_eager.
    on_error: "fallback" runs the unrewritten graph and logs one line; "raise" re-raises.
    verify_each: verify the IR after every pass.
    dump_ir: directory to write the IR text before and after the pipeline, per graph.
    log_passes: log each pass's time and node counts at INFO level.
    mesh: the 1-D DeviceMesh or ProcessGroup that distributed passes (cache_parallel) split
      over; None is the default group.
    cache_parallel: a KVCacheManager to use (set by torch_plugin.cache_parallel); None makes
      one per compiled model when the cache_parallel pass runs.
    placement: options of the placement pass (see placement.PlacementOptions), a dict.
    precision: "f32" or "bf16": what inference graphs may compute in (OpenVINO's bf16 hint,
      Inductor on the graph traced under autocast), each candidate held to that precision's
      stated tolerance against eager (placement/precision.py). None (the default) is f32,
      unless the graph already computes in bf16 (a bf16 model, a call under autocast).
    """

    passes: tuple[str, ...] | None = None
    on_error: str = "fallback"
    verify_each: bool = True
    dump_ir: str | None = None
    log_passes: bool = False
    mesh: Any = None
    cache_parallel: Any = None
    placement: Any = None
    precision: str | None = None

    @property
    def auto(self) -> bool:
        """No passes named: the backend decides per graph (see `passes`)."""
        return self.passes is None

    def runs(self, name: str) -> bool:
        """Whether the pass `name` was asked for by name."""
        return self.passes is not None and name in self.passes

    @classmethod
    def from_user(cls, options: Mapping[str, Any] | Options | None) -> Options:
        if options is None:
            return cls()
        if isinstance(options, Options):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(
                f"torch_plugin options must be a dict, got {type(options).__name__}; "
                f"valid keys: {', '.join(f.name for f in dataclasses.fields(cls))}"
            )
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(
                f"torch_plugin: unknown option(s) {', '.join(map(repr, unknown))}; "
                f"valid options: {', '.join(sorted(valid))}"
            )
        kwargs = dict(options)
        passes = kwargs.get("passes")
        if passes is None:
            kwargs["passes"] = None
        elif isinstance(passes, str) or not isinstance(passes, (list, tuple)):
            raise TypeError(
                "torch_plugin option 'passes' must be a list of pass names, "
                f"got {passes!r}; valid passes: {', '.join(registered_passes())}"
            )
        if passes is not None:
            known = registered_passes()
            bad = [p for p in passes if p not in known]
            if bad:
                raise ValueError(
                    f"torch_plugin: unknown pass(es) {', '.join(map(repr, bad))}; "
                    f"valid passes: {', '.join(known)}"
                )
            kwargs["passes"] = tuple(passes)
        if "placement" in kwargs:
            from .placement.planner import PlacementOptions

            kwargs["placement"] = PlacementOptions.from_user(kwargs["placement"])
        if kwargs.get("precision") is not None:
            from .placement.precision import check_precision

            check_precision(kwargs["precision"])
        if kwargs.get("on_error", "fallback") not in _ON_ERROR:
            raise ValueError(
                f"torch_plugin option 'on_error' must be one of {', '.join(_ON_ERROR)}, "
                f"got {kwargs['on_error']!r}"
            )
        for flag in ("verify_each", "log_passes"):
            if flag in kwargs and not isinstance(kwargs[flag], bool):
                raise TypeError(f"torch_plugin option {flag!r} must be a bool")
        if kwargs.get("dump_ir") is not None and not isinstance(kwargs["dump_ir"], str):
            raise TypeError("torch_plugin option 'dump_ir' must be a directory path (str)")
        return cls(**kwargs)
