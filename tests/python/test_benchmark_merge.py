"""A --merge run of a benchmark keeps the saved rows it does not measure again, each naming the
run it came from (issue 42: a merged table spans several commits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

# The repository root on sys.path for the test only: benchmarks/ has modules named like the
# tests' own helpers (user_programs), which later tests' workers must not pick up.
ROOT = Path(__file__).resolve().parents[2]


def test_kept_rows_name_their_run_and_skip_what_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.provenance import kept_rows

    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(
            {
                "commit": "aaa",
                "dirty": False,
                "machine": {"cpu": "x"},
                "rows": [
                    {"model": "bert", "batch": 1, "ms": 1.0},
                    {"model": "bert", "batch": 8, "ms": 8.0},
                    {"model": "vit", "batch": 1, "ms": 2.0, "commit": "bbb"},
                ],
            }
        )
    )
    kept = kept_rows(path, {("bert", 1)})
    assert [(r["model"], r["batch"]) for r in kept] == [("bert", 8), ("vit", 1)]
    assert kept[0]["commit"] == "aaa" and kept[0]["machine"] == {"cpu": "x"}
    assert kept[1]["commit"] == "bbb"  # a row that names its commit keeps it
    assert kept_rows(tmp_path / "absent.json", set()) == []
    by_model = kept_rows(path, {("bert",)}, key=("model",))
    assert [r["model"] for r in by_model] == ["vit"]


def test_real_size_ratios_compare_within_a_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import real_size_inference as rsi

    row = rsi._ratios(
        {
            "ms": {
                "eager": 10.0,
                "ov_convert_f32": 4.0,
                "ours": 5.0,
                "openvino": 2.0,
                "ours_bf16": 2.5,
            }
        }
    )
    assert row["best_f32"] == "ov_convert_f32" and row["ratio_f32"] == 0.8
    assert row["best_bf16"] == "openvino" and row["ratio_bf16"] == 0.8


def test_real_size_rows_say_how_near_the_peak_each_contender_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import real_size_inference as rsi

    monkeypatch.setattr(rsi, "_bf16_limit_gflops", lambda peak: 2.0 * peak)
    # 10 GFLOP in 50 ms is 200 GFLOP/s: 0.8 of a 250 GFLOP/s f32 peak, 0.4 of bf16's 500.
    row = rsi._ratios(
        {"gflop": 10.0, "f32_peak_gflops": 250.0, "ms": {"ours": 50.0, "ours_bf16": 50.0}}
    )
    assert row["peak_fraction"] == pytest.approx({"ours": 0.8, "ours_bf16": 0.4})
    table = rsi.tables([{"model": "bert", "batch": 1, **row}])
    assert table["f32_ms"][0]["ours, of peak"] == pytest.approx(0.8)
    assert table["bf16_ms"][0]["GFLOP"] == 10.0
    # No bf16 limit known (AMX, or no bf16 units): no bf16 fraction, f32's stands.
    monkeypatch.setattr(rsi, "_bf16_limit_gflops", lambda peak: None)
    assert rsi._peak_fractions(row) == pytest.approx({"ours": 0.8})
    # A row measured before the counts were recorded has none.
    assert rsi._ratios({"ms": {"ours": 50.0}})["peak_fraction"] == {}
    assert rsi.summarise([row])["geomean_peak_fraction_f32"] == pytest.approx(0.8)


def test_real_size_rows_say_what_torch_compile_itself_costs_a_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import real_size_inference as rsi

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    entry = rsi._entry_ms(model, (torch.randn(3, 8),), calls=3)
    assert set(entry) == {"warm", "cold_caches"} and all(v > 0 for v in entry.values())
    # The page gives it as a share of ours' call, per precision.
    row = {"model": "resnet50", "batch": 1, "ms": {"ours": 40.0, "ours_bf16": 20.0}}
    table = rsi.tables([{**row, "entry_ms": {"warm": 0.1, "cold_caches": 0.8}}])
    assert table["f32_ms"][0]["torch.compile's call, of ours"] == pytest.approx(0.02)
    assert table["bf16_ms"][0]["torch.compile's call, of ours"] == pytest.approx(0.04)
    # A row measured before it was recorded has none.
    assert rsi.tables([row])["bf16_ms"][0]["torch.compile's call, of ours"] is None
