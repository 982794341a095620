"""Graph pipeline parallelism: plans from C++ and the gloo runtime against single-process."""

from __future__ import annotations

import json
from pathlib import Path

import dist_workers
import pytest
import torch
import torch.fx as fx

import torch_plugin
from torch_plugin import models
from torch_plugin.distributed import plan_pipeline


@pytest.mark.parametrize("name", ["mmt", "candle_uno", "dlrm"])
def test_plans_cover_every_node_once(name: str) -> None:
    model, inputs = models.build(name, small=True, batch=8)
    for strategy in ("gpp", "spp"):
        plan, traced = plan_pipeline(model, inputs, 4, strategy=strategy, scope_depth=3)
        seen = [n for stage in plan.stage_nodes for n in stage]
        assert sorted(seen) == sorted(n.name for n in traced.nodes)
        assert sum(s.replicas for s in plan.stages) == 4
        sim = plan.raw.sim
        assert 0 <= sim.bubble_fraction < 1 and sim.throughput > 0
        if strategy == "spp":
            assert plan.raw.depth == plan.num_stages


def test_gpp_is_shallower_than_spp_on_branches() -> None:
    model, inputs = models.build("candle_uno", small=True, batch=16)
    gpp, traced = plan_pipeline(model, inputs, 8, scope_depth=3, micro_batch_sizes=[2])
    spp, _ = plan_pipeline(traced, strategy="spp", num_devices=8, micro_batch_sizes=[2])
    assert gpp.raw.depth < spp.raw.depth


def test_plan_png_and_summary(tmp_path: Path) -> None:
    model, inputs = models.build("mmt", small=True, batch=8)
    plan, _ = plan_pipeline(model, inputs, 4, scope_depth=3, micro_batch_sizes=[2])
    dag, gantt = plan.save_png(str(tmp_path / "mmt"))
    assert Path(dag).stat().st_size > 1000 and Path(gantt).stat().st_size > 1000
    assert "stages on 4 devices" in plan.summary()


def test_bad_options_are_clear_errors() -> None:
    model, inputs = models.build("mlp", small=True, batch=4)
    with pytest.raises(ValueError, match="valid: gpp, spp"):
        plan_pipeline(model, inputs, 2, strategy="zigzag")
    with pytest.raises(ValueError, match="valid: v100"):
        plan_pipeline(model, inputs, 2, device="tpu")
    with pytest.raises(ValueError, match="does not divide"):
        plan_pipeline(model, inputs, 2, micro_batch_sizes=[3])
    with pytest.raises(torch_plugin._C.PlanError, match="needs"):
        plan_pipeline(model, inputs, 2, memory_limit_bytes=1000)


def test_parallelize_bad_input() -> None:
    model, inputs = models.build("mlp", small=True, batch=4)
    with pytest.raises(ValueError, match="valid: shard, pipeline, gpp, spp"):
        torch_plugin.parallelize(model, None, inputs, strategy="zero", loss_fn=torch.nn.MSELoss())
    with pytest.raises(ValueError, match="does not divide"):
        torch_plugin.parallelize(
            model, None, inputs, loss_fn=torch.nn.MSELoss(), num_microbatches=3
        )
    with pytest.raises(ValueError, match="needs loss_fn"):
        torch_plugin.parallelize(model, None, inputs)


def test_runtime_requires_distributed() -> None:
    model, inputs = models.build("mlp", small=True, batch=4)
    with pytest.raises(RuntimeError, match="init_process_group"):
        torch_plugin.distributed.PipelineParallel(
            model, inputs, loss_fn=torch.nn.functional.mse_loss
        )


@pytest.mark.parametrize(
    "model_name,strategy,micro",
    [
        ("mmt", "gpp", [2]),
        ("mmt", "spp", [2]),
        ("candle_uno", "gpp", [2]),
        ("candle_uno", "spp", [2]),
        ("candle_uno", "gpp", [1, 2, 4]),  # per-stage micro-batch sizes and replicas
        ("mmt", "gpp", None),  # torch_plugin.parallelize(..., num_microbatches=4)
    ],
)
def test_four_rank_step_equals_single_process(
    gloo, model_name: str, strategy: str, micro: list[int] | None, tmp_path: Path
) -> None:
    dist_workers.pooled(
        gloo(4), dist_workers.pipeline_step_matches, model_name, strategy, micro, 8, str(tmp_path)
    )
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(reports) == 4
    # Every parameter is owned by exactly one stage (replicas share their stage's).
    by_stage: dict[int, list[str]] = {}
    for r in reports:
        by_stage.setdefault(r["stage"], r["params"])
        assert by_stage[r["stage"]] == r["params"]
    model, _ = models.build(model_name, small=True)
    owned = sorted(n for names in by_stage.values() for n in names)
    assert owned == sorted(n for n, _ in model.named_parameters())
    assert max(r["max_grad_diff"] for r in reports) <= 1e-5
    # Twice the example's batch: two chunks of the schedule, one process's gradients.
    assert max(r["chunked_grad_diff"] for r in reports) <= 1e-5
    # 1.5x the example's batch: a stage split at module level refuses it, naming the fix.
    assert all("a multiple of it" in r["refused"] for r in reports), reports[0]["refused"]


