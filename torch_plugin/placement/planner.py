"""Backend placement of one ATen graph (Collage): candidates from the C++ pattern rules,
measured on real-shaped inputs with a persistent cache, placed by the C++ dynamic program,
refined by the C++ evolutionary search over graph-level compilers, then materialised as an
`fx.GraphModule` whose groups call their backends' compiled callables.

Python measures and compiles (it has the backends); every decision is made in C++.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import math
import operator
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._prims_common import is_non_overlapping_and_dense_or_false

from .. import _C, fx_bridge
from .backends import DEFAULT_BACKENDS, Backend, BackendError, get_backends
from .cache import Entry, ProfileCache, machine_key

log = logging.getLogger("torch_plugin")

# 5: op-level ONNX Runtime groups without an arena; the fused kernels on all threads.
PROFILE_VERSION = "5"

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
    time_budget_s / max_evaluations: bounds of the evolutionary search.
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
      None = when the graph's tensors outgrow the cache.
    search: "exhaustive" (every candidate group measured, DP, evolution: place()'s search) or
      "whole_graph_first" (the default backend's: each compiler's whole graph first, the
      finer search only within the budget; csrc/passes/placement_search.h).
    budget_factor: whole_graph_first's compile budget, in multiples of Inductor's compile of
      the same graph; time_budget_s when Inductor cannot compile it.
    allow_refine: whether whole_graph_first may run the finer search at all.
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
    budget_factor: float = 2.5
    allow_refine: bool = True

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
        v = kwargs.get("budget_factor")
        if v is not None and (not isinstance(v, (int, float)) or v <= 0):
            raise ValueError(
                f"torch_plugin placement option 'budget_factor' must be > 0, got {v!r}"
            )
        v = kwargs.get("cold_cache")
        if v is not None and not isinstance(v, bool):
            raise ValueError(
                f"torch_plugin placement option 'cold_cache' must be True, False or None "
                f"(None: when the graph's tensors outgrow the last-level cache), got {v!r}"
            )
        return cls(**kwargs)


@dataclasses.dataclass
class Group:
    backend: str
    rule: str
    nodes: list[str]
    inputs: list[str]
    outputs: list[str]
    seconds: float  # measured, alone
    ops: list[str] = dataclasses.field(default_factory=list)
    call_inputs: list[str] | None = None  # what its callable takes (inputs less frozen ones)

    def arguments(self) -> list[str]:
        return self.inputs if self.call_inputs is None else self.call_inputs


# A placement ready to run: its groups and, per group, the compiled callable (None: ATen).
Built = tuple[list[Group], Sequence[Callable[..., Any] | None]]


@dataclasses.dataclass
class PlacementResult:
    """What the placement pass decided for one graph, and the figures behind it."""

    groups: list[Group]
    dp_cost_s: float
    dp_exact: bool
    dp_states: int
    measured_dp_s: float | None = None
    measured_final_s: float | None = None
    measured_eager_s: float | None = None
    evolution: dict[str, Any] | None = None
    candidates: int = 0
    # (backend, rule) -> [candidates, of which usable (compiled, right numbers)]
    candidates_by_rule: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    measured: int = 0
    cache_hits: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    search_s: float = 0.0
    switch_penalty_s: float = 0.0
    boundary_s: dict[str, float] = dataclasses.field(default_factory=dict)
    kept_eager: bool = False  # the placement measured slower than the unplaced graph
    cold_cache: bool = False  # groups were timed with the last-level cache evicted
    phase_s: dict[str, float] = dataclasses.field(default_factory=dict)
    kind: str = "inference"  # or a training graph's "forward" / "backward"
    # whole_graph_first: the C++ driver's plan (trials, pick, reason); frozen weights.
    whole_graph: dict[str, Any] | None = None
    frozen: int = 0

    def backend_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for g in self.groups:
            counts[g.backend] = counts.get(g.backend, 0) + len(g.nodes)
        return counts

    def summary(self) -> str:
        """One line: what runs this graph, against what, and why."""
        w = self.whole_graph
        if w is None:
            counts = ", ".join(f"{k} {v}" for k, v in self.backend_counts().items())
            return (
                f"{self.kind} graph: {counts} nodes; eager {_ms(self.measured_eager_s)}, "
                f"placed {_ms(self.measured_final_s)}; search {self.search_s:.1f} s"
            )
        trials = ", ".join(
            f"{t['backend']} {_ms(t['median_s'])}"
            if t["compiled"]
            else f"{t['backend']} {'skipped' if t['skipped'] else 'failed'}"
            for t in w["trials"]
        )
        return (
            f"{self.kind} graph ({sum(self.backend_counts().values())} nodes): "
            f"{w['pick'] if not w.get('refined') else 'finer placement'} "
            f"({_ms(self.measured_final_s)}; whole graphs: {trials})"
            + (f"; {self.frozen} weights frozen" if self.frozen else "")
            + f"; compiled in {self.search_s:.1f} s"
            + (" (cached decision)" if w.get("cached") else f"; {w['reason']}")
        )

    def table(self) -> str:
        """One line per group run outside ATen, and totals per backend."""
        if self.whole_graph is not None and not self.whole_graph.get("refined"):
            return self.summary()
        lines = [f"{'backend':<12} {'rule':<16} {'nodes':>5} {'us':>9}  ops"]
        for g in self.groups:
            if g.backend == "aten":
                continue
            ops = ", ".join(o.split("::")[-1].split(".")[0] for o in g.ops[:6])
            lines.append(
                f"{g.backend:<12} {g.rule:<16} {len(g.nodes):>5} {g.seconds * 1e6:>9.1f}  {ops}"
            )
        counts = self.backend_counts()
        lines.append("nodes per backend: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        lines.append(
            f"DP modelled {self.dp_cost_s * 1e3:.3f} ms ({'exact' if self.dp_exact else 'bounded'}"
            f", {self.dp_states} states); candidates {self.candidates}, measured {self.measured}, "
            f"cache hits {self.cache_hits}, search {self.search_s:.1f} s"
            + ("; groups timed with the cache cold" if self.cold_cache else "")
        )
        if self.kept_eager:
            lines.append("the placement measured slower than eager end to end: eager kept")
        if self.measured_final_s is not None:
            lines.append(
                f"end to end: eager {_ms(self.measured_eager_s)}, DP {_ms(self.measured_dp_s)}, "
                f"final {_ms(self.measured_final_s)}"
            )
        return "\n".join(lines)

    def save_png(self, path: str) -> None:
        """A strip per backend: which nodes (in graph order) each backend runs."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        backends = sorted({g.backend for g in self.groups})
        order: dict[str, int] = {}
        for g in self.groups:
            for n in g.nodes:
                order.setdefault(n, len(order))
        fig, ax = plt.subplots(figsize=(12, 1 + 0.5 * len(backends)))
        colors = plt.get_cmap("tab10")
        for gi, g in enumerate(self.groups):
            row = backends.index(g.backend)
            xs = sorted(order[n] for n in g.nodes)
            ax.broken_barh([(x, 1) for x in xs], (row - 0.4, 0.8), color=colors(row % 10))
            if g.backend != "aten" and len(xs) > 1:
                ax.plot([xs[0], xs[-1] + 1], [row + 0.45] * 2, color="black", lw=0.6)
            del gi
        ax.set_yticks(range(len(backends)), backends)
        ax.set_xlabel("node (execution order)")
        ax.set_title(
            "torch_plugin placement: "
            + ", ".join(f"{k} {v}" for k, v in self.backend_counts().items())
        )
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f} ms"


