"""f32 linears as three bf16 products under "high" float32 matmul precision (placement/bf16x3.py,
kernels/cpu/linear_bf16x3.cc): the kernel's numerics against float64, the graph rewrite, and the
default compile taking it only where the user's matmul precision allows it. Timings are stubbed
(`fixed_profile`); where the CPU has no AMX the gate is patched open, the kernel runs anyway."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_plugin.backend import collect_stats
from torch_plugin.placement import backends as placement_backends
from torch_plugin.placement import bf16x3

pytestmark = pytest.mark.skipif(
    not bf16x3._kernel_available(), reason="torch's MKL does not export its bf16 GEMM"
)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.fixture
def high() -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def test_split_weight_is_hi_lo_in_the_f32_weights_bytes() -> None:
    w = torch.randn(5, 7)
    w2 = torch.ops.torch_plugin.split_bf16x3_weight(w)
    assert w2.dtype == torch.bfloat16 and w2.shape == (5, 14)
    hi, lo = w2[:, :7], w2[:, 7:]
    assert torch.equal(hi, w.bfloat16())
    assert torch.equal(lo, (w - hi.float()).bfloat16())


@pytest.mark.parametrize("bias", [True, False])
def test_linear_keeps_sixteen_bits_where_one_bf16_product_keeps_eight(bias: bool) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 33, 320), torch.randn(96, 320)
    b = torch.randn(96) if bias else None
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    got = torch.ops.torch_plugin.linear_bf16x3(x, torch.ops.torch_plugin.split_bf16x3_weight(w), b)
    assert got.dtype == torch.float32 and got.shape == (2, 33, 96)
    one_pass = torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).double()
    one_pass = one_pass + (0 if b is None else b.double())
    assert _relative(got, want) < 2e-5  # three products: ~4e-6
    assert _relative(one_pass, want) > 1e-3  # one product: ~2e-3


def test_linear_takes_a_non_contiguous_input_and_names_a_wrong_weight() -> None:
    x, w = torch.randn(64, 40).t(), torch.randn(24, 64)  # x [40, 64], strided
    w3 = torch.ops.torch_plugin.split_bf16x3_weight(w)
    got = torch.ops.torch_plugin.linear_bf16x3(x, w3)
    assert _relative(got, x.double() @ w.double().t()) < 2e-5
    with pytest.raises(RuntimeError, match="linear_bf16x3: the weight must be split_bf16x3"):
        torch.ops.torch_plugin.linear_bf16x3(x, w.bfloat16())


class _Mlp(torch.nn.Module):
    """bert's linear (addmm on w.t()), a bias-free one (mm) and GPT-2's Conv1D (addmm on a
    weight stored [in, out]), and one too small to gain."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(128, 256)
        self.proj = torch.nn.Linear(256, 128, bias=False)
        self.conv1d_w = torch.nn.Parameter(torch.randn(128, 256) * 0.05)
        self.conv1d_b = torch.nn.Parameter(torch.randn(256))
        self.small = torch.nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(torch.nn.functional.gelu(self.fc(x)))
        h = torch.addmm(self.conv1d_b, h.reshape(-1, 128), self.conv1d_w)
        return self.small(h)


