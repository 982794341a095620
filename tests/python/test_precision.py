"""The precision option of the default compile (issue 39, placement/precision.py): bf16 lets
Inductor and OpenVINO compute in bf16, every candidate is held to the stated bound against
eager, a candidate outside it is never picked, and a graph traced under autocast implies bf16.
Timings are stubbed (`fixed_profile`)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from torch_plugin.backend import collect_stats
from torch_plugin.models import hf_suite, output_tensors
from torch_plugin.placement import backends as placement_backends
from torch_plugin.placement.precision import (
    TOLERANCE,
    defer_output_casts,
    fold_constants,
    lower_precision_graph,
    output_error,
)


def _opts(tmp_path: Any, precision: str | None, backends: list[str]) -> dict[str, Any]:
    placement = {
        "cache_path": str(tmp_path / "profile.db"),
        "samples": 1,
        "backends": backends,
        "allow_refine": False,  # the whole-graph decision is what these tests check
    }
    return {"precision": precision, "placement": placement}


def _bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model, inputs = hf_suite.build("bert", batch=2)
    return model.eval(), {k: v for k, v in inputs.items() if k != "labels"}


def _error(got: Any, want: Any) -> float:
    return output_error(tuple(output_tensors(got)), tuple(output_tensors(want)))


def _summary(stats: list[dict[str, Any]]) -> str:
    (line,) = [r["summary"] for r in stats if "summary" in r]
    return line


def test_bf16_runs_inductor_in_bf16_within_the_stated_bound(tmp_path, fixed_profile) -> None:
    fixed_profile({"inductor": 1e-5})
    model, x = _bert()
    with torch.no_grad():
        want = model(**x)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, "bf16", ["inductor"]))
    with collect_stats() as stats, torch.no_grad():
        got = f(**x)
    line = _summary(stats)
    assert ": inductor (" in line and "bf16 precision: the pick computes in bf16" in line, line
    err = _error(got, want)
    # Computed in bf16 (f32 Inductor agrees with eager to ~1e-6), and within the bound.
    assert 1e-4 < err <= TOLERANCE["bf16"], err
    for a, b in zip(output_tensors(got), output_tensors(want), strict=True):
        assert a.dtype == b.dtype == torch.float32


def test_bf16_takes_attention_whose_key_comes_from_an_f32_cache(tmp_path, fixed_profile) -> None:
    """GPT-2 at its library defaults (use_cache=True) concatenates its key and value with the
    f32 cache: ATen's attention kernel, which autocast does not cast, gets them in bf16."""
    import transformers

    fixed_profile({"inductor": 1e-5})
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        want = model(ids).logits
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, "bf16", ["inductor"]))
    with collect_stats() as stats, torch.no_grad():
        got = f(ids).logits
    line = _summary(stats)
    assert ": inductor (" in line and "computes in bf16" in line, line
    assert 1e-4 < output_error((got,), (want,)) <= TOLERANCE["bf16"]


def test_f32_stays_the_default(tmp_path, fixed_profile) -> None:
    fixed_profile({"inductor": 1e-5})
    model, x = _bert()
    with torch.no_grad():
        want = model(**x)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, None, ["inductor"]))
    with collect_stats() as stats, torch.no_grad():
        got = f(**x)
    line = _summary(stats)
    assert ": inductor (" in line and "precision" not in line, line
    assert _error(got, want) < 1e-4


def test_a_candidate_outside_the_bound_is_never_picked(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """The fastest candidate is off by 10% (relative L2): over bf16's 5e-2, so eager runs."""
    fixed_profile({"inductor": 1e-6})

    def noisy(self, gm, inputs, rule):  # noqa: ANN001, ANN202
        def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            outs = gm(*args)
            return tuple(o * 1.10 if o.is_floating_point() else o for o in outs)

        return run

    monkeypatch.setattr(placement_backends.InductorBackend, "compile", noisy)
    model, x = _bert()
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, "bf16", ["inductor"]))
    with collect_stats() as stats, torch.no_grad():
        got = f(**x)
        want = model(**x)
    line = _summary(stats)
    assert ": eager (" in line and "inductor failed" in line, line
    assert _error(got, want) == 0.0


