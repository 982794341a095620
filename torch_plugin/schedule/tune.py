"""Schedule auto-tuning (Slapo section 3.4): symbolic variables in a schedule define a search
space; the C++ search (`csrc/passes/schedule_tune.cc`, exhaustive or randomized coordinate
descent) picks points, a user-given evaluation scores them.

    space = torch_plugin.schedule.Space()
    space.create_symbol("ckpt_ratio", [0.0, 0.25, 0.5, 1.0])
    space.create_symbol("batch", [4, 8, 16])
    space.constraint(lambda cfg: cfg["batch"] * (1 - cfg["ckpt_ratio"]) <= 8)  # dependent domains
    result = torch_plugin.schedule.tune(space, evaluate, method="coordinate_descent")
    print(result.table())

`evaluate(cfg)` returns a score (higher is better, e.g. samples/s); raising, or returning None,
marks the point failed (out of memory, an error), and the search goes on. It may instead be a
command (list of strings with `{name}` placeholders) whose last number printed is the score.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from .. import _C

log = logging.getLogger("torch_plugin.schedule")


class Space:
    """Named variables, each a finite list of candidates, and constraints between them."""

    def __init__(self) -> None:
        self.symbols: dict[str, list[Any]] = {}
        self.constraints: list[Callable[[dict[str, Any]], bool]] = []

    def create_symbol(self, name: str, candidates: Sequence[Any]) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError("a symbol needs a non-empty name")
        if name in self.symbols:
            raise ValueError(f"symbol {name!r} already exists")
        candidates = list(candidates)
        if not candidates:
            raise ValueError(f"symbol {name!r} needs at least one candidate")
        self.symbols[name] = candidates
        return name

    def constraint(self, fn: Callable[[dict[str, Any]], bool]) -> None:
        """Points where fn(cfg) is false are skipped without evaluating them."""
        self.constraints.append(fn)

    def config(self, point: Sequence[int]) -> dict[str, Any]:
        return {n: c[i] for (n, c), i in zip(self.symbols.items(), point, strict=True)}

    def size(self) -> int:
        n = 1
        for c in self.symbols.values():
            n *= len(c)
        return n


@dataclasses.dataclass
class TuneResult:
    best: dict[str, Any] | None
    best_score: float | None
    trials: list[tuple[dict[str, Any], float | None]]
    space_size: int
    method: str
    stopped_by_budget: bool
    skipped: int = 0  # points a constraint ruled out (not evaluated)

    def table(self) -> str:
        names = list(self.trials[0][0]) if self.trials else []
        lines = [
            f"{self.method}: {len(self.trials)} of {self.space_size} points visited, "
            f"{self.skipped} ruled out by constraints"
            + (" (budget reached)" if self.stopped_by_budget else ""),
            "  ".join(f"{n:>12}" for n in [*names, "score"]),
        ]
        for cfg, score in self.trials:
            mark = " *" if cfg == self.best else ""
            shown = "skip/fail" if score is None else f"{score:.6g}"
            lines.append("  ".join(f"{cfg[n]!s:>12}" for n in names) + f"  {shown:>12}{mark}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=str)


def _command_score(command: Sequence[str], cfg: dict[str, Any], timeout_s: float) -> float | None:
    args = [part.format(**cfg) for part in command]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    numbers = re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", done.stdout)
    if done.returncode != 0 or not numbers:
        log.info(
            "schedule tune: %s failed (exit %d): %s", args, done.returncode, done.stderr[-300:]
        )
        return None
    return float(numbers[-1])


def tune(
    space: Space,
    evaluate: Callable[[dict[str, Any]], float | None] | Sequence[str],
    *,
    method: str = "exhaustive",
    max_evaluations: int = 0,
    time_budget_s: float = 0.0,
    seed: int = 0,
    restarts: int = 1,
    progress: bool = True,
    command_timeout_s: float = 600.0,
) -> TuneResult:
    """Searches `space` for the best score of `evaluate`; see the module docstring."""
    if not space.symbols:
        raise ValueError("the space has no symbols: space.create_symbol(name, candidates)")
    if method not in ("exhaustive", "coordinate_descent"):
        raise ValueError(f"unknown method {method!r}; methods: exhaustive, coordinate_descent")
    if isinstance(evaluate, str):
        raise TypeError("a command evaluation is a list of arguments, e.g. ['python', 'b.py']")
    if not callable(evaluate):
        command = list(evaluate)
        evaluate = lambda cfg: _command_score(command, cfg, command_timeout_s)  # noqa: E731

    skipped = [0]

    def score(point: list[int]) -> float | None:
        cfg = space.config(point)
        if not all(c(cfg) for c in space.constraints):
            skipped[0] += 1
            return None
        try:
            value = evaluate(cfg)
        except Exception as e:  # noqa: BLE001 - a failed point is pruned, the search goes on
            log.info("schedule tune: %s failed: %s: %s", cfg, type(e).__name__, e)
            return None
        return None if value is None else float(value)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=max_evaluations or space.size(), desc=f"tune ({method})", leave=False)

    def on_trial(n: int, point: list[int], s: float | None, best: float | None) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix(best=best)

    try:
        pm = _C.PassManager(log=log.info, time_budget_s=time_budget_s)
        raw = pm.tune_schedule(
            [len(c) for c in space.symbols.values()],
            score,
            _C.TuneOptions(
                method=method, max_evaluations=max_evaluations, seed=seed, restarts=restarts
            ),
            progress=on_trial,
        )
    finally:
        if bar is not None:
            bar.close()
    return TuneResult(
        best=space.config(raw.best) if raw.best else None,
        best_score=raw.best_score if raw.best else None,
        trials=[(space.config(t.point), t.score) for t in raw.trials],
        space_size=raw.space_size,
        method=method,
        stopped_by_budget=raw.stopped_by_budget,
        skipped=skipped[0],
    )