# ---------------------------------------------------------------- helpers


class _Recorder(fx.Interpreter):
    """Runs the graph once on real inputs and keeps every node's value by name."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def synthesize_inputs(gm: fx.GraphModule) -> list[Any]:
    """Real tensors shaped like the placeholders' fake values: floats random, ints zero (valid
    indices and positions), bools true."""
    gen = torch.Generator().manual_seed(0)
    out: list[Any] = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            shape = [int(d) for d in v.shape]
            if v.dtype.is_floating_point:
                t = torch.randn(shape, generator=gen, dtype=v.dtype) * 0.5
            elif v.dtype == torch.bool:
                t = torch.ones(shape, dtype=torch.bool)
            else:
                t = torch.zeros(shape, dtype=v.dtype)
            # With the traced strides: a compiled graph (Inductor's) asserts its inputs' strides,
            # and a backward's saved activations are often transposed views.
            stride = tuple(int(s) for s in v.stride())
            if t.stride() != stride and t.numel() > 0:
                t = torch.empty_strided(shape, stride, dtype=v.dtype).copy_(t)
            out.append(t)
        elif isinstance(v, (int, torch.SymInt)):
            out.append(int(v))
        else:
            raise BackendError(f"cannot make an input for placeholder '{n.name}'")
    return out


def time_call(
    fn: Callable[..., Any],
    args: Sequence[Any],
    samples: int,
    warm_s: float = 0.0,
    min_s: float = 0.0,
    prepare: Callable[[], None] | None = None,
) -> float:
    """Median seconds per call; each sample repeats the call until it lasts >= 0.2 ms.

    prepare: run, untimed, before each sample, which is then a single call (a cache flush).

    warm_s / min_s: warm up for at least warm_s, and keep sampling past `samples` until the
    samples last min_s. End-to-end measurements that decide the search use them: on a
    sub-millisecond graph, seven samples right after a compile varied by up to 80% (0.58 to
    1.07 ms for one ONNX Runtime session of GPT-2), enough to pick a slower placement."""
    fn(*args)
    t0 = time.perf_counter()
    fn(*args)
    once = max(time.perf_counter() - t0, 1e-7)
    reps = 1 if prepare is not None else max(1, min(200, math.ceil(2e-4 / once)))
    t_end = time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        fn(*args)
    times = []
    t_end = time.perf_counter() + min_s
    while len(times) < samples or time.perf_counter() < t_end:
        if prepare is not None:
            prepare()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(*args)
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def time_end_to_end(fn: Callable[..., Any], args: Sequence[Any], samples: int) -> float:
    """time_call for a whole placed graph: 10 ms of warm-up, >= 50 ms of samples."""
    return time_call(fn, args, samples, warm_s=0.01, min_s=0.05)


def last_level_cache_bytes() -> int:
    """Size of the CPU's largest cache, from sysfs; 32 MiB where it cannot be read."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
            best = max(best, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (OSError, ValueError, IndexError):
            continue
    return best or 32 * 2**20


def _shapes_only(values: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """values with each tensor of 1 MiB or more not named in `keep` replaced by an
    uninitialised one of the same shape, strides and dtype: its pages are never touched."""
    out: dict[str, Any] = {}
    for name, v in values.items():
        if name in keep or not isinstance(v, torch.Tensor) or v.nbytes < 1 << 20:
            out[name] = v
        else:
            out[name] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
    return out


def footprint_bytes(values: dict[str, Any]) -> int:
    """Bytes of the distinct CPU storages behind a recorded run's values (weights, inputs and
    every activation): the data one inference touches."""
    seen: set[int] = set()
    total = 0
    for v in values.values():
        for t in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
    return total


class _CacheFlush:
    """Evicts the last-level cache (writes a buffer 1.5x its size), then reads the given
    tensors back in: inside a model larger than the cache, a group finds its weights cold (the
    rest of the model ran since its last call) and its activation inputs warm (just made)."""

    def __init__(self, cache_bytes: int) -> None:
        self.buf = torch.zeros(cache_bytes * 3 // 2 // 4)

    def __call__(self, warm: Sequence[Any]) -> None:
        self.buf.add_(1.0)
        for t in warm:
            if isinstance(t, torch.Tensor) and t.numel():
                t.sum()


def build_subgraph(
    gm: fx.GraphModule,
    nodes: Sequence[str],
    inputs: Sequence[str],
    outputs: Sequence[str],
    constants: dict[str, torch.Tensor] | None = None,
) -> fx.GraphModule:
    """The group as its own GraphModule: placeholders for its inputs, a tuple of its outputs.
    Tuple-producing nodes bring their getitem users along (the IR folds them into outputs).
    Inputs named in `constants` (frozen parameters) become attributes of the module instead,
    so a graph compiler sees them as weights it may fold and prepack."""
    by_name = {n.name: n for n in gm.graph.nodes}
    group = set(nodes)
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    root: dict[str, Any] = {}
    constants = constants or {}
    for name in inputs:
        if name in constants:
            continue
        p = g.placeholder(name)
        p.meta = dict(by_name[name].meta)
        env[name] = p
    for name in inputs:
        if name in constants:
            attr = f"_frozen_{name}"
            root[attr] = constants[name].detach()
            env[name] = g.get_attr(attr)
            env[name].meta = dict(by_name[name].meta)
    for n in gm.graph.nodes:
        inside = n.name in group or (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
            and n.args[0].name in group
        )
        if inside:
            env[n.name] = g.node_copy(n, lambda a: env[a.name])
    g.output(tuple(env[o] for o in outputs))
    for n in g.nodes:
        if n.op == "get_attr" and str(n.target) not in root:
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            root[str(n.target)] = obj
    return fx.GraphModule(root, g)


def _direct_aten(gm: fx.GraphModule) -> Callable[..., Any]:
    """Calls the group's node targets directly: what the inline host graph pays, without the
    GraphModule call overhead that a measurement of `gm` itself would add."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    body = [n for n in nodes if n.op == "call_function"]
    out = nodes[-1].args[0]

    def run(*args: Any) -> tuple[Any, ...]:
        env: dict[fx.Node, Any] = dict(zip(placeholders, args, strict=False))
        for n in body:
            a = fx.node.map_arg(n.args, lambda x: env[x])
            k = fx.node.map_arg(n.kwargs, lambda x: env[x])
            env[n] = n.target(*a, **k)
        return tuple(env[o] for o in out)

    if all(n.op in ("placeholder", "call_function", "output") for n in nodes):
        return run
    return gm


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not a.dtype.is_floating_point:
            return torch.equal(a, b)
        finite = b.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)
        scale = float(finite.max()) if b.numel() else 0.0
        return torch.allclose(a, b, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)
    return a == b


class _GroupCall(torch.nn.Module):
    """A group compiled by a backend, called from the host graph."""

    def __init__(self, fn: Callable[..., Any], backend: str, nodes: int) -> None:
        super().__init__()
        self.fn = fn
        self.backend = backend
        self.num_nodes = nodes

    def forward(self, *args: Any) -> Any:
        return tuple(self.fn(*args))

    def extra_repr(self) -> str:
        return f"backend={self.backend}, nodes={self.num_nodes}"


def _eager_stride(n: fx.Node) -> tuple[int, ...] | None:
    """The strides of a node's eager value where they are not the contiguous ones (None
    otherwise): ATen ops after it may depend on them. SDPA's output, for one, is laid out so
    that its transpose is contiguous and the `view` after it works; a backend returns it
    contiguous, and the view then fails."""
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        stride = tuple(int(s) for s in val.stride())
        # Only a dense layout can be rebuilt with empty_strided (not an expand's zero strides).
        dense = is_non_overlapping_and_dense_or_false(val)
        contiguous = bool(val.is_contiguous())
    except Exception:  # noqa: BLE001 - symbolic strides: nothing to enforce
        return None
    return stride if dense and not contiguous else None


def _restride(t: Any, stride: tuple[int, ...]) -> Any:
    """`t` with the given strides (a copy only where they differ)."""
    if not isinstance(t, torch.Tensor) or t.stride() == stride:
        return t
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def materialize(
    gm: fx.GraphModule, groups: Sequence[Group], compiled: Sequence[Callable[..., Any] | None]
) -> fx.GraphModule:
    """The host GraphModule: aten groups inline, others as call_module of their callables, in
    the groups' order (a valid execution order, from the DP)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    getitems: dict[str, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
        ):
            getitems.setdefault(n.args[0].name, []).append(n)
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    root: dict[str, Any] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n.name] = g.node_copy(n, lambda a: env[a.name])
        elif n.op == "get_attr":  # lifted constants: the new module needs them too
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            root[str(n.target)] = obj
    for gi, (group, fn) in enumerate(zip(groups, compiled, strict=True)):
        if fn is None:
            for name in sorted(group.nodes, key=list(by_name).index):
                n = by_name[name]
                env[name] = g.node_copy(n, lambda a: env[a.name])
                for gitem in getitems.get(name, []):
                    env[gitem.name] = g.node_copy(gitem, lambda a: env[a.name])
            continue
        sub = f"group{gi}_{group.backend}"
        root[sub] = _GroupCall(fn, group.backend, len(group.nodes))
        call = g.call_module(sub, tuple(env[i] for i in group.arguments()))
        for k, o in enumerate(group.outputs):
            item = g.call_function(operator.getitem, (call, k))
            item.meta = dict(by_name[o].meta)
            stride = _eager_stride(by_name[o])
            if stride is not None:
                item = g.call_function(_restride, (item, stride))
                item.meta = dict(by_name[o].meta)
            env[o] = item
    out = next(n for n in gm.graph.nodes if n.op == "output")
    g.node_copy(out, lambda a: env[a.name])
    return fx.GraphModule(root, g)


