"""The torch.compile backend: registration (entry point and import), option validation, pass
pipeline through C++, logged fallback, IR dumps, dynamic batch without recompiles."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from roundtrip import assert_bit_exact, run_model, small_model

import torch_plugin
from torch_plugin import _C
from torch_plugin.backend import collect_stats


def test_backend_works_without_importing_torch_plugin() -> None:
    code = (
        "import sys, torch\n"
        "f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend='torch_plugin')\n"
        "x = torch.randn(4, 4)\n"
        "torch.testing.assert_close(f(x), torch.nn.functional.gelu(x) * 2)\n"
        "assert 'torch_plugin' in sys.modules  # loaded through the entry point\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_backend_registered_after_import() -> None:
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert "torch_plugin" in list_backends(exclude_tags=())
    assert lookup_backend("torch_plugin") is torch_plugin.torch_plugin_backend


@pytest.mark.parametrize(
    "options, error, fragment",
    [
        (
            {"pases": []},
            ValueError,
            "valid options: cache_parallel, dump_ir, log_passes, mesh, on_error, passes, "
            "placement, precision, verify_each",
        ),
        ({"passes": ["fuse_everything"]}, ValueError, "valid passes: dead_code_elimination"),
        ({"passes": "dead_code_elimination"}, TypeError, "must be a list of pass names"),
        ({"on_error": "ignore"}, ValueError, "must be one of fallback, raise"),
        ({"verify_each": "yes"}, TypeError, "'verify_each' must be a bool"),
        ({"dump_ir": 3}, TypeError, "'dump_ir' must be a directory"),
    ],
)
def test_bad_options_are_rejected_with_the_valid_ones(options, error, fragment) -> None:
    f = torch.compile(lambda x: x + 1, backend="torch_plugin", options=options)
    with pytest.raises(Exception) as info:
        f(torch.randn(2))
    # Dynamo wraps backend errors; the cause must be ours with the message intact.
    cause = info.value
    while not isinstance(cause, error):
        nxt = getattr(cause, "inner_exception", None) or cause.__cause__
        if nxt is None:
            break
        cause = nxt
    assert isinstance(cause, error), repr(info.value)
    assert fragment in str(cause)


def test_options_object_validates_directly() -> None:
    assert torch_plugin.Options.from_user({"passes": ["dead_code_elimination"]}).passes == (
        "dead_code_elimination",
    )
    with pytest.raises(TypeError, match="must be a dict"):
        torch_plugin.Options.from_user(["passes"])


def test_dead_code_elimination_through_the_backend_keeps_numerics() -> None:
    model, inputs = small_model("gpt2")
    reference = run_model(model, inputs, "aot_eager")
    with collect_stats() as stats:
        ours = run_model(
            model, inputs, "torch_plugin", options={"passes": ["dead_code_elimination"]}
        )
    assert_bit_exact(reference, ours, "gpt2 with dead_code_elimination")
    assert all(r["fallback"] is None for r in stats)
    assert all(r["passes"][0]["name"] == "dead_code_elimination" for r in stats)


class _BrokenPassManager:
    """A pass manager whose every run fails, as a bug of ours would."""

    def __init__(self, **kwargs: object) -> None:
        pass

    def run(self, *args: object) -> None:
        raise _C.PassError("simulated failure")


def test_failure_in_pipeline_falls_back_with_one_log_line(monkeypatch, caplog) -> None:
    monkeypatch.setattr(_C, "PassManager", _BrokenPassManager)
    model, inputs = small_model("mlp")
    reference = run_model(model, inputs, "aot_eager")
    with caplog.at_level(logging.WARNING, logger="torch_plugin"), collect_stats() as stats:
        ours = run_model(model, inputs, "torch_plugin")
    assert_bit_exact(reference, ours, "fallback")
    lines = [r for r in caplog.records if r.name == "torch_plugin"]
    assert len(lines) == len(stats) == 2  # forward and backward, one line each
    assert "falling back to the unrewritten forward graph (PassError: simulated failure)" in (
        lines[0].getMessage()
    )
    assert all(r["fallback"] for r in stats)


def test_unsupported_graph_falls_back(monkeypatch, caplog) -> None:
    """An op the bridge cannot export (here: simulated) leaves the graph as it was."""
    from torch_plugin import fx_bridge

    real = fx_bridge.op_name

    def picky(target):
        if target is torch.ops.aten.gelu.default:
            raise fx_bridge.BridgeError("node 'gelu': op not supported")
        return real(target)

    monkeypatch.setattr(fx_bridge, "op_name", picky)
    f = torch.compile(lambda x: torch.nn.functional.gelu(x) + 1, backend="torch_plugin")
    x = torch.randn(8)
    with caplog.at_level(logging.WARNING, logger="torch_plugin"):
        assert torch.equal(f(x), torch.nn.functional.gelu(x) + 1)
    assert any("node 'gelu': op not supported" in r.getMessage() for r in caplog.records)


def test_on_error_raise_reraises(monkeypatch) -> None:
    monkeypatch.setattr(_C, "PassManager", _BrokenPassManager)
    f = torch.compile(lambda x: x * 2, backend="torch_plugin", options={"on_error": "raise"})
    with pytest.raises(Exception, match="simulated failure"):
        f(torch.randn(3))


def test_dump_ir_writes_before_and_after(tmp_path) -> None:
    f = torch.compile(
        lambda x: torch.relu(x) @ x.T,
        backend="torch_plugin",
        options={"dump_ir": str(tmp_path), "passes": ["dead_code_elimination"]},
    )
    f(torch.randn(3, 3))
    files = sorted(os.listdir(tmp_path))
    assert any(n.endswith(".before.ir") for n in files) and any(
        n.endswith(".after.ir") for n in files
    )
    text = (tmp_path / [n for n in files if n.endswith(".before.ir")][0]).read_text()
    assert "aten::relu.default" in text and "aten::mm.default" in text


def test_dynamic_batch_compiles_once_for_all_sizes() -> None:
    """Which compiler runs the graph is measured on this machine (eager, Inductor or OpenVINO
    on symbolic sizes): outputs are held to the f32 bound, not bit for bit."""
    model, _ = small_model("mlp")
    x = torch.randn(3, model.in_features)
    torch._dynamo.mark_dynamic(x, 0)
    f = torch.compile(model, backend="torch_plugin")
    with collect_stats() as stats, torch.no_grad():
        for batch in (3, 5, 17):
            xb = x if batch == 3 else torch.randn(batch, model.in_features)
            torch.testing.assert_close(f(xb), model(xb), rtol=1e-4, atol=1e-5)
    assert len(stats) == 1, "a new batch size recompiled"
    assert stats[0]["symbolic_inputs"] == 1


def test_frozen_weights_guard_replaces_on_change_only() -> None:
    """A frozen graph's weight guard: unchanged weights run the graph; another tensor object on
    the same storage is the same weight; an in-place change, a new tensor or new data under the
    same object (`.data = ...`) places the graph again (twice with freezing, then without)."""
    from torch_plugin.backend import FrozenWeightsGuard

    w1, w2, x = torch.randn(3), torch.randn(2), torch.randn(4)
    kinds = [("input", "x"), ("parameter", "w1"), ("buffer", "w2")]
    ran, placed = [], []

    def fn(args: list) -> str:
        ran.append(list(args))
        return "graph"

    def replace(args: list | None) -> object:
        placed.append(args is not None)
        return fn

    guard = FrozenWeightsGuard(fn, [x, w1, w2], kinds, replace)
    assert guard([x, w1, w2]) == "graph" and placed == []
    assert guard([torch.randn(4), w1, w2]) == "graph" and placed == []  # inputs are not guarded
    assert guard([x, w1.view(3), w2]) == "graph" and placed == []  # same storage, unchanged
    w2.add_(1.0)
    assert guard([x, w1, w2]) == "graph" and placed == [True]
    assert guard([x, w1, w2]) == "graph" and placed == [True]  # the new snapshot holds
    assert guard([x, torch.randn(3), w2]) == "graph" and placed == [True, True]
    w1.mul_(2.0)
    assert guard([x, w1, w2]) == "graph" and placed == [True, True, False]  # now unfrozen
    w1.mul_(2.0)
    assert guard([x, w1, w2]) == "graph" and placed == [True, True, False]


def test_frozen_weights_guard_sees_new_data_under_the_same_object() -> None:
    """`weight.data = other` keeps the tensor object and its version counter: only its data
    pointer tells, and the guard places the graph again with it."""
    from torch_plugin.backend import FrozenWeightsGuard

    w, x = torch.nn.Parameter(torch.randn(3)), torch.randn(2)
    placed = []

    def replace(args: list | None) -> object:
        placed.append(args[1].data_ptr())
        return lambda args: "graph"

    guard = FrozenWeightsGuard(
        lambda args: "graph", [x, w], [("input", "x"), ("parameter", "w")], replace
    )
    version = w._version
    w.data = torch.randn(3)
    assert w._version == version and guard([x, w]) == "graph" and placed == [w.data_ptr()]
    assert guard([x, w]) == "graph" and len(placed) == 1  # the new snapshot holds
    with pytest.raises(TypeError, match="list"):
        guard.frozen.first_changed((x, w))
