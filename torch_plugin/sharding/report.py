"""The sharding plan as users read it: specs, bytes per rank, collectives, modelled times; a
table and a PNG."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import _C


@dataclasses.dataclass
class ShardingPlan:
    """What the planner chose, for people: `print(plan)` shows the table, `save_png` a chart."""

    world: int
    device: str
    params: list[tuple[str, tuple[int, ...], str, int]]  # name, shape, spec, bytes on this rank
    collectives: list[dict[str, Any]]
    compute_s: float
    comm_s: float
    grad_sync_s: float
    param_bytes_per_rank: float
    solve_status: str
    variables: int
    constraints: int
    level: str
    raw: _C.ShardingPlan | None = dataclasses.field(repr=False, default=None)  # the C++ plan
    # Training: activations the forward keeps for the backward, per rank (example batch).
    activation_bytes_per_rank: float = 0.0
    # Training: parameters + gradients + optimizer state per rank, after ZeRO.
    state_bytes_per_rank: float = 0.0
    # Parameters whose optimizer state is sharded (ZeRO-1) -> over how many copies.
    zero_copies: dict[str, int] = dataclasses.field(default_factory=dict)
    zero_stage: dict[str, int] = dataclasses.field(default_factory=dict)  # 1 or 2
    zero_gather_s: float = 0.0
    dp: int = 1

    def table(self) -> str:
        lines = [
            f"sharding plan on {f'{self.dp} dp x ' if self.dp > 1 else ''}{self.world} tp ranks "
            f"(modelled on {self.device}; {self.level} ILP, "
            f"{self.variables} variables, {self.constraints} constraints, {self.solve_status})",
            f"{'parameter':<52} {'shape':<16} {'spec':<6} {'bytes/rank':>12} "
            f"{'optimizer state':>16}",
        ]
        for name, shape, spec, nbytes in self.params:
            copies = self.zero_copies.get(name)
            stage = self.zero_stage.get(name, 1)
            state = f"1/{copies} (ZeRO-{stage})" if copies else "whole"
            lines.append(f"{name:<52} {str(list(shape)):<16} {spec:<6} {nbytes:>12,} {state:>16}")
        lines.append(f"{'collective':<16} {'value':<36} {'from->to':<10} {'bytes':>12} {'ms':>8}")
        for c in self.collectives:
            lines.append(
                f"{c['kind']:<16} {c['value']:<36} {c['from_spec'] + '->' + c['to_spec']:<10} "
                f"{int(c['bytes']):>12,} {c['seconds'] * 1e3:>8.3f}"
            )
        lines.append(
            f"modelled per step: compute {self.compute_s * 1e3:.3f} ms, collectives "
            f"{self.comm_s * 1e3:.3f} ms, gradient sync {self.grad_sync_s * 1e3:.3f} ms"
            + (f" (and over {self.dp} dp replicas)" if self.dp > 1 else "")
            + (f", ZeRO collectives {self.zero_gather_s * 1e3:.3f} ms" if self.zero_copies else "")
            + f"; parameters {self.param_bytes_per_rank / 2**20:.2f} MiB per rank, with gradients "
            f"and optimizer state {self.state_bytes_per_rank / 2**20:.2f} MiB, saved "
            f"activations {self.activation_bytes_per_rank / 2**20:.2f} MiB per rank"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def save_png(self, path: str) -> None:
        """A bar chart of parameter bytes per rank by spec and of modelled time by kind."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        by_spec: dict[str, int] = {}
        for _, _, spec, nbytes in self.params:
            by_spec[spec] = by_spec.get(spec, 0) + nbytes
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        a.bar(list(by_spec), [v / 2**20 for v in by_spec.values()])
        a.set_title("parameter MiB per rank by spec")
        kinds = {
            "compute": self.compute_s,
            "collectives": self.comm_s,
            "grad sync": self.grad_sync_s,
        }
        b.bar(list(kinds), [v * 1e3 for v in kinds.values()])
        b.set_title(f"modelled ms per step ({self.device}, {self.world} ranks)")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
