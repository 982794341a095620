"""Schedule language (issue 8): primitives on real zoo models, their misuse, the verifier, and
the Megatron-style GPT-2 schedule of examples/slapo_style_gpt.py on 2 gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import dist_workers
import pytest
import torch
import torch.nn.functional as F

import torch_plugin
from torch_plugin import models
from torch_plugin.models import gpt
from torch_plugin.schedule import ScheduleError


def test_megatron_gpt2_schedule_equals_single_process(gloo, tmp_path: Path) -> None:
    dist_workers.pooled(gloo(2), dist_workers.schedule_gpt2_matches, str(tmp_path))
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        print(r, {k: v for k, v in res.items() if k != "forward_all_reduces"})
        assert res["report"]["grads"] == 53  # every parameter's gradient was compared
        # Gradients of the loss (each rank's blocks against the same blocks of one process).
        assert res["max_grad_diff"] < 1e-5 and res["max_grad"] > 1e-3
        assert res["max_param_diff"] < 1e-5  # after one SGD step
        for a, b in zip(res["losses"], res["expect"], strict=True):
            assert abs(a - b) < 1e-5
        # Megatron: one all-reduce per attention and per MLP in forward (4 layers), one for
        # the embedding, one all-gather of the logits.
        assert sum(res["forward_all_reduces"].values()) == 10, res["forward_all_reduces"]
        assert res["sharded"] == 4 * 6 + 2  # the tied embedding / LM head weight twice
        assert res["local_bytes"] < 0.6 * res["full_bytes"]


def test_schedule_misuse_gives_clear_errors(gloo, tmp_path: Path) -> None:
    dist_workers.pooled(gloo(2), dist_workers.schedule_misuse, str(tmp_path))
    errors = json.loads((tmp_path / "rank0.json").read_text())
    print(json.dumps(errors, indent=1))
    assert errors["wrong_path"].startswith('sch["model.transformer.h.0"] (GPT2Block) has no sub')
    assert "'atn'; its children: ln_1, attn, ln_2, mlp" in errors["wrong_path"]
    assert "axis out of range" in errors["axis"]
    assert "has no parameter 'weights'" in errors["no_param"]
    assert "size 384 is not divisible by 2 ranks x 5 sections" in errors["divides"]
    assert "nothing in this module is sharded" in errors["sync_unsharded"]
    assert "unknown mode 'after'" in errors["bad_mode"]
    assert ".trace() first" in errors["find_untraced"]
    assert "bias stays whole" in errors["row_bias"]
    assert 'sch["model.transformer.h.0.mlp.c_proj"].sync("fwd_post")' in errors["missing_sync"]
    assert "column-parallel" in errors["missing_bwd_sync"]
    assert 'fails in sch["model.transformer.h.0.attn"]' in errors["verify_fails"]
    assert "h.1.attn" in errors["verify_differs"] and "outputs differ" in errors["verify_differs"]


# ---- single-process primitives on zoo models ---------------------------------------------


def _gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model, inputs = models.build(
        "gpt2", small=True, batch=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    return model, inputs


def _gpt() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return models.build("gpt", small=True, batch=2)


def test_paths_wildcards_and_hierarchy() -> None:
    model, _ = _gpt2()
    sch = torch_plugin.create_schedule(model)
    blocks = sch["model.transformer.h.*"]
    assert [s.path for s in blocks] == ["model.transformer.h.0", "model.transformer.h.1"]
    mlps = blocks["mlp"]
    assert len(mlps) == 2 and isinstance(
        mlps.schedules[0].module, type(model.model.transformer.h[0].mlp)
    )
    h0 = sch["model.transformer"]["h.0"]
    assert h0.path == "model.transformer.h.0" and h0.parent.path == "model.transformer.h"
    with pytest.raises(ScheduleError, match=r"no sub-module matches 'model.transformer.x.\*'"):
        sch["model.transformer.x.*"]
    with pytest.raises(ScheduleError, match="needs a mesh"):
        h0["mlp.c_fc"].shard("weight", axis=1)
    with pytest.raises(ScheduleError, match="needs a mesh"):
        h0["mlp"].sync("bwd_post")


def test_checkpoint_recomputes_blocks_and_keeps_numerics() -> None:
    model, inputs = _gpt2()
    sch = torch_plugin.create_schedule(model)
    sch["model.transformer.h.*"].checkpoint()
    calls = []
    # A pre-hook: recomputation stops as soon as backward has what it needs (early stop), so
    # the MLP's recomputed forward starts but need not finish.
    model.model.transformer.h[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    report = sch.verify(inputs, random_trials=0)
    assert report["grads"] > 0 and report["trials"] == 1
    # verify runs two forwards (outputs, then gradients); the checkpointed block's MLP runs
    # once more, recomputed in backward.
    assert len(calls) == 3, calls
    with pytest.raises(ScheduleError, match="already checkpointed"):
        sch["model.transformer.h.0"].checkpoint()


class _TanhGeluMLP(torch.nn.Module):
    """GPT-2's MLP written with nn.functional (the same parameters, by reference)."""

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.c_fc, self.c_proj = mlp.c_fc, mlp.c_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


