"""A --merge run of a benchmark keeps the saved rows it does not measure again, each naming the
run it came from (issue 42: a merged table spans several commits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