def _frozen_aten_graph(model: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    """The model's ATen graph with its weights as constants (get_attr), as the default compile
    hands a frozen inference graph to Inductor."""
    with torch.no_grad():
        return make_fx(model)(x)


def test_rewrite_takes_each_large_linear_on_a_frozen_weight_and_leaves_gm_alone() -> None:
    torch.manual_seed(0)
    model, x = _Mlp().eval(), torch.randn(512, 128)
    gm = _frozen_aten_graph(model, x)
    before = str(gm.graph)
    out, count = bf16x3.with_bf16x3_linears(gm)
    assert count == 3  # fc, proj, the Conv1D; not `small` (2*512*256*4 < MIN_FLOPS)
    assert str(gm.graph) == before
    targets = [n.target for n in out.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.torch_plugin.linear_bf16x3.default) == 3
    assert targets.count(torch.ops.aten.addmm.default) == 1  # `small`
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
        got = out(x)
    assert _relative(got, want) < 2e-5


class _Conv1DStack(torch.nn.Module):
    """GPT-2's Conv1D four times over, each weight stored [in, out] and of the same shape."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(128, 128)) for _ in range(4))
        self.b = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(128)) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w, b in zip(self.w, self.b, strict=True):
            x = torch.addmm(b, x, w) / 16
        return x


def test_rewrite_splits_each_of_same_shaped_weights_stored_in_out() -> None:
    torch.manual_seed(0)
    model, x = _Conv1DStack().eval(), torch.randn(512, 128)
    out, count = bf16x3.with_bf16x3_linears(_frozen_aten_graph(model, x))
    assert count == 4
    assert len({t.data_ptr() for t in out.buffers()} & {w.data_ptr() for w in model.w}) == 0
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
        got = out(x)
    assert _relative(got, want) < 2e-5


def test_rewrite_reads_a_transpose_only_where_it_swaps_the_dims() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    outs = []
    for dims in ((0, 1), (0, 0), (-1, 0)):  # w.t(), w itself, w.t()
        w = g.get_attr(f"w{len(outs)}")
        outs.append(
            g.call_function(
                torch.ops.aten.mm.default,
                (x, g.call_function(torch.ops.aten.transpose.int, (w, *dims))),
            )
        )
    g.output(tuple(outs))
    root = torch.nn.Module()
    for i in range(3):
        root.register_buffer(f"w{i}", torch.randn(512, 512))
    gm = torch.fx.GraphModule(root, g)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_x = mode.from_tensor(torch.randn(512, 512))
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                n.meta["val"] = fake_x
            elif n.op == "call_function" and n.target is torch.ops.aten.mm.default:
                n.meta["val"] = fake_x.new_empty((512, 512))
    out, count = bf16x3.with_bf16x3_linears(gm)
    assert count == 2
    x_ = torch.randn(512, 512)
    got, want = out(x_), gm(x_)
    for a, b in zip(got, want, strict=True):
        assert _relative(a, b.double()) < 2e-5


@pytest.mark.parametrize("rows", [256, 512])
def test_a_linear_of_few_rows_stays_f32(rows: int) -> None:
    model = torch.nn.Linear(256, 256).eval()
    _, count = bf16x3.with_bf16x3_linears(_frozen_aten_graph(model, torch.randn(rows, 256)))
    assert count == (rows >= bf16x3.MIN_ROWS)


def test_applies_only_under_high_precision_on_a_cpu_with_amx(monkeypatch) -> None:
    monkeypatch.setattr(bf16x3, "_amx", lambda: True)
    assert "not 'high'" in str(bf16x3.applies("cpu"))  # the default, "highest"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert bf16x3.applies("cpu") is None
        assert "not on the CPU" in str(bf16x3.applies("cuda:H100"))
        monkeypatch.setattr(bf16x3, "_amx", lambda: False)
        assert "no AMX" in str(bf16x3.applies("cpu"))
    finally:
        torch.set_float32_matmul_precision(before)


def test_only_inductor_computes_f32x3() -> None:
    got = {
        b.name: b.compute
        for b in placement_backends.get_backends(["inductor", "openvino", "fused"], "f32x3")
    }
    assert got["inductor"] == "f32x3"
    assert got["aten"] == got["fused"] == got.get("openvino", "f32") == "f32"


def _compile(tmp_path: Any, model: torch.nn.Module, x: torch.Tensor) -> tuple[Any, str]:
    placement = {
        "cache_path": str(tmp_path / "profile.db"),
        "samples": 1,
        "backends": ["inductor"],
        "allow_refine": False,
    }
    f = torch.compile(model, backend="torch_plugin", options={"placement": placement})
    with collect_stats() as stats, torch.no_grad():
        got = f(x)
    (line,) = [r["summary"] for r in stats if "summary" in r]
    return got, line


def test_default_compile_runs_inductors_linears_as_three_products_under_high(
    tmp_path, fixed_profile, monkeypatch, high
) -> None:
    fixed_profile({"inductor": 1e-5})
    monkeypatch.setattr(bf16x3, "_amx", lambda: True)
    seen: list[int] = []
    rewrite = bf16x3.with_bf16x3_linears
    monkeypatch.setattr(
        bf16x3,
        "with_bf16x3_linears",
        lambda gm: seen.append(1) or rewrite(gm),  # type: ignore[func-returns-value]
    )
    torch.manual_seed(0)
    model, x = _Mlp().eval(), torch.randn(512, 128)
    got, line = _compile(tmp_path, model, x)
    assert ": inductor (" in line and "'high': 3 linears as three bf16 products" in line, line
    assert seen, "Inductor's graph was not rewritten"
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    assert 1e-8 < _relative(got, want) < 2e-5  # f32 alone gives ~1e-7


def test_default_compile_says_where_no_linear_has_enough_rows(
    tmp_path, fixed_profile, monkeypatch, high
) -> None:
    fixed_profile({"inductor": 1e-5})
    monkeypatch.setattr(bf16x3, "_amx", lambda: True)
    model, x = _Mlp().eval(), torch.randn(128, 128)
    got, line = _compile(tmp_path, model, x)
    assert "'high': no linear of 512 rows or more, all f32" in line, line
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    assert _relative(got, want) < 2e-6


def test_default_compile_logs_why_linears_stay_f32_under_high(
    tmp_path, fixed_profile, monkeypatch, high, caplog
) -> None:
    fixed_profile({"inductor": 1e-5})
    monkeypatch.setattr(bf16x3, "_amx", lambda: False)
    model, x = _Mlp().eval(), torch.randn(512, 128)
    with caplog.at_level(logging.INFO, logger="torch_plugin"):
        _, line = _compile(tmp_path, model, x)
    assert "f32 linears stay f32: the CPU has no AMX tiles" in caplog.text
    assert "bf16 products" not in line and "'high'" not in line, line


def test_default_compile_keeps_f32_linears_under_highest(tmp_path, fixed_profile, monkeypatch):
    fixed_profile({"inductor": 1e-5})
    monkeypatch.setattr(bf16x3, "_amx", lambda: True)
    assert torch.get_float32_matmul_precision() == "highest"
    model, x = _Mlp().eval(), torch.randn(512, 128)
    got, line = _compile(tmp_path, model, x)
    assert ": inductor (" in line and "bf16 products" not in line, line
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
    assert _relative(got, want) < 2e-6
