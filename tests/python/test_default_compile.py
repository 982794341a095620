"""The default `torch.compile(model, backend="torch_plugin")` (issue 27): inference graphs placed
whole-graph-first with frozen weights and a guard, training graphs on the measured-best of
eager and Inductor, failures as logged fallbacks. Timings are stubbed (`fixed_profile`): no test
depends on which backend is faster on the machine running it."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

from torch_plugin.backend import collect_stats
from torch_plugin.models import hf_suite, output_tensors
from torch_plugin.placement import backends as placement_backends


def _opts(tmp_path: Any, **placement: Any) -> dict[str, Any]:
    """No passes named (the default), the profile cache in the test's directory. The budget is
    a multiple of Inductor's real compile time: a wide one, and no finer search, so that which
    compilers are tried never depends on how fast this machine compiles (1.25x left OpenVINO
    a few tenths of a second after Inductor's compile of the small ViT)."""
    defaults = {"samples": 1, "budget_factor": 100.0, "allow_refine": False}
    return {"placement": {"cache_path": str(tmp_path / "profile.db"), **defaults, **placement}}


def _vit() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model, inputs = hf_suite.build("vit", batch=2)
    return model.eval(), {"pixel_values": inputs["pixel_values"]}


def _close(got: Any, want: Any, tol: float = 1e-4) -> None:
    for a, b in zip(output_tensors(got), output_tensors(want), strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, float(b.abs().max())))


def _summaries(stats: list[dict[str, Any]]) -> list[str]:
    return [r["summary"] for r in stats if "summary" in r]


def test_inference_runs_the_fastest_whole_graph_with_frozen_weights(
    tmp_path, fixed_profile, caplog
) -> None:
    fixed_profile({"openvino": 1e-5, "inductor": 5e-4, "onnxruntime": 2e-4})
    model, x = _vit()
    with torch.no_grad():
        want = model(**x)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad(), caplog.at_level(logging.INFO, "torch_plugin"):
        got = f(**x)
    _close(got, want)
    (line,) = _summaries(stats)
    assert line.startswith("inference graph") and ": openvino (" in line, line
    assert "weights frozen" in line and "eager 1.000 ms" in line
    assert any(r.getMessage() == "torch_plugin: " + line for r in caplog.records)
    # A graph placed whole on one compiler is called as that compiler's function, not through
    # the graph's code and the group's module (materialize.boxed_single_group).
    from torch_plugin.placement.materialize import _GroupCall

    module_calls: list[int] = []
    forward = _GroupCall.forward
    _GroupCall.forward = lambda self, *a: module_calls.append(1) or forward(self, *a)
    try:
        with torch.no_grad():
            _close(f(**x), want)
    finally:
        _GroupCall.forward = forward
    assert module_calls == []


def test_eager_is_kept_unless_a_compiler_beats_it(tmp_path, fixed_profile) -> None:
    # Every compiler "measures" what eager does: nothing beats it by the 2% margin.
    fixed_profile({"openvino": 1e-3, "inductor": 1e-3, "onnxruntime": 1e-3})
    model, x = _vit()
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad():
        got = f(**x)
        want = model(**x)
    assert ": eager (" in _summaries(stats)[0]
    for a, b in zip(output_tensors(got), output_tensors(want), strict=True):
        assert torch.equal(a, b)


def test_frozen_weights_are_guarded_against_updates_and_replacement(
    tmp_path, fixed_profile, caplog
) -> None:
    fixed_profile({"onnxruntime": 1e-5})
    model, x = _vit()
    opts = _opts(tmp_path, backends=["aten", "onnxruntime"])  # the quickest compiler only
    f = torch.compile(model, backend="torch_plugin", options=opts)
    with torch.no_grad(), caplog.at_level(logging.INFO, "torch_plugin"):
        _close(f(**x), model(**x))
        model.classifier.weight.mul_(2.0)  # in place: its version counter moves
        _close(f(**x), model(**x))
        model.classifier.weight = torch.nn.Parameter(torch.randn_like(model.classifier.weight))
        _close(f(**x), model(**x))
        model.classifier.bias.add_(1.0)  # a third change: placed again, now unfrozen
        _close(f(**x), model(**x))
        model.classifier.bias.add_(1.0)
        _close(f(**x), model(**x))
    changed = [r.getMessage() for r in caplog.records if "changed in place" in r.getMessage()]
    assert len(changed) == 3, changed
    assert "without freezing" in changed[-1]


