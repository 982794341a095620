"""Users' training programs as they are (issue 38): library-default HF configs, collated
padded batches whose length changes every step, a short last batch, other keyword sets after
one `parallelize`, and the errors a user sees for calls that cannot run."""

from __future__ import annotations

import pytest
import user_programs


@pytest.mark.parametrize(
    "kind,shape",
    [("llama", [2]), ("qwen2", [2]), ("gpt2", [2]), ("gpt2", [2, 2])],
)
def test_default_config_trains_on_padded_batches_of_every_length(gloo, kind, shape) -> None:
    world = 1
    for s in shape:
        world *= s
    results = gloo(world).run(user_programs.train_like_a_user, 0, kind, shape)
    r = results[0]
    assert r["config_use_cache"]  # the user's config is left as it was
    diffs = [abs(a - b) for a, b in zip(r["ours"], r["expect"], strict=True)]
    assert max(diffs) < 1e-5, (r["ours"], r["expect"])
    assert max(r["ours"]) - min(r["ours"]) > 1e-3  # the losses move: training happened
    # One program per shape of the first pass (the example's included), none after warm-up.
    assert r["programs"] == len(user_programs.SHAPES)
    assert r["after_warmup"] == r["programs"]
    # Captures: the three new shapes, then the call without a mask.
    assert len(r["capture_s"]) == len(user_programs.SHAPES)
    # Another length or batch is the same program at another size: the example's strategies
    # are read off without an ILP (8 x 24 and 4 x 20; at 13 tokens a split of the sequence
    # does not divide, and the ILP plans that node with the rest fixed); the call without a
    # mask is another graph, planned by the ILP.
    plans = dict(zip(user_programs.SHAPES[1:], r["plans"], strict=False))
    assert plans[(8, 24)] == plans[(4, 20)] == "fixed", r["plans"]
    assert r["plans"][-1] != "fixed"
    ours, expect = r["no_mask"]
    assert abs(ours - expect) < 1e-5
    for other in results[1:]:
        assert other["ours"] == r["ours"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])  # dropout 0.1 inside GPT-2's layers
def test_gradient_checkpointing_is_kept_after_parallelize(gloo, kind) -> None:
    """A user enables checkpointing to fit: the sharded program replayed its captured trace op
    by op and saved every activation either way (6.7 MB a rank for the 2-layer Llama, with or
    without, against one process's 1.9 MB with it). Each checkpointed layer now runs under
    torch.utils.checkpoint (dropout recomputed from the state it drew from): the losses are one
    process's over batches of changing length."""
    for r in gloo(2).run(user_programs.checkpointed_training, 0, kind):
        saved = r["saved"]
        assert saved[True] < 0.5 * saved[False], saved
        assert saved[True] < 1.5 * saved["one process True"], saved
        diffs = [abs(a - b) for a, b in zip(r["ours"], r["expect"], strict=True)]
        assert max(diffs) < 1e-5, (r["ours"], r["expect"])


def test_gradient_checkpointing_is_kept_in_pipeline_stages(gloo) -> None:
    """The same for strategy="pipeline": each stage ran its captured trace op by op and saved
    every activation (GPT-2's first stage: 3.2 MB with checkpointing or without, 0.9 MB kept
    now). Losses and gradients stay one process's; dropout is recomputed with its masks."""
    for r in gloo(2).run(user_programs.pipeline_checkpointed, 0, "gpt2"):
        assert r["saved"][True] < 0.6 * r["saved"][False], r["saved"]
        for ours, expect in zip(r["losses"], r["expect"], strict=True):
            assert abs(ours - expect) < 1e-5, (r["losses"], r["expect"])
        assert max(r["grad_diff"].values()) < 1e-5, r["grad_diff"]


def test_pipeline_steps_under_saved_tensors_hooks_trace_new_lengths(gloo) -> None:
    """A step under the user's saved-tensor hooks (save_on_cpu) that traced a new batch length
    was refused: the hooks ran into the trace, and its graph "differs at node 'detach'". They
    are set aside while tracing, and the step runs under them: every step saves through them,
    losses and gradients are one process's."""
    for r in gloo(2).run(user_programs.pipeline_under_saved_tensors_hooks, 0):
        assert all(n > 0 for n in r["saved"]), r["saved"]
        for ours, expect in zip(r["losses"], r["expect"], strict=True):
            assert abs(ours - expect) < 1e-5, (r["losses"], r["expect"])
        assert max(r["grad_diff"]) < 1e-5, r["grad_diff"]


