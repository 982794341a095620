"""Inductor's matmul floor (placement/kernel_floor.py): which matmuls it counts, how it sums
them, and that the default compile skips Inductor's compile when the floor is over the fastest
graph. Timings are stubbed: no test depends on this machine's speed."""

from __future__ import annotations

from typing import Any

import aten_graphs
import pytest
import torch

from torch_plugin.backend import collect_stats
from torch_plugin.placement import backends as placement_backends
from torch_plugin.placement import kernel_floor


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)
        self.down = torch.nn.Linear(1024, 256)
        self.again = torch.nn.Linear(256, 1024)  # the same matmul as `up`
        self.tiny = torch.nn.Linear(256, 4, bias=False)  # under MIN_FLOPS

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.down(torch.relu(self.up(x)))
        return self.again(h), self.tiny(h)


def _compile_mlp(tmp_path: Any, **placement: Any) -> str:
    """The default compile of _Mlp, checked against eager; its one summary line. A wide budget
    and no finer search: what is tried never depends on this machine's compile speed."""
    model, x = _Mlp().eval(), torch.randn(64, 256)
    defaults = {"samples": 1, "budget_factor": 100.0, "allow_refine": False}
    opts = {"placement": {"cache_path": str(tmp_path / "profile.db"), **defaults, **placement}}
    f = torch.compile(model, backend="torch_plugin", options=opts)
    with collect_stats() as stats, torch.no_grad():
        got, want = f(x), model(x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    (line,) = [r["summary"] for r in stats if "summary" in r]
    return line


def test_matmuls_groups_equal_matmuls_largest_first_and_leaves_small_ones_out() -> None:
    gm = aten_graphs.forward_graph(_Mlp().eval(), torch.randn(64, 256))[0]
    groups = kernel_floor.matmuls(gm)
    # up and again: one group of two (2 x 64 x 256 x 1024 FLOPs each); down: one; tiny: none.
    assert [count for _, count in groups] == [2, 1], groups
    (op, a_shape, _, b_shape, b_stride), _ = groups[0]
    assert (op, a_shape, b_shape) == ("addmm", (64, 256), (256, 1024))
    assert b_stride == (1, 256)  # a Linear's weight, transposed: MKL's packed call applies
    assert groups[1][0][3] == (1024, 256)


def test_the_floor_sums_each_groups_fastest_call_and_stops_at_the_target() -> None:
    gm = aten_graphs.forward_graph(_Mlp().eval(), torch.randn(64, 256))[0]
    timed: list[int] = []

    def timer(call: Any) -> float:
        timed.append(1)
        return 0.004 if len(timed) % 2 else 0.003  # ATen's call, then MKL's packed one

    ways = 2 if torch._C.has_mkl else 1
    fastest = 0.003 if ways == 2 else 0.004
    # Both groups: 2 x fastest + 1 x fastest.
    assert abs(kernel_floor.matmul_floor(gm, 1.0, timer) - 3 * fastest) < 1e-12
    assert len(timed) == 2 * ways
    # A target the first group reaches: the second is never timed, and its sum is returned.
    timed.clear()
    assert abs(kernel_floor.matmul_floor(gm, 0.005, timer) - 2 * fastest) < 1e-12
    assert len(timed) == ways


def test_the_floor_holds_only_for_inductor_in_f32_on_the_cpu_with_its_default_matmuls(
    monkeypatch,
) -> None:
    import torch._inductor.config as inductor_config

    x = [torch.randn(2, 2)]
    inductor = placement_backends.InductorBackend()
    assert kernel_floor.applies(inductor, x)
    assert not kernel_floor.applies(placement_backends.OpenVINOBackend(), x)
    assert not kernel_floor.applies(None, x)
    bf16 = placement_backends.InductorBackend()
    bf16.compute = "bf16"
    assert not kernel_floor.applies(bf16, x)
    monkeypatch.setattr(inductor_config, "max_autotune", True)
    assert not kernel_floor.applies(inductor, x)


def test_a_group_whose_operands_would_overrun_the_measuring_cap_is_left_out(monkeypatch) -> None:
    """The 1.2B Llama's vocabulary projection at one token: 2 x 1 x 2048 x 128256 FLOPs, under
    the MLP's, but a 1 GB weight to fill and pack again (18 s in the middle of its compile,
    where the cap, checked between groups, was 3 s). Left out before its operands are made;
    the groups before and after it are summed (a sum without it is a bound too)."""
    mlp = ("mm", (512, 2048), (2048, 1), (2048, 8192), (1, 2048))
    vocab = ("mm", (1, 2048), (2048, 1), (2048, 128256), (1, 2048))
    small = ("mm", (512, 2048), (2048, 1), (2048, 512), (1, 2048))
    assert kernel_floor.setup_bytes(vocab) > 2e9 > 2e8 > kernel_floor.setup_bytes(mlp)
    monkeypatch.setattr(kernel_floor, "matmuls", lambda gm: [(mlp, 32), (vocab, 1), (small, 16)])
    made: list[tuple[Any, ...]] = []
    monkeypatch.setattr(kernel_floor, "_calls", lambda key: made.append(key) or [lambda: None])
    floor = kernel_floor.matmul_floor(None, 10.0, lambda call: 0.001, max_measure_s=1.0)
    assert made == [mlp, small]
    assert abs(floor - 48 * 0.001) < 1e-12
    # With the time to make it, it is counted.
    made.clear()
    floor = kernel_floor.matmul_floor(None, 10.0, lambda call: 0.001, max_measure_s=5.0)
    assert made == [mlp, vocab, small] and abs(floor - 49 * 0.001) < 1e-12


def test_the_default_compile_skips_inductor_when_its_matmuls_cannot_beat_the_fastest(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """OpenVINO's graph measures 10 us; Inductor's matmuls alone "take" 1 ms (stubbed): its
    compile cannot pay and never runs. ONNX Runtime, after it, is still compiled."""
    fixed_profile({"openvino": 1e-5, "inductor": 5e-4, "onnxruntime": 2e-5})
    # OpenVINO's compile expected cheap (tried first), ONNX Runtime's after Inductor's.
    for cls, per_node in (("OpenVINOBackend", 1e-3), ("InductorBackend", 1.0)):
        monkeypatch.setattr(getattr(placement_backends, cls), "compile_s_per_node", per_node)
    monkeypatch.setattr(placement_backends.OnnxRuntimeBackend, "compile_s_per_node", 0.5)
    asked: list[float] = []
    monkeypatch.setattr(
        kernel_floor, "matmul_floor", lambda gm, target_s: asked.append(target_s) or 1e-3
    )
    compiled: list[int] = []
    real = placement_backends.InductorBackend.compile
    monkeypatch.setattr(
        placement_backends.InductorBackend,
        "compile",
        lambda self, *a: compiled.append(1) or real(self, *a),
    )
    line = _compile_mlp(tmp_path)
    assert ": openvino (" in line, line
    assert "inductor skipped (cannot win: its matmuls alone take 1.0 ms, 0.0 ms measured)" in line
    assert "onnxruntime skipped" not in line and "onnxruntime 0.020 ms" in line, line
    assert compiled == []
    assert asked and abs(asked[0] - 1e-5 / 0.85) < 1e-12


def test_operands_are_made_in_any_layout_a_graph_gives_them() -> None:
    # A broadcast operand (stride 0) shares memory between elements: made without writing it.
    a = kernel_floor._strided((4, 8), (0, 1))
    assert a.shape == (4, 8) and a.stride() == (0, 1)
    assert torch.equal(a[0], a[3])
    assert kernel_floor._strided((8, 4), (1, 8)).stride() == (1, 8)


def test_a_floor_that_cannot_be_measured_is_no_bound(tmp_path, fixed_profile, monkeypatch) -> None:
    """A matmul the floor cannot time (an error in a kernel call) costs no compile: the floor
    is 0, logged, and Inductor is compiled and measured as before."""
    fixed_profile({"openvino": 1e-5, "inductor": 5e-4})
    monkeypatch.setattr(placement_backends.OpenVINOBackend, "compile_s_per_node", 1e-3)
    monkeypatch.setattr(placement_backends.InductorBackend, "compile_s_per_node", 1.0)

    def fails(gm: Any, target_s: float) -> float:
        raise RuntimeError("no kernel for this layout")

    monkeypatch.setattr(kernel_floor, "matmul_floor", fails)
    line = _compile_mlp(tmp_path, backends=["openvino", "inductor"])
    assert "inductor 0.500 ms" in line and "skipped" not in line, line


def test_best_of_counts_the_warm_up_and_stops_past_max_s(monkeypatch) -> None:
    """A fake clock: a 0.2 s call is made twice (warm-up and one more, 0.4 s > 0.3 s), a 10 ms
    one four times; the warm-up's time counts in the minimum."""
    clock = [0.0]
    monkeypatch.setattr(kernel_floor.time, "perf_counter", lambda: clock[0])

    def timed(durations: list[float]) -> tuple[Any, list[float]]:
        made: list[float] = []

        def fn() -> None:
            t = durations[min(len(made), len(durations) - 1)]
            made.append(t)
            clock[0] += t

        return fn, made

    fn, made = timed([0.2])
    assert kernel_floor.best_of(fn) == 0.2 and len(made) == 2
    fn, made = timed([0.01])
    assert kernel_floor.best_of(fn) == pytest.approx(0.01) and len(made) == 4
    fn, made = timed([0.5, 0.9])  # one call past max_s still gets a second
    assert kernel_floor.best_of(fn) == 0.5 and len(made) == 2