def test_replace_module_and_verify_names_a_wrong_replacement() -> None:
    model, inputs = _gpt2()
    sch = torch_plugin.create_schedule(model)
    for mlp in sch["model.transformer.h.*.mlp"]:
        mlp.replace(_TanhGeluMLP(mlp.module))
    assert isinstance(model.model.transformer.h[1].mlp, _TanhGeluMLP)
    assert sch.verify(inputs)["grads"] > 0
    with pytest.raises(ScheduleError, match="needs an nn.Module"):
        sch["model.transformer.h.0.mlp"].replace(F.gelu)
    # A replacement that computes something else: verify names it.
    sch["model.transformer.h.1.mlp"].replace(torch.nn.Identity())
    with pytest.raises(
        ScheduleError, match=r'sch\["model.transformer.h.1.mlp"\].replace\(Identity\)'
    ):
        sch.verify(inputs)


def test_decompose_trace_find_fuse_keeps_names_and_numerics() -> None:
    model, inputs = _gpt()
    names_before = list(dict(model.named_parameters()))
    sch = torch_plugin.create_schedule(model)
    with pytest.raises(ScheduleError, match="nn.Linear with a bias"):
        sch["blocks.0.ln1"].decompose()
    for i, compiler in enumerate(["inductor", "aot_eager"]):
        blk = sch[f"blocks.{i}"]
        blk["fc1"].decompose()
        blk.trace(flatten=True)
        found = blk.find(lambda x, bias: F.gelu(x + bias))
        assert len(found) == 1 and len(found[0].nodes) == 2, found
        blk.fuse(found, compiler=compiler, name="bias_gelu")
        assert any(n.startswith("bias_gelu") for n, _ in blk.module.named_children())
    assert list(dict(model.named_parameters())) == names_before  # the hierarchy is kept
    report = sch.verify(inputs)
    assert report["grads"] == len(names_before)
    with pytest.raises(ScheduleError, match="found in"):
        sch["blocks.1"].fuse(sch["blocks.0"].find("fc2"), compiler="eager")
    with pytest.raises(ScheduleError, match="matched nothing"):
        sch["blocks.1"].fuse(sch["blocks.1"].find("no_such_node"), compiler="eager")


def _bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias)


def test_replace_and_checkpoint_subgraphs() -> None:
    model, inputs = _gpt()
    sch = torch_plugin.create_schedule(model)
    b0, b1 = sch["blocks.0"], sch["blocks.1"]
    for blk in (b0, b1):
        blk["fc1"].decompose()
        blk.trace(flatten=True)
    b0.replace(_bias_gelu, b0.find(lambda x, bias: F.gelu(x + bias)))
    assert any(n.target is _bias_gelu for n in b0.module.graph.nodes)
    b1.checkpoint(b1.find(lambda x, bias: F.gelu(x + bias)))
    assert any(n.startswith("checkpointed") for n, _ in b1.module.named_children())
    assert sch.verify(inputs)["grads"] > 0
    with pytest.raises(ScheduleError, match="trace"):
        sch["ln_f"].checkpoint(b1.find("fc2"))


def test_untraceable_module_stays_eager_with_a_clear_error() -> None:
    model, inputs = _gpt2()
    sch = torch_plugin.create_schedule(model)
    with pytest.raises(ScheduleError, match="cannot be traced.*stays eager"):
        sch["model.transformer"].trace(flatten=True)
    sch["model.transformer.h.0"].checkpoint()  # module-level primitives still apply
    assert sch.verify(inputs)["grads"] > 0


def test_bind_kernels() -> None:
    torch.manual_seed(0)
    model, inputs = models.build("bert", small=True, batch=2)
    model.eval()
    with torch.no_grad():
        expect = model(*inputs)
    sch = torch_plugin.create_schedule(model)
    lns = sch["model.encoder.layer.*.output.LayerNorm"]
    lns.bind("layer_norm")
    calls = []

    def counted(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)

    sch["model.encoder.layer.0.attention.output.LayerNorm"].bind(counted)
    with torch.no_grad():
        got = model(*inputs)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1
    assert sch.verify(inputs)["grads"] > 0  # training falls back to ATen's layer norm
    with pytest.raises(ScheduleError, match="needs a LayerNorm"):
        sch["model.encoder.layer.0.intermediate.dense"].bind("layer_norm")
    with pytest.raises(ScheduleError, match="unknown kernel"):
        lns.bind("flash")