def test_positional_example_then_keyword_calls(gloo) -> None:
    for r in gloo(2).run(user_programs.positional_then_keywords, 0):
        assert r["logits"] < 1e-5
        ours, expect = r["loss"]
        assert abs(ours - expect) < 1e-5
        assert r["grad_diff"] < 1e-5


def test_bad_calls_name_their_cause(gloo) -> None:
    for seen in gloo(2).run(user_programs.bad_calls, 0):
        kind, message = seen["short_mask"]
        assert kind == "ValueError" and "`attention_mask` has a batch of 2 rows" in message
        kind, message = seen["short_labels"]
        assert kind == "ValueError" and "`labels` has a batch of 3 rows" in message
        # A call the model itself refuses: the model's own error, not a capture failure.
        assert seen["model_error"] is not None
        assert seen["model_refuses"] == seen["model_error"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])  # rotary tables; dropout 0.1
def test_pipeline_takes_a_default_config_and_batches_of_every_length(gloo, kind) -> None:
    results = gloo(2).run(user_programs.pipeline_default_config, 0, kind)
    for r in results:
        for ours, expect in zip(r["losses"], r["expect"], strict=True):
            assert abs(ours - expect) < 1e-5, (r["losses"], r["expect"])
        assert r["grads"] > 0 and r["grad_diff"] < 1e-5, r["grad_diff"]
        # Dropout masks are one process's: the same draws, the generator left where it was.
        assert r["same_generator"]
        assert (r["draws"] > 0) == (kind == "gpt2"), r["draws"]
        # Each new length is captured once per micro-batch size the stage runs (2 samples;
        # 6 rows at 16 tokens are 3 micro-batches of 2), none seen again.
        assert len(r["captures"]) == 2, r["captures"]
        # 9 rows run as chunks of 8 and 1: the model's graph at one sample differs, so a
        # rank refuses, naming the chunking, and its peers name it.
        refused = r["refused"]
        assert refused is not None
        assert (
            "this batch of 9 leaves 1 sample(s) to a micro-batch (it runs as chunks of the "
            "example's 8)"
            in refused
            or "cannot run its stage on this batch (9 samples" in refused
        ), refused
    assert any("chunks of the example's 8" in r["refused"] for r in results)


@pytest.mark.parametrize("kind,built_under", [("llama", False), ("gpt2", False), ("llama", True)])
def test_pipeline_steps_under_autocast_as_one_process(gloo, kind, built_under) -> None:
    """Mixed-precision training as HF Trainer's bf16=True and hand-written loops run it: steps
    under torch.autocast("cpu", bfloat16) through a pipeline built without it (or built under
    it and stepped once without). Under autocast the first step ran the f32 graph, whose loss
    came out in bf16 (0.009 from one process's: the f32 trace drops HF's logits.float()), and a
    step at another length failed with a KeyError. Now each stage runs its part of the graph
    traced under the step's autocast state, matched to the plan through its casts: losses as
    one process's under the same state (to bf16's rounding of micro-batches: GPT-2's dropout
    layers), gradients to bf16's resolution, the f32 step as one process's."""
    results = gloo(2).run(user_programs.pipeline_under_autocast, 0, kind, built_under)
    for r in results:
        for i, on in enumerate((True, True, False, True)):
            loss, want, diff = r["loss"][i], r["expect"][i], r["grad_diff"][i]
            if not on:  # f32
                assert abs(loss - want) < 1e-5 and diff < 1e-5, (i, r)
            else:
                assert abs(loss - want) < 2e-4 and diff < 5e-3, (i, r)
        other = "without autocast" if built_under else "under torch.autocast('cpu'"
        assert any(other in c for c in r["captures"]), r["captures"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])  # rotary buffers; tied embeddings
