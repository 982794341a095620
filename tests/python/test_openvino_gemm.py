"""OpenVINO's GEMM kernel per weight shape (torch_plugin/placement/openvino_gemm.py): which
matmuls a graph has, the identity clamp that hands one to oneDNN, and the measured choice kept
in the profile cache. Timings are stubs: no test depends on this machine's speed."""

from __future__ import annotations

import copy
import platform
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from torch_plugin.placement import openvino_gemm
from torch_plugin.placement.backends import get_backends
from torch_plugin.placement.openvino_gemm import MIN_MACS, GemmChooser, gemm_shapes, steer

aten = torch.ops.aten


def _propagate(gm: fx.GraphModule, *inputs: torch.Tensor) -> None:
    """Fake values on every node (what AOTAutograd's graphs carry), constants included."""
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)


def _frozen_mlp(rows: int, width: int, hidden: int) -> tuple[fx.GraphModule, torch.Tensor]:
    """An ATen graph as the frozen inference graph has it: x [rows, width] -> addmm to `hidden`
    -> gelu -> addmm back to `width`, weights as graph attributes (t(W) on the right)."""
    torch.manual_seed(0)
    root = torch.nn.Module()
    root.register_buffer("w1", torch.randn(hidden, width) * 0.05)
    root.register_buffer("b1", torch.randn(hidden) * 0.05)
    root.register_buffer("w2", torch.randn(width, hidden) * 0.05)
    root.register_buffer("b2", torch.randn(width) * 0.05)
    g = fx.Graph()
    x = g.placeholder("x")
    h = g.call_function(
        aten.addmm.default,
        (g.get_attr("b1"), x, g.call_function(aten.t.default, (g.get_attr("w1"),))),
    )
    h = g.call_function(aten.gelu.default, (h,))
    y = g.call_function(
        aten.addmm.default,
        (g.get_attr("b2"), h, g.call_function(aten.t.default, (g.get_attr("w2"),))),
    )
    g.output((y,))
    gm = fx.GraphModule(root, g)
    inp = torch.randn(rows, width)
    _propagate(gm, inp)
    return gm, inp


def test_steer_puts_an_identity_clamp_after_the_chosen_matmuls_only() -> None:
    gm, x = _frozen_mlp(rows=8, width=16, hidden=64)
    want = gm(x)[0]
    # The first matmul feeds GELU, which OpenVINO fuses into it (so it runs on oneDNN
    # already): only the second is offered.
    assert sorted(gemm_shapes(gm).values()) == [(8, 64, 16)]
    asked = []

    def down_projections(m: int, k: int, n: int) -> bool:
        asked.append((m, k, n))
        return k >= 2 * n

    assert steer(gm, down_projections) == 1
    assert asked == [(8, 64, 16)]
    clamps = [n for n in gm.graph.nodes if n.target is aten.clamp.default]
    assert len(clamps) == 1
    (clamp,) = clamps
    assert clamp.args[0].target is aten.addmm.default and clamp.args[1:] == (
        float("-inf"),
        float("inf"),
    )
    assert clamp.meta["val"].shape == (8, 16)
    # The clamp took the second matmul's users; the first matmul's feed gelu as before.
    assert [u.op for u in clamp.users] == ["output"]
    torch.testing.assert_close(gm(x)[0], want, rtol=0, atol=0)
    # The clamp is an activation: the matmul it follows is not offered again.
    assert steer(gm, lambda *s: True) == 0