@pytest.mark.multirank
@pytest.mark.parametrize("scenario", ["dead", "stall", "mismatch"])
def test_faulty_rank_fails_the_job_fast(scenario: str, tmp_path: Path) -> None:
    timeout_s = 5.0
    dist_workers.spawn(dist_workers.pipeline_fault, 4, scenario, timeout_s, str(tmp_path))
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    survivors = [r for r in reports if r["rank"] != 3]
    assert len(survivors) == 3
    for r in survivors:
        assert r["message"], f"rank {r['rank']} did not notice the {scenario} rank"
        assert r["seconds"] < 3 * timeout_s
        if scenario == "mismatch":
            assert "plans differ" in r["message"] and "[3]" in r["message"]
        else:
            assert (
                "died or stalled" in r["message"]
                or "timed out" in r["message"].lower()
                or ("connection" in r["message"].lower())
            ), r["message"]


def test_replayed_draws_know_which_run_along_the_batch() -> None:
    """A dropout over a parameter whose rows are a multiple of the micro-batch (8 positions,
    micro-batches of 2) is not a batch draw: the replay draws it whole, once per step, as one
    process does; a dropout over activations takes each micro-batch's rows of a whole-batch
    mask, and the model's draws at another length are checked against the plan."""
    import torch.nn.functional as F

    from torch_plugin.pipeline import capture as pipeline_capture
    from torch_plugin.pipeline.draws import DrawPlan, StepDraws, draws_of

    class PositionDropout(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = torch.nn.Parameter(torch.randn(8, 16))
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pos = F.dropout(self.pos, 0.1, training=True)[: x.shape[1]]
            return F.dropout(self.lin(x + pos), 0.1, training=True).sum()

    model = PositionDropout()
    call = ((), {"x": torch.randn(4, 8, 16)})
    whole = pipeline_capture.capture(model, call, 4)
    half = pipeline_capture.capture(model, call, 4, 2)
    free = frozenset(n.name for n in whole.free)
    plan = DrawPlan.of(whole.gm.graph, 4, half.gm.graph, 2, free)
    assert plan.batch_major == (False, True)
    draws = StepDraws()
    names = [d.name for d in draws_of(half.gm.graph)]
    draws.replay(plan, half.gm.graph, 2, 3, set(names), torch.device("cpu"))
    assert [tuple(draws.kept[n][0].shape) for n in names] == [(8, 16), (3, 8, 16)]
    draws.rows = (2, 3)
    assert draws.take(names[0]).shape == (8, 16) and draws.take(names[1]).shape == (1, 8, 16)
    # Another length: the same draws; a graph with another count is named.
    longer = pipeline_capture.capture(model, ((), {"x": torch.randn(4, 6, 16)}), 4, 2)
    plan.check(longer.gm.graph, 2, "at 6 positions")
    with pytest.raises(RuntimeError, match="draws 2 random tensors at 6 positions but 3"):
        DrawPlan((False, True, True), ((0, 1),) * 3).check(longer.gm.graph, 2, "at 6 positions")


@pytest.mark.parametrize("fused", [False, True])
def test_module_level_dropout_is_drawn_as_one_process(gloo, fused: bool) -> None:
    """A model torch.fx traces, with nn.Dropout: at module level each stage would draw its
    masks per micro-batch; capture='auto' splits its ATen graph instead, whose draws are
    replayed as one process draws them (also on a batch twice the example's). fused: the
    dropout is ATen's native_dropout, as on CUDA: the replay draws the whole batch's mask with
    it and each micro-batch applies its rows."""
    for r in dist_workers.pooled(gloo(2), dist_workers.pipeline_module_dropout, fused):
        assert r["aten"] and r["draws"] == 4, r
        for ours, expect in zip(r["losses"], r["expect"], strict=True):
            assert abs(ours - expect) < 1e-5, (r["losses"], r["expect"])
        assert r["grad_diff"] < 1e-5


def test_module_level_draws_are_found() -> None:
    import torch.nn.functional as F

    from torch_plugin.pipeline.draws import module_level_draws

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.off = torch.nn.Dropout(0.0)
            self.on = torch.nn.Dropout(0.1)
            self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.off(x) + F.dropout(x, 0.1, training=False) + F.alpha_dropout(x, 0.1)
            x = self.on(x) + F.dropout(x, 0.2) + torch.rand_like(x)
            return self.block(x)

    gm = torch.fx.symbolic_trace(Mixed())
    found = module_level_draws(gm)
    assert found == ["on", "dropout_1", "rand_like", "block_1"], found
    assert module_level_draws(torch.fx.symbolic_trace(Mixed().eval())) == [
        "dropout_1",
        "rand_like",
    ]


def test_a_rank_failing_mid_schedule_fails_every_rank_at_once(gloo) -> None:
    """The user's loss_fn raises on one rank in the middle of a step: that rank raises its own
    error, the others name it, all within seconds (the process group's timeout is 60 s); the
    step's gradients are discarded and the next step equals one process's."""
    results = dist_workers.pooled(gloo(2), dist_workers.pipeline_fails_fast)
    for r in results:
        assert r["seconds"] < 10, r
        assert r["grads_cleared"], r
        if r["loss_rank"]:
            assert r["error"] == "ValueError: bad target in the user's loss", r
        else:
            assert "failed during this step" in r["error"], r
        ours, expect = r["loss"]
        assert abs(ours - expect) < 1e-5 and r["grad_diff"] < 1e-5, r
    assert sum(r["loss_rank"] for r in results) == 1 and results[0]["stages"] == 2


class _DropoutBatchNorm(torch.nn.Module):
    def __init__(self, drop: str = "module") -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.bn = torch.nn.BatchNorm1d(6)
        self.drop_out = torch.nn.Dropout(0.3)
        self.drop = drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.lin(x))
        if self.drop == "module":
            h = self.drop_out(h)
        elif self.drop == "call":
            h = torch.nn.functional.dropout(h, 0.3, training=self.training)
        elif self.drop == "rand":  # per-sample draws (stochastic depth, timm's old drop_path)
            h = h * (0.7 + torch.rand(h.shape[0], 1)).floor() / 0.7 if self.training else h
        elif self.drop == "where":  # a mask used otherwise than dropout uses one
            mask = torch.empty_like(h).bernoulli_(0.7)
            h = torch.where(mask.bool(), h, -h) if self.training else h
        return h.relu().sum(-1)


