"""The HF model suite (torch_plugin.models.hf_suite) called the HF way, `model(**inputs).loss`,
through the entry points of benchmarks/hf_suite.py: CI's cross-section (the full table is
`python benchmarks/hf_suite.py`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from benchmarks import hf_suite as runner
from torch_plugin.models import hf_suite


def test_the_suite_covers_the_architectures_users_train() -> None:
    assert len(hf_suite.ARCHS) >= 40
    families = {a.family for a in hf_suite.ARCHS.values()}
    assert families == {"decoder", "moe", "encoder", "encoder-decoder", "vision", "multimodal"}
    assert set(hf_suite.CI_SUBSET) <= set(hf_suite.ARCHS)
    with pytest.raises(ValueError, match="unknown HF suite architecture 'nope'"):
        hf_suite.build("nope")


@pytest.mark.parametrize("name", hf_suite.names())
def test_every_architecture_trains_from_its_labels(name: str) -> None:
    """Each model computes its loss from `labels` in its keyword inputs, and the padded
    positions of row 1 carry no label."""
    model, inputs = hf_suite.build(name)
    out = model(**inputs)
    loss = hf_suite.loss_of(out)
    assert torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None for p in model.parameters())
    if "attention_mask" in inputs and "labels" in inputs and inputs["labels"].dim() == 2:
        mask = inputs["attention_mask"]
        if inputs["labels"].shape == mask.shape:
            assert (inputs["labels"][mask == 0] == -100).all()


@pytest.mark.parametrize("name", ["llama", "mixtral", "bert", "vit"])
def test_roundtrip_is_bit_exact_on_hf_calls(name: str) -> None:
    """A decoder, MoE, an encoder and a vision model (the full suite: `python
    benchmarks/hf_suite.py --entries roundtrip`). check_roundtrip raises Mismatch on a loss or
    gradient that is not bit-exact against aot_eager; the figure it returns is checked too."""
    figures = runner.check_roundtrip(name)
    assert figures["max_grad_diff"] <= runner.LOSS_RTOL, figures


class TestOnTwoRanks:
    def test_sharded_t5_trains_as_one_process(self, gloo: Any) -> None:
        """parallelize(model, mesh, inputs_dict) then model(**inputs).loss, 3 AdamW steps on
        gloo: losses equal one process within 1e-5, the model's parameter names and .config
        are kept."""
        figures = runner.run_on_pool(gloo(2), "shard2", "t5")
        assert figures["max_loss_diff"] <= runner.LOSS_RTOL
        # The default plan splits what a 2-rank user expects split (the memory objective):
        # T5's shared token table included, each rank holds about half.
        assert figures["param_fraction"] <= 0.6

    def test_bf16_sharded_decoder_trains_as_one_process_recipe(self, gloo: Any) -> None:
        """Llama on 2 ranks in bf16, both ways: bf16 parameters stepped as float32 master
        weights (`optimizer(..., master_weights=True)`, gradients summed in float32), and
        float32 parameters under torch.autocast(bfloat16); 3 AdamW steps each within 1e-3 of
        one process running the same recipe, whose losses move by more than that."""
        figures = runner.run_on_pool(gloo(2), "bf16_2", "llama")
        assert figures["bf16_params_loss_diff"] <= runner.BF16_RTOL
        assert figures["autocast_loss_diff"] <= runner.BF16_RTOL

    def test_fp16_sharded_decoder_scales_its_loss_and_agrees_on_overflows(self, gloo: Any) -> None:
        """Llama on 2 ranks in fp16 with torch_plugin.ShardedGradScaler, both ways (fp16
        parameters with float32 masters; float32 parameters under autocast(float16)): 3 AdamW
        steps within 5e-4 of one process with torch.amp.GradScaler (whose losses move by
        more). An inf in one rank's gradient makes every rank skip the step and halve its
        scale."""
        figures = runner.run_on_pool(gloo(2), "fp16_2", "llama")
        assert figures["fp16_params_loss_diff"] <= runner.FP16_RTOL
        assert figures["autocast_loss_diff"] <= runner.FP16_RTOL
        assert figures["overflow_disagreements"] == 0


class TestOnFourRanks:
    def test_sharded_bert_on_a_dp_tp_mesh_trains_as_one_process(self, gloo: Any) -> None:
        """On the (dp, tp) mesh the two replicas' slices hold different numbers of labels (row
        1 is padded): BERT's loss is a mean, weighted by each slice's share of the labels."""
        figures = runner.run_on_pool(gloo(4), "shard2x2", "bert")
        assert figures["max_loss_diff"] <= runner.LOSS_RTOL

    def test_accumulation_and_clipping_on_a_dp_tp_mesh_equal_one_process(self, gloo: Any) -> None:
        """Llama on (dp=2, tp=2), which takes num_items_in_batch: 4 micro-steps, 3 under
        no_sync() with no gradient collective, then clip_grad_norm_ (the norm equals one
        process's on the whole batch within 1e-6) and an AdamW step (the next loss within
        1e-5)."""
        figures = runner.run_on_pool(gloo(4), "recipe2x2", "llama")
        assert figures["norm_rel_diff"] <= 1e-6
        assert figures["max_loss_diff"] <= runner.LOSS_RTOL
        assert figures["quiet_micro_steps"] == 3

    def test_hf_decoder_pipelines_train_as_one_process(self, gloo: Any) -> None:
        """OPT (4 layers, its embedding tied to the LM head) on a 4-rank graph pipeline,
        called the HF way (`parallelize(model, 4, inputs_dict, strategy="pipeline")`,
        `loss_fn` reading `out.loss`): 3 clipped AdamW steps equal one process within 1e-5
        (losses) and 1e-5 (norms). The tied weight is read in two stages, whose gradients
        are summed."""
        figures = runner.run_on_pool(gloo(4), "pipeline4", "opt")
        assert figures["max_loss_diff"] <= runner.LOSS_RTOL
        assert figures["max_norm_rel_diff"] <= 1e-5
        assert figures["tied"] == 1 and figures["stages"] >= 2

    def test_alibi_crosses_pipeline_stages_as_rows_per_sample(self, gloo: Any) -> None:
        """BLOOM's ALiBi bias is [batch * heads, 1, seq], made by a view merging the batch
        with the heads: it crosses stages as `heads` rows per sample (micro-batches take
        contiguous row blocks); 3 clipped AdamW steps on 4 ranks equal one process."""
        figures = runner.run_on_pool(gloo(4), "pipeline4", "bloom")
        assert figures["max_loss_diff"] <= runner.LOSS_RTOL
        assert figures["max_norm_rel_diff"] <= 1e-5
        assert figures["stages"] >= 2


def test_aten_pipeline_graph_recomputes_what_does_not_depend_on_the_batch() -> None:
    """The ATen-level pipeline graph of an HF call: parameters and rotary tables are free
    (each stage recomputes them); the hidden states depend on the batch. OPT's graph at one
    sample differs from its graph at four (a reshape is a view there), which the runtime
    must know to leave that micro-batch size out."""
    from torch_plugin.pipeline import capture as pipeline_capture
    from torch_plugin.runtime.capture import as_call

    model, inputs = hf_suite.build("llama", batch=4, layers=2)
    g = pipeline_capture.capture(model, as_call(inputs), 4)
    free = {n.name for n in g.free}
    attrs = [n for n in g.gm.graph.nodes if n.op == "get_attr"]
    assert attrs and all(n.name in free for n in attrs)
    assert any("rotary" in str(n.meta.get("nn_module_stack", "")) for n in g.free)
    embedding = next(n for n in g.gm.graph.nodes if n.target is torch.ops.aten.embedding.default)
    assert embedding.name not in free
    assert all(g.batch_major)  # input_ids, attention_mask, labels
    params = {n for n, _ in g.gm.named_parameters()}
    assert params == {f"m.{n}" for n, _ in model.named_parameters()}

    model, inputs = hf_suite.build("opt", batch=4, layers=2)
    whole = pipeline_capture.capture(model, as_call(inputs), 4)
    assert (
        pipeline_capture.same_graph(whole, pipeline_capture.capture(model, as_call(inputs), 4, 2))
        is None
    )
    assert pipeline_capture.same_graph(
        whole, pipeline_capture.capture(model, as_call(inputs), 4, 1)
    )


def test_uncapturable_forward_is_named_with_what_to_do() -> None:
    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow
                return self.fc(x)
            return x

    from torch_plugin.sharding.module import capture_graph

    with pytest.raises(RuntimeError, match="forward of Branchy could not be captured"):
        capture_graph(Branchy(), {"x": torch.randn(2, 4)})


def test_keyword_capture_sees_every_tensor_argument() -> None:
    """A dict of example inputs is the keyword call: the graph takes its tensors (labels
    included) and the loss is computed inside."""
    from torch_plugin.sharding.module import capture_graph

    model, inputs = hf_suite.build("llama")
    graph = capture_graph(model, inputs)
    n_params = len(dict(model.named_parameters())) + len(dict(model.named_buffers()))
    assert len(graph.records()[0]) - n_params == 3  # input_ids, attention_mask, labels
    with pytest.raises(TypeError, match="no scalar loss"):
        hf_suite.loss_of(model(input_ids=inputs["input_ids"]))


def test_a_dp_axis_is_refused_where_batch_norm_couples_the_samples() -> None:
    """ResNet in training on a (dp, tp) mesh would normalise each replica by its slice's
    statistics (other numbers than one process): refused, naming the module."""
    from torch_plugin.sharding.capture import _refuse_batch_statistics

    model, _ = hf_suite.build("resnet")
    with pytest.raises(NotImplementedError, match=r"module 'resnet\.embedder.*BatchNorm2d"):
        _refuse_batch_statistics(model)
    _refuse_batch_statistics(model.eval())  # running statistics: nothing couples the batch


@pytest.mark.parametrize(("name", "coupled"), [("clip", True), ("llama", False), ("t5", False)])
def test_a_dp_axis_is_refused_where_samples_are_combined(name: str, coupled: bool) -> None:
    """CLIP's contrastive loss compares every text with every image of the batch: a dp
    replica's slice would contrast only its own samples (its loss was 0 on a (2, 2) mesh, one
    sample per replica). The forward traced at the whole batch and at a slice shows the batch
    in a non-leading dimension there, and a dp axis is refused naming the node; models whose
    samples stay apart (Llama, T5) pass the check."""
    import torch.utils._pytree as pytree

    from torch_plugin.runtime.capture import as_call
    from torch_plugin.sharding.capture import _capture, _refuse_batch_coupling

    model, inputs = hf_suite.build(name)
    full = as_call(inputs)
    half = pytree.tree_map(
        lambda x: x[: x.shape[0] // 2] if isinstance(x, torch.Tensor) and x.dim() else x, full
    )
    local = _capture(model, half)
    if coupled:
        with pytest.raises(NotImplementedError, match=r"CLIPModel: node .* use a 1-D"):
            _refuse_batch_coupling(model, full, local)
    else:
        _refuse_batch_coupling(model, full, local)