def test_a_call_under_autocast_implies_bf16(tmp_path, fixed_profile) -> None:
    """The graph Dynamo captures under autocast computes in bf16; Inductor's compile of it
    differs from eager's bf16 by more than f32's elementwise 1e-3 would allow, within bf16's."""
    fixed_profile({"inductor": 1e-5})
    model, x = _bert()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        want = model(**x)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, None, ["inductor"]))
    with collect_stats() as stats, torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        got = f(**x)
    line = _summary(stats)
    assert ": inductor (" in line and "bf16 precision" in line, line
    assert _error(got, want) <= TOLERANCE["bf16"]


def _linear_graph(rows: int, cols: int) -> tuple[torch.fx.GraphModule, torch.Tensor]:
    """addmm of a [rows, 16] input by frozen weights (get_attr) to `cols` outputs."""
    lin = torch.nn.Linear(16, cols)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(rows, 16)
    wn, bn = g.get_attr("w"), g.get_attr("b")
    mm = g.call_function(
        torch.ops.aten.addmm.default, (bn, x, g.call_function(torch.ops.aten.t.default, (wn,)))
    )
    mm.meta["val"] = torch.empty(rows, cols)
    g.output((mm,))
    weights = {"w": lin.weight.detach(), "b": lin.bias.detach()}
    return torch.fx.GraphModule(weights, g), torch.randn(rows, 16)