# ---------------------------------------------------------------- the pass


def place_graph(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None,
    opts: PlacementOptions,
    input_kinds: Sequence[tuple[str, str]] | None = None,
) -> tuple[fx.GraphModule, PlacementResult]:
    """Places one ATen graph (inference, or a training graph's forward or backward, which
    AOTAutograd makes pure functions); returns the materialised module and the decision.

    input_kinds: (kind, source) per placeholder; "parameter"/"buffer" inputs are frozen into
    graph compilers' subgraphs when opts.freeze and real example inputs are given."""
    t_start = time.perf_counter()
    backends = get_backends(opts.backends)
    by_name: dict[str, Backend] = {b.name: b for b in backends}
    graph, _ = fx_bridge.to_ir(gm)
    inputs = list(example_inputs) if example_inputs is not None else synthesize_inputs(gm)
    recorder = _Recorder(gm)
    with torch.no_grad():
        recorder.run(*inputs)
    values = recorder.values
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    frozen: dict[str, torch.Tensor] = {}
    if opts.freeze and example_inputs is not None and input_kinds is not None:
        frozen = frozen_inputs(gm, inputs, input_kinds)
    # Weights (and their views, such as a linear's transposed weight): what a group finds cold
    # inside a model larger than the cache. All graph inputs where their kinds are unknown.
    weight_names = (
        {
            n
            for n, (kind, _) in zip(placeholders, input_kinds, strict=False)
            if kind in ("parameter", "buffer")
        }
        if input_kinds is not None
        else set(placeholders)
    )
    weights = {
        values[n].untyped_storage().data_ptr()
        for n in weight_names
        if isinstance(values.get(n), torch.Tensor)
    }
    cache_bytes = last_level_cache_bytes()
    cold = opts.cold_cache
    if cold is None:
        cold = footprint_bytes(values) > cache_bytes
    flush = _CacheFlush(cache_bytes) if cold else None

    phases: dict[str, float] = {}
    mark = [time.perf_counter()]

    def phase(name: str) -> None:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - mark[0]
        mark[0] = now

    phase("record")
    gen = _C.placement_candidates(graph, [b.rule_set for b in backends])
    cands = gen["candidates"]
    for c in cands:
        c["backend"] = backends[[b.rule_set for b in backends].index(c["backend"])].name

    # Bump when how groups are compiled or timed changes: cached figures must be comparable.
    versions = {"torch": torch.__version__, "torch_plugin.placement": PROFILE_VERSION}
    for b in backends:
        versions[b.name] = b.version()
    cache = ProfileCache(opts.cache_path)
    machine = machine_key("cpu", versions)
    measured = 0
    failures: list[str] = []
    costs: dict[int, float] = {}
    ops_of = {
        n.name: fx_bridge.op_name(n.target) if n.op == "call_function" else n.op
        for n in gm.graph.nodes
    }
    seen_sig: dict[tuple[str, str], Entry] = {}
    by_rule: dict[str, list[int]] = {}

    bar = None
    if opts.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cands), desc="placement: measuring", leave=False)
    try:
        for c in cands:
            if bar is not None:
                bar.update(1)
            backend = by_name[c["backend"]]
            signature = c["signature"] + ("|cold" if cold else "")
            if backend.graph_level and frozen:
                signature += "|frozen:" + ",".join(
                    str(k) for k, i in enumerate(c["inputs"]) if i in frozen
                )
            sig_key = (backend.name, signature)
            entry = seen_sig.get(sig_key)
            key = ProfileCache.key(backend.name, signature, machine)
            if entry is None:
                entry = cache.get(key)
            if entry is None:
                entry = _measure(gm, c, backend, values, opts.samples, frozen, weights, flush)
                measured += 1
                cache.put(key, backend.name, signature, entry)
                if not entry.ok:
                    failures.append(f"{backend.name} on {c['nodes'][:3]}: {entry.note}")
                    log.info(
                        "torch_plugin placement: %s excluded for group %s (%s)",
                        backend.name,
                        c["nodes"][:4],
                        entry.note,
                    )
            seen_sig[sig_key] = entry
            tally = by_rule.setdefault(f"{backend.name}:{c['rule']}", [0, 0])
            tally[0] += 1
            tally[1] += int(entry.ok)
            if entry.ok and entry.seconds is not None:
                costs[c["id"]] = entry.seconds
            elif backend.name == "aten":
                # Eager is the fallback every node must have: keep it, at a nominal cost.
                costs[c["id"]] = 1e-5
    finally:
        if bar is not None:
            bar.close()
    hits = cache.hits
    phase("measure")
    # The recorded intermediates served the measurements (real inputs, eager's references).
    # From here on they only give compiles their example arguments, which are traced, not
    # read: each becomes an untouched buffer of its shape and strides (no resident pages).
    # Held alongside what the DP's compiled groups keep, a model's activations ran full-size
    # NasNet at batch 8 (8.3 GB of module outputs) out of 24 GiB.
    values = _shapes_only(values, keep=set(placeholders))
    del recorder

    penalty = opts.switch_penalty_s
    boundary: dict[str, float] = {}
    if penalty is None:
        # Measured once per machine and cached, like the boundary probes below: a re-measured
        # penalty would let a warm compile's DP choose other groups than the cold one's (the
        # result must be deterministic given the cache).
        key = ProfileCache.key("host", "switch-penalty-v1", machine)
        entry = cache.get(key)
        if entry is None:
            entry = Entry(_measure_switch_penalty(opts.samples), True, "", 0.0)
            cache.put(key, "host", "switch-penalty-v1", entry)
        penalty = entry.seconds
        # What a backend's calls cost between ATen ops beyond their isolated time (waking its
        # thread pool, moving tensors in and out): measured once per machine, cached.
        for b in backends:
            if b.graph_level:
                key = ProfileCache.key(b.name, "boundary-probe-v1", machine)
                entry = cache.get(key)
                if entry is None:
                    entry = _measure_boundary(b, opts.samples)
                    cache.put(key, b.name, "boundary-probe-v1", entry)
                boundary[b.name] = entry.seconds or 0.0
    options = [
        (c["id"], c["node_ids"], costs[c["id"]] + boundary.get(c["backend"], 0.0), c["backend"])
        for c in cands
        if c["id"] in costs
    ]
    dp = _C.place_op_level(graph, options, penalty, opts.max_states, log.debug)
    by_id = {c["id"]: c for c in cands}
    groups = [
        Group(
            by_id[i]["backend"],
            by_id[i]["rule"],
            list(by_id[i]["nodes"]),
            list(by_id[i]["inputs"]),
            list(by_id[i]["outputs"]),
            costs[i],
            [ops_of.get(n, "?") for n in by_id[i]["nodes"]],
        )
        for i in dp["chosen"]
    ]
    result = PlacementResult(
        groups=groups,
        dp_cost_s=dp["cost"],
        dp_exact=dp["exact"],
        dp_states=dp["states"],
        candidates=len(cands),
        candidates_by_rule=by_rule,
        measured=measured,
        cache_hits=hits,
        failures=failures,
        switch_penalty_s=penalty,
        boundary_s=boundary,
        cold_cache=cold,
    )
    phase("dp")
    # Compiled on first use: a warm compile builds only the groups its replayed rounds and
    # pick use (the pick is often one whole-graph region; a wide graph's DP has hundreds).
    compiled = _LazyCompiled(gm, groups, by_name, values, frozen)
    evolve_backends = _pick_evolve_backends(opts, backends)
    evolving = opts.evolve and bool(evolve_backends)
    try:
        cached = None
        if evolving:
            decision_key = ProfileCache.key(
                "decision",
                _C.graph_signature(graph)
                + repr(
                    (
                        sorted(by_name),
                        [b.name for b in evolve_backends],
                        opts.max_evaluations,
                        opts.seed,
                        _placement_key(groups, frozen),
                    )
                ),
                machine,
            )
            cached = cache.get_decision(decision_key)
        if cached is None:
            compiled.compile_all()  # a cold search runs the DP's placement first
        phase("compile")
        if evolving:
            groups, compiled, evolution = _evolve(
                gm, groups, compiled, evolve_backends, values, inputs, opts, cached, frozen
            )
            if not evolution["cached"]:
                cache.put_decision(decision_key, evolution)
            placed = materialize(gm, groups, compiled)
            result.groups = groups
            result.evolution = evolution
            result.measured_dp_s = evolution["seed_fitness"]
            finalists_s = evolution["finalists_s"]
            picked = finalists_s[evolution["final"]] if finalists_s else -1.0
            result.measured_final_s = picked if picked > 0 else evolution["best_fitness"]
        else:
            placed = materialize(gm, groups, compiled)
            result.measured_dp_s = time_end_to_end(placed, inputs, opts.samples)
            result.measured_final_s = result.measured_dp_s
        phase("evolve")
        _check_outputs(placed, gm, inputs)
        # Never slower than the graph we were given: both measured now, side by side. The
        # verdict is cached with the placement it judged, so a warm compile returns what the
        # cold one did (a fresh re-measurement of a near tie could flip it).
        check_key = ProfileCache.key(
            "final-check",
            _C.graph_signature(graph) + repr(_placement_key(result.groups, frozen)),
            machine,
        )
        verdict = cache.get_decision(check_key)
        if not isinstance(verdict, dict) or not {"eager_s", "final_s"} <= verdict.keys():
            with torch.no_grad():
                eager_s = time_end_to_end(gm, inputs, opts.samples)
                final_s = time_end_to_end(placed, inputs, opts.samples)
            verdict = {"eager_s": eager_s, "final_s": final_s}
            cache.put_decision(check_key, verdict)
        result.measured_eager_s = float(verdict["eager_s"])
        final_s = float(verdict["final_s"])
    finally:
        cache.close()
    if final_s > result.measured_eager_s * 1.02:
        log.info(
            "torch_plugin placement: the placed graph measured %.3f ms, eager %.3f ms; "
            "keeping eager",
            final_s * 1e3,
            result.measured_eager_s * 1e3,
        )
        placed = gm
        result.kept_eager = True
        result.groups = [
            Group("aten", "op", [n], [], [], 0.0, [ops_of.get(n, "?")])
            for n in (node.name for node in gm.graph.nodes)
            if ops_of.get(n) not in ("placeholder", "output")
        ]
    phase("check")
    result.phase_s = phases
    result.search_s = time.perf_counter() - t_start
    return placed, result