def test_pipeline_split_marks_and_build_says_what_is_missing() -> None:
    model, _ = _gpt()
    sch = torch_plugin.create_schedule(model)
    sch["blocks.0"].pipeline_split()
    with pytest.raises(ScheduleError, match="already ends a pipeline stage"):
        sch["blocks.0"].pipeline_split()
    with pytest.raises(ScheduleError, match="needs a mesh with a 'pp' axis of 2 ranks"):
        torch_plugin.build(sch)


def test_schedule_decorator_on_a_module_class() -> None:
    def checkpoint_blocks(sch: torch_plugin.Schedule) -> None:
        sch["blocks.*"].checkpoint()

    @torch_plugin.schedule(checkpoint_blocks)
    class CheckpointedGPT(gpt.GPT):
        pass

    torch.manual_seed(0)
    model = CheckpointedGPT(gpt.GPTConfig(64, 2, 4, 1000, 16))
    assert [s.primitive for s in model._schedule.steps] == ["checkpoint", "checkpoint"]
    tokens = torch.randint(0, 1000, (2, 16))
    assert model._schedule.verify((tokens,))["grads"] > 0
    with pytest.raises(TypeError, match="nn.Module classes"):
        torch_plugin.schedule(checkpoint_blocks)(int)


def test_autotune_checkpoint_ratio_and_batch_on_gpt() -> None:
    """Symbolic checkpoint ratio x batch size on GPT. Each point is applied to a fresh model and
    its saved activations measured (saved-tensor hooks): over a 3.5 MB budget is "out of
    memory" (pruned); otherwise the score is a throughput model that pays 33% per recomputed
    forward. Large batches need checkpointing to fit, so the optimum is inside the space."""
    from torch_plugin.schedule import Space, tune

    def evaluate(cfg: dict) -> float:
        torch.manual_seed(0)
        model = gpt.GPT(gpt.GPTConfig(64, 4, 4, 1000, 16))
        sch = torch_plugin.create_schedule(model)
        for i in range(int(cfg["ckpt_ratio"] * 4)):
            sch[f"blocks.{i}"].checkpoint()
        saved = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        tokens = torch.randint(0, 1000, (cfg["batch"], 16))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens).sum().backward()
        if saved[0] > 3.5e6:
            raise MemoryError(f"{saved[0] / 1e6:.2f} MB of activations")
        b, r = cfg["batch"], cfg["ckpt_ratio"]
        return b / ((b + 4) * (1 + 0.33 * r))

    space = Space()
    space.create_symbol("ckpt_ratio", [0.0, 0.25, 0.5, 0.75, 1.0])
    space.create_symbol("batch", [2, 4, 8, 16])
    space.constraint(lambda cfg: not (cfg["batch"] == 2 and cfg["ckpt_ratio"] > 0.5))
    full = tune(space, evaluate, progress=False)
    fast = tune(space, evaluate, method="coordinate_descent", seed=1, restarts=3, progress=False)
    print(full.table())
    print(f"coordinate descent: {len(fast.trials)} evaluations, best {fast.best}")
    assert full.best == {"ckpt_ratio": 0.5, "batch": 16}
    assert len(full.trials) == 20 and full.skipped == 2
    assert sum(s is None for _, s in full.trials) == 2 + 3  # ruled out + out of memory
    assert fast.best == full.best and len(fast.trials) < len(full.trials)
    assert "*" in full.table() and "ckpt_ratio" in full.table()
    with pytest.raises(ValueError, match="unknown method"):
        tune(space, evaluate, method="annealing")
    with pytest.raises(ValueError, match="no symbols"):
        tune(Space(), evaluate)


def test_autotune_with_an_evaluation_script() -> None:
    import sys

    from torch_plugin.schedule import Space, tune

    space = Space()
    space.create_symbol("x", [1, 2, 3])
    script = (
        "import sys; x = int(sys.argv[1]); sys.exit(1) if x == 2 else print('samples/s', 10 * x)"
    )
    result = tune(space, [sys.executable, "-c", script, "{x}"], progress=False)
    assert result.best == {"x": 3} and result.best_score == 30.0
    assert [s for _, s in result.trials] == [10.0, None, 30.0]


