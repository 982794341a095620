# Generated from the built extension by scripts/gen_stub.sh (pybind11-stubgen); checked
# against it by `make stubtest` (mypy stubtest) in CI. Do not edit by hand.
"""
torch_plugin C++ core: IR, passes, solver.
"""
from __future__ import annotations
import collections.abc
import typing

# The submodule of pattern bindings (torch_plugin._C.pattern).
pattern: ModuleType
from types import ModuleType
class GraphError(ValueError):
    """
    A malformed graph; `.node` names the offending node.
    """
    node: typing.ClassVar[str] = ''
class PlanError(RuntimeError):
    """
    No parallel plan fits; `.min_memory_bytes` is what the leanest plan found needs.
    """
    min_memory_bytes: typing.ClassVar[float] = -1.0
class PassError(RuntimeError):
    """
    A pass failed; `.pass_name` and `.node` say where, `.hint` what to do.
    """
    hint: typing.ClassVar[str] = ''
    node: typing.ClassVar[str] = ''
    pass_name: typing.ClassVar[str] = ''
    passes_before: typing.ClassVar[list] = list()
class Graph:
    """
    An ATen-level graph (csrc/ir/graph.h).
    """
    @staticmethod
    def from_records(inputs: list, nodes: list, output: typing.Any, verify: bool = True) -> Graph:
        """
        Builds a graph from records; raises GraphError naming the bad node.
        """
    @staticmethod
    def parse(text: str) -> Graph:
        """
        Reads the text form str(graph) writes (csrc/ir/text.h); raises GraphError naming the line.
        """
    def __str__(self) -> str:
        ...
    def estimate(self) -> list:
        ...
    def records(self) -> tuple:
        """
        (inputs, nodes, output) records; node records carry their output value ids last.
        """
    def verify(self) -> None:
        ...
    @property
    def num_inputs(self) -> int:
        ...
    @property
    def num_nodes(self) -> int:
        ...
class PassManager:
    """
    Runs graph rewrites by name and every planning pass through typed options and plans (csrc/passes/pass_manager.h). log(line) receives what the passes say; time_budget_s bounds the searches (0: none).
    """
    def __init__(self, *, log: collections.abc.Callable[[str], None] = None, verify_each: bool = True, time_budget_s: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> None:
        ...
    def evolve_placement(self, seed: collections.abc.Sequence[bool], fitness: collections.abc.Callable[[collections.abc.Sequence[bool]], float], options: EvolveOptions, *, progress: collections.abc.Callable[[typing.SupportsInt | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex], None] = None) -> EvolveResult:
        """
        Evolutionary search over offload bits; fitness(bits) -> seconds (lower is better); stops at the manager's time budget.
        """
    def materialize_sharding(self, graph: Graph, plan: ShardingPlan, options: MaterializeOptions) -> ShardedGraph:
        """
        The SPMD graph of a plan, with torch_plugin::reshard / grad_sync / replicated_output nodes on process group handle options.group.
        """
    def place_op_level(self, graph: Graph, choices: collections.abc.Sequence[PlacementChoice], options: PlacementOptions, *, switch_penalty: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> Placement:
        """
        Op-level DP over candidate groups (PlacementChoice); seconds per switch into a backend.
        """
    def plan_cache_parallel(self, graph: Graph, options: CacheParallelOptions) -> CacheParallelPlan:
        """
        The cache_parallel pass's plan for a graph, without rewriting it.
        """
    def plan_pipeline(self, nodes: list, options: PipelineOptions) -> PipelinePlan:
        """
        Coarsens a cost graph (records), partitions it into pipeline stages (GPP, or SPP with sequential=True), schedules the micro-batches and simulates one iteration.
        """
    def plan_sharding(self, graph: Graph, options: ShardingOptions) -> ShardingPlan:
        """
        Sharding plan of an ATen graph on a 1-D mesh (ILP on CBC). Raises PlanError (with .min_memory_bytes) when no plan fits the budget.
        """
    def run(self, graph: Graph, passes: collections.abc.Sequence[str], options: RewriteOptions = ...) -> tuple[Graph, PassReport]:
        """
        Runs the named rewrites (empty list: verify only); returns (graph, PassReport).
        """
    def search_whole_graph_first(self, backends: collections.abc.Sequence[str], measurer: typing.Any, options: WholeGraphSearchOptions) -> WholeGraphPlan:
        """
        The default placement's driver: each compiler's whole graph compiled (reference first, within the budget) and measured in turns against eager; returns the pick and whether the finer search may run. measurer: compile(backend) -> bool, time(backend) -> s, elapsed() -> s, optionally served(backend) -> bool (its last compile came from a cache), floor(backend, target_s) -> s (a lower bound on its run time, measured on demand), free_bytes() -> bytes (the memory the process can still take) and saved_s(backend) -> s (what the user's own compile of it would have taken beyond its last one).
        """
    def tune_schedule(self, sizes: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], evaluate: collections.abc.Callable[[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], float | None], options: TuneOptions, *, progress: collections.abc.Callable[[typing.SupportsInt | typing.SupportsIndex, collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], typing.SupportsFloat | typing.SupportsIndex | None, typing.SupportsFloat | typing.SupportsIndex | None], None] = None) -> TuneResult:
        """
        Search over candidate indices; evaluate(point) -> score (higher is better) or None.
        """