def frozen_inputs(
    gm: fx.GraphModule, inputs: Sequence[Any], input_kinds: Sequence[tuple[str, str]]
) -> dict[str, torch.Tensor]:
    """The graph's parameter and buffer inputs by placeholder name: what graph compilers'
    subgraphs take as constants when weights are frozen."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return {
        name: x
        for name, (kind, _), x in zip(placeholders, input_kinds, inputs, strict=False)
        if kind in ("parameter", "buffer") and isinstance(x, torch.Tensor)
    }


def compile_region(
    gm: fx.GraphModule,
    nodes: Sequence[str],
    backend: Backend,
    values: dict[str, Any],
    consts: dict[str, torch.Tensor],
    rule: str,
) -> tuple[Group, Callable[..., Any]]:
    """`nodes` (a convex stretch of `gm`) as one region of `backend`, compiled with the
    recorded values of its inputs; `consts` inputs become constants of the region. Raises
    what the backend raises."""
    inputs, outputs = _region(gm, nodes)
    call_inputs = [x for x in inputs if x not in consts]
    sub = build_subgraph(gm, nodes, inputs, outputs, consts)
    fn = backend.compile(sub, [values[x] for x in call_inputs], rule)
    return Group(backend.name, "region", list(nodes), inputs, outputs, 0.0, [], call_inputs), fn


def _placement_key(groups: Sequence[Group], frozen: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    """What a cached decision about a placement depends on: its groups and which weights are
    frozen (frozen weights compile, and run, differently)."""
    return [(g.backend, g.rule, g.nodes) for g in groups], sorted(frozen)


def _frozen_for(backend: Backend, frozen: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return frozen if backend.graph_level else {}


def _measure(
    gm: fx.GraphModule,
    c: dict[str, Any],
    backend: Backend,
    values: dict[str, Any],
    samples: int,
    frozen: dict[str, torch.Tensor],
    weights: set[int] | None = None,
    flush: _CacheFlush | None = None,
) -> Entry:
    """Compiles candidate `c` on `backend`, checks it against eager once and times it.
    weights: storages that a flush leaves cold; the group's other inputs are read back in."""
    consts = _frozen_for(backend, frozen)
    args = [values[i] for i in c["inputs"] if i not in consts]
    warm = [
        a
        for a in args
        if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() not in (weights or ())
    ]
    refs = [values[o] for o in c["outputs"]]
    t0 = time.perf_counter()
    try:
        sub = build_subgraph(gm, c["nodes"], c["inputs"], c["outputs"], consts)
        if backend.name == "aten":
            fn: Callable[..., Any] = _direct_aten(sub)
        else:
            if not all(isinstance(a, torch.Tensor) for a in args + refs):
                raise BackendError("non-tensor inputs or outputs")
            fn = backend.compile(sub, args, c["rule"])
        compile_s = time.perf_counter() - t0
        with torch.no_grad():
            got = list(fn(*args))
            if len(got) != len(refs) or not all(
                _close(a, b, backend.rtol, backend.atol) for a, b in zip(got, refs, strict=False)
            ):
                return Entry(None, False, "wrong numerics vs eager", compile_s)
            prepare = None if flush is None else (lambda: flush(warm))
            seconds = time_call(fn, args, samples, prepare=prepare)
        return Entry(seconds, True, "", compile_s)
    except Exception as e:  # noqa: BLE001 - a backend failing on a group only excludes it
        return Entry(None, False, f"{type(e).__name__}: {str(e)[:200]}", time.perf_counter() - t0)