def test_pretrained_weights_in_and_out_of_rank_blocks(gloo, tmp_path, kind) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    user_programs.default_config_model(kind).save_pretrained(src, max_shard_size="100KB")
    assert (src / "model.safetensors.index.json").exists()  # a sharded checkpoint
    results = gloo(2).run(user_programs.pretrained_round_trip, 0, kind, str(src), str(out))
    for r in results:
        ours, expect = r["loss"]
        assert abs(ours - expect) < 1e-5
        assert r["report"]["missing"] == [] and r["report"]["loaded"] > 0
    assert results[0]["reloaded"] < 1e-5
    assert "model.safetensors.index.json" in results[0]["files"]
    # Each rank read less than the whole checkpoint: the sharded parameters' other blocks not.
    whole = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    assert all(r["report"]["bytes_read"] < 0.8 * whole for r in results)


def test_a_meta_capture_keeps_which_parameters_need_gradients() -> None:
    """New programs are captured from a meta copy of the model. Its parameters must keep
    requires_grad: SDPA picks its CPU kernel by it, and the flash kernel it picks for a mask
    without gradients refuses one with (Swin's relative-position bias; a new batch size failed
    at run time)."""
    import torch
    import torch.nn.functional as F

    from torch_plugin.runtime.capture import trace_call

    class BiasedAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(1, 1, 4, 4))

        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, q, q, attn_mask=self.bias)

    with torch.device("meta"):
        model = BiasedAttention()
    traced = trace_call(model, ((torch.randn(1, 1, 4, 8),), {}))
    targets = {str(n.target) for n in traced.gm.graph.nodes}
    assert not any("flash" in t for t in targets), targets


def test_a_checkpoint_of_another_model_is_named(tmp_path) -> None:
    """load_pretrained into a plain module: a checkpoint of another size names the tensor and
    both shapes; one missing tensors names them (strict), and strict=False loads the rest."""
    import torch

    import torch_plugin
    from torch_plugin.checkpoint.pretrained import PretrainedError

    user_programs.default_config_model("llama").save_pretrained(tmp_path / "llama")
    small = torch.nn.Linear(4, 4)
    with pytest.raises(PretrainedError, match="not in the checkpoint: \\['weight', 'bias'\\]"):
        torch_plugin.load_pretrained(small, tmp_path / "llama")
    model = user_programs.default_config_model("llama")
    model.model.embed_tokens = torch.nn.Embedding(user_programs.VOCAB + 8, 64)
    with pytest.raises(
        PretrainedError, match="'model.embed_tokens.weight' has shape \\[256, 64\\]"
    ):
        torch_plugin.load_pretrained(model, tmp_path / "llama")
    report = torch_plugin.load_pretrained(small, tmp_path / "llama", strict=False)
    assert report["loaded"] == 0 and report["missing"] == ["weight", "bias"]
    with pytest.raises(PretrainedError, match="no model.safetensors"):
        torch_plugin.load_pretrained(small, tmp_path)


@pytest.mark.parametrize(
    ("strategy", "dropout"),
    [("tp", 0.1), ("pipeline", 0.1), ("pipeline", 0.0)],  # 0.0: a module-level trace works
)
def test_a_models_own_checkpoint_calls_are_kept(gloo, strategy, dropout) -> None:
    """A model that calls torch.utils.checkpoint in its own forward (not HF's layers) was
    traced through: its program saved every activation, as much with checkpointing as without,
    and nothing said so. Each call now recomputes in the backward; losses and gradients stay
    one process's over batches of changing size, with dropout and without (a model without
    draws split at module level, where torch.fx runs through the calls: it is split at ATen
    level instead, and capture="module" says it keeps every activation)."""
    for r in gloo(2).run(user_programs.self_checkpointed_training, 0, strategy, dropout):
        assert r["saved"][True] < 0.6 * r["saved"][False], r["saved"]
        for ours, expect in zip(r["losses"], r["expect"], strict=True):
            assert abs(ours - expect) < 1e-5, (r["losses"], r["expect"])
        assert r["grad_diff"] < 1e-5, r["grad_diff"]
        if strategy == "pipeline":
            assert any("keep every activation" in w for w in r["warned"]), r["warned"]