def test_a_stage_traced_for_training_computes_the_models_eval_mode_exactly() -> None:
    """pipeline/draws.to_evaluation on the ATen graph the pipeline captures: dropout masks
    keep everything, batch norm reads its running statistics and updates nothing (its
    counter included); the result is model.eval()'s, bit for bit."""
    from torch_plugin.pipeline import capture as pipeline_capture
    from torch_plugin.pipeline.draws import to_evaluation
    from torch_plugin.runtime.capture import as_call

    torch.manual_seed(0)
    model = _DropoutBatchNorm().train()
    x = torch.randn(8, 6)
    model(x)  # running statistics away from their initial values
    gm = pipeline_capture.capture(model, as_call((x,)), 8).gm
    kinds = {str(n.target) for n in gm.graph.nodes}
    assert "aten.bernoulli_.float" in kinds and "aten.native_batch_norm.default" in kinds
    stats = [t.clone() for t in model.bn.buffers()]
    to_evaluation(gm, "the test stage")
    kinds = {str(n.target) for n in gm.graph.nodes}
    assert "aten.bernoulli_.float" not in kinds and "aten.add_.Tensor" not in kinds
    with torch.no_grad():
        (got,) = gm(x)  # the graph's outputs, flat
        assert all(torch.equal(a, b) for a, b in zip(stats, model.bn.buffers(), strict=True))
        assert torch.equal(got, model.eval()(x))


@pytest.mark.parametrize("drop,says", [("rand", "stochastic depth"), ("where", "otherwise")])
def test_a_draw_whose_eval_behaviour_is_unknown_is_refused(drop: str, says: str) -> None:
    from torch_plugin.pipeline import capture as pipeline_capture
    from torch_plugin.pipeline.draws import to_evaluation
    from torch_plugin.runtime.capture import as_call

    model = _DropoutBatchNorm(drop).train()
    x = torch.randn(8, 6)
    gm = pipeline_capture.capture(model, as_call((x,)), 8).gm
    with pytest.raises(RuntimeError, match=says):
        to_evaluation(gm, "stage S0")


