"""Backend placement (Collage): run each part of a model on the backend that is fastest for it.

fast = torch.compile(model, backend="torch_plugin", options={"passes": ["placement"]})
placed = torch_plugin.place(model, example_inputs)       # the same, plus the decision
print(placed.placement.table()); placed.placement.save_png("placement.png")
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .backends import BACKENDS, DEFAULT_BACKENDS, Backend, BackendError, get_backends
from .cache import ProfileCache
from .planner import PlacementOptions, PlacementResult, place_graph

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKENDS",
    "Backend",
    "BackendError",
    "PlacedModule",
    "PlacementOptions",
    "PlacementResult",
    "ProfileCache",
    "get_backends",
    "place",
    "place_graph",
    "record",
]


@contextlib.contextmanager
def record() -> Iterator[list[PlacementResult]]:
    """Collects the PlacementResult of every graph placed inside the block."""
    from ..backend import _PLACEMENT_SINKS

    sink: list[PlacementResult] = []
    _PLACEMENT_SINKS.append(sink)
    try:
        yield sink
    finally:
        _PLACEMENT_SINKS.remove(sink)


class PlacedModule(torch.nn.Module):
    """A model compiled with the placement pass; `.placement` holds the decision per graph."""

    def __init__(self, compiled: Any, results: list[PlacementResult]) -> None:
        super().__init__()
        self.compiled = compiled
        self.results = results

    @property
    def placement(self) -> PlacementResult:
        if not self.results:
            raise RuntimeError(
                "torch_plugin.place: no graph was placed (did the model fall back? see the log)"
            )
        return self.results[0]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return self.compiled(*args, **kwargs)


def place(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    on_error: str = "raise",
    **placement_options: Any,
) -> PlacedModule:
    """Compiles `model` for inference with the placement pass and runs it once on the example
    inputs (which triggers the search). Options: see PlacementOptions. The weights are frozen
    into graph compilers' subgraphs unless freeze=False: update them and place again."""
    placement_options.setdefault("freeze", True)
    opts = {
        "passes": ["placement"],
        "placement": PlacementOptions.from_user(placement_options),
        "on_error": on_error,
    }
    compiled = torch.compile(model, backend="torch_plugin", options=opts)
    with record() as results, torch.no_grad():
        compiled(*example_inputs)
    return PlacedModule(compiled, list(results))