@pytest.mark.parametrize("strategy,kind", [("tp", "llama"), ("pipeline", "gpt2")])
def test_torch_clip_grad_norm_clips_by_the_whole_models_norm(gloo, strategy, kind) -> None:
    """torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm), as HF Trainer and most
    loops call it, on what parallelize returned: each rank used to clip by its own part's norm
    (tp: 1.00 and 1.05 on the two ranks where one process has 1.45; pipeline stages 1.63 and
    1.40 against 1.91), so ranks scaled differently and the losses left one process's. Now the
    norm is the whole model's on every rank (GPT-2's tied embedding counted once), the losses
    are one process's, and tp's replicated blocks stay bitwise equal across ranks."""
    results = gloo(2).run(user_programs.clipped_with_torch, 0, strategy, kind)
    for r in results:
        for got, total, want in zip(r["norm"], r["total"], r["expect"], strict=True):
            assert abs(got - want) <= 1e-5 * want, (r["norm"], r["expect"])
            assert total == got  # get_total_norm over the same gradients agrees
        assert min(r["expect"]) > 0.05  # max_norm clipped every step
        diffs = [abs(a - b) for a, b in zip(r["loss"], r["expect_loss"], strict=True)]
        assert max(diffs) < 1e-5, (r["loss"], r["expect_loss"])
        assert r["replicated_drift"] == 0.0
    assert results[0]["norm"] == results[1]["norm"]


def test_a_frozen_stage_leaves_torchs_clip_to_the_ranks_that_train(gloo) -> None:
    """Fine-tuning GPT-2's last layer through a pipeline whose first stage holds only frozen
    parameters, clipping with torch.nn.utils.clip_grad_norm_(pp.parameters()): the frozen
    rank found no gradient and returned 0 before any collective, while the training rank's
    norm waited in one over both ranks until the timeout. Now the training rank's norm is one
    process's, the frozen rank's is 0 (it has no gradient to clip), pp.clip_grad_norm_ gives
    one process's norm on both ranks, and the losses are one process's. A stage unfrozen after
    parallelize is refused by name on its rank rather than left to hang the others."""
    results = gloo(2).run(user_programs.pipeline_frozen_stage, 0)
    for r in results:
        assert r["trains"] == [False, True], r["trains"]
        expect = r["expect"]
        assert min(expect) > 0
        for got, want in zip(r["pp_norm"], expect, strict=True):
            assert abs(got - want) <= 1e-5 * want, (r["pp_norm"], expect)
        if r["my_stage"] == 0:
            assert r["torch_norm"] == [0.0] * len(expect), r["torch_norm"]
            assert "unfrozen later" in r["unfrozen"] and "before parallelize" in r["unfrozen"]
        else:
            for got, want in zip(r["torch_norm"], expect, strict=True):
                assert abs(got - want) <= 1e-5 * want, (r["torch_norm"], expect)
        diffs = [abs(a - b) for a, b in zip(r["loss"], r["expect_loss"], strict=True)]
        assert max(diffs) < 1e-5, (r["loss"], r["expect_loss"])
    assert sorted(r["my_stage"] for r in results) == [0, 1]


def test_a_pipeline_evaluates_in_eval_mode_between_training_steps(gloo) -> None:
    """An evaluation pass as users write it (pp.eval() or their own model.eval(), pp.step on
    validation batches of other lengths and a short one under torch.no_grad(), pp.train()),
    after a backward and before the optimizer's step. GPT-2's default config drops out 0.1.
    A no_grad step used to fail on every rank (its backward had nothing to differentiate), and
    nothing turned dropout off. Now each evaluation loss is one process's model.eval() loss,
    the gradients and the generator are as they were, and training goes on as one process's;
    `pp(**batch)` gives the model's output (logits, loss) on every rank as one process's (under
    inference_mode too, at a length first seen there); a
    no_grad step in training mode replays dropout as one process draws it."""
    for r in gloo(2).run(user_programs.pipeline_evaluation, 0, "gpt2"):
        assert r["modes"] == [False, False, False]
        for got, want in zip(r["eval"], r["expect_eval"], strict=True):
            assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5, (got, want)
        diffs = [abs(a - b) for a, b in zip(r["train"], r["expect_train"], strict=True)]
        assert max(diffs) < 1e-5, (r["train"], r["expect_train"])
        assert r["grads_kept"] and r["same_generator"]
        outputs = r["outputs"]  # pp(**batch): the model's output, on every rank
        # Logits relative to their largest (9e-6 here: three AdamW steps at lr 1e-2 carry the
        # rounding of micro-batched gradients into the parameters).
        assert outputs["logits"] < 1e-4 and outputs["loss"] < 1e-5, outputs
        assert "torch.no_grad()" in outputs["with_grad"]
        ours, expect, eval_mode = r["dropout_on"]
        assert abs(ours - expect) < 1e-5
        assert abs(ours - eval_mode) > 1e-4  # dropout was on there