def test_a_module_level_stage_in_eval_mode_turns_its_dropout_calls_off() -> None:
    """torch.fx bakes `training=self.training` into a dropout call: the eval copy turns it off
    (modules such as BatchNorm follow the model's mode by themselves); the training graph is
    left as it was."""
    from torch_plugin.pipeline.draws import module_level_evaluation

    torch.manual_seed(0)
    model = _DropoutBatchNorm("call").train()
    x = torch.randn(8, 6)
    gm = torch.fx.symbolic_trace(model)
    model.eval()
    evaluated = module_level_evaluation(gm, "stage S0")
    with torch.no_grad():
        assert torch.equal(evaluated(x), model(x))
        assert not torch.equal(gm(x), model(x))  # the training graph still drops


def test_eval_keeps_batch_statistics_without_running_ones_and_turns_fused_dropout_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Instance norm and BatchNorm(track_running_stats=False) normalise by the batch in eval
    mode too: their flag stays (turned off, ATen crashed on the missing statistics). CUDA's
    fused native_dropout (train: bool?) is turned off. Noise a model adds only in training
    (randn_like) runs as traced, with a warning naming it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_plugin.pipeline import capture as pipeline_capture
    from torch_plugin.pipeline.draws import to_evaluation
    from torch_plugin.runtime.capture import as_call

    class Norms(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)
            self.bn = torch.nn.BatchNorm1d(6, track_running_stats=False)
            self.inorm = torch.nn.InstanceNorm1d(6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)
            return (self.bn(h) + self.inorm(h.t()).t()).relu().sum(-1)

    torch.manual_seed(0)
    model = Norms().train()
    x = torch.randn(8, 6)
    gm = pipeline_capture.capture(model, as_call((x,)), 8).gm
    to_evaluation(gm, "stage S0")
    with torch.no_grad():
        (got,) = gm(x)
        assert torch.equal(got, model.eval()(x))

    fused = make_fx(lambda t: torch.native_dropout(t, 0.5, True)[0] * 2)(x)
    noisy = make_fx(lambda t: t + torch.randn_like(t))(x)
    with caplog.at_level("WARNING", logger="torch_plugin.pipeline"):
        to_evaluation(fused, "stage S1")
        to_evaluation(noisy, "stage S2")
    assert torch.equal(fused(x), x * 2)
    assert "randn_like" in caplog.text and "stage S2" in caplog.text
    assert "stage S1" not in caplog.text


def _aten_graph(fn):  # noqa: ANN001, ANN202
    return fx.symbolic_trace(fn).graph


def test_autocast_twins_see_through_casts_and_name_a_difference() -> None:
    """A step under another autocast state matches its graph to the plan's: an op to the op of
    its name whose inputs are the same once casts are seen through; the casts autocast added
    are left to join the stage of the op they feed (pull). A graph that differs beyond casts
    is refused, naming the node and the fix."""
    from torch_plugin.pipeline import autocast

    aten = torch.ops.aten

    def plan(x, w):  # noqa: ANN001, ANN202
        return aten.relu.default(aten.mm.default(x, w))

    def cast(x, w):  # noqa: ANN001, ANN202
        bf = torch.bfloat16
        mm = aten.mm.default(aten._to_copy.default(x, dtype=bf), aten._to_copy.default(w, dtype=bf))
        return aten.relu.default(mm)

    def other(x, w):  # noqa: ANN001, ANN202
        return aten.relu.default(aten.mm.default(w, x))

    new, planned = _aten_graph(cast), _aten_graph(plan)
    twins = autocast.twins(planned, new, "under autocast")
    # Every plan node to the node of its name; the two casts belong to no plan node.
    assert {k: v.name for k, v in twins.items()} == {n.name: n.name for n in planned.nodes}
    casts = [n for n in new.nodes if n.target is aten._to_copy.default]
    assert len(casts) == 2 and not set(casts) & set(twins.values())
    by_target = {n.target: n for n in new.nodes}
    # The stage holding mm pulls both casts in after its inputs.
    g = fx.Graph()
    env = {n: g.placeholder(n.name) for n in new.nodes if n.op == "placeholder"}
    mm = by_target[aten.mm.default]
    copied = g.node_copy(mm, lambda a: autocast.pull(a, g, env, "stage S0"))
    assert [a.target for a in copied.args] == [aten._to_copy.default] * 2
    with pytest.raises(RuntimeError, match="neither computed in the stage"):
        autocast.pull(by_target[aten.relu.default].args[0], fx.Graph(), {}, "stage S1")
    with pytest.raises(
        RuntimeError, match=r"at node 'mm_default'.*inputs differ.*same torch.autocast"
    ):
        autocast.twins(_aten_graph(plan), _aten_graph(other), "under autocast")
