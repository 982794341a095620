"""A default compile's inference graph seen before, from its saved model without AOTAutograd
(placement/known_graphs.py). Timings are stubbed (`fixed_profile`): OpenVINO is the pick on any
machine; every output is compared with eager's."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import test_default_compile as default_compile
import torch
from test_default_compile import _close, _vit

from torch_plugin.backend import collect_stats
from torch_plugin.placement import backends as placement_backends
from torch_plugin.placement import known_graphs

pytest.importorskip("openvino")


def _opts(tmp_path: Any, backend: str = "openvino") -> dict[str, Any]:
    return default_compile._opts(tmp_path, backends=["aten", backend])


class _Counted:
    """Counts AOTAutograd's traces, OpenVINO's conversions and ONNX exports of ATen graphs."""

    def __init__(self, monkeypatch: Any) -> None:
        import torch._dynamo.backends.common as common

        self.aot = 0
        self.converted = 0
        aot, convert = common.aot_module_simplified, placement_backends.OpenVINOBackend._convert_fx
        export = placement_backends.OnnxRuntimeBackend._exported

        def traced(*a: Any, **k: Any) -> Any:
            self.aot += 1
            return aot(*a, **k)

        def converted(gm: Any, inputs: Any) -> Any:
            self.converted += 1
            return convert(gm, inputs)

        def exported(backend: Any, gm: Any, inputs: Any, rule: str) -> Any:
            self.converted += 1
            return export(backend, gm, inputs, rule)

        monkeypatch.setattr(common, "aot_module_simplified", traced)
        monkeypatch.setattr(
            placement_backends.OpenVINOBackend, "_convert_fx", staticmethod(converted)
        )
        monkeypatch.setattr(placement_backends.OnnxRuntimeBackend, "_exported", exported)


def _compile(model: torch.nn.Module, x: dict[str, torch.Tensor], opts: dict[str, Any]) -> Any:
    torch._dynamo.reset()
    return torch.compile(model, backend="torch_plugin", options=opts)


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_a_warm_compile_of_a_known_graph_skips_aotautograd_and_the_conversion(
    tmp_path, fixed_profile, monkeypatch, backend
) -> None:
    pytest.importorskip(backend)
    fixed_profile({backend: 1e-5})
    model, x = _vit()
    opts = _opts(tmp_path, backend)
    with torch.no_grad():
        want = model(**x)
        with collect_stats() as stats:
            _close(_compile(model, x, opts)(**x), want)
    assert f": {backend} (" in stats[0]["summary"]
    assert "(known graph)" not in stats[0]["summary"]
    counted = _Counted(monkeypatch)
    with torch.no_grad(), collect_stats() as stats:
        f = _compile(model, x, opts)
        _close(f(**x), want)
        _close(f(**x), want)
    (record,) = stats
    assert record["summary"].endswith("(known graph)"), record["summary"]
    assert f": {backend} (" in record["summary"]
    assert counted.aot == 0 and counted.converted == 0


def test_a_known_graph_whose_weights_change_compiles_the_usual_way(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """Weights changed in place after a known graph's compile: the next call compiles the usual
    way, with the new weights (eager's outputs); so do other weights at the compile."""
    fixed_profile({"openvino": 1e-5})
    model, x = _vit()
    opts = _opts(tmp_path)
    with torch.no_grad():
        _compile(model, x, opts)(**x)
        counted = _Counted(monkeypatch)
        f = _compile(model, x, opts)
        _close(f(**x), model(**x))
        assert counted.aot == 0
        model.classifier.weight.mul_(-2.0)
        _close(f(**x), model(**x))
        assert counted.aot == 1 and counted.converted == 1
        _close(f(**x), model(**x))
        assert counted.aot == 1
        other = copy.deepcopy(model)
        other.classifier.bias.add_(1.0)
        with collect_stats() as stats:
            _close(_compile(other, x, opts)(**x), other(**x))
        assert "(known graph)" not in stats[0]["summary"] and counted.aot == 2
    # Each weights' model in files of its own: an entry is never read beside another's weights.
    assert len(list((tmp_path / "profile.artifacts").glob("*.xml"))) >= 2


class _SetsGradMode(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.set_grad_enabled(False)
        return self.lin(x).relu()


def test_a_graph_that_sets_the_grad_mode_is_not_kept(tmp_path, fixed_profile) -> None:
    """A forward that turns gradients off as a function call leaves them off after each call,
    as eager does: AOTAutograd's wrapper sets the mode again after the call, which a kept model
    would skip, so none is kept."""
    fixed_profile({"openvino": 1e-5})
    model = _SetsGradMode().requires_grad_(False)
    x = torch.randn(4, 8)
    opts = _opts(tmp_path)
    for _ in range(2):
        f = _compile(model, {}, opts)
        with torch.enable_grad(), collect_stats() as stats:
            got = f(x)
            assert not torch.is_grad_enabled()
        assert "(known graph)" not in stats[0]["summary"]
        with torch.no_grad():
            _close(got, model(x))
    assert not list((tmp_path / "profile.artifacts").glob("*.xml"))


def test_a_graph_is_not_known_where_the_call_differs(tmp_path) -> None:
    """No key for a call that needs gradients, a fake or size argument, a graph holding a
    tensor of its own; the key tells input layouts, options, autocast and the float32 matmul
    precision apart."""
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.output((g.call_function(torch.add, (a, b)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    kinds = [("parameter", "w"), ("user", "x")]
    w, x = torch.nn.Parameter(torch.randn(4)), torch.randn(4)
    key = known_graphs.structure_key
    with torch.no_grad():
        base = key(gm, [w, x], kinds, "opts")
        assert base is not None and key(gm, [w, x], kinds, "opts") == base
        assert key(gm, [w, x.t().contiguous().view(4)], kinds, "opts") == base
        assert key(gm, [w, x.double()], kinds, "opts") != base
        assert key(gm, [w, x], kinds, "other opts") != base
        assert key(gm, [w, x], [("user", ""), ("user", "x")], "opts") != base
        with torch.autocast("cpu", torch.bfloat16):
            assert key(gm, [w, x], kinds, "opts") != base
        default = torch.get_default_dtype()
        try:
            torch.set_default_dtype(torch.float64)
            assert key(gm, [w, x], kinds, "opts") != base  # torch.ones(3) in the code
        finally:
            torch.set_default_dtype(default)
        precision = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("high")  # linears as bf16 products (bf16x3.py)
            assert key(gm, [w, x], kinds, "opts") != base
        finally:
            torch.set_float32_matmul_precision(precision)
        assert key(gm, [w, 4], kinds, "opts") is None
        with torch.inference_mode():
            made = torch.randn(4)
        assert key(gm, [w, made], kinds, "opts") is None
        held = torch.fx.GraphModule(torch.nn.Module(), g)
        held.register_buffer("c", torch.ones(4))
        assert key(held, [w, x], kinds, "opts") is None
        # A module's attributes (LeakyReLU's slope) are not in the graph's code.
        g2 = torch.fx.Graph()
        a2 = g2.placeholder("a")
        g2.placeholder("b")
        g2.output((g2.call_module("act", (a2,)),))
        root = torch.nn.Module()
        root.act = torch.nn.LeakyReLU(0.1)
        assert key(torch.fx.GraphModule(root, g2), [w, x], kinds, "opts") is None
        # Symbolic sizes (a dynamic graph).
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import (
            DimDynamic,
            ShapeEnv,
            StatelessSymbolicContext,
        )

        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC])
        sym = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(x, symbolic_context=context)
        dynamic = torch.fx.GraphModule(torch.nn.Module(), copy.deepcopy(g))
        for n in dynamic.graph.nodes:
            if n.op == "placeholder":
                n.meta["example_value"] = sym
        assert key(dynamic, [w, x], kinds, "opts") is None
    assert key(gm, [w, x], kinds, "opts") is None  # w requires grad, grad mode on