def test_torch_compile_over_a_sharded_model_runs_its_program(gloo) -> None:
    """Dynamo inside the sharded program broke its graph at every collective and recompiled
    the autograd functions around them until its limit (27-65 s for this model's first step,
    no faster after), or failed (InternalTorchDynamoError: UnsafeScriptObjectError, here).
    torch.compile(dist_model) now runs the planned program as it is: no graph is made, and
    the losses are one process's."""
    for r in gloo(2).run(user_programs.compiled_by_the_user, 0):
        assert r["graphs"] == 0, r
        assert max(abs(a - b) for a, b in zip(r["losses"], r["expect"], strict=True)) < 1e-5


@pytest.mark.parametrize("strategy,kind", [("tp", "llama"), ("tp", "gpt2"), ("pipeline", "llama")])
def test_generate_on_the_model_being_trained(gloo, strategy, kind) -> None:
    """model.generate(...) in a training script (samples at evaluation) on what parallelize
    returned raised AttributeError. Now it runs HF's generate on a gathered copy of the whole
    model (Llama's rotary buffers, GPT-2's tied head): greedy tokens are one process's, before
    and after an optimizer step (the copy is gathered again), and sampling returns rank 0's
    tokens on every rank."""
    results = gloo(2).run(user_programs.generate_while_training, 0, strategy, kind)
    for r in results:
        assert r["same"] == [True, True], r
    assert results[0]["sampled"] == results[1]["sampled"]


@pytest.mark.parametrize("strategy", ["tp", "pipeline"])
def test_model_to_after_parallelize(gloo, strategy) -> None:
    """model.to(...) on what parallelize returned, as scripts call it late. A sharded model
    cast to bf16 cast its blocks under a program captured in f32 ("expected scalar type Float
    but found BFloat16"); now each kind of call is captured again at the new dtype: losses and
    gradients as one process's model cast alike (bf16: to bf16's rounding of the split
    matmuls), and exact after .float(); generate's copy follows each cast. A pipeline had no
    .to: the device and dtype it runs
    return it, another dtype is refused by name."""
    for r in gloo(2).run(user_programs.cast_after_parallelize, 0, strategy):
        if strategy == "pipeline":
            assert r["same"] and "before parallelize" in r["refused"], r
            continue
        assert r["dtype"] == "torch.float32"
        f32, bf16, back = zip(r["losses"], r["expect"], r["grad_diff"], strict=True)
        assert abs(f32[0] - f32[1]) < 1e-5 and f32[2] < 1e-5, r
        assert abs(bf16[0] - bf16[1]) < 1e-3 and bf16[2] < 5e-3, r
        assert abs(back[0] - back[1]) < 1e-5 and back[2] < 1e-5, r
        assert r["generated_alike"] == [True, True, True], r
        assert max(r["logit_diff"]) < 1e-4, r  # a stale copy (f32 under bf16) is 3e-3 off


@pytest.mark.parametrize("strategy,how", [("tp", "wrap"), ("tp", "in_place"), ("pipeline", "wrap")])
def test_a_model_compiled_before_parallelize(gloo, strategy, how) -> None:
    """torch.compile(model) or model.compile() before parallelize, as scripts that compile
    first do (DDP and FSDP take a compiled model): parallelize failed while capturing
    ("Detected that you are using FX to symbolically trace a dynamo-optimized function").
    Now it distributes the model itself and warns that what it returns runs the planned
    program uncompiled (as torch.compile over a sharded model does: no graph); the losses are
    one process's."""
    for r in gloo(2).run(user_programs.compiled_before_parallelize, 0, strategy, how):
        for ours, expect in zip(r["losses"], r["expect"], strict=True):
            assert abs(ours - expect) < 1e-5, (r["losses"], r["expect"])
        assert r["graphs"] == 0, r
        assert r["returned"] == ("ShardedModule" if strategy == "tp" else "PipelineParallel")
        assert any("torch.compile's settings are not applied" in w for w in r["warned"]), r


