"""benchmarks/real_size_inference.py times ours on the program its cold compile picked: the timing
process's first call of ours reads that compile's profile cache, and only that call."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_ours_first_call_reads_the_cold_compiles_profile_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import real_size_inference as bench

    seen: list[str | None] = []

    def compiled(*args: Any) -> Any:
        seen.append(os.environ.get("TORCH_PLUGIN_PROFILE_DB"))
        return args

    monkeypatch.setattr(torch, "compile", lambda *a, **k: compiled)
    monkeypatch.setenv("TORCH_PLUGIN_PROFILE_DB", "/timing/profile.db")
    monkeypatch.setenv("BENCH_OURS_PROFILE_DB", "/ours/profile.db")
    monkeypatch.delenv("BENCH_OURS_BF16_PROFILE_DB", raising=False)
    fns = bench.contenders(torch.nn.Identity(), (), ["ours", "ours_bf16"])
    fns["ours"](1)
    fns["ours"](2)
    # The compile (first call) reads the cold compile's cache; later calls and what runs after
    # them see the timing process's own.
    assert seen == ["/ours/profile.db", "/timing/profile.db"]
    assert os.environ["TORCH_PLUGIN_PROFILE_DB"] == "/timing/profile.db"
    # Without a cold compile's cache named, a contender decides in the timing process.
    assert fns["ours_bf16"] is compiled


def test_the_timing_child_is_handed_each_cold_compiles_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import real_size_inference as bench

    envs: list[tuple[list[str], dict[str, str]]] = []

    def child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
        envs.append((args, env))
        return {"model": "bert", "batch": 1} if args[0] == "--time" else {}

    monkeypatch.setattr(bench, "_child", child)
    monkeypatch.setattr(bench, "_ratios", lambda row: row)
    bench.run(["bert"], [1], 1, {})
    compiles = {a[-1]: e for a, e in envs if a[0] == "--compile"}
    ((_, timing),) = [(a, e) for a, e in envs if a[0] == "--time"]
    for c in ("ours", "ours_bf16", "ours_high"):
        assert timing[f"BENCH_{c.upper()}_PROFILE_DB"] == compiles[c]["TORCH_PLUGIN_PROFILE_DB"]
    assert timing["TORCH_PLUGIN_PROFILE_DB"] != compiles["ours"]["TORCH_PLUGIN_PROFILE_DB"]


def test_the_high_contenders_compile_and_run_under_high_and_restore_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import real_size_inference as bench

    seen: list[str] = []

    def compiled(*args: Any) -> Any:
        seen.append(torch.get_float32_matmul_precision())
        return args

    monkeypatch.setattr(torch, "compile", lambda *a, **k: compiled)
    monkeypatch.delenv("BENCH_OURS_HIGH_PROFILE_DB", raising=False)
    before = torch.get_float32_matmul_precision()
    fns = bench.contenders(torch.nn.Identity(), (), ["ours_high", "inductor_freezing_high", "ours"])
    for name in ("ours_high", "inductor_freezing_high", "ours"):
        fns[name](1)
    assert seen == ["high", "high", before]
    assert torch.get_float32_matmul_precision() == before
    row = bench._ratios(
        {"ms": {"ours_high": 5.0, "inductor_freezing_high": 9.0, "onnxruntime": 8.0, "ours": 7.0}}
    )
    assert row["best_f32_high"] == "onnxruntime" and row["ratio_f32_high"] == 8.0 / 5.0