def _measure_boundary(backend: Backend, samples: int) -> Entry:
    """Extra seconds a call to `backend` costs when it alternates with ATen ops, over the sum
    of both alone: a 128x128 matmul probe, big enough for the backend to use its threads."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 128, generator=gen)
    w = torch.randn(128, 128, generator=gen)
    probe = torch.fx.experimental.proxy_tensor.make_fx(lambda a, b: (torch.mm(a, b),))(x, w)
    try:
        fn = backend.compile(probe, [x, w], "fusion")
        alone = time_call(fn, [x, w], samples)
        aten = time_call(torch.add, [x, 1.0], samples)

        def alternating(a: torch.Tensor, b: torch.Tensor) -> Any:
            return fn(torch.add(a, 1.0), b)

        both = time_call(alternating, [x, w], samples)
        return Entry(max(0.0, both - alone - aten), True, "", 0.0)
    except Exception as e:  # noqa: BLE001 - no probe, no extra penalty
        return Entry(0.0, True, f"probe failed: {type(e).__name__}: {e}", 0.0)


def _measure_switch_penalty(samples: int) -> float:
    """Seconds the host graph pays to call a group module and unpack its outputs."""
    x = torch.zeros(1)
    mod = _GroupCall(lambda a: (a,), "probe", 1)

    def via_module(a: torch.Tensor) -> Any:
        return mod(a)[0]

    def inline(a: torch.Tensor) -> Any:
        return a

    return max(0.0, time_call(via_module, [x], samples) - time_call(inline, [x], samples))


class _LazyCompiled(Sequence):
    """Each non-ATen group's callable (None for ATen), compiled on first access. Compiling
    sets the group's call_inputs (its inputs less frozen ones); a group that fails to compile
    now (it measured fine once) runs on ATen, with a warning."""

    def __init__(
        self,
        gm: fx.GraphModule,
        groups: Sequence[Group],
        backends: dict[str, Backend],
        values: dict[str, Any],
        frozen: dict[str, torch.Tensor],
    ) -> None:
        self._gm, self._groups, self._backends = gm, groups, backends
        self._values, self._frozen = values, frozen
        self._fns: dict[int, Callable[..., Any] | None] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - int or slice, as a list's
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        if i not in self._fns:
            self._fns[i] = self._compile(self._groups[i])
        return self._fns[i]

    def __iter__(self) -> Iterator[Callable[..., Any] | None]:
        # Explicit: Sequence's own __iter__ would end silently on an IndexError from a compile.
        for i in range(len(self)):
            yield self[i]

    def compile_all(self) -> None:
        for _ in self:
            pass

    def _compile(self, g: Group) -> Callable[..., Any] | None:
        if g.backend == "aten":
            return None
        consts = _frozen_for(self._backends[g.backend], self._frozen)
        g.call_inputs = [i for i in g.inputs if i not in consts]
        sub = build_subgraph(self._gm, g.nodes, g.inputs, g.outputs, consts)
        try:
            args = [self._values[i] for i in g.call_inputs]
            return self._backends[g.backend].compile(sub, args, g.rule)
        except Exception as e:  # noqa: BLE001 - measured fine once; if not now, ATen runs it
            log.warning(
                "torch_plugin placement: %s failed to compile group %s (%s); it runs on aten",
                g.backend,
                g.nodes[:4],
                e,
            )
            g.backend, g.rule, g.call_inputs = "aten", "op", None
            return None


def _pick_evolve_backends(opts: PlacementOptions, backends: Sequence[Backend]) -> list[Backend]:
    """The graph-level compilers the search offloads to, one round each, in order."""
    # Cheapest compilers first: each round gets an equal share of the remaining budget, and
    # a fast compiler's round leaves time for the slow one's whole-graph individual.
    order = {"onnxruntime": 0, "openvino": 1, "inductor": 2}
    graph_level = sorted(
        (b for b in backends if b.graph_level), key=lambda b: order.get(b.name, len(order))
    )
    if opts.evolve_backend is not None:
        chosen = [b for b in graph_level if b.name == opts.evolve_backend]
        if not chosen:
            log.warning(
                "torch_plugin placement: evolve_backend %r is not an available graph-level "
                "backend; skipping the evolutionary search",
                opts.evolve_backend,
            )
        return chosen
    return graph_level


def _evolve(
    gm: fx.GraphModule,
    groups: list[Group],
    compiled: Sequence[Callable[..., Any] | None],
    evolve_backends: Sequence[Backend],
    values: dict[str, Any],
    inputs: Sequence[Any],
    opts: PlacementOptions,
    cached: dict[str, Any] | None,
    frozen: dict[str, torch.Tensor],
) -> tuple[list[Group], Sequence[Callable[..., Any] | None], dict[str, Any]]:
    """One evolutionary round per graph-level compiler, each seeded with the previous result
    (the first with the DP's): so the final program can mix regions of several compilers."""
    deadline = time.perf_counter() + opts.time_budget_s
    rounds: list[dict[str, Any]] = []
    cached_rounds = (cached or {}).get("rounds", [])
    # The seed, then per round the whole graph on its compiler and the round's result, as
    # thunks: the final pick among them is measured again (a warm compile builds its pick).
    finalists: list[Callable[[], Built]] = [lambda g=groups, c=compiled: (g, c)]
    for k, backend in enumerate(evolve_backends):
        hit = None
        if k < len(cached_rounds) and cached_rounds[k].get("backend") == backend.name:
            hit = cached_rounds[k]
        groups, compiled, info, whole = _evolve_round(
            gm,
            groups,
            compiled,
            backend,
            values,
            inputs,
            opts,
            hit,
            max(0.0, deadline - time.perf_counter()) / (len(evolve_backends) - k),
            _frozen_for(backend, frozen),
        )
        rounds.append(info)
        finalists += [whole, lambda g=groups, c=compiled: (g, c)]
    cached_all = all(r.get("cached", False) for r in rounds)
    final = (cached or {}).get("final") if cached_all else None
    final_s: list[float] = []
    if isinstance(final, int) and 0 <= final < len(finalists):
        chosen = finalists[final]()
    else:
        final, final_s, chosen = _pick_finalist(gm, finalists, inputs, opts.samples)
    summary = {
        "rounds": rounds,
        "seed_fitness": rounds[0]["seed_fitness"],
        "best_fitness": min(r["best_fitness"] for r in rounds),
        "evaluations": sum(r["evaluations"] for r in rounds),
        "cached": cached_all,
        "final": final,
        "finalists_s": final_s,
    }
    return chosen[0], chosen[1], summary


def _pick_finalist(
    gm: fx.GraphModule,
    finalists: Sequence[Callable[[], Built]],
    inputs: Sequence[Any],
    samples: int,
    turns: int = 3,
) -> tuple[int, list[float], Built]:
    """The fastest of the seed and the rounds' results, measured in turns (median of each
    one's turns). Each round kept its best by one measurement per individual; on a
    sub-millisecond graph two such measurements differ by up to 10-50% (another runtime's
    thread pool still spinning, the machine's drift), so a later round's "better" result can
    be noise, and rounds compound it. Re-measuring a handful of finalists side by side keeps
    the search from returning a placement slower than one it already held."""
    built = [make() for make in finalists]
    # The same placement reached twice (a round that kept its seed) is measured once.
    first: dict[tuple[Any, ...], int] = {}
    for k, (gs, _) in enumerate(built):
        first.setdefault(tuple((g.backend, tuple(g.nodes)) for g in gs), k)
    distinct = sorted(first.values())
    medians = [math.inf] * len(built)
    if len(distinct) > 1:
        modules = {k: materialize(gm, *built[k]) for k in distinct}
        times: dict[int, list[float]] = {k: [] for k in distinct}
        with torch.no_grad():
            # Numbers checked once per finalist, not on every turn.
            modules = {k: m for k, m in modules.items() if _outputs_match(m, gm, inputs, 1e-3)}
            for _ in range(turns):
                for k, mod in modules.items():
                    times[k].append(time_end_to_end(mod, inputs, samples))
        for k, t in times.items():
            medians[k] = statistics.median(t) if t else math.inf
    else:
        medians[distinct[0]] = 0.0
    best = min(distinct, key=medians.__getitem__)
    if not math.isfinite(medians[best]):
        best = 0  # nothing measurable: the seed, which the caller checks against eager
    log.info(
        "torch_plugin placement: finalists (seed, then whole graph and result per round) "
        "%s ms; picked %d",
        ", ".join("-" if not math.isfinite(m) else f"{m * 1e3:.3f}" for m in medians),
        best,
    )
    return best, [m if math.isfinite(m) else -1.0 for m in medians], built[best]


def _evolve_round(
    gm: fx.GraphModule,
    groups: list[Group],
    compiled: Sequence[Callable[..., Any] | None],
    backend: Backend,
    values: dict[str, Any],
    inputs: Sequence[Any],
    opts: PlacementOptions,
    cached: dict[str, Any] | None,
    budget_s: float,
    consts: dict[str, torch.Tensor],
) -> tuple[list[Group], Sequence[Callable[..., Any] | None], dict[str, Any], Callable[[], Built]]:
    """Bits over the current groups: set = run by `backend`, with consecutive set groups (a
    contiguous stretch of a topological order, hence convex) merged into one region; a clear
    bit keeps the group as it is (a group of `backend` goes back to ATen). Returns the round's
    result and a thunk that builds the whole graph as one region of `backend`."""
    region_cache: dict[tuple[str, ...], tuple[Group, Callable[..., Any]] | None] = {}
    seed = [g.backend == backend.name for g in groups]

    def build(bits: Sequence[bool]) -> Built:
        out_groups: list[Group] = []
        out_fns: list[Callable[..., Any] | None] = []
        i = 0
        while i < len(groups):
            if not bits[i]:
                g = groups[i]
                if g.backend == backend.name:  # turned off: back to ATen
                    out_groups.append(dataclasses.replace(g, backend="aten", rule="op"))
                    out_fns.append(None)
                else:
                    out_groups.append(g)
                    out_fns.append(compiled[i])
                i += 1
                continue
            j = i
            while j < len(groups) and bits[j]:
                j += 1
            nodes = [n for g in groups[i:j] for n in g.nodes]
            key = tuple(nodes)
            if key not in region_cache:
                # "graph": the whole graph, with no other runtime between its calls.
                rule = "graph" if i == 0 and j == len(groups) else "region"
                try:
                    region_cache[key] = compile_region(gm, nodes, backend, values, consts, rule)
                except Exception as e:  # noqa: BLE001 - this region keeps its groups
                    log.info(
                        "torch_plugin placement: %s cannot compile a region of %d nodes (%s)",
                        backend.name,
                        len(nodes),
                        e,
                    )
                    region_cache[key] = None
            hit = region_cache[key]
            if hit is None:
                out_groups.extend(groups[i:j])
                out_fns.extend(compiled[i:j])
            else:
                region, fn = hit
                out_groups.append(
                    dataclasses.replace(
                        region,
                        seconds=sum(g.seconds for g in groups[i:j]),
                        ops=[o for g in groups[i:j] for o in g.ops],
                    )
                )
                out_fns.append(fn)
            i = j
        return out_groups, out_fns

    def fitness(bits: list[bool]) -> float:
        try:
            gs, fns = build(bits)
            mod = materialize(gm, gs, fns)
            with torch.no_grad():
                if not _outputs_match(mod, gm, inputs, 1e-3):
                    return math.inf
                return time_end_to_end(mod, inputs, opts.samples)
        except Exception as e:  # noqa: BLE001 - an individual that fails is just unfit
            log.debug("torch_plugin placement: individual failed (%s)", e)
            return math.inf

    def whole() -> Built:
        return build([True] * len(groups))

    if cached is not None and len(cached.get("best", [])) == len(groups):
        # A warm compile: this round already ran for this graph, options and machine.
        best = [bool(b) for b in cached["best"]]
        gs, fns = build(best) if best != seed else (groups, compiled)
        return gs, fns, dict(cached, cached=True), whole

    bar = None
    progress = None
    if opts.progress:
        from tqdm import tqdm

        bar = tqdm(
            total=opts.max_evaluations, desc=f"placement: evolving ({backend.name})", leave=False
        )

        def progress(gen: int, best: float, evals: int) -> None:
            bar.n = evals
            bar.set_postfix(best_ms=f"{best * 1e3:.3f}")
            bar.refresh()

    try:
        r = _C.evolve_placement(
            seed,
            fitness,
            population=8,
            generations=10,
            min_improvement=0.02,
            rng_seed=opts.seed,
            max_evaluations=opts.max_evaluations,
            time_budget_s=budget_s if budget_s > 0 else 1e-9,
            progress=progress,
            log=log.debug,
        )
    finally:
        if bar is not None:
            bar.close()
    info = {
        k: r[k]
        for k in (
            "best",
            "best_fitness",
            "seed_fitness",
            "evaluations",
            "generations",
            "stopped_by_deadline",
        )
    }
    info["backend"] = backend.name
    info["offloaded"] = int(sum(r["best"]))
    if r["best"] == seed:
        return groups, compiled, info, whole
    gs, fns = build(r["best"])
    return gs, fns, info, whole


def _region(gm: fx.GraphModule, nodes: Sequence[str]) -> tuple[list[str], list[str]]:
    """Inputs and outputs (by value name) of a set of nodes, as the IR names them."""
    group = set(nodes)
    for n in gm.graph.nodes:
        if (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
            and n.args[0].name in group
        ):
            group.add(n.name)
    inputs: list[str] = []
    outputs: list[str] = []
    for n in gm.graph.nodes:
        if n.name not in group:
            continue
        for a in n.all_input_nodes:
            if a.name not in group and a.name not in inputs:
                inputs.append(a.name)
        tuple_node = any(u.target is operator.getitem for u in n.users)
        if not tuple_node and any(u.name not in group for u in n.users):
            outputs.append(n.name)
    return inputs, outputs


def _outputs_match(
    mod: fx.GraphModule, ref: fx.GraphModule, inputs: Sequence[Any], tol: float
) -> bool:
    try:
        got = mod(*inputs)
    except Exception as e:  # noqa: BLE001 - a placement that cannot run is unfit, not fatal
        log.info(
            "torch_plugin placement: a candidate placement failed to run (%s: %s)",
            type(e).__name__,
            e,
        )
        return False
    want = ref(*inputs)
    got_l = list(got) if isinstance(got, (tuple, list)) else [got]
    want_l = list(want) if isinstance(want, (tuple, list)) else [want]
    return len(got_l) == len(want_l) and all(
        _close(a, b, tol, tol) for a, b in zip(got_l, want_l, strict=True)
    )


def _check_outputs(placed: fx.GraphModule, gm: fx.GraphModule, inputs: Sequence[Any]) -> None:
    with torch.no_grad():
        if not _outputs_match(placed, gm, inputs, 1e-3):
            raise BackendError("the placed graph's outputs differ from eager's; not using it")