class PassInfo:
    """
    A registered pass: what it takes and returns.
    """
    name: str
    options: str
    result: str
    rewrite: bool
    summary: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
class PassRecord:
    """
    One rewrite's run.
    """
    changed: bool
    name: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def ms(self) -> float:
        ...
    @ms.setter
    def ms(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def nodes_after(self) -> int:
        ...
    @nodes_after.setter
    def nodes_after(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def nodes_before(self) -> int:
        ...
    @nodes_before.setter
    def nodes_before(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def notes(self) -> list[str]:
        ...
    @notes.setter
    def notes(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
class PassReport:
    """
    What PassManager.run did.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def passes(self) -> list[PassRecord]:
        ...
    @passes.setter
    def passes(self, arg0: collections.abc.Sequence[PassRecord]) -> None:
        ...
    @property
    def verify_ms(self) -> float:
        ...
    @verify_ms.setter
    def verify_ms(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class PipelineOptions:
    """
    Options of pipeline_partition (csrc/passes/pipeline_plan.h).
    """
    absorb_joins: bool
    device: str
    simulate: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def cheap_fraction(self) -> float:
        ...
    @cheap_fraction.setter
    def cheap_fraction(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def epsilon(self) -> float:
        ...
    @epsilon.setter
    def epsilon(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def k_values(self) -> list[int]:
        ...
    @k_values.setter
    def k_values(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def max_blocks(self) -> int:
        ...
    @max_blocks.setter
    def max_blocks(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_limit(self) -> float:
        """
        bytes per device; 0: the profile's
        """
    @memory_limit.setter
    def memory_limit(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def micro_batch_sizes(self) -> list[int]:
        ...
    @micro_batch_sizes.setter
    def micro_batch_sizes(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def mini_batch(self) -> int:
        ...
    @mini_batch.setter
    def mini_batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def num_devices(self) -> int:
        ...
    @num_devices.setter
    def num_devices(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def schedule(self) -> str:
        """
        '1f1b', 'kfkb', 'gpipe', 'greedy'
        """
    @schedule.setter
    def schedule(self, arg0: str) -> None:
        ...
    @property
    def scope_depth(self) -> int:
        ...
    @scope_depth.setter
    def scope_depth(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def sequential(self) -> bool:
        """
        SPP baseline instead of GPP
        """
    @sequential.setter
    def sequential(self, arg0: bool) -> None:
        ...
    @property
    def time_limit_s(self) -> float:
        ...
    @time_limit_s.setter
    def time_limit_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class PipelineStage:
    """
    One stage: its blocks, configuration and modelled costs.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def allreduce_time(self) -> float:
        ...
    @allreduce_time.setter
    def allreduce_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def blocks(self) -> list[int]:
        ...
    @blocks.setter
    def blocks(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def bwd_time(self) -> float:
        ...
    @bwd_time.setter
    def bwd_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def comm_time(self) -> float:
        ...
    @comm_time.setter
    def comm_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def devices(self) -> list[int]:
        ...
    @devices.setter
    def devices(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def fwd_time(self) -> float:
        ...
    @fwd_time.setter
    def fwd_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def id(self) -> int:
        ...
    @id.setter
    def id(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def in_flight(self) -> int:
        ...
    @in_flight.setter
    def in_flight(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def k(self) -> int:
        ...
    @k.setter
    def k(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_bytes(self) -> float:
        ...
    @memory_bytes.setter
    def memory_bytes(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def micro_batch(self) -> int:
        ...
    @micro_batch.setter
    def micro_batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def replicas(self) -> int:
        ...
    @replicas.setter
    def replicas(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def tps(self) -> float:
        ...
    @tps.setter
    def tps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class PartitionStats:
    """
    How the partitioner's search went.
    """
    sp_tree: str
    timed_out: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def blocks(self) -> int:
        ...
    @blocks.setter
    def blocks(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def dp_states(self) -> int:
        ...
    @dp_states.setter
    def dp_states(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def iterations(self) -> int:
        ...
    @iterations.setter
    def iterations(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def linearised_regions(self) -> int:
        ...
    @linearised_regions.setter
    def linearised_regions(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def search_seconds(self) -> float:
        ...
    @search_seconds.setter
    def search_seconds(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class PipelineSimulation:
    """
    One simulated iteration.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def bubble_fraction(self) -> float:
        ...
    @bubble_fraction.setter
    def bubble_fraction(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def device_busy(self) -> list[float]:
        ...
    @device_busy.setter
    def device_busy(self, arg0: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    @property
    def device_peak_memory(self) -> list[float]:
        ...
    @device_peak_memory.setter
    def device_peak_memory(self, arg0: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    @property
    def events(self) -> list:
        """
        (stage, micro_batch, backward, start, end) per pass
        """
    @property
    def iteration_time(self) -> float:
        ...
    @iteration_time.setter
    def iteration_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def stage_peak_in_flight(self) -> list[int]:
        ...
    @stage_peak_in_flight.setter
    def stage_peak_in_flight(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def throughput(self) -> float:
        ...
    @throughput.setter
    def throughput(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class PipelinePlan:
    """
    Pipeline stages, their schedule and the simulated iteration.
    """
    sim: PipelineSimulation | None
    stats: PartitionStats
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def bottleneck_tps(self) -> float:
        ...
    @property
    def depth(self) -> int:
        ...
    @property
    def edges(self) -> list:
        """
        (from, to, bytes_per_sample, data) per stage edge
        """
    @property
    def kind(self) -> str:
        """
        'gpp' or 'spp'
        """
    @property
    def max_memory_bytes(self) -> float:
        ...
    @property
    def mini_batch(self) -> int:
        ...
    @property
    def num_devices(self) -> int:
        ...
    @property
    def schedule(self) -> list:
        """
        per stage: (micro_batch, backward) in run order
        """
    @property
    def schedule_kind(self) -> str:
        ...
    @property
    def stage_nodes(self) -> list[list[int]]:
        """
        each stage's original cost-graph nodes, sorted
        """
    @property
    def stages(self) -> list[PipelineStage]:
        ...
    @property
    def text(self) -> str:
        ...
class CacheParallelOptions:
    """
    Options of the cache_parallel pass (csrc/passes/cache_parallel.h).
    """
    allow_batch_split: bool
    device: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def batch(self) -> int:
        ...
    @batch.setter
    def batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def context(self) -> int:
        ...
    @context.setter
    def context(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def handle(self) -> int:
        """
        the runtime's KV cache manager
        """
    @handle.setter
    def handle(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def scheme(self) -> str:
        """
        'auto', 'gather_partials', 'gather_qkv'
        """
    @scheme.setter
    def scheme(self, arg0: str) -> None:
        ...
    @property
    def world(self) -> int:
        """
        ranks sharing the cache (required)
        """
    @world.setter
    def world(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class CacheAttentionSite:
    """
    One attention node over a KV cache.
    """
    attention_node: str
    cache_k: str
    cache_v: str
    causal: bool
    grown: bool
    indexed_write: bool
    masked: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def batch(self) -> int:
        ...
    @batch.setter
    def batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def capacity(self) -> int:
        ...
    @capacity.setter
    def capacity(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def head_dim(self) -> int:
        ...
    @head_dim.setter
    def head_dim(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def kv_heads(self) -> int:
        ...
    @kv_heads.setter
    def kv_heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def q_heads(self) -> int:
        ...
    @q_heads.setter
    def q_heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class CacheParallelPlan:
    """
    The cache_parallel pass's plan: sites, refusals and why, scheme.
    """
    scheme: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def gather_partials(self) -> dict:
        ...
    @property
    def gather_qkv(self) -> dict:
        ...
    @property
    def sites(self) -> list[CacheAttentionSite]:
        ...
    @sites.setter
    def sites(self, arg0: collections.abc.Sequence[CacheAttentionSite]) -> None:
        ...
    @property
    def skipped(self) -> list[str]:
        """
        'node: why' per attention node left alone
        """
    @skipped.setter
    def skipped(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
class ShardingOptions:
    """
    Options of the sharding ILP (csrc/passes/sharding_ilp.h).
    """
    training: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def activation_bytes_factor(self) -> float:
        ...
    @activation_bytes_factor.setter
    def activation_bytes_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def auto_fast_above(self) -> int:
        ...
    @auto_fast_above.setter
    def auto_fast_above(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def device(self) -> str:
        """
        device profile for the cost model
        """
    @device.setter
    def device(self, arg0: str) -> None:
        ...
    @property
    def dp(self) -> int:
        """
        data-parallel replicas of the graph
        """
    @dp.setter
    def dp(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def fixed_strategies(self) -> dict[str, str]:
        """
        node or input name -> strategy name (a plan's `strategy`): the same program at another size; all fixed: no ILP is solved (status 'fixed')
        """
    @fixed_strategies.setter
    def fixed_strategies(self, arg0: collections.abc.Mapping[str, str]) -> None:
        ...
    @property
    def fixed_zero(self) -> dict[str, int]:
        """
        parameter -> ZeRO stage (a plan's `zero_stage`) where strategies are fixed
        """
    @fixed_zero.setter
    def fixed_zero(self, arg0: collections.abc.Mapping[str, typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def level(self) -> str:
        """
        'exact', 'fast' or 'auto'
        """
    @level.setter
    def level(self, arg0: str) -> None:
        ...
    @property
    def max_zero_stage(self) -> int:
        ...
    @max_zero_stage.setter
    def max_zero_stage(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_budget_bytes(self) -> float:
        """
        0: unlimited
        """
    @memory_budget_bytes.setter
    def memory_budget_bytes(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_slack(self) -> float:
        """
        least memory among plans within this fraction of the fastest; 0: the fastest
        """
    @memory_slack.setter
    def memory_slack(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def pinned(self) -> dict[str, str]:
        """
        input source or node name -> spec ('R', 'S(d)', 'S(d)xk', 'P')
        """
    @pinned.setter
    def pinned(self, arg1: collections.abc.Mapping[str, str]) -> None:
        ...
    @property
    def reduce_scatter(self) -> bool:
        """
        the runtime's library has reduce-scatter (NCCL, gloo); False prices all-reduce
        """
    @reduce_scatter.setter
    def reduce_scatter(self, arg0: bool) -> None:
        ...
    @property
    def state_bytes_factor(self) -> float:
        ...
    @state_bytes_factor.setter
    def state_bytes_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def time_limit_s(self) -> float:
        ...
    @time_limit_s.setter
    def time_limit_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def world(self) -> int:
        """
        ranks on the tensor-parallel axis
        """
    @world.setter
    def world(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Collective:
    """
    One forward resharding the plan priced.
    """
    consumer: str
    kind: str
    value: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def bytes(self) -> float:
        ...
    @bytes.setter
    def bytes(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def from_spec(self) -> str:
        ...
    @property
    def seconds(self) -> float:
        ...
    @seconds.setter
    def seconds(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def to_spec(self) -> str:
        ...
class ShardingPlan:
    """
    A sharding plan: strategy per node, spec per value, collectives, costs.
    """
    level: str
    status: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def activation_bytes_per_rank(self) -> float:
        ...
    @activation_bytes_per_rank.setter
    def activation_bytes_per_rank(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def classes(self) -> int:
        ...
    @classes.setter
    def classes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def collectives(self) -> list[Collective]:
        ...
    @collectives.setter
    def collectives(self, arg0: collections.abc.Sequence[Collective]) -> None:
        ...
    @property
    def comm_s(self) -> float:
        ...
    @comm_s.setter
    def comm_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def compute_s(self) -> float:
        ...
    @compute_s.setter
    def compute_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def constraints(self) -> int:
        ...
    @constraints.setter
    def constraints(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def fastest_objective(self) -> float:
        ...
    @fastest_objective.setter
    def fastest_objective(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def grad_sync_s(self) -> float:
        ...
    @grad_sync_s.setter
    def grad_sync_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def input_specs(self) -> dict[str, list[str]]:
        ...
    @property
    def node_compute_s(self) -> dict[str, float]:
        ...
    @node_compute_s.setter
    def node_compute_s(self, arg0: collections.abc.Mapping[str, typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    @property
    def objective(self) -> float:
        ...
    @objective.setter
    def objective(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def param_bytes_per_rank(self) -> float:
        ...
    @param_bytes_per_rank.setter
    def param_bytes_per_rank(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def spec(self) -> dict[str, str]:
        ...
    @property
    def state_bytes_per_rank(self) -> float:
        ...
    @state_bytes_per_rank.setter
    def state_bytes_per_rank(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def strategy(self) -> dict[str, str]:
        ...
    @strategy.setter
    def strategy(self, arg0: collections.abc.Mapping[str, str]) -> None:
        ...
    @property
    def variables(self) -> int:
        ...
    @variables.setter
    def variables(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def zero_copies(self) -> dict[str, int]:
        ...
    @zero_copies.setter
    def zero_copies(self, arg0: collections.abc.Mapping[str, typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def zero_gather_s(self) -> float:
        ...
    @zero_gather_s.setter
    def zero_gather_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def zero_stage(self) -> dict[str, int]:
        ...
    @zero_stage.setter
    def zero_stage(self, arg0: collections.abc.Mapping[str, typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
class MaterializeOptions:
    """
    Options of sharding_materialize.
    """
    training: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def group(self) -> int:
        """
        runtime handle of the process group the collectives use
        """
    @group.setter
    def group(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def world(self) -> int:
        ...
    @world.setter
    def world(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class ShardedGraph:
    """
    The SPMD graph every rank runs on its local shards.
    """
    graph: Graph
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def grad_syncs(self) -> int:
        ...
    @property
    def reshards(self) -> int:
        ...
    @property
    def views_rewritten(self) -> int:
        ...
class PlacementOptions:
    """
    Options of the op-level placement DP.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def max_states(self) -> int:
        """
        past this many states the search is Collage's bounded form (exact=False)
        """
    @max_states.setter
    def max_states(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class PlacementChoice:
    """
    One candidate group the DP may pick: its nodes, measured seconds, backend.
    """
    backend: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def candidate(self) -> int:
        ...
    @candidate.setter
    def candidate(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def cost(self) -> float:
        """
        seconds
        """
    @cost.setter
    def cost(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def nodes(self) -> list[int]:
        """
        node ids
        """
    @nodes.setter
    def nodes(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
class Placement:
    """
    The op-level DP's cover of the graph.
    """
    exact: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def chosen(self) -> list[int]:
        """
        candidate ids in execution order
        """
    @chosen.setter
    def chosen(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def cost(self) -> float:
        """
        modelled seconds
        """
    @cost.setter
    def cost(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def states(self) -> int:
        ...
    @states.setter
    def states(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class WholeGraphSearchOptions:
    """
    Options of the default placement's driver (csrc/passes/placement_search.h).
    """
    allow_refine: bool
    always_refine: bool
    reference: str
    stop_decided: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def budget_factor(self) -> float:
        ...
    @budget_factor.setter
    def budget_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def budget_s(self) -> float:
        ...
    @budget_s.setter
    def budget_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def cheap_fraction(self) -> float:
        ...
    @cheap_fraction.setter
    def cheap_fraction(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def close_ratio(self) -> float:
        ...
    @close_ratio.setter
    def close_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def compile_bytes(self) -> dict[str, float]:
        ...
    @compile_bytes.setter
    def compile_bytes(self, arg0: collections.abc.Mapping[str, typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    @property
    def compiles_with(self) -> dict[str, str]:
        ...
    @compiles_with.setter
    def compiles_with(self, arg0: collections.abc.Mapping[str, str]) -> None:
        ...
    @property
    def drop_ratio(self) -> float:
        ...
    @drop_ratio.setter
    def drop_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def expected_compile_s(self) -> dict[str, float]:
        ...
    @expected_compile_s.setter
    def expected_compile_s(self, arg0: collections.abc.Mapping[str, typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    @property
    def fallback_budget_s(self) -> float:
        ...
    @fallback_budget_s.setter
    def fallback_budget_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def floor_slack(self) -> float:
        ...
    @floor_slack.setter
    def floor_slack(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def keep_eager_margin(self) -> float:
        ...
    @keep_eager_margin.setter
    def keep_eager_margin(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def lower_bound_s(self) -> dict[str, float]:
        ...
    @lower_bound_s.setter
    def lower_bound_s(self, arg0: collections.abc.Mapping[str, typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    @property
    def memory_slack(self) -> float:
        ...
    @memory_slack.setter
    def memory_slack(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_gain(self) -> float:
        ...
    @min_gain.setter
    def min_gain(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def mixing_prior(self) -> float:
        ...
    @mixing_prior.setter
    def mixing_prior(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def refine_candidates(self) -> int:
        ...
    @refine_candidates.setter
    def refine_candidates(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def seconds_per_candidate(self) -> float:
        ...
    @seconds_per_candidate.setter
    def seconds_per_candidate(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def turn_slack(self) -> float:
        ...
    @turn_slack.setter
    def turn_slack(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def turns(self) -> int:
        ...
    @turns.setter
    def turns(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class WholeGraphTrial:
    """
    One compiler's whole-graph trial.
    """
    backend: str
    compiled: bool
    skipped: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def compile_s(self) -> float:
        ...
    @compile_s.setter
    def compile_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def median_s(self) -> float:
        ...
    @median_s.setter
    def median_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class WholeGraphPlan:
    """
    The default placement's pick.
    """
    memory_limited: bool
    notes: str
    pick: str
    reason: str
    refine: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def budget_s(self) -> float:
        ...
    @budget_s.setter
    def budget_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def eager_s(self) -> float:
        ...
    @eager_s.setter
    def eager_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def pick_s(self) -> float:
        ...
    @pick_s.setter
    def pick_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def predicted_gain(self) -> float:
        ...
    @predicted_gain.setter
    def predicted_gain(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def predicted_refine_s(self) -> float:
        ...
    @predicted_refine_s.setter
    def predicted_refine_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def refine_budget_s(self) -> float:
        ...
    @refine_budget_s.setter
    def refine_budget_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def trials(self) -> list[WholeGraphTrial]:
        ...
    @trials.setter
    def trials(self, arg0: collections.abc.Sequence[WholeGraphTrial]) -> None:
        ...
class EvolveOptions:
    """
    Options of the evolutionary offload search.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def generations(self) -> int:
        ...
    @generations.setter
    def generations(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_evaluations(self) -> int:
        """
        <= 0: no limit
        """
    @max_evaluations.setter
    def max_evaluations(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_improvement(self) -> float:
        ...
    @min_improvement.setter
    def min_improvement(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def mutation_rate(self) -> float:
        """
        < 0: 1 / bits
        """
    @mutation_rate.setter
    def mutation_rate(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def population(self) -> int:
        ...
    @population.setter
    def population(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def seed(self) -> int:
        ...
    @seed.setter
    def seed(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class EvolveResult:
    """
    The best offload bits found.
    """
    stopped_by_deadline: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def best(self) -> list[bool]:
        ...
    @best.setter
    def best(self, arg0: collections.abc.Sequence[bool]) -> None:
        ...
    @property
    def best_fitness(self) -> float:
        ...
    @best_fitness.setter
    def best_fitness(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def evaluations(self) -> int:
        ...
    @evaluations.setter
    def evaluations(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def generations(self) -> int:
        ...
    @generations.setter
    def generations(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def seed_fitness(self) -> float:
        ...
    @seed_fitness.setter
    def seed_fitness(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class PlacementRoundOptions:
    """
    Options of the finer search's rounds (csrc/passes/placement_rounds.h).
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def hopeless_ratio(self) -> float:
        ...
    @hopeless_ratio.setter
    def hopeless_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def keep_eager_margin(self) -> float:
        ...
    @keep_eager_margin.setter
    def keep_eager_margin(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def only(self) -> str:
        """
        one compiler's round only; empty: all
        """
    @only.setter
    def only(self, arg0: str) -> None:
        ...
class FinalistPick:
    """
    The finalist kept and each finalist's median.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def index(self) -> int:
        ...
    @index.setter
    def index(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def medians_s(self) -> list[float]:
        """
        -1 where not measured
        """
    @medians_s.setter
    def medians_s(self, arg0: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
class TuneOptions:
    """
    Options of schedule_tune.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def max_evaluations(self) -> int:
        """
        <= 0: no limit
        """
    @max_evaluations.setter
    def max_evaluations(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def method(self) -> str:
        """
        'exhaustive' or 'coordinate_descent'
        """
    @method.setter
    def method(self, arg1: str) -> None:
        ...
    @property
    def restarts(self) -> int:
        ...
    @restarts.setter
    def restarts(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def seed(self) -> int:
        ...
    @seed.setter
    def seed(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class TuneTrial:
    """
    One evaluated point; score None when invalid.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def point(self) -> list[int]:
        ...
    @point.setter
    def point(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def score(self) -> float | None:
        ...
    @score.setter
    def score(self, arg0: typing.SupportsFloat | typing.SupportsIndex | None) -> None:
        ...
class TuneResult:
    """
    The best point, its score and every trial.
    """
    stopped_by_budget: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def best(self) -> list[int]:
        ...
    @best.setter
    def best(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def best_score(self) -> float:
        ...
    @best_score.setter
    def best_score(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def space_size(self) -> int:
        ...
    @space_size.setter
    def space_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def trials(self) -> list[TuneTrial]:
        ...
    @trials.setter
    def trials(self, arg0: collections.abc.Sequence[TuneTrial]) -> None:
        ...
class ClusterProfile:
    """
    A training cluster: device peak and efficiencies, memory, the fabric inside a node and the network between nodes (csrc/cost/cluster_profile.h).
    """
    calibrated_on: str
    name: str
    source: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def attention_bwd_efficiency(self) -> float:
        ...
    @attention_bwd_efficiency.setter
    def attention_bwd_efficiency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def attention_efficiency(self) -> float:
        ...
    @attention_efficiency.setter
    def attention_efficiency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def devices_per_node(self) -> int:
        ...
    @devices_per_node.setter
    def devices_per_node(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def gemm_efficiency(self) -> float:
        ...
    @gemm_efficiency.setter
    def gemm_efficiency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def inter_bandwidth(self) -> float:
        ...
    @inter_bandwidth.setter
    def inter_bandwidth(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def inter_latency(self) -> float:
        ...
    @inter_latency.setter
    def inter_latency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def intra_bandwidth(self) -> float:
        ...
    @intra_bandwidth.setter
    def intra_bandwidth(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def intra_latency(self) -> float:
        ...
    @intra_latency.setter
    def intra_latency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def mem_bandwidth(self) -> float:
        ...
    @mem_bandwidth.setter
    def mem_bandwidth(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_bytes(self) -> float:
        ...
    @memory_bytes.setter
    def memory_bytes(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def peak_flops(self) -> float:
        ...
    @peak_flops.setter
    def peak_flops(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def sms(self) -> int:
        ...
    @sms.setter
    def sms(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def sustained(self) -> float:
        """
        share of the kernel efficiencies a training step sustains (calibrated)
        """
    @sustained.setter
    def sustained(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def usable_memory(self) -> float:
        ...
    @usable_memory.setter
    def usable_memory(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class TransformerSpec:
    """
    A decoder-only transformer by its sizes.
    """
    name: str
    tied_embeddings: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def forward_flops(self, seq_len: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        forward FLOPs of one sequence (causal attention)
        """
    def to_dict(self) -> dict:
        ...
    @property
    def biases(self) -> bool:
        """
        GPT-style biases and LayerNorm
        """
    @biases.setter
    def biases(self, arg0: bool) -> None:
        ...
    @property
    def ffn(self) -> int:
        ...
    @ffn.setter
    def ffn(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def gated_mlp(self) -> bool:
        """
        SwiGLU (True) or a two-matrix MLP
        """
    @gated_mlp.setter
    def gated_mlp(self, arg0: bool) -> None:
        ...
    @property
    def head_dim(self) -> int:
        """
        0: hidden / heads
        """
    @head_dim.setter
    def head_dim(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def heads(self) -> int:
        ...
    @heads.setter
    def heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def hidden(self) -> int:
        ...
    @hidden.setter
    def hidden(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def kv_heads(self) -> int:
        ...
    @kv_heads.setter
    def kv_heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def layers(self) -> int:
        ...
    @layers.setter
    def layers(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def params(self) -> float:
        """
        parameter count
        """
    @property
    def positions(self) -> int:
        """
        learned position embeddings
        """
    @positions.setter
    def positions(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def vocab(self) -> int:
        ...
    @vocab.setter
    def vocab(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class TrainingJob:
    """
    Devices, sequence length and global batch (sequences).
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def global_batch(self) -> int:
        ...
    @global_batch.setter
    def global_batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def seq_len(self) -> int:
        ...
    @seq_len.setter
    def seq_len(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def world(self) -> int:
        ...
    @world.setter
    def world(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class TrainingLayout:
    """
    A 3-D (+ context parallel) training layout.
    """
    sequence_parallel: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def chunks(self) -> int:
        """
        model chunks per device (interleaved 1F1B > 1)
        """
    @chunks.setter
    def chunks(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def cp(self) -> int:
        ...
    @cp.setter
    def cp(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def dp(self) -> int:
        ...
    @dp.setter
    def dp(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def micro_batch(self) -> int:
        ...
    @micro_batch.setter
    def micro_batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def order(self) -> str:
        """
        mesh dimensions in rank order, innermost first
        """
    @order.setter
    def order(self, arg0: str) -> None:
        ...
    @property
    def pp(self) -> int:
        ...
    @pp.setter
    def pp(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def recompute(self) -> str:
        """
        'none', 'selective' or 'full'
        """
    @recompute.setter
    def recompute(self, arg0: str) -> None:
        ...
    @property
    def tp(self) -> int:
        ...
    @tp.setter
    def tp(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def tp_overlap(self) -> bool:
        """
        async TP
        """
    @tp_overlap.setter
    def tp_overlap(self, arg0: bool) -> None:
        ...
    @property
    def zero(self) -> int:
        """
        0-3; 3 is FSDP
        """
    @zero.setter
    def zero(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class StepEstimate:
    """
    The modelled step of one layout.
    """
    feasible: bool
    reason: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def activation_bytes(self) -> float:
        ...
    @activation_bytes.setter
    def activation_bytes(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def bubble_fraction(self) -> float:
        ...
    @bubble_fraction.setter
    def bubble_fraction(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def compute_time(self) -> float:
        ...
    @compute_time.setter
    def compute_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def cp_comm_time(self) -> float:
        ...
    @cp_comm_time.setter
    def cp_comm_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def dp_exposed_time(self) -> float:
        ...
    @dp_exposed_time.setter
    def dp_exposed_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_bytes(self) -> float:
        ...
    @memory_bytes.setter
    def memory_bytes(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def mfu(self) -> float:
        ...
    @mfu.setter
    def mfu(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def micro_batches(self) -> int:
        ...
    @micro_batches.setter
    def micro_batches(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def model_flops(self) -> float:
        ...
    @model_flops.setter
    def model_flops(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def optimizer_time(self) -> float:
        ...
    @optimizer_time.setter
    def optimizer_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def pipeline_time(self) -> float:
        ...
    @pipeline_time.setter
    def pipeline_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def pp_send_time(self) -> float:
        ...
    @pp_send_time.setter
    def pp_send_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def state_bytes(self) -> float:
        ...
    @state_bytes.setter
    def state_bytes(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def step_time(self) -> float:
        ...
    @step_time.setter
    def step_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def tflops_per_device(self) -> float:
        ...
    @tflops_per_device.setter
    def tflops_per_device(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def tp_comm_time(self) -> float:
        ...
    @tp_comm_time.setter
    def tp_comm_time(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class LayoutSearch:
    """
    Candidate values per decision; empty: all that tile.
    """
    order: str
    sequence_parallel: bool
    tp_overlap: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def chunks(self) -> list[int]:
        ...
    @chunks.setter
    def chunks(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def cp(self) -> list[int]:
        ...
    @cp.setter
    def cp(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def keep(self) -> int:
        ...
    @keep.setter
    def keep(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def micro_batch(self) -> list[int]:
        ...
    @micro_batch.setter
    def micro_batch(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def pp(self) -> list[int]:
        ...
    @pp.setter
    def pp(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def recompute(self) -> list[str]:
        ...
    @recompute.setter
    def recompute(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
    @property
    def tp(self) -> list[int]:
        ...
    @tp.setter
    def tp(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def zero(self) -> list[int]:
        ...
    @zero.setter
    def zero(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
class LayoutCandidate:
    """
    A layout and its estimate.
    """
    estimate: StepEstimate
    layout: TrainingLayout
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
class LayoutPlan:
    """
    The fastest layout that fits, and the runners-up.
    """
    estimate: StepEstimate
    layout: TrainingLayout
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
    @property
    def best(self) -> list[LayoutCandidate]:
        ...
    @best.setter
    def best(self, arg0: collections.abc.Sequence[LayoutCandidate]) -> None:
        ...
    @property
    def evaluated(self) -> int:
        ...
    @evaluated.setter
    def evaluated(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def feasible(self) -> int:
        ...
    @feasible.setter
    def feasible(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class FrozenArguments:
    """
    Snapshot of a graph's frozen weight arguments (their positions in its argument list): each tensor, its data pointer and its version counter (torch_plugin/backend.py).
    """
    def __init__(self, args: collections.abc.Sequence, index: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    def __len__(self) -> int:
        ...
    def first_changed(self, args: typing.Any) -> int:
        """
        -1 when every frozen argument is the tensor it was frozen from (or another on the same data) and unchanged since (its version counter); else the first that is not.
        """
class RewriteOptions:
    """
    Typed options of the graph rewrites, one field per rewrite.
    """
    cache_parallel: CacheParallelOptions
    def __init__(self, **kwargs) -> None:
        """
        Keyword arguments set fields by name; the rest keep their defaults.
        """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        ...
def builds_dp_placement(dp_cost_s: typing.SupportsFloat | typing.SupportsIndex, beat_s: typing.SupportsFloat | typing.SupportsIndex, options: PlacementRoundOptions) -> bool:
    """
    Whether the finer search builds the DP's placement for a graph that already runs in beat_s (<= 0: nothing to beat): not when the DP predicts over hopeless_ratio times it.
    """
def cluster_profile(name: str) -> ClusterProfile:
    """
    A preset cluster profile by name (see cluster_profile_names()).
    """
def cluster_profile_names() -> list[str]:
    ...
def device_profiles() -> dict:
    ...
def estimate_training_step(spec: TransformerSpec, job: TrainingJob, layout: TrainingLayout, cluster: ClusterProfile) -> StepEstimate:
    """
    Models one training step of `layout` (csrc/passes/layout_plan.h).
    """
def gradient_spec(spec: str) -> str:
    """
    The spec of a value's gradient: R <-> P, a shard stays itself.
    """
def graph_signature(arg0: Graph) -> str:
    """
    Canonical text of the whole graph (ops, constants, wiring, input types): the key under which placement decisions are cached.
    """
def keeps_eager(placed_s: typing.SupportsFloat | typing.SupportsIndex, eager_s: typing.SupportsFloat | typing.SupportsIndex, options: PlacementRoundOptions) -> bool:
    """
    Whether eager is kept over the placed graph (measured side by side).
    """
def measure_f32_peak(threads: typing.SupportsInt | typing.SupportsIndex, seconds: typing.SupportsFloat | typing.SupportsIndex = 0.02, tries: typing.SupportsInt | typing.SupportsIndex = 3) -> float:
    """
    The machine's f32 multiply-add peak in FLOP/s on `threads` threads, measured (csrc/cost/cpu_peak.h).
    """
def mkldnn_from_bytes(data: typing.Any, sizes: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], dtype: typing.Any, metadata: typing.Any) -> typing.Any:
    """
    A tensor of the mkldnn layout rebuilt from its packed bytes and its serialised oneDNN descriptor (torch.ops.mkldnn._get_mkldnn_serialized_md); it owns a copy of the bytes.
    """
def model_decode_layer(layer: dict, world: typing.SupportsInt | typing.SupportsIndex, strategy: str, device: typing.Any) -> dict:
    """
    Modelled decode step of one layer: times, bytes sent per rank, memory (dict). device: a preset name, or a dict {'base': preset, field: value} (mem_bandwidth, attention_bandwidth, link_bandwidth, ...).
    """
def offloaded_runs(bits: collections.abc.Sequence[bool]) -> list[tuple[int, int]]:
    """
    Runs [begin, end) of set bits: each becomes one region of the round's compiler.
    """
def parse_spec(spec: str) -> tuple[str, int, int]:
    """
    (kind, dim, sections) of 'R', 'P', 'S(d)' or the strided 'S(d)xN' (dim -1 unless kind is 'S'). Raises ValueError for anything else.
    """
def pick_finalist(turns_s: collections.abc.Sequence[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]]) -> FinalistPick:
    """
    The fastest finalist by median over its turns; empty turns are not measured.
    """
def placement_candidates(graph: Graph, backends: collections.abc.Sequence[str], extra_rules: collections.abc.Mapping[str, collections.abc.Sequence[tuple[str, typing.Any]]] = {}, max_candidates: typing.SupportsInt | typing.SupportsIndex = 200000) -> dict:
    """
    Candidate groups per backend: dicts with id, backend, rule, node names/ids, input and output value names, and the canonical signature.
    """
def placement_round_order(compilers: collections.abc.Sequence[tuple[str, typing.SupportsFloat | typing.SupportsIndex]], options: PlacementRoundOptions) -> list[str]:
    """
    The graph compilers that get an evolutionary round, in order, from (name, expected compile seconds) pairs: cheapest first.
    """
def plan_training_layout(spec: TransformerSpec, job: TrainingJob, cluster: ClusterProfile, search: LayoutSearch) -> LayoutPlan:
    """
    The fastest layout that fits in memory, over the search's candidates.
    """
def registered_passes() -> list[PassInfo]:
    """
    Every pass: name, summary, options type, result type, whether PassManager.run takes it.
    """
def reshard_op(src: str, dst: str) -> str:
    """
    The step turning spec `src` into `dst` (ir::ReshardOpFor): none, slice, zero_pad, keep_on_rank_zero, all_gather, all_gather_slice, all_to_all, all_reduce, reduce_scatter.
    """
def round_budget(remaining_s: typing.SupportsFloat | typing.SupportsIndex, rounds_left: typing.SupportsInt | typing.SupportsIndex) -> float:
    """
    A round's budget: an equal share of what is left.
    """
def solve_ilp(variables: collections.abc.Sequence[tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, bool]], constraints: collections.abc.Sequence[tuple[collections.abc.Sequence[tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]], str, typing.SupportsFloat | typing.SupportsIndex]], maximize: bool = False, time_limit_s: typing.SupportsFloat | typing.SupportsIndex = 60.0) -> tuple[str, float, list[float]]:
    ...