def test_lowering_casts_matmuls_and_folds_the_weight_casts() -> None:
    torch.manual_seed(0)
    gm, inp = _linear_graph(4, 8)
    low = lower_precision_graph(gm, [inp], "bf16")
    addmm = [n for n in low.graph.nodes if n.target is torch.ops.aten.addmm.default]
    assert len(addmm) == 1 and addmm[0].meta["val"].dtype == torch.bfloat16
    # The weight's transpose and cast are constants now; only the activation is cast per call.
    casts = [n for n in low.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert all(n.args[0].op != "get_attr" for n in casts), low.code
    consts = [getattr(low, str(n.target)) for n in low.graph.nodes if n.op == "get_attr"]
    assert sorted(c.dtype == torch.bfloat16 for c in consts) == [True, True]
    assert not hasattr(low, "w") or "w" not in low._buffers  # the f32 weight is not kept
    (out,) = low(inp)
    assert out.dtype == torch.float32
    ref = gm(inp)[0]  # eager, f32
    assert 0 < output_error((out,), (ref,)) <= TOLERANCE["bf16"]
    assert fold_constants(low) == 0  # nothing left to fold


def test_lowering_casts_convolutions_which_autocast_leaves_in_f32() -> None:
    """aten.convolution, what conv2d lowers to in an AOT graph, is not on autocast's list: the
    lowering casts it as autocast casts conv2d (ResNet-50's convolutions ran in f32 under the
    bf16 option otherwise), its weight's cast folded."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(1, 3, 10, 10)
    args = (x, g.get_attr("w"), g.get_attr("b"), [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    out = g.call_function(torch.ops.aten.convolution.default, args)
    out.meta["val"] = torch.empty(1, 8, 8, 8)
    g.output((out,))
    gm = torch.fx.GraphModule({"w": conv.weight.detach(), "b": conv.bias.detach()}, g)
    inp = torch.randn(1, 3, 10, 10)
    low = lower_precision_graph(gm, [inp], "bf16")
    (node,) = [n for n in low.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert node.meta["val"].dtype == torch.bfloat16, low.code
    assert all(a.meta["val"].dtype == torch.bfloat16 for a in node.all_input_nodes), low.code
    assert [n.op for n in node.all_input_nodes[1:]] == ["get_attr", "get_attr"]  # folded
    (got,) = low(inp)
    assert got.dtype == torch.float32
    assert 0 < output_error((got,), gm(inp)) <= TOLERANCE["bf16"]


class _Mlp(torch.nn.Module):
    """A transformer's MLP block on [batch, tokens, width]: layer norm, linear, GELU, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up = torch.nn.LayerNorm(16), torch.nn.Linear(16, 64)
        self.down = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_lowering_casts_activations_before_their_views_and_writes_gelu_out_in_f32() -> None:
    """The lowered graph has the order and form Inductor traced under autocast sees: a linear's
    activation cast before the view that flattens it (so view, addmm, view fold into one
    oneDNN linear), and GELU computed in f32 between two prims.convert_element_type (so it
    fuses into that linear)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    model = _Mlp().eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        gm = make_fx(lambda x: (model(x),))(x)
    low = lower_precision_graph(gm, [x], "bf16")
    nodes = list(low.graph.nodes)
    assert not [n for n in nodes if n.target is torch.ops.aten.gelu.default], low.code
    converts = [n for n in nodes if n.target is torch.ops.prims.convert_element_type.default]
    assert [n.args[1] for n in converts] == [torch.float32, torch.bfloat16], low.code
    for mm in [n for n in nodes if n.target is torch.ops.aten.addmm.default]:
        flat = mm.args[1]  # the activation: a view of a cast, never a cast of a view
        assert flat.target is torch.ops.aten.view.default, low.code
        assert flat.args[0].target is not torch.ops.aten.view.default, low.code
    assert 0 < output_error(low(x), (model(x),)) <= TOLERANCE["bf16"]


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="Inductor packs bf16 linears for oneDNN only where oneDNN has bf16",
)
def test_bf16_inductor_fuses_the_activation_into_the_linear(tmp_path, fixed_profile) -> None:
    """What the lowering's order and form are for: Inductor's GELU goes into the bf16 linear's
    oneDNN call, as it does for the model traced under autocast."""
    from torch._dynamo.utils import counters

    fixed_profile({"inductor": 1e-5})
    torch.manual_seed(0)
    model, x = _Mlp().eval(), torch.randn(2, 4, 16)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, "bf16", ["inductor"]))
    counters.clear()
    with collect_stats() as stats, torch.no_grad():
        got = f(x)
    assert ": inductor (" in _summary(stats), _summary(stats)
    assert counters["inductor"]["mkldnn_unary_fusion_matcher_count"] >= 1, dict(counters)
    assert output_error((got,), (model(x),)) <= TOLERANCE["bf16"]


def test_large_outputs_are_cast_back_outside_the_graph() -> None:
    """An output from DEFER_CAST_MIN_BYTES on leaves the lowered graph in bf16, its cast back to
    f32 the caller's (into memory it reuses); a smaller one is cast in the graph."""
    gm, x = _linear_graph(4, 8)
    low = lower_precision_graph(gm, [x], "bf16")
    assert defer_output_casts(low) == [None]  # 128 bytes: cast in the graph
    assert low(x)[0].dtype == torch.float32
    assert defer_output_casts(low, min_bytes=128) == [torch.float32]
    (out,) = low(x)
    assert out.dtype == torch.bfloat16
    back = [n for n in low.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert [n.kwargs["dtype"] for n in back] == [torch.bfloat16]  # the input's cast alone


def test_inductor_casts_a_large_bf16_output_into_memory_no_result_holds() -> None:
    """Inductor at bf16 returns a large output in the graph's dtype (f32), cast outside the
    compiled graph into arrays it hands out again: a result the caller holds is never written
    by the next call, and every result matches the graph."""
    gm, x = _linear_graph(256, 4096)  # 4 MB of f32 output
    inductor = placement_backends.get_backends(["inductor"], "bf16")[-1]
    assert inductor.name == "inductor" and inductor.compute == "bf16"
    with torch.no_grad():
        fn = inductor.compile(gm, [x], "graph")
        first = fn(x)[0]
        kept = first.clone()
        second = fn(x * 2.0)[0]
        want = gm(x * 2.0)[0]
    assert first.dtype == second.dtype == torch.float32
    assert first.data_ptr() != second.data_ptr() and torch.equal(first, kept)
    assert 0 < output_error((second,), (want,)) <= TOLERANCE["bf16"]


def test_output_error_is_infinite_where_outputs_cannot_be_compared() -> None:
    a = torch.ones(3)
    assert output_error((a,), (a.clone(),)) == 0.0
    assert math.isinf(output_error((a,), (torch.ones(4),)))
    assert math.isinf(output_error((a,), (a.double(),)))
    assert math.isinf(output_error((torch.tensor([1, 2]),), (torch.tensor([1, 3]),)))
    assert math.isinf(output_error((a * float("nan"),), (a,)))
    assert output_error((a * 1.01,), (a,)) == pytest.approx(0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_output_check_kernel_agrees_with_torch(dtype: torch.dtype) -> None:
    """kernels/cpu/output_compare.cc against the torch ops it replaces: the relative L2 error and
    torch.allclose (absolute part scaled by the largest finite |want|, NaN equal to NaN), on
    values with infinities, NaNs and elements on either side of the bound."""
    from torch_plugin.placement import precision

    torch.manual_seed(0)
    want = (torch.randn(3, 70_001) * 4).to(dtype)
    want[0, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=dtype)
    got = want.clone()
    tol = 1e-2
    allowed = tol * float(want.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).max())

    def by_torch(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.allclose(a, b, rtol=tol, atol=allowed, equal_nan=True)

    cases = {"equal": got}
    near = got.clone()
    near[1, 5] = float(near[1, 5]) + 0.5 * allowed  # inside
    cases["inside"] = near
    far = got.clone()
    far[2, 70_000] = float(far[2, 70_000]) + 4 * allowed + 4 * tol * abs(float(far[2, 70_000]))
    cases["outside"] = far
    inf = got.clone()
    inf[1, 7] = float("inf")
    cases["infinite"] = inf
    nan = got.clone()
    nan[0, 0] = float("nan")  # against want's inf
    cases["nan"] = nan
    for name, a in cases.items():
        err, ok = precision._kernel_stats(a, want, tol, tol)
        assert ok == by_torch(a, want), name
        assert math.isinf(err)  # want holds a NaN: every L2 error is NaN, reported as inf
    finite = want.nan_to_num(0.0, posinf=0.0, neginf=0.0)
    off = finite * 1.01
    err, ok = precision._kernel_stats(off, finite, tol, tol)
    ref = float(torch.linalg.vector_norm(off.double() - finite.double())) / float(
        torch.linalg.vector_norm(finite.double())
    )
    assert err == pytest.approx(ref, rel=1e-9)
    assert ok == torch.allclose(off, finite, rtol=tol, atol=tol * float(finite.abs().max()))
    # Non-contiguous outputs, and the same figures whatever the thread count.
    t = finite.t()
    assert precision._kernel_stats(t * 1.01, t, tol, tol) == pytest.approx((ref, ok))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = precision._kernel_stats(off, finite, tol, tol)
    finally:
        torch.set_num_threads(threads)
    assert one == (err, ok)


def test_bf16_reaches_the_compilers_that_have_it() -> None:
    got = {
        b.name: b.compute
        for b in placement_backends.get_backends(["inductor", "onnxruntime", "fused"], "bf16")
    }
    assert got["inductor"] == "bf16"
    assert got["aten"] == got["fused"] == "f32"  # the reference and our f32 kernels
    assert got.get("onnxruntime", "f32") == "f32"  # no bf16 CPU kernels: f32 meets the bound


@pytest.mark.parametrize("bad", ["fp8", "float16", 16])
def test_an_unknown_precision_is_refused(bad: Any) -> None:
    model = torch.nn.Linear(4, 4)
    f = torch.compile(model, backend="torch_plugin", options={"precision": bad})
    with pytest.raises(Exception, match="'precision' must be one of f32, bf16"):
        f(torch.randn(2, 4))


def test_place_says_that_its_finer_search_builds_f32_regions(tmp_path, caplog) -> None:
    """place() starts from the whole-graph search, whose compilers compute in bf16 when asked;
    the finer search after it builds f32 regions, and says so."""
    import logging

    import torch_plugin

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    with caplog.at_level(logging.INFO, "torch_plugin"):
        placed = torch_plugin.place(
            model,
            (x,),
            backends=["aten"],
            cache_path=str(tmp_path / "p.db"),
            precision="bf16",
            samples=1,
        )
    torch.testing.assert_close(placed(x), model(x))
    assert any("finer search builds f32 regions" in r.getMessage() for r in caplog.records)


def test_openvino_hands_a_bf16_models_outputs_back_as_bf16(tmp_path, fixed_profile) -> None:
    """numpy has no bf16: OpenVINO's results for a bf16 output come as float16 arrays holding
    bf16's bits. Taken as float16, every bf16 model's graph failed its check (error inf) and
    OpenVINO was never picked for one."""
    pytest.importorskip("openvino")
    fixed_profile({"openvino": 1e-5})
    torch.manual_seed(0)
    # Token ids in, as a bf16 language model takes them (bf16 inputs OpenVINO is not given).
    model = torch.nn.Sequential(
        torch.nn.Embedding(100, 16),
        torch.nn.Linear(16, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 8),
    )
    model = model.to(torch.bfloat16).eval()
    x = torch.randint(0, 100, (4, 12))
    with torch.no_grad():
        want = model(x)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, None, ["openvino"]))
    with collect_stats() as stats, torch.no_grad():
        got = f(x)
    assert ": openvino (" in _summary(stats), _summary(stats)
    assert got.dtype == torch.bfloat16
    assert output_error(got, want) <= TOLERANCE["bf16"], output_error(got, want)


def test_openvino_takes_a_bf16_models_activations_as_bf16(tmp_path, fixed_profile) -> None:
    """A bf16 input (an image, hidden states) goes to OpenVINO as a bf16 tensor made from its
    bits; numpy has none, and such graphs were refused ('not a supported tensor')."""
    pytest.importorskip("openvino")
    fixed_profile({"openvino": 1e-5})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    model = model.to(torch.bfloat16).eval()
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path, None, ["openvino"]))
    with collect_stats() as stats, torch.no_grad():
        got = f(x)
        again = f(x[:, :].flip(0).contiguous())
    assert ": openvino (" in _summary(stats), _summary(stats)
    assert got.dtype == torch.bfloat16
    assert output_error(got, want) <= TOLERANCE["bf16"], output_error(got, want)
    with torch.no_grad():
        assert output_error(again, model(x.flip(0))) <= TOLERANCE["bf16"]
    # A bf16 ViT (its image in bf16) through OpenVINO's FX frontend, whose input ports take
    # bf16: it fell back to TorchScript's, which does not convert ViT.
    vit, inputs = hf_suite.build("vit", batch=2)
    vit = vit.to(torch.bfloat16).eval()
    image = inputs["pixel_values"].to(torch.bfloat16)
    with torch.no_grad():
        want = vit(pixel_values=image).logits
    opts = _opts(tmp_path / "vit", None, ["openvino"])
    with collect_stats() as stats, torch.no_grad():
        got = torch.compile(vit, backend="torch_plugin", options=opts)(pixel_values=image).logits
    assert ": openvino (" in _summary(stats), _summary(stats)
    assert output_error(got, want) <= TOLERANCE["bf16"], output_error(got, want)