@pytest.mark.parametrize("strategy,kind", [("tp", "llama"), ("pipeline", "gpt2")])
def test_what_a_script_reads_off_an_hf_model_works_on_the_distributed_one(
    gloo, tmp_path, strategy, kind
) -> None:
    """`batch.to(model.device)`, `model.dtype`, `model.num_parameters()` and
    `model.save_pretrained(out)` raised AttributeError on what parallelize returned (FSDP2
    keeps the model, so scripts call them); so did a pipeline's `zero_grad()`, and a sharded
    model's `load_state_dict` of the plain model's state dict failed on sizes. Now the counts
    are the whole model's, the checkpoint written after a training step loads with
    from_pretrained as one process's model after that step (GPT-2's tied embedding stored
    once), and the plain model's state dict loads (whole tensors cut to blocks, tied aliases
    read once): the eval loss is the plain model's."""
    out = tmp_path / "saved"
    results = gloo(2).run(user_programs.hf_model_methods, 0, strategy, kind, str(out))
    for r in results:
        assert all(ours == theirs for ours, theirs in r["counts"]), r["counts"]
        assert r["dtype"] == "torch.float32"
        assert "state_dict" in r["refused"]
        got, want = r["after_load"]
        assert abs(got - want) < 1e-5 and r["load_result"] == [[], []]
        assert r["grads_cleared"]
        refused = r["refusals"]
        assert all(v is not None for v in refused.values()), refused  # each one raised
        assert refused["unexpected"][0] == "RuntimeError", refused
        assert "unexpected ['extra.weight']" in refused["unexpected"][1], refused
    # A tensor only the last stage holds: its rank names it, the other says another's missed.
    norm = "transformer.ln_f.weight" if kind == "gpt2" else "model.norm.weight"
    missing = [r["refusals"]["missing"] for r in results]
    assert all(m is not None and m[0] == "RuntimeError" for m in missing), missing
    if strategy == "pipeline":
        assert f"missing ['{norm}']" in missing[-1][1] and "stage S1" in missing[-1][1]
        assert "another rank's stage did not find its tensors" in missing[0][1], missing
        for r in results:
            assert r["refusals"]["args_and_kwargs"][0] == "ValueError", r["refusals"]
            assert "not both" in r["refusals"]["args_and_kwargs"][1]
            assert r["refusals"]["grad_enabled"][0] == "RuntimeError", r["refusals"]
            assert "torch.no_grad()" in r["refusals"]["grad_enabled"][1]
    else:
        assert all(f"missing ['{norm}']" in m[1] for m in missing), missing
        for r in results:
            assert r["refusals"]["assign"][0] == "ValueError", r["refusals"]
            assert "assign=False" in r["refusals"]["assign"][1]
    for r in results:  # it syncs its own gradients: DDP would broadcast rank 0's blocks
        assert r["refusals"]["ddp"][0] == "RuntimeError", r["refusals"]
        assert "DistributedDataParallel cannot wrap this" in r["refusals"]["ddp"][1]
        assert "drop the DistributedDataParallel wrapper" in r["refusals"]["ddp"][1]
    r = results[0]
    assert "config.json" in r["files"] and "generation_config.json" in r["files"]
    assert len([f for f in r["files"] if f.endswith(".safetensors")]) > 1  # 200KB shards
    assert r["reloaded"] < 1e-5


def test_pipeline_gradients_accumulate_over_steps_as_one_process(gloo) -> None:
    """Two pp.step calls before an optimizer step: each step summed the whole .grad of a
    parameter shared between ranks (GPT-2's tied embedding, read in both stages), so what
    earlier steps left was summed again (0.72 of the embedding's gradient off, relative to its
    largest element). Now each step sums its own part: every gradient is one process's."""
    for r in gloo(2).run(user_programs.pipeline_accumulation, 0, "gpt2"):
        assert r["tied"] == ["transformer.wte.weight"]
        assert "transformer.wte.weight" in r["diffs"]
        assert max(r["diffs"].values()) < 1e-5, sorted(r["diffs"].items(), key=lambda kv: -kv[1])[
            :3
        ]