def test_matmuls_on_weights_fed_as_inputs_are_not_steered() -> None:
    """An unfrozen graph's weights are inputs: OpenVINO keeps such a MatMul (no MLAS path)."""
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    g.output((g.call_function(aten.mm.default, (x, g.call_function(aten.t.default, (w,)))),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    _propagate(gm, torch.randn(4, 8), torch.randn(3, 8))
    assert gemm_shapes(gm) == {}


def test_the_choice_is_measured_once_per_shape_and_kept_in_the_profile_cache(tmp_path) -> None:
    db = str(tmp_path / "profile.db")
    times = {(64, 1024, 256): (1.00, 0.90), (64, 256, 1024): (1.00, 0.98)}
    calls = []

    def timer(m: int, k: int, n: int) -> tuple[float, float]:
        calls.append((m, k, n))
        return times[(m, k, n)]

    chooser = GemmChooser(db, threads=2, timer=timer)
    assert chooser(64, 1024, 256) is True  # oneDNN 10% faster
    assert chooser(64, 256, 1024) is False  # 2%: within the margin, left to MLAS
    assert chooser(64, 1024, 256) is True
    assert calls == [(64, 1024, 256), (64, 256, 1024)]
    # A second process (a new chooser on the same cache) measures nothing.
    again = GemmChooser(db, threads=2, timer=lambda *s: (_ for _ in ()).throw(AssertionError))
    assert again(64, 1024, 256) is True and again(64, 256, 1024) is False
    # Another thread count is another machine setting: measured again.
    other = GemmChooser(db, threads=1, timer=timer)
    assert other(64, 1024, 256) is True
    assert len(calls) == 3


def test_openvino_runs_a_steered_graph_as_eager_does() -> None:
    """The OpenVINO backend asks its chooser about each large matmul of an f32 graph (small
    ones never) and compiles the steered graph; outputs match eager."""
    import pytest

    backend = get_backends(["openvino"])[-1]
    if backend.name != "openvino":
        pytest.skip("no openvino")
    gm, x = _frozen_mlp(rows=64, width=256, hidden=1024)
    assert 64 * 256 * 1024 >= MIN_MACS
    asked = []

    def timer(m: int, k: int, n: int) -> tuple[float, float]:
        asked.append((m, k, n))
        return (1.0, 0.5) if k > n else (1.0, 1.0)

    backend.gemms = GemmChooser(":memory:", threads=2, timer=timer)
    got = backend.compile(gm, [x], "graph")(x)[0]
    assert asked == [(64, 1024, 256)]  # the matmul into GELU is on oneDNN already
    torch.testing.assert_close(got, gm(x)[0], rtol=1e-4, atol=1e-4)
    # The graph it was handed is unchanged (the backend steers a copy).
    assert not any(n.target is aten.clamp.default for n in gm.graph.nodes)

    small, xs = _frozen_mlp(rows=8, width=16, hidden=64)
    asked.clear()
    torch.testing.assert_close(backend.compile(small, [xs], "graph")(xs)[0], small(xs)[0])
    assert asked == []


def test_a_failed_timing_leaves_the_graph_as_openvino_picks_and_says_so(caplog) -> None:
    """Timing a shape may fail (OpenVINO refusing the one-layer model, memory): the graph
    converts unsteered and the log says why, instead of OpenVINO's compile failing."""
    import logging

    import pytest

    backend = get_backends(["openvino"])[-1]
    if backend.name != "openvino":
        pytest.skip("no openvino")
    gm, x = _frozen_mlp(rows=64, width=256, hidden=1024)

    def broken(m: int, k: int, n: int) -> tuple[float, float]:
        raise RuntimeError("no memory for the one-layer model")

    backend.gemms = GemmChooser(":memory:", threads=2, timer=broken)
    with caplog.at_level(logging.INFO, logger="torch_plugin"):
        got = backend.compile(gm, [x], "graph")(x)[0]
    torch.testing.assert_close(got, gm(x)[0], rtol=1e-4, atol=1e-4)
    assert "matmul kernels left as it picks them" in caplog.text
    assert "RuntimeError: no memory for the one-layer model" in caplog.text


def test_the_clamp_hands_the_matmul_to_onednn_through_the_fx_converter() -> None:
    """What the steer is for, checked on OpenVINO's compiled model: unsteered, the matmul that
    feeds no activation runs on MLAS; steered, on oneDNN with the clamp fused into it (no
    layer of its own). And the documented difference: a NaN leaves it as -inf."""
    import pytest

    backend = get_backends(["openvino"])[-1]
    if backend.name != "openvino":
        pytest.skip("no openvino")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("OpenVINO has MLAS on x86-64 only")
    import openvino as ov

    gm, x = _frozen_mlp(rows=64, width=256, hidden=1024)
    steered = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    assert steer(steered, lambda *s: True) == 1

    def compiled(g: fx.GraphModule) -> tuple[Any, list[tuple[str, str]]]:
        c = ov.Core().compile_model(
            backend._convert_fx(g, [x]),
            "CPU",
            {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1},
        )
        info = [op.get_rt_info() for op in c.get_runtime_model().get_ops()]
        layers = [(i["layerType"].astype(str), i["primitiveType"].astype(str)) for i in info]
        return c, [lt for lt in layers if lt[0] not in ("Input", "Output", "Const", "Reshape")]

    _, plain = compiled(gm)
    c, steered_layers = compiled(steered)
    assert [t for _, t in plain if "mlas" in t] == ["gemm_mlas_f32"], plain
    assert [lt for lt in steered_layers if lt[0] != "FullyConnected"] == [], steered_layers
    assert not any("mlas" in t for _, t in steered_layers), steered_layers
    bad = x.clone()
    bad[3, 0] = float("nan")
    got = torch.from_numpy(c.create_infer_request().infer([bad.numpy()])[0].copy())
    want = gm(bad)[0]
    assert torch.isnan(want[3]).all() and torch.isneginf(got[3]).all()
    torch.testing.assert_close(got[:3], want[:3], rtol=1e-4, atol=1e-4)


def test_time_fully_connected_times_both_kernels() -> None:
    import pytest

    if get_backends(["openvino"])[-1].name != "openvino":
        pytest.skip("no openvino")
    mlas, onednn = openvino_gemm.time_fully_connected(16, 128, 96, threads=1)
    assert 0 < mlas < 1 and 0 < onednn < 1
