"""The default compile's CUDA-graph candidate (placement/cuda_graphs.py) and the device filter
of the placement backends. The replay itself needs a GPU: those tests skip here and run on the
lent GPU machine (scripts/gpu/run.sh)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from torch_plugin.placement import backends as B
from torch_plugin.placement.cuda_graphs import CudaGraphBackend, GraphReplay, capture_blocker

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _backends() -> list[B.Backend]:
    return [B.AtenBackend(), B.FusedBackend(), B.InductorBackend(), B.OnnxRuntimeBackend()]


def test_cpu_only_backends_are_left_out_of_a_gpu_graph(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="torch_plugin"):
        kept = B.for_device(_backends(), "cuda:NVIDIA H100 80GB HBM3")
    assert [b.name for b in kept] == ["aten", "inductor"]
    assert "fused, onnxruntime run on the CPU only" in caplog.text
    assert [b.name for b in B.for_device(_backends(), "cpu")] == [
        "aten",
        "fused",
        "inductor",
        "onnxruntime",
    ]
    assert B.for_device([CudaGraphBackend(B.InductorBackend())], "cpu") == []


def _graph(fn, *args):  # noqa: ANN001, ANN202
    with torch.no_grad():
        return make_fx(fn)(*args)


def test_capture_is_refused_where_a_replay_would_differ() -> None:
    x = torch.randn(4, 8)
    plain = _graph(lambda t: torch.relu(t) * 2, x)
    with torch.no_grad():
        assert "not a CUDA tensor" in capture_blocker(plain, [x])
    assert "autograd is on" in capture_blocker(plain, [x])
    drop = _graph(lambda t: F.dropout(t, 0.5, training=True), x)
    with torch.no_grad():
        reason = capture_blocker(drop, [x])  # the ops are read first
    assert reason is not None and "draws random numbers" in reason, reason
    # Attention kernels are tagged as random for their dropout; at dropout_p=0 they are not.
    q = torch.randn(1, 2, 8, 16)
    sdpa = _graph(lambda a: F.scaled_dot_product_attention(a, a, a), q)
    assert any("attention" in str(n.target) for n in sdpa.graph.nodes), sdpa.code
    with torch.no_grad():
        assert "not a CUDA tensor" in capture_blocker(sdpa, [q])

    def write(t: torch.Tensor) -> torch.Tensor:
        t.add_(1)
        return t * 2

    with torch.no_grad():
        assert "writes into its inputs" in capture_blocker(_graph(write, x.clone()), [x])


def test_the_candidate_shares_inductors_compile_of_a_whole_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def fake(self, gm, inputs):  # noqa: ANN001, ANN202
        calls.append(1)
        return lambda *a: gm(*a)

    monkeypatch.setattr(B.InductorBackend, "_compile", fake)
    x = torch.randn(4, 8)
    gm = _graph(lambda t: torch.relu(t) * 2, x)
    inductor = B.InductorBackend()
    with torch.no_grad():
        first = inductor.compile(gm, [x], "graph")
        assert inductor.compile(gm, [x], "graph") is first
        inductor.compile(gm, [torch.randn(2, 8)], "graph")  # another shape: compiled again
        inductor.compile(gm, [x], "region")  # regions are not kept
    assert len(calls) == 3
    with pytest.raises(B.BackendError, match="whole graphs only"):
        CudaGraphBackend(inductor).compile(gm, [x], "region")


@cuda
def test_a_replayed_graph_equals_the_plain_one_and_keeps_returned_outputs() -> None:
    w = torch.nn.Parameter(torch.randn(8, 8, device="cuda"))

    def fn(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ weight
        return y.relu(), y.sum(1)

    x = torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        replay = GraphReplay(fn, [x, w])
        a = [torch.randn(4, 8, device="cuda") for _ in range(3)]
        outs = [replay(t, w) for t in a]
        for t, out in zip(a, outs, strict=True):  # earlier outputs not overwritten
            want = fn(t, w)
            torch.testing.assert_close(out[0], want[0])
            torch.testing.assert_close(out[1], want[1])
        other = torch.nn.Parameter(torch.randn(8, 8, device="cuda"))
        torch.testing.assert_close(replay(a[0], other)[0], fn(a[0], other)[0])  # plain run
        torch.testing.assert_close(replay(a[0][:2], w)[0], fn(a[0][:2], w)[0])


@cuda
def test_the_default_compile_on_a_gpu_times_the_cuda_graph_candidate() -> None:
    from torch_plugin.placement import record

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    model = model.cuda().eval()
    x = torch.randn(2, 64, device="cuda")
    torch._dynamo.reset()
    with torch.no_grad(), record() as results:
        compiled = torch.compile(model, backend="torch_plugin", dynamic=False)
        got = compiled(x)
        torch.testing.assert_close(got, model(x), rtol=1e-3, atol=1e-3)
        again = compiled(x + 1)
        torch.testing.assert_close(again, model(x + 1), rtol=1e-3, atol=1e-3)
    trials = [t["backend"] for r in results for t in (r.whole_graph or {}).get("trials", [])]
    assert "inductor_cudagraphs" in trials, trials


def test_the_replay_is_no_compile_of_its_own_to_expect_or_record() -> None:
    """Its seconds (a capture, or Inductor's compile when it went first) once became its
    expected compile: it went before Inductor on the next graph or was skipped for the budget
    (GPT-2, ViT, DistilBERT on the H100 and H200 kept plain Inductor). Now the search places it
    after Inductor (compiles_with) and no rate of it is kept."""
    from torch_plugin.placement import whole_graph
    from torch_plugin.placement.cache import ProfileCache

    inductor = B.InductorBackend()
    replay = CudaGraphBackend(inductor)
    assert replay.compiles_with == "inductor" and inductor.compiles_with is None
    rates = {"inductor": 0.02, "inductor_cudagraphs": 0.03}
    assert whole_graph.expected_compiles([inductor, replay], rates, 100) == {
        "inductor": pytest.approx(2.0)
    }
    trials = [
        {"backend": "inductor", "compiled": True, "compile_s": 2.0},
        {"backend": "inductor_cudagraphs", "compiled": True, "compile_s": 3.0},
    ]
    cache = ProfileCache(":memory:")
    by_name = {"inductor": inductor, "inductor_cudagraphs": replay}
    whole_graph.record_compile_rates(cache, "m", trials, 100, None, by_name)
    names = ["inductor", "inductor_cudagraphs"]
    assert whole_graph.compile_rates(cache, "m", names) == {"inductor": pytest.approx(0.02)}
