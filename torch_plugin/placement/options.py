"""Options of the placement pass, validated once into a frozen dataclass."""

from __future__ import annotations

import dataclasses
from typing import Any

from .backends import DEFAULT_BACKENDS

_VALID_KEYS = (
    "backends",
    "cache_path",
    "evolve",
    "evolve_backend",
    "time_budget_s",
    "max_evaluations",
    "samples",
    "switch_penalty_s",
    "max_states",
    "seed",
    "progress",
    "freeze",
    "cold_cache",
    "search",
    "budget_factor",
    "allow_refine",
    "precision",
    "dp_hopeless_ratio",
)


_SEARCHES = ("exhaustive", "whole_graph_first")


@dataclasses.dataclass(frozen=True)
class PlacementOptions:
    """Options of the placement pass (`options={"passes": ["placement"], "placement": {...}}`).

    backends: backends to consider ("aten" is always there); missing packages are skipped.
    cache_path: SQLite profile cache; None = $TORCH_PLUGIN_PROFILE_DB or
      ~/.cache/torch_plugin/profile.db; ":memory:" keeps nothing.
    evolve: run the evolutionary search after the DP (graph-level compilers).
    evolve_backend: the graph-level compiler it offloads to; None = the first available of
      inductor, openvino, onnxruntime among `backends`.
    time_budget_s: bounds the search from its start: measuring candidate groups (eager's are
      all timed; the others, not in the profile cache, until it is spent: the rest are left
      out, loudly), then the evolutionary search in what is left.
    max_evaluations: the evolutionary search's other bound.
    samples: timed samples per measurement (median taken).
    switch_penalty_s: seconds per group run outside the host graph; None = measured.
    max_states: DP states before it switches to its bounded form.
    seed: RNG seed of the search; progress: show a tqdm bar.
    freeze: hand parameters and buffers to graph compilers as constants (they fold and prepack
      weights, as whole-model exports do); the placed module then assumes the weights do not
      change, like torch._inductor's freezing: off for torch.compile (weights may be updated
      in place under the compiled model), on in torch_plugin.place() (an inference module).
      Only with real example inputs.
    cold_cache: time each group right after evicting the last-level cache (its weights
      cold, its activation inputs warm), as it runs inside a model whose tensors do not fit
      in that cache: timed hot, ResNet-50's groups measured half what they cost in the model.
      None = when the graph's tensors outgrow the cache (on CPU; on a GPU, never: the flush
      evicts the host's cache).
    search: "exhaustive" (every candidate group measured, DP, evolution: place()'s search) or
      "whole_graph_first" (the default backend's: each compiler's whole graph first, the
      finer search only within the budget; csrc/passes/placement_search.h).
    budget_factor: whole_graph_first's compile budget, in multiples of Inductor's compile of
      the same graph; time_budget_s when Inductor cannot compile it, and in the explicit
      placement pass (which then runs the finer search in what is left).
    allow_refine: whether whole_graph_first may run the finer search at all.
    dp_hopeless_ratio: the explicit pass's finer search builds the DP's placement (and evolves
      from it) only where the DP predicts at most this multiple of the time the whole-graph
      pick measured (_C.builds_dp_placement); math.inf: always.
    precision: "f32" or "bf16" (placement/precision.py): what inference graphs' compilers may
      compute in, and the tolerance each candidate is held to against eager; None = f32 unless
      the graph already computes in bf16. Set by the backend's top-level `precision` option.
    cuda_graphs: on a GPU, the whole-graph search also times Inductor's graph replayed as one
      CUDA graph (placement/cuda_graphs.py) for inference graphs, and picks it where faster.
    """

    backends: tuple[str, ...] = DEFAULT_BACKENDS
    cache_path: str | None = None
    evolve: bool = True
    evolve_backend: str | None = None
    time_budget_s: float = 60.0
    max_evaluations: int = 40
    samples: int = 7
    switch_penalty_s: float | None = None
    max_states: int = 20000
    freeze: bool = False
    seed: int = 0
    progress: bool = False
    cold_cache: bool | None = None
    search: str = "exhaustive"
    budget_factor: float = 1.25
    allow_refine: bool = True
    dp_hopeless_ratio: float = 2.0
    precision: str | None = None
    cuda_graphs: bool = True

    def progress_bar(self, total: int, desc: str) -> Any:
        """A tqdm bar for one phase of the search: shown once the phase lasts 2 s, on a
        terminal, and always with progress=True (at real sizes a phase takes minutes)."""
        from tqdm import tqdm

        return tqdm(
            total=total,
            desc=desc,
            delay=2.0,
            disable=False if self.progress else None,
            leave=False,
        )

    @classmethod
    def from_user(cls, value: Any) -> PlacementOptions:
        if value is None:
            return cls()
        if isinstance(value, PlacementOptions):
            return value
        if not isinstance(value, dict):
            raise TypeError(
                f"torch_plugin option 'placement' must be a dict, got {type(value).__name__}; "
                f"valid keys: {', '.join(_VALID_KEYS)}"
            )
        unknown = sorted(set(value) - set(_VALID_KEYS))
        if unknown:
            raise ValueError(
                f"torch_plugin placement: unknown option(s) {', '.join(map(repr, unknown))}; "
                f"valid: {', '.join(_VALID_KEYS)}"
            )
        kwargs = dict(value)
        if "backends" in kwargs:
            b = kwargs["backends"]
            if isinstance(b, str) or not isinstance(b, (list, tuple)):
                raise TypeError("torch_plugin placement option 'backends' must be a list of names")
            from .backends import BACKENDS

            bad = [x for x in b if x not in BACKENDS]
            if bad:
                raise ValueError(
                    f"torch_plugin placement: unknown backend(s) {', '.join(map(repr, bad))}; "
                    f"valid: {', '.join(BACKENDS)}"
                )
            kwargs["backends"] = tuple(b)
        for key in ("time_budget_s", "switch_penalty_s"):
            v = kwargs.get(key)
            if v is not None and (not isinstance(v, (int, float)) or v < 0):
                raise ValueError(f"torch_plugin placement option {key!r} must be >= 0, got {v!r}")
        for key in ("samples", "max_evaluations", "max_states"):
            v = kwargs.get(key)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"torch_plugin placement option {key!r} must be an int >= 1")
        if kwargs.get("search", "exhaustive") not in _SEARCHES:
            raise ValueError(
                f"torch_plugin placement option 'search' must be one of {', '.join(_SEARCHES)}, "
                f"got {kwargs['search']!r}"
            )
        for key in ("budget_factor", "dp_hopeless_ratio"):
            v = kwargs.get(key)
            if v is not None and (not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"torch_plugin placement option {key!r} must be > 0, got {v!r}")
        from .precision import check_precision

        check_precision(kwargs.get("precision"))
        v = kwargs.get("cold_cache")
        if v is not None and not isinstance(v, bool):
            raise ValueError(
                f"torch_plugin placement option 'cold_cache' must be True, False or None "
                f"(None: when the graph's tensors outgrow the last-level cache), got {v!r}"
            )
        return cls(**kwargs)