@pytest.mark.parametrize("pinned", [False, True], ids=["partitioned", "pinned+placement"])
def test_schedule_composes_with_graph_pipeline_on_4_ranks(
    gloo, tmp_path: Path, pinned: bool
) -> None:
    """Mesh (pp=2, tp=2): the Megatron schedule over 'tp', two pipeline stages over 'pp' (cut
    by the partitioner, or where pipeline_split pins it); 3 SGD steps equal one process.
    The pinned run also places each stage's compute (placement pass, forward and backward)."""
    placement = pinned
    dist_workers.pooled(
        gloo(4), dist_workers.schedule_pipeline_composition, str(tmp_path), pinned, placement
    )
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    diffs = [abs(a - b) for r in res for a, b in zip(r["losses"], r["expect"], strict=True)]
    print(f"pinned={pinned}: largest loss difference {max(diffs):.2e}", res[0]["losses"])
    for r in res:
        assert r["stages"] == 2
        for a, b in zip(r["losses"], r["expect"], strict=True):
            assert abs(a - b) < 1e-5, (r["losses"], r["expect"])
    # Ranks 0, 1 run stage 0 (its two tensor-parallel halves), ranks 2, 3 stage 1.
    assert [r["stage"] for r in res] == [0, 0, 1, 1]
    first, second = set(res[0]["params"]), set(res[2]["params"])
    assert set(res[1]["params"]) == first and not first & second
    if pinned:  # the cut is where the schedule put it: embeddings and block 0 first
        owners = {p.rsplit(".", 1)[0].split(".")[0] for p in first}
        blocks = {p.split(".")[1] for p in first if p.startswith("blocks.")}
        assert owners == {"tok", "pos", "blocks"} and blocks == {"0"}, first
    for r in res:
        if not placement:
            assert r["segments"] == [] and r["placed"] == []
            continue
        # Every run of compute between the syncs went through placement: once forward, once
        # backward (the schedule's sharded and synced modules stay eager between the runs).
        kinds = [k for k, _ in r["placed"]]
        assert r["segments"] and kinds.count("forward") == len(r["segments"]), r["placed"]
        assert kinds.count("backward") == len(r["segments"]), r["placed"]
        assert not any("attn" in n or "fc1" in n or "fc2" in n for s in r["segments"] for n in s)
    if placement:
        print("placement per rank:", [r["placed"] for r in res])


def test_schedule_pins_and_the_ilp_plans_the_rest(gloo, tmp_path: Path) -> None:
    dist_workers.pooled(gloo(2), dist_workers.schedule_auto_shard, str(tmp_path))
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        specs = res["specs"]
        assert res["grad_diff"] < 1e-5
        for i in range(2):  # the pins
            for lin in ("q", "k", "v"):
                assert specs[f"blocks.{i}.attn.{lin}.weight"] == "S(0)"
                assert specs[f"blocks.{i}.attn.{lin}.bias"] == "S(0)"
            assert specs[f"blocks.{i}.attn.o.weight"] == "S(1)"
        # What the ILP chose for the unpinned MLP (Megatron's plan on this graph).
        print({k: v for k, v in specs.items() if "fc" in k})


def test_auto_shard_refuses_syncs_it_would_replace() -> None:
    model, inputs = _gpt()
    sch = torch_plugin.create_schedule(model)
    sch["blocks.0"].checkpoint()
    with pytest.raises(ScheduleError, match="plans the collectives itself"):
        torch_plugin.build(sch, auto="shard", example_inputs=inputs)
    with pytest.raises(ScheduleError, match="unknown auto pass"):
        torch_plugin.build(sch, auto="pipeline")


def test_parallelize_decorator_on_a_module_class(gloo, tmp_path: Path) -> None:
    dist_workers.pooled(gloo(2), dist_workers.parallelize_decorator, str(tmp_path))
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["type"] == "ShardedModule"
    with pytest.raises(TypeError, match="with arguments"):
        torch_plugin.parallelize(gpt.GPT)


def test_schedule_with_data_parallel_replicas_on_4_ranks(gloo, tmp_path: Path) -> None:
    dist_workers.pooled(gloo(4), dist_workers.schedule_dp_tp, str(tmp_path))
    for r in range(4):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["type"] == "DataParallelSchedule"
        for a, b in zip(res["losses"], res["expect"], strict=True):
            assert abs(a - b) < 1e-5, (res["losses"], res["expect"])
        # One bucketed gradient all-reduce per step, one output gather per step.
        assert res["dp_calls"] == {"grad_sync": 3, "dp outputs": 3}, res["dp_calls"]
