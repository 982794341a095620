"""A stub measurer for the placement search (the `fixed_profile` fixture, and spawned ranks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Undo:
    """A setattr that remembers what it replaced: pass it as `setattr_` in a rank of a pool
    that outlives the test, and call restore() when the case ends, so the stubs do not leak
    into the next case the same process runs."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def __call__(self, obj: Any, name: str, value: Any) -> None:
        self.saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def restore(self) -> None:
        for obj, name, old in reversed(self.saved):
            setattr(obj, name, old)
        self.saved.clear()


def install(seconds: dict[str, float], setattr_: Callable[..., Any] = setattr) -> None:
    """Every group that compiles and matches eager on a backend named in `seconds` costs that
    many seconds (ATen and unnamed backends: 1e-3 s); groups are still compiled and checked
    (one sample); every end-to-end timing returns the same figure, so the DP's pick runs.
    `setattr_`: monkeypatch.setattr in tests (undone after), plain setattr in a spawned rank."""
    from torch_plugin.placement import planner
    from torch_plugin.placement.cache import Entry

    measure = planner._measure

    def stub(gm, c, backend, values, samples, frozen, *rest):  # noqa: ANN001, ANN202
        e = measure(gm, c, backend, values, 1, frozen, *rest)
        if not e.ok:
            return e
        return Entry(seconds.get(backend.name, 1e-3), True, e.note, e.compile_seconds)

    setattr_(planner, "_measure", stub)
    from torch_plugin.placement import measure as measure_module

    def fixed(fn, args, samples, **_):  # noqa: ANN001, ANN202
        fn(*args)
        return 1e-3

    setattr_(planner, "time_call", fixed)
    setattr_(measure_module, "time_call", fixed)


def install_whole_graph(seconds: dict[str, float], setattr_: Callable[..., Any] = setattr) -> None:
    """The default backend's whole-graph timings, stubbed: a graph compiled whole by a backend
    named in `seconds` measures that many seconds (eager and unnamed backends: 1e-3 s). Each
    timed module still runs once, so a placement that cannot run still fails."""
    import torch

    from torch_plugin.placement import whole_graph

    def fake(fn, args, samples, warm=False, ran_s=None, has_run=False):  # noqa: ANN001, ANN202
        fn(*args)
        while hasattr(fn, "__wrapped__"):  # run from a fixed generator state, written inputs
            fn = fn.__wrapped__
        names = [n for n, _ in fn.named_children()] if isinstance(fn, torch.nn.Module) else []
        backend = next((n.split("_", 1)[1] for n in names if n.startswith("group")), "eager")
        return seconds.get(backend, 1e-3)

    setattr_(whole_graph, "time_end_to_end", fake)
    setattr_(whole_graph._Writes, "restore_s", 0.0)
    # Nothing skipped for this machine's speed either: no compile-time expectation, neither the
    # priors nor the rates learned from earlier compiles (the search then skips only once the
    # budget is spent), a peak no FLOP count reaches and no measured matmul floor (no bound).
    from torch_plugin.placement import backends

    for cls in backends.BACKENDS.values():
        setattr_(cls, "compile_s_per_node", 0.0)
    setattr_(whole_graph, "_f32_peak", lambda threads: float("inf"))
    setattr_(whole_graph.kernel_floor, "matmul_floor", lambda gm, target_s: 0.0)
    setattr_(whole_graph, "compile_rates", lambda cache, machine, compilers, computes=None: {})