def test_weights_stay_guarded_under_torchs_guard_filter_that_drops_module_guards(
    tmp_path, fixed_profile, caplog
) -> None:
    # PyTorch's remedy for Dynamo's per-call cost (docs: default_compile.md, what a call costs):
    # torch takes guard_filter_fn out of the options, and the frozen-weights guard still sees a
    # weight changed in place or replaced, which Dynamo no longer checks.
    fixed_profile({"onnxruntime": 1e-5})
    model, x = _vit()
    opts = _opts(tmp_path, backends=["aten", "onnxruntime"])
    opts["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    f = torch.compile(model, backend="torch_plugin", options=opts)
    with torch.no_grad(), caplog.at_level(logging.INFO, "torch_plugin"):
        _close(f(**x), model(**x))
        model.classifier.weight.mul_(2.0)
        _close(f(**x), model(**x))
        model.classifier.weight = torch.nn.Parameter(torch.randn_like(model.classifier.weight))
        _close(f(**x), model(**x))
    changed = [r.getMessage() for r in caplog.records if "changed in place" in r.getMessage()]
    assert len(changed) == 2, changed


def test_training_runs_forward_and_backward_on_the_faster_and_matches_eager(
    tmp_path, fixed_profile
) -> None:
    fixed_profile({"inductor": 1e-5, "openvino": 1e-6})  # openvino is not a training choice
    model, inputs = hf_suite.build("llama")
    ref = copy.deepcopy(model)
    hf_suite.loss_of(ref(**inputs)).backward()
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats:
        loss = hf_suite.loss_of(f(**inputs))
        loss.backward()
    lines = _summaries(stats)
    assert [ln.split(" graph")[0] for ln in lines] == ["forward", "backward"], lines
    assert all(": inductor (" in ln and "openvino" not in ln for ln in lines), lines
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        scale = max(1.0, float(q.grad.abs().max()))
        assert float((p.grad - q.grad).abs().max()) <= 1e-4 * scale, n


def test_a_compiler_that_fails_or_is_missing_is_a_logged_fallback(
    tmp_path, fixed_profile, monkeypatch, caplog
) -> None:
    fixed_profile({"openvino": 1e-5, "inductor": 5e-4})

    def broken(self, gm, inputs, rule):  # noqa: ANN001, ANN202
        raise RuntimeError("simulated OpenVINO conversion failure")

    monkeypatch.setattr(placement_backends.OpenVINOBackend, "compile", broken)
    monkeypatch.setattr(
        placement_backends.OnnxRuntimeBackend,
        "unavailable",
        lambda self: "python package 'onnxruntime' is not importable (simulated)",
    )
    model, x = _vit()
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad(), caplog.at_level(logging.INFO, "torch_plugin"):
        _close(f(**x), model(**x))
    line = _summaries(stats)[0]
    assert ": inductor (" in line and "openvino failed" in line and "onnxruntime" not in line
    assert any("openvino cannot compile the whole" in r.getMessage() for r in caplog.records)


def test_bf16_skips_an_f32_compiler_that_cannot_beat_the_fastest_so_far(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """With bf16 allowed, ONNX Runtime still computes in f32: once a bf16 graph measures faster
    than the graph's FLOPs take at the machine's f32 peak, ONNX Runtime cannot win and is not
    compiled (its export was most of a cold compile). The peak is stubbed: a tiny one makes the
    bound exceed any timing."""
    from torch_plugin.placement import whole_graph

    fixed_profile({"openvino": 1e-5, "inductor": 5e-4, "onnxruntime": 1e-6})
    monkeypatch.setattr(whole_graph, "_f32_peak", lambda threads: 1.0)
    exported: list[int] = []
    real = placement_backends.OnnxRuntimeBackend.compile
    monkeypatch.setattr(
        placement_backends.OnnxRuntimeBackend,
        "compile",
        lambda self, *a: exported.append(1) or real(self, *a),
    )
    model, x = _vit()
    opts = {**_opts(tmp_path), "precision": "bf16"}
    f = torch.compile(model, backend="torch_plugin", options=opts)
    with collect_stats() as stats, torch.no_grad():
        _close(f(**x), model(**x), tol=5e-2)
    (line,) = _summaries(stats)
    assert ": openvino (" in line, line
    assert "onnxruntime skipped (cannot win: at least" in line, line
    assert "inductor skipped" not in line and "openvino skipped" not in line, line
    assert exported == []


def test_a_compiler_whose_copy_of_the_weights_would_not_fit_in_memory_is_skipped(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """Each compiled graph holds a copy of the frozen weights until the pick: with less memory
    free than that copy needs, no compiler is compiled (the pick is eager) and the summary says
    how much each would need; with the free memory unknown (0), the search is as before. A
    decision made for lack of memory is not kept in the profile cache: the next process (here
    the same cache, Dynamo reset) searches again."""
    from torch_plugin.placement import memory

    fixed_profile({"openvino": 1e-5, "inductor": 5e-4, "onnxruntime": 1e-6})
    compiled: list[str] = []
    for cls in (placement_backends.InductorBackend, placement_backends.OpenVINOBackend):
        real = cls.compile
        monkeypatch.setattr(
            cls, "compile", lambda self, *a, real=real: compiled.append(self.name) or real(self, *a)
        )
    model, x = _vit()
    for free, pick in ((1e3, "eager"), (0.0, "onnxruntime")):
        monkeypatch.setattr(memory, "free_bytes", lambda free=free: free)
        compiled.clear()
        torch._dynamo.reset()
        f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
        with collect_stats() as stats, torch.no_grad():
            _close(f(**x), model(**x))
        (line,) = _summaries(stats)
        assert f": {pick} (" in line, line
        if pick == "eager":
            assert compiled == [], compiled
            assert "inductor skipped (would need ~0.0 GB of memory, 0.0 GB free)" in line, line
        else:
            assert "would need" not in line and "inductor" in compiled, (line, compiled)


def test_a_compiler_expected_to_overrun_the_budget_is_skipped(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """The budget is a multiple of Inductor's compile, compiled first; a compiler expected to
    take longer than what is left of it is skipped, named in the summary with its estimate."""
    fixed_profile({"openvino": 1e-5, "inductor": 5e-4, "onnxruntime": 1e-6})
    monkeypatch.setattr(placement_backends.OnnxRuntimeBackend, "compile_s_per_node", 1e3)
    model, x = _vit()
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad():
        _close(f(**x), model(**x))
    (line,) = _summaries(stats)
    assert ": openvino (" in line and "onnxruntime skipped (would take ~" in line, line


def test_what_inductors_compile_ran_side_by_side_counts_in_the_budget(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """Inductor's first CPU compile in a process probes the CPU's vector ISAs; run side by
    side (vec_isa.py), they take less than the user's own Inductor spends on them. The seconds
    saved count in the budget as the user's compile would have spent them: a compiler that a
    budget of the faster compile alone leaves out (ONNX Runtime, expected far past it) is
    compiled within one that counts them."""
    from torch_plugin.placement import vec_isa

    fixed_profile({"openvino": 1e-5, "inductor": 5e-4, "onnxruntime": 1e-6})
    monkeypatch.setattr(placement_backends.OnnxRuntimeBackend, "compile_s_per_node", 1e3)
    model, x = _vit()
    for saved, ort_compiled in ((0.0, False), (1e9, True)):
        monkeypatch.setattr(vec_isa, "probe_side_by_side", lambda saved=saved: saved)
        torch._dynamo.reset()
        f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path / str(saved)))
        with collect_stats() as stats, torch.no_grad():
            _close(f(**x), model(**x))
        (line,) = _summaries(stats)
        if ort_compiled:
            assert ": onnxruntime (" in line and "skipped" not in line, line
        else:
            assert ": openvino (" in line and "onnxruntime skipped (would take ~" in line, line


def test_compile_rates_are_learned_per_compiler_and_machine() -> None:
    """Each compiled whole graph's seconds per node join its compiler's history on this machine
    (the last 8); the median replaces the fixed prior. Eager and failed trials add nothing."""
    from torch_plugin.placement import whole_graph
    from torch_plugin.placement.cache import ProfileCache

    cache = ProfileCache(":memory:")
    assert whole_graph.compile_rates(cache, "m1", ["inductor"]) == {}
    for s in (1.0, 2.0, 9.0, *[3.0] * 8):
        whole_graph.record_compile_rates(
            cache,
            "m1",
            [
                {"backend": "eager", "compiled": True, "compile_s": 0.0},
                {"backend": "inductor", "compiled": True, "compile_s": s * 100},
                {"backend": "openvino", "compiled": False, "compile_s": 5.0},
            ],
            nodes=100,
        )
        if s == 9.0:
            assert whole_graph.compile_rates(cache, "m1", ["inductor", "openvino"]) == {
                "inductor": 2.0
            }
    assert whole_graph.compile_rates(cache, "m1", ["inductor"]) == {"inductor": 3.0}  # last 8
    assert whole_graph.compile_rates(cache, "m2", ["inductor"]) == {}  # another machine
    # The output check's run of the compiled graph (one run: the median) is not compile time.
    trials = [{"backend": "openvino", "compiled": True, "compile_s": 5.0, "median_s": 4.0}]
    whole_graph.record_compile_rates(cache, "m3", trials, nodes=100)
    assert whole_graph.compile_rates(cache, "m3", ["openvino"]) == {"openvino": pytest.approx(0.01)}
    # Per precision computed in: a bf16 compile's rate is not an f32 one's.
    bf16 = {"openvino": "bf16"}
    assert whole_graph.compile_rates(cache, "m3", ["openvino"], bf16) == {}
    trials = [{"backend": "openvino", "compiled": True, "compile_s": 5.0, "median_s": 0.0}]
    whole_graph.record_compile_rates(cache, "m3", trials, nodes=100, computes=bf16)
    assert whole_graph.compile_rates(cache, "m3", ["openvino"], bf16) == {"openvino": 0.05}
    assert whole_graph.compile_rates(cache, "m3", ["openvino"]) == {"openvino": pytest.approx(0.01)}


def test_a_learned_compile_rate_sets_the_expectation(tmp_path, fixed_profile, monkeypatch) -> None:
    """The search's compile expectation comes from the learned rate where there is one: a
    compiler that took 1000 s per node before is expected to overrun the budget, and skipped."""
    from torch_plugin.placement import whole_graph

    fixed_profile({"openvino": 1e-5, "inductor": 5e-4, "onnxruntime": 1e-6})
    monkeypatch.setattr(
        whole_graph,
        "compile_rates",
        lambda cache, machine, compilers, computes=None: {"onnxruntime": 1e3},
    )
    model, x = _vit()
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad():
        _close(f(**x), model(**x))
    (line,) = _summaries(stats)
    assert "onnxruntime skipped (would take ~" in line, line


def _without_known_graphs(monkeypatch: Any) -> None:
    """The cached decision's path alone: a graph seen before is otherwise recalled whole before
    AOTAutograd (placement/known_graphs.py, tests in test_known_graphs.py), which this path
    still serves where that does not apply."""
    from torch_plugin.placement import known_graphs

    monkeypatch.setattr(known_graphs, "recall", lambda *a, **k: None)


def test_a_warm_compile_builds_only_the_pick(tmp_path, fixed_profile, monkeypatch) -> None:
    fixed_profile({"onnxruntime": 1e-5})
    _without_known_graphs(monkeypatch)
    model, x = _vit()
    opts = _opts(tmp_path, backends=["aten", "openvino", "onnxruntime"])
    with torch.no_grad():
        torch.compile(model, backend="torch_plugin", options=opts)(**x)
    compiled: list[str] = []
    for cls in (
        placement_backends.InductorBackend,
        placement_backends.OpenVINOBackend,
        placement_backends.OnnxRuntimeBackend,
    ):
        real = cls.compile

        def spy(self, gm, inputs, rule, real=real):  # noqa: ANN001, ANN202
            compiled.append(self.name)
            return real(self, gm, inputs, rule)

        monkeypatch.setattr(cls, "compile", spy)
    torch._dynamo.reset()
    f = torch.compile(model, backend="torch_plugin", options=opts)
    with collect_stats() as stats, torch.no_grad():
        _close(f(**x), model(**x))
    assert compiled == ["onnxruntime"]
    assert "(cached decision)" in _summaries(stats)[0]


def test_a_warm_compile_checks_the_pick_again_only_on_other_weights(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """A pick checked against eager on these weights is rebuilt without the check (a run of
    eager and one of the graph); on changed weights (same graph) it is checked again, once."""
    from torch_plugin.placement import whole_graph

    fixed_profile({"onnxruntime": 1e-5})
    _without_known_graphs(monkeypatch)
    checks: list[int] = []
    real = whole_graph.within

    def counted(got, want, precision):  # noqa: ANN001, ANN202
        checks.append(1)
        return real(got, want, precision)

    monkeypatch.setattr(whole_graph, "within", counted)
    model, x = _vit()
    opts = _opts(tmp_path, backends=["aten", "onnxruntime"])

    def compile_and_check(m: torch.nn.Module) -> str:
        torch._dynamo.reset()
        checks.clear()
        with collect_stats() as stats, torch.no_grad():
            _close(torch.compile(m, backend="torch_plugin", options=opts)(**x), m(**x))
        return _summaries(stats)[0]

    assert "(cached decision)" not in compile_and_check(model) and checks
    assert "(cached decision)" in compile_and_check(model) and not checks
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.classifier.weight.mul_(-1.0)
    assert "(cached decision)" in compile_and_check(other) and len(checks) == 1
    compile_and_check(other)
    assert not checks


def test_a_warm_compile_reuses_the_exported_onnx_model_of_the_same_weights(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """The ONNX export is kept beside the profile cache under a key of the graph and its
    weights' bytes: a warm compile skips it; other weights (same graph) export again."""
    fixed_profile({"onnxruntime": 1e-5})
    exports: list[int] = []
    real = placement_backends._export_onnx

    def counted(gm, args):  # noqa: ANN001, ANN202
        exports.append(1)
        return real(gm, args)

    monkeypatch.setattr(placement_backends, "_export_onnx", counted)
    model, x = _vit()
    opts = _opts(tmp_path, backends=["aten", "onnxruntime"])

    def compile_and_check(m: torch.nn.Module) -> None:
        torch._dynamo.reset()
        with torch.no_grad():
            _close(torch.compile(m, backend="torch_plugin", options=opts)(**x), m(**x))

    compile_and_check(model)
    assert len(exports) == 1 and list((tmp_path / "profile.artifacts").glob("*.onnx"))
    compile_and_check(model)  # warm: the decision and the model from disk
    assert len(exports) == 1
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.classifier.weight.mul_(-1.0)
    compile_and_check(other)
    assert len(exports) == 2


def test_a_warm_compile_loads_inductors_frozen_graph_from_its_cache(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """Inductor's freezing packs the weights for oneDNN, and its FX graph cache refused every
    graph holding such a weight ("mkldnn tensors unpickleable"): a warm or second process
    compiled an Inductor pick from scratch. Now the compiled graph is loaded, and its weights
    are the model's own, read when it is loaded (other weights, same graph: eager's numbers)."""
    from torch._dynamo.utils import counters
    from torch._inductor import codecache

    from torch_plugin import placement
    from torch_plugin.placement import whole_graph

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    fixed_profile({"inductor": 1e-5})
    model, x = _vit()
    opts = _opts(tmp_path, backends=["aten", "inductor"])
    hooks = (
        codecache.FxGraphCachePickler._reduce_tensor,
        codecache.CacheabilityValidator.check_tensor,
    )

    def compile_and_check(m: torch.nn.Module) -> dict[str, int]:
        torch._dynamo.reset()
        counters.clear()
        with collect_stats() as stats, torch.no_grad():
            _close(torch.compile(m, backend="torch_plugin", options=opts)(**x), m(**x))
        assert ": inductor (" in _summaries(stats)[0]
        return {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}

    first = compile_and_check(model)
    assert "fxgraph_cache_bypass" not in first, first
    other = copy.deepcopy(model)
    with torch.no_grad():  # vectors of up to 8 elements are inlined into the code: kept
        for p in other.parameters():
            if p.dim() > 1:
                p.mul_(-0.5)
    assert compile_and_check(other) == {"fxgraph_cache_hit": 1}
    # A decision made afresh (another profile cache) beside that Inductor cache: the graph
    # served from it is no compile. Its seconds are not recorded as Inductor's compile rate,
    # and the budget is a multiple of its expected compile (here 1 s a node), not of them.
    recorded: list[str] = []
    real = whole_graph.record_compile_rates

    def spy(cache, machine, trials, nodes, computes=None, by_name=None):  # noqa: ANN001, ANN202
        recorded.extend(t["backend"] for t in trials)
        return real(cache, machine, trials, nodes, computes, by_name)

    monkeypatch.setattr(whole_graph, "record_compile_rates", spy)
    monkeypatch.setattr(placement_backends.InductorBackend, "compile_s_per_node", 1.0)
    opts = _opts(tmp_path / "afresh", backends=["aten", "inductor"])
    with placement.record() as placed:
        assert compile_and_check(other) == {"fxgraph_cache_hit": 1}
    plan = placed[0].whole_graph
    assert recorded == ["eager"] and not plan["cached"]
    nodes = len(placed[0].groups[0].nodes)
    assert plan["budget_s"] == pytest.approx(100.0 * 1.0 * nodes)
    # Inductor's own hooks are put back after each compile.
    assert hooks == (
        codecache.FxGraphCachePickler._reduce_tensor,
        codecache.CacheabilityValidator.check_tensor,
    )


def test_a_torch_without_the_frozen_graph_cache_hooks_is_said_so(monkeypatch, caplog) -> None:
    """Where this torch lacks the hooks that key a packed frozen weight, a frozen graph compiles
    uncached as before, and the log says so (it fell back silently), leaving Inductor as is."""
    from torch._inductor import codecache

    reduce = codecache.FxGraphCachePickler._reduce_tensor
    monkeypatch.delattr(codecache, "_ident")
    with caplog.at_level(logging.INFO, "torch_plugin"):
        with placement_backends._frozen_graph_cacheable():
            assert codecache.FxGraphCachePickler._reduce_tensor is reduce
    said = [r.getMessage() for r in caplog.records if "cannot keep a graph" in r.getMessage()]
    assert len(said) == 1 and torch.__version__ in said[0], said


class _Cache(torch.nn.Module):
    """A static cache as modules keep one: a buffer written at a position each call, and a
    step counter added to (a write that is not idempotent: run twice, it counts twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kv", torch.zeros(4, 8))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.kv.index_copy_(0, pos, self.proj(x)[None])
        self.steps.add_(1)
        return torch.tanh(self.kv).sum(0) * self.steps


def test_a_graph_that_writes_its_inputs_runs_on_inductor_writing_them_as_eager(
    tmp_path, fixed_profile, caplog
) -> None:
    """Its whole graph goes to eager or Inductor (faster in the stub), the only compilers that
    write into a graph's inputs as eager does; measuring runs on copies of the written inputs
    (the counter is added to once per call, not once per run of the search), the written
    buffers are state (not frozen as weights, not guarded), and what it writes is eager's."""
    fixed_profile({"inductor": 1e-5, "openvino": 1e-6, "onnxruntime": 1e-6})
    model = _Cache()
    ref = copy.deepcopy(model)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad(), caplog.at_level(logging.INFO, "torch_plugin"):
        for pos in (1, 3, 0):
            x, at = torch.randn(8), torch.tensor([pos])
            torch.testing.assert_close(f(x, at), ref(x, at), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(model.kv, ref.kv, rtol=1e-5, atol=1e-6)
    assert int(model.steps) == int(ref.steps) == 3
    (line,) = _summaries(stats)
    assert ": inductor (" in line and "openvino" not in line and "onnxruntime" not in line, line
    assert "2 weights frozen" in line, line  # proj's weight and bias; not kv nor steps
    assert not any("changed in place" in r.getMessage() for r in caplog.records)


def test_a_graph_whose_writes_inductor_gets_wrong_runs_as_eager(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """What a candidate writes into its inputs is checked as its outputs are: a compile that
    computes the outputs right but writes the cache wrong is not picked."""
    fixed_profile({"inductor": 1e-5})
    real = placement_backends.InductorBackend._compile

    def writes_wrong(self, gm, inputs):  # noqa: ANN001, ANN202
        fn = real(self, gm, inputs)
        kv = next(i for i, x in enumerate(inputs) if x.dim() == 2)

        def run(*args):  # noqa: ANN002, ANN202
            out = fn(*args)
            args[kv].add_(1.0)
            return out

        return run

    monkeypatch.setattr(placement_backends.InductorBackend, "_compile", writes_wrong)
    model = _Cache()
    ref = copy.deepcopy(model)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad():
        x, at = torch.randn(8), torch.tensor([2])
        torch.testing.assert_close(f(x, at), ref(x, at), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(model.kv, ref.kv, rtol=0, atol=0)
    (line,) = _summaries(stats)
    assert ": eager (" in line and "inductor failed" in line, line


def test_a_decoder_whose_cache_buffers_it_writes_runs_placed_and_writes_them_as_eager(
    tmp_path, fixed_profile
) -> None:
    """The zoo's Llama keeps its KV cache in module buffers, written in place each step: the
    prefill's and each decode step's graph go to Inductor (faster in the stub) with only the
    weights frozen, and the logits and every cache buffer stay within f32 rounding of eager's."""
    from roundtrip import small_model

    fixed_profile({"inductor": 1e-5})
    model, _ = small_model("llama")
    model.eval()
    tokens = torch.randint(0, model.vocab_size, (2, 6))
    ref = copy.deepcopy(model)
    f = torch.compile(model, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, torch.no_grad():
        for a, b, pos in ((0, 4, 0), (4, 5, 4), (5, 6, 5)):
            _close(f(tokens[:, a:b], pos), ref(tokens[:, a:b], pos), tol=1e-5)
    for (n, a), (_, b) in zip(model.named_buffers(), ref.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"buffer {n}")
    lines = _summaries(stats)
    assert lines and all(": inductor (" in line for line in lines), lines


def test_generate_with_a_static_cache_runs_placed_and_gives_eagers_tokens(
    tmp_path, fixed_profile
) -> None:
    """HF's recipe for a compiled generate(): a static cache and the model's forward compiled.
    Both graphs (the prompt's, and a step's, which writes the cache) are placed on Inductor
    (faster in the stub), and the tokens are eager's, padded prompts included."""
    import transformers

    fixed_profile({"inductor": 1e-5})
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 256, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    kw = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.generation_config.cache_implementation = "static"
        opts = _opts(tmp_path)
        model.forward = torch.compile(model.forward, backend="torch_plugin", options=opts)
        with collect_stats() as stats:
            got = model.generate(ids, **kw)
            again = model.generate(ids, **kw)
    assert torch.equal(got, want) and torch.equal(again, want)
    lines = _summaries(stats)
    assert lines and all(": inductor (" in line for line in lines), lines


def _serve_lengths(
    name: str, placement: dict[str, Any], lengths: tuple[int, ...]
) -> tuple[list[int], list[str]]:
    """An HF suite model compiled with dynamic=True (the sequence length a symbol from the first
    call: a static first graph would cost the test Inductor's compile) and run on padded
    batches of `lengths`, each within f32 rounding of eager: the number of graphs placed after
    each call, and their summaries."""
    model, _ = hf_suite.build(name, batch=2)
    model.eval()
    f = torch.compile(model, backend="torch_plugin", options=placement, dynamic=True)
    compiles: list[int] = []
    with collect_stats() as stats, torch.no_grad():
        for length in lengths:
            ids = torch.randint(0, model.config.vocab_size, (2, length))
            mask = torch.ones(2, length, dtype=torch.long)
            mask[1, length - 5 :] = 0  # the shorter sequence of a padded batch
            batch = {"input_ids": ids, "attention_mask": mask}
            _close(f(**batch), model(**batch))
            compiles.append(len(_summaries(stats)))
    return compiles, _summaries(stats)


def test_a_dynamic_inference_graph_runs_on_a_compiler_that_keeps_its_sizes_symbolic(
    tmp_path, fixed_profile
) -> None:
    """A padded batch of another length makes Dynamo trace again with the sequence length a
    symbol. That graph is placed whole on a compiler that compiles for every size (OpenVINO),
    never on one that compiles for the sizes it is shown (ONNX Runtime, faster in the stub),
    and serves every length without another compile."""
    pytest.importorskip("openvino")
    fixed_profile({"openvino": 1e-5, "onnxruntime": 1e-6})
    opts = _opts(tmp_path, backends=("aten", "openvino", "onnxruntime"))
    compiles, (dynamic,) = _serve_lengths("bert", opts, (16, 24, 20, 31, 9))
    assert compiles == [1] * 5, compiles
    assert ": openvino (" in dynamic and "weights frozen" in dynamic, dynamic
    assert "whole graphs: eager" in dynamic, dynamic
    assert "onnxruntime" not in dynamic and "sizes symbolic" in dynamic, dynamic


def test_inductor_compiles_a_dynamic_inference_graph_for_every_length(
    tmp_path, fixed_profile
) -> None:
    """Inductor is a candidate for a dynamic graph too: compiled on the frame's symbolic sizes,
    as it compiles them as the frame's own backend, frozen weights folded. One program serves
    lengths shorter and longer than the one it was measured at, with no other compile."""
    fixed_profile({"inductor": 1e-5})
    opts = _opts(tmp_path, backends=("aten", "inductor"))
    compiles, (dynamic,) = _serve_lengths("gpt2", opts, (12, 20, 7, 33))
    assert compiles == [1] * 4, compiles
    assert ": inductor (" in dynamic and "weights frozen" in dynamic, dynamic
    assert "sizes symbolic" in dynamic, dynamic


def test_a_size_no_tensor_argument_has_is_a_logged_fallback(tmp_path, fixed_profile) -> None:
    """An int argument made a symbol (dynamic=True) that sizes no tensor argument: OpenVINO's
    copy cannot read it off a shape, so OpenVINO is reported failed and eager runs the graph."""
    pytest.importorskip("openvino")
    fixed_profile({"openvino": 1e-5})
    lin = torch.nn.Linear(8, 8).eval()

    def head(x: torch.Tensor, n: int) -> torch.Tensor:
        return lin(x)[:n] * 2

    f = torch.compile(head, backend="torch_plugin", options=_opts(tmp_path), dynamic=True)
    with collect_stats() as stats, torch.no_grad():
        for n in (3, 5):
            x = torch.randn(7, 8)
            torch.testing.assert_close(f(x, n), head(x, n))
    line = _summaries(stats)[0]
    assert ": eager (" in line and "openvino failed" in line, line


def test_a_dynamic_training_graph_is_placed_and_its_gradients_are_eagers(
    tmp_path, fixed_profile
) -> None:
    """A training step whose batch size changes (dynamic=True: the size a symbol): forward and
    backward are placed on Inductor's dynamic compile (faster in the stub) once, and every
    size's loss and gradients are eager's to f32 rounding."""
    fixed_profile({"inductor": 1e-5})
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(mlp)
    g = torch.compile(mlp, backend="torch_plugin", options=_opts(tmp_path), dynamic=True)
    with collect_stats() as stats:
        for rows in (5, 9, 3):
            x = torch.randn(rows, 8)
            g(x).square().mean().backward()
            ref(x).square().mean().backward()
            for p, q in zip(mlp.parameters(), ref.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
                p.grad = q.grad = None
    lines = _summaries(stats)
    assert sorted(line.split(" graph")[0] for line in lines) == ["backward", "forward"], lines
    assert all(": inductor (" in line and "sizes symbolic" in line for line in lines), lines


def test_a_dynamic_backward_is_searched_on_real_tensors(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """A backward that takes a symbolic size from its forward is compiled by AOTAutograd right
    after the forward, inside its fake mode: the search's inputs (the forward's activations and
    random incoming gradients) must still be real tensors, or every candidate but eager reads
    as differing (GPT-2 124M's dynamic backward stayed on eager)."""
    from torch._subclasses.fake_tensor import FakeTensor

    from torch_plugin.placement import whole_graph

    fixed_profile({"inductor": 1e-5})
    searched: list[tuple[str, Any]] = []
    search = whole_graph.place_whole_graph_first

    def spy(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        searched.append((kwargs.get("kind", "inference"), example_inputs))
        return search(gm, example_inputs, *args, **kwargs)

    monkeypatch.setattr(whole_graph, "place_whole_graph_first", spy)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    g = torch.compile(mlp, backend="torch_plugin", options=_opts(tmp_path), dynamic=True)
    with collect_stats() as stats:
        g(torch.randn(5, 8)).square().mean().backward()
    backward = [inputs for kind, inputs in searched if kind == "backward"]
    assert len(backward) == 1 and backward[0] is not None, searched
    tensors = [a for a in backward[0] if isinstance(a, torch.Tensor)]
    assert tensors and not any(isinstance(a, FakeTensor) for a in tensors), backward
    lines = [line for line in _summaries(stats) if line.startswith("backward")]
    assert len(lines) == 1 and ": inductor (" in lines[0], lines


def _step_as_eager(
    ours: Any, eager: Any, model: torch.nn.Module, ref: torch.nn.Module, seed: int
) -> None:
    """One training step of `ours` and of `eager` (each returns the loss) from the same seed:
    the loss, every gradient and the generator after the step are eager's; gradients cleared."""
    torch.manual_seed(seed)
    loss = ours()
    loss.backward()
    after = torch.rand(3)
    torch.manual_seed(seed)
    want = eager()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(after, torch.rand(3), rtol=0, atol=0)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)
        p.grad = q.grad = None


def test_a_training_graph_with_dropout_runs_on_inductor_with_eagers_masks(
    tmp_path, fixed_profile
) -> None:
    """Dropout as HF models ship it: the forward draws random numbers. Inductor (faster in the
    stub) is a candidate because it draws them from ATen's generator as eager does: the loss and
    gradients are eager's for the same seed, and the generator ends where eager leaves it
    (measuring did not advance it). Nothing else that draws otherwise is tried."""
    fixed_profile({"inductor": 1e-5, "openvino": 1e-6, "onnxruntime": 1e-6})
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.GELU(), torch.nn.Linear(32, 4)
    )
    ref = copy.deepcopy(mlp)
    g = torch.compile(mlp, backend="torch_plugin", options=_opts(tmp_path))
    x = torch.randn(8, 16)
    with collect_stats() as stats:
        for step in range(2):
            _step_as_eager(
                lambda: g(x).square().mean(), lambda: ref(x).square().mean(), mlp, ref, step
            )
    lines = _summaries(stats)
    forward = next(line for line in lines if line.startswith("forward"))
    assert ": inductor (" in forward, forward
    assert "openvino" not in forward and "onnxruntime" not in forward, forward


def test_a_gradient_checkpointed_training_step_runs_on_inductor_with_eagers_gradients(
    tmp_path, fixed_profile, caplog
) -> None:
    """Activation checkpointing with dropout (HF's gradient_checkpointing_enable, or
    torch.utils.checkpoint as here): the forward saves the generator state of each recomputed
    dropout and the backward runs it again from there. Both halves fell back unplaced: the
    backward's search ran dropout from a zero state ("Invalid mt19937 state", a WARNING), and
    Inductor, handed either half, traced it through AOTAutograd again, which cannot take those
    ops. Now both run on Inductor (faster in the stub) with eager's loss, gradients and stream,
    over two lengths (the second graph dynamic)."""
    from torch.utils.checkpoint import checkpoint

    fixed_profile({"inductor": 1e-5})
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(
        torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.GELU(), torch.nn.Linear(32, 16)
        )
        for _ in range(2)
    )

    def step(mods: torch.nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        for block in mods:
            x = x + checkpoint(block, x, use_reentrant=False)
        return x.square().mean()

    ref = copy.deepcopy(blocks)
    g = torch.compile(step, backend="torch_plugin", options=_opts(tmp_path))
    with collect_stats() as stats, caplog.at_level(logging.WARNING, logger="torch_plugin"):
        for i, rows in enumerate((8, 6)):
            x = torch.randn(rows, 5, 16)
            _step_as_eager(lambda x=x: g(blocks, x), lambda x=x: step(ref, x), blocks, ref, i)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    lines = _summaries(stats)
    for kind in ("forward", "backward"):
        placed = [line for line in lines if line.startswith(kind)]
        assert len(placed) == 2 and all(": inductor (" in line for line in placed), lines


def test_a_recomputed_random_ops_generator_state_is_synthesized_valid() -> None:
    """A backward whose forward values are not at hand (a warm compile checks its pick on
    synthesized inputs) takes each saved generator state as an input: made as zeros like other
    integer inputs, it was no valid state ("Invalid mt19937 state") and the graph could not
    run. It is the generator's own state now."""
    import torch.fx as fx

    from torch_plugin.placement.measure import synthesize_inputs

    g = fx.Graph()
    state, x = g.placeholder("rng_state_output_0"), g.placeholder("x")
    state.meta["val"], x.meta["val"] = torch.get_rng_state(), torch.empty(4, 8)
    dropout = torch.ops.aten.native_dropout.default
    out = g.call_function(torch.ops.higher_order.run_with_rng_state, (state, dropout, x, 0.5, True))
    g.output((out,))
    gm = fx.GraphModule({}, g)
    made = synthesize_inputs(gm)
    torch.testing.assert_close(made[0], torch.get_rng_state(), rtol=0, atol=0)
    before = torch.get_rng_state()
    first, again = gm(*made)[0], gm(*made)[0]
    torch.testing.assert_close(first, again, rtol=0, atol=0)  # the same state, the same mask
    torch.testing.assert_close(torch.get_rng_state(), before, rtol=0, atol=0)


def test_the_backward_is_searched_on_the_activations_its_forward_saved(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """The backward's candidates run on what the forward computed from the real inputs (its
    eager reference run), not on random tensors of the same shapes: random saved activations
    made a 12-layer GPT-2's gradients overflow on eager and Inductor alike, and Inductor was
    dropped as differing. Incoming gradients stay random."""
    from torch_plugin.placement import whole_graph

    fixed_profile({"inductor": 1e-5})
    seen: dict[str, list[Any]] = {}
    search = whole_graph.place_whole_graph_first

    def spy(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        seen[kwargs.get("kind", "inference")] = list(example_inputs or [])
        return search(gm, example_inputs, *args, **kwargs)

    monkeypatch.setattr(whole_graph, "place_whole_graph_first", spy)
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    g = torch.compile(lambda x: lin(x).sin().sum(), backend="torch_plugin", options=_opts(tmp_path))
    x = torch.randn(4, 8)
    g(x).backward()
    assert set(seen) == {"forward", "backward"}, sorted(seen)
    # The backward of sin saves its input: the linear layer's output on x.
    with torch.no_grad():
        pre = lin(x)
    assert any(
        isinstance(v, torch.Tensor) and v.shape == pre.shape and torch.allclose(v, pre)
        for v in seen["backward"]
    ), [tuple(v.shape) for v in seen["backward"] if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("passes", [[], ["dead_code_elimination"]])
def test_named_passes_turn_the_default_off(tmp_path, passes: list[str]) -> None:
    model, x = _vit()
    f = torch.compile(model, backend="torch_plugin", options={"passes": passes})
    with collect_stats() as stats, torch.no_grad():
        f(**x)
    assert stats and not _summaries(stats)


def test_the_weights_digest_tells_any_changed_piece_on_any_number_of_threads(monkeypatch) -> None:
    """A warm compile skips the output check of a graph checked before on the same weights,
    told by a digest summed in pieces over threads: it must differ for a change in any piece
    (the last, short one included), a swap of two equal-shaped weights and a buffer's change,
    and be the same on equal weights held by other tensors, on one thread or several."""
    from torch_plugin.placement import whole_graph

    monkeypatch.setattr(whole_graph, "DIGEST_PIECE", 64)  # 16 floats: several pieces each
    monkeypatch.setattr(whole_graph, "DIGEST_BATCH", 300)  # summed a few tensors at a time
    torch.manual_seed(0)
    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    gm.register_buffer("table", torch.randn(7, 5))
    frozen = {"a": torch.randn(10, 10), "b": torch.randn(10, 10), "c": torch.randn(3)}
    digest = whole_graph._weights_digest(gm, frozen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert whole_graph._weights_digest(gm, frozen) == digest
        torch.set_num_threads(3)
        assert whole_graph._weights_digest(gm, frozen) == digest
    finally:
        torch.set_num_threads(threads)
    assert whole_graph._weights_digest(gm, {k: v.clone() for k, v in frozen.items()}) == digest
    for name, index in (("a", 0), ("a", 50), ("a", 99), ("c", 2)):
        changed = {k: v.clone() for k, v in frozen.items()}
        changed[name].view(-1)[index] += 1e-3
        assert whole_graph._weights_digest(gm, changed) != digest, (name, index)
    swapped = {**frozen, "a": frozen["b"], "b": frozen["a"]}
    assert whole_graph._weights_digest(gm, swapped) != digest
    gm.table[6, 4] += 1.0
    assert whole_graph._weights_digest(gm, frozen) != digest
