# Stubs for the pybind11 module built from csrc/bindings/module.cc.
from collections.abc import Callable
from typing import Any

class GraphError(ValueError):
    node: str

class PlanError(RuntimeError):
    min_memory_bytes: float

class PassError(RuntimeError):
    pass_name: str
    node: str
    hint: str
    passes_before: list[str]

class Graph:
    @staticmethod
    def from_records(
        inputs: list[tuple[Any, ...]],
        nodes: list[tuple[Any, ...]],
        output: Any,
        verify: bool = True,
    ) -> Graph: ...
    def records(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], Any]: ...
    def verify(self) -> None: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def num_inputs(self) -> int: ...
    def estimate(self) -> list[tuple[str, str, str, float, float, bool]]: ...

def registered_passes() -> list[tuple[str, str]]: ...
def run_pipeline(
    graph: Graph,
    passes: list[str],
    verify_each: bool = True,
    log: Callable[[str], None] | None = None,
    options: dict[str, str] = ...,
) -> tuple[Graph, dict[str, Any]]: ...
def solve_ilp(
    variables: list[tuple[float, float, float, bool]],
    constraints: list[tuple[list[tuple[int, float]], str, float]],
    maximize: bool = False,
    time_limit_s: float = 60.0,
) -> tuple[str, float, list[float]]: ...
def pipeline_plan(nodes: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """Coarsen, partition (GPP, or SPP with sequential=True), schedule and simulate.

    nodes: records with name, scope, inputs (earlier indices), fwd_flops, bwd_flops, io_bytes,
    act_bytes, out_bytes (per sample), param_bytes, kernels, is_output.
    options: mini_batch, num_devices, device, memory_limit, micro_batch_sizes, k_values,
    sequential, absorb_joins, epsilon, time_limit_s, schedule, simulate, scope_depth,
    max_blocks, cheap_fraction.
    Returns stages (nodes, micro_batch, k, replicas, devices, in_flight, times, memory), edges,
    schedule (per stage: (micro_batch, backward)), depth, bottleneck_tps, text, stats, sim.
    """
    ...

def device_profiles() -> dict[str, dict[str, float]]: ...
def model_decode_layer(
    layer: dict[str, float], world: int, strategy: str, device: str
) -> dict[str, Any]: ...
def plan_cache_parallel(graph: Graph, options: dict[str, str]) -> dict[str, Any]: ...
def plan_sharding(
    graph: Graph,
    world: int,
    device: str = "a100",
    training: bool = True,
    memory_budget_bytes: float = 0.0,
    time_limit_s: float = 30.0,
    pinned: dict[str, str] = ...,
    level: str = "auto",
    activation_bytes_factor: float = 1.0,
    dp: int = 1,
    max_zero_stage: int = 1,
) -> dict[str, Any]: ...

# Backend placement (csrc/bindings/placement.cc).
class _PatternModule:
    class Pattern:
        def has_attr(self, key: str, value: str) -> _PatternModule.Pattern: ...
        def has_dtype(self, dtypes: list[str]) -> _PatternModule.Pattern: ...
        def has_rank(self, lo: int, hi: int) -> _PatternModule.Pattern: ...
        def static_shape(self) -> _PatternModule.Pattern: ...

    def wildcard(self) -> Pattern: ...
    def is_op(self, ops: list[str], inputs: list[Pattern] = ...) -> Pattern: ...
    def is_op_class(self, classes: list[str], inputs: list[Pattern] = ...) -> Pattern: ...
    def alt(self, alternatives: list[Pattern]) -> Pattern: ...
    def known_rule_sets(self) -> list[str]: ...
    def match_all(self, graph: Graph, pattern: Pattern) -> list[list[str]]: ...

pattern: _PatternModule

def placement_candidates(
    graph: Graph,
    backends: list[str],
    extra_rules: dict[str, list[tuple[str, Any]]] = ...,
    max_candidates: int = 200000,
) -> dict[str, Any]: ...
def graph_signature(graph: Graph) -> str: ...
def place_op_level(
    graph: Graph,
    options: list[tuple[int, list[int], float, str]],
    switch_penalty: float = 0.0,
    max_states: int = 20000,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]: ...
def search_whole_graph_first(
    backends: list[str],
    compile: Callable[[str], bool],
    time: Callable[[str], float],
    elapsed: Callable[[], float],
    options: dict[str, Any] = ...,
) -> dict[str, Any]: ...
def evolve_placement(
    seed: list[bool],
    fitness: Callable[[list[bool]], float],
    population: int = 12,
    generations: int = 10,
    min_improvement: float = 0.02,
    rng_seed: int = 0,
    max_evaluations: int = 0,
    time_budget_s: float = 0.0,
    progress: Callable[[int, float, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]: ...
def tune_schedule(
    sizes: list[int],
    evaluate: Callable[[list[int]], float | None],
    method: str = "exhaustive",
    max_evaluations: int = 0,
    seed: int = 0,
    restarts: int = 1,
    time_budget_s: float = 0.0,
    progress: Callable[[int, list[int], float | None, float | None], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]: ...
