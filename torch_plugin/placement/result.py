"""What the placement pass decided for one graph (groups, figures) and how it is shown."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from .bf16x3 import MIN_ROWS


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
    # Per backend, the candidate groups left unmeasured when time_budget_s ran out.
    unmeasured: dict[str, int] = dataclasses.field(default_factory=dict)
    failures: list[str] = dataclasses.field(default_factory=list)
    search_s: float = 0.0
    switch_penalty_s: float = 0.0
    boundary_s: dict[str, float] = dataclasses.field(default_factory=dict)
    kept_eager: bool = False  # the placement measured slower than the unplaced graph
    cold_cache: bool = False  # groups were timed with the last-level cache evicted
    phase_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # Why the finer search stopped after its DP without building a placement (place_graph's
    # beat_s); empty when it built one.
    not_built: str = ""
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
        if w is not None and w.get("known_graph"):  # known_graphs.recall: what placed it then
            return (
                f"{w['known_graph']}; now from its saved model before AOTAutograd in "
                f"{self.search_s:.1f} s (known graph)"
            )
        if w is None:
            counts = ", ".join(f"{k} {v}" for k, v in self.backend_counts().items())
            return (
                f"{self.kind} graph: {counts} nodes; eager {_ms(self.measured_eager_s)}, "
                f"placed {_ms(self.measured_final_s)}; search {self.search_s:.1f} s"
            )
        trials = ", ".join(
            f"{t['backend']} {_ms(t['median_s'])}"
            if t["compiled"]
            else f"{t['backend']} {'skipped (' + t['skipped'] + ')' if t['skipped'] else 'failed'}"
            for t in w["trials"]
        )
        return (
            f"{self.kind} graph ({sum(self.backend_counts().values())} nodes): "
            f"{w['pick'] if not w.get('refined') else 'finer placement'} "
            f"({_ms(self.measured_final_s)}; whole graphs: {trials})"
            + (f"; {self.frozen} weights frozen" if self.frozen else "")
            + _precision_note(w)
            + f"; compiled in {self.search_s:.1f} s"
            + (" (cached decision)" if w.get("cached") else f"; {w['reason']}")
        )

    def table(self) -> str:
        """One line per group run outside ATen, and totals per backend."""
        if self.whole_graph is not None and not self.whole_graph.get("refined"):
            if "finer_not_built" in self.whole_graph:
                return f"{self.summary()}\nfiner search: {self.whole_graph['finer_not_built']}"
            if "finer_s" not in self.whole_graph:
                return self.summary()
            # The finer search ran (the explicit pass) and measured slower: what it saw.
            return (
                f"{self.summary()}\nfiner search: {_ms(self.whole_graph['finer_s'])}, kept "
                f"the whole graph; candidates {self.candidates}, measured {self.measured}, "
                f"cache hits {self.cache_hits}"
                + ("; groups timed with the cache cold" if self.cold_cache else "")
            )
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


def _precision_note(w: dict[str, Any]) -> str:
    """Where the precision is not f32, or f32 linears may run as three bf16 products ("high"
    matmul precision): what the pick computes in and its measured error."""
    precision = w.get("precision", "f32")
    pick = w["pick"]
    if precision == "f32":
        if w.get("compute", {}).get(pick) != "f32x3":
            return ""
        linears = w.get("bf16x3_linears", {}).get(pick, 0)
        if not linears:
            return (
                f"; float32 matmul precision 'high': no linear of {MIN_ROWS} rows or more, all f32"
            )
        err = w.get("errors", {}).get(pick)
        return f"; float32 matmul precision 'high': {linears} linears as three bf16 products" + (
            f", error {err:.1e}" if err is not None else ""
        )
    if w.get("refined"):
        return f"; {precision} precision: the finer placement's regions compute in f32"
    compute = w.get("compute", {}).get(pick, "f32") if pick != "eager" else "eager's dtypes"
    err = w.get("errors", {}).get(pick)
    return f"; {precision} precision: the pick computes in {compute}" + (
        f", error {err:.1e}" if err is not None else ""
    )
