"""The HF model suite: `transformers` architectures from small random configs, each with the
keyword inputs and labels a user's training loop passes (`model(**inputs).loss`).

    from torch_plugin.models import hf_suite
    model, inputs = hf_suite.build("llama")          # inputs: dict with input_ids, labels, ...
    loss = model(**inputs).loss

Nothing is downloaded: configs are written here, weights are random (seeded). Shapes are small
but keep the real structure (GQA, sliding windows, fused projections, tied embeddings, MoE
routing, relative position bias, padding masks). Widths divide by 4 so every model can be split
over 2 and 4 ranks; the batch divides by 2 for a (dp, tp) mesh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

VOCAB = 256
SEQ = 16
BATCH = 2
IMAGE = 32
CLASSES = 8
PAD = 0  # every tokenizer-side id is inside the small vocabulary
_IDS = dict(pad_token_id=PAD, bos_token_id=1, eos_token_id=2)


@dataclasses.dataclass(frozen=True)
class HFArch:
    """One architecture: its class, a small config, what its inputs look like.

    kind: "causal" (decoder LM), "masked" (encoder MLM), "seq2seq" (encoder-decoder, labels
    shifted into decoder inputs by the model), "speech" (Whisper: mel features in),
    "image" (classification), "clip" (contrastive, return_loss).
    """

    name: str
    family: str  # decoder, moe, encoder, encoder-decoder, vision, multimodal
    model_class: str
    config_class: str
    config: dict[str, Any]
    kind: str
    tied: bool = False  # input embedding and LM head share one tensor
    notes: str = ""

    @property
    def generates(self) -> bool:
        """Decoders whose generate() the cache-parallel entry point serves."""
        return self.kind == "causal"


def _llama_like(**extra: Any) -> dict[str, Any]:
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **_IDS,
    )
    cfg.update(extra)
    return cfg


def _bart_like(**extra: Any) -> dict[str, Any]:
    cfg = dict(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=64,
        decoder_start_token_id=2,
        **_IDS,
    )
    cfg.update(extra)
    return cfg


def _bert_like(**extra: Any) -> dict[str, Any]:
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        pad_token_id=PAD,
    )
    cfg.update(extra)
    return cfg


def _vit_like(**extra: Any) -> dict[str, Any]:
    cfg = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=IMAGE,
        patch_size=8,
        num_labels=CLASSES,
    )
    cfg.update(extra)
    return cfg


_G2 = dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=VOCAB, **_IDS)

ARCHS: dict[str, HFArch] = {
    a.name: a
    for a in [
        # Decoders.
        HFArch("llama", "decoder", "LlamaForCausalLM", "LlamaConfig", _llama_like(), "causal"),
        HFArch(
            "mistral",
            "decoder",
            "MistralForCausalLM",
            "MistralConfig",
            _llama_like(sliding_window=8),
            "causal",
            notes="sliding window 8 < sequence 16",
        ),
        HFArch("qwen2", "decoder", "Qwen2ForCausalLM", "Qwen2Config", _llama_like(), "causal"),
        HFArch(
            "qwen3",
            "decoder",
            "Qwen3ForCausalLM",
            "Qwen3Config",
            _llama_like(head_dim=16),
            "causal",
        ),
        HFArch(
            "gemma",
            "decoder",
            "GemmaForCausalLM",
            "GemmaConfig",
            _llama_like(head_dim=16),
            "causal",
            tied=True,
        ),
        HFArch(
            "gemma2",
            "decoder",
            "Gemma2ForCausalLM",
            "Gemma2Config",
            _llama_like(head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
            "causal",
            tied=True,
            notes="sliding window, logit soft-capping",
        ),
        HFArch(
            "phi3",
            "decoder",
            "Phi3ForCausalLM",
            "Phi3Config",
            _llama_like(),
            "causal",
            notes="fused qkv_proj and gate_up_proj",
        ),
        HFArch("phi", "decoder", "PhiForCausalLM", "PhiConfig", _llama_like(), "causal"),
        HFArch("olmo", "decoder", "OlmoForCausalLM", "OlmoConfig", _llama_like(), "causal"),
        HFArch("olmo2", "decoder", "Olmo2ForCausalLM", "Olmo2Config", _llama_like(), "causal"),
        HFArch(
            "granite", "decoder", "GraniteForCausalLM", "GraniteConfig", _llama_like(), "causal"
        ),
        HFArch(
            "stablelm", "decoder", "StableLmForCausalLM", "StableLmConfig", _llama_like(), "causal"
        ),
        HFArch(
            "starcoder2",
            "decoder",
            "Starcoder2ForCausalLM",
            "Starcoder2Config",
            _llama_like(sliding_window=8),
            "causal",
        ),
        HFArch(
            "cohere",
            "decoder",
            "CohereForCausalLM",
            "CohereConfig",
            _llama_like(),
            "causal",
            tied=True,
        ),
        HFArch(
            "gpt_neox",
            "decoder",
            "GPTNeoXForCausalLM",
            "GPTNeoXConfig",
            _llama_like(num_key_value_heads=4),
            "causal",
            notes="fused query_key_value",
        ),
        HFArch(
            "gptj",
            "decoder",
            "GPTJForCausalLM",
            "GPTJConfig",
            dict(_G2, rotary_dim=8),
            "causal",
        ),
        HFArch(
            "codegen",
            "decoder",
            "CodeGenForCausalLM",
            "CodeGenConfig",
            dict(_G2, rotary_dim=8, n_ctx=64),
            "causal",
            notes="fused qkv_proj in mp_num blocks",
        ),
        HFArch(
            "opt",
            "decoder",
            "OPTForCausalLM",
            "OPTConfig",
            dict(
                vocab_size=VOCAB,
                hidden_size=64,
                ffn_dim=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=64,
                word_embed_proj_dim=64,
                **_IDS,
            ),
            "causal",
            tied=True,
        ),
        HFArch(
            "bloom",
            "decoder",
            "BloomForCausalLM",
            "BloomConfig",
            dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, **_IDS),
            "causal",
            tied=True,
            notes="ALiBi",
        ),
        HFArch(
            "falcon",
            "decoder",
            "FalconForCausalLM",
            "FalconConfig",
            dict(
                vocab_size=VOCAB,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                new_decoder_architecture=True,
                num_kv_heads=2,
                **_IDS,
            ),
            "causal",
            tied=True,
        ),
        HFArch(
            "gpt_bigcode",
            "decoder",
            "GPTBigCodeForCausalLM",
            "GPTBigCodeConfig",
            dict(_G2, multi_query=True),
            "causal",
            tied=True,
            notes="multi-query c_attn",
        ),
        HFArch("gpt2", "decoder", "GPT2LMHeadModel", "GPT2Config", dict(_G2), "causal", tied=True),
        HFArch(
            "gpt_neo",
            "decoder",
            "GPTNeoForCausalLM",
            "GPTNeoConfig",
            dict(
                vocab_size=VOCAB,
                hidden_size=64,
                num_layers=2,
                num_heads=4,
                attention_types=[[["global", "local"], 1]],
                window_size=8,
                max_position_embeddings=64,
                **_IDS,
            ),
            "causal",
            tied=True,
        ),
        HFArch(
            "xglm",
            "decoder",
            "XGLMForCausalLM",
            "XGLMConfig",
            dict(
                vocab_size=VOCAB,
                d_model=64,
                num_layers=2,
                attention_heads=4,
                ffn_dim=128,
                max_position_embeddings=64,
                **_IDS,
            ),
            "causal",
            tied=True,
        ),
        HFArch(
            "biogpt",
            "decoder",
            "BioGptForCausalLM",
            "BioGptConfig",
            _bert_like(bos_token_id=1, eos_token_id=2),
            "causal",
            tied=True,
        ),
        # Mixture of experts.
        HFArch(
            "mixtral",
            "moe",
            "MixtralForCausalLM",
            "MixtralConfig",
            _llama_like(num_local_experts=4, num_experts_per_tok=2),
            "causal",
        ),
        HFArch(
            "qwen2_moe",
            "moe",
            "Qwen2MoeForCausalLM",
            "Qwen2MoeConfig",
            _llama_like(
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
            ),
            "causal",
            notes="shared expert",
        ),
        HFArch(
            "qwen3_moe",
            "moe",
            "Qwen3MoeForCausalLM",
            "Qwen3MoeConfig",
            _llama_like(
                head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
            ),
            "causal",
        ),
        HFArch(
            "olmoe",
            "moe",
            "OlmoeForCausalLM",
            "OlmoeConfig",
            _llama_like(num_experts=4, num_experts_per_tok=2),
            "causal",
        ),
        # Encoders (masked LM).
        HFArch("bert", "encoder", "BertForMaskedLM", "BertConfig", _bert_like(), "masked", True),
        HFArch(
            "roberta",
            "encoder",
            "RobertaForMaskedLM",
            "RobertaConfig",
            _bert_like(pad_token_id=1, max_position_embeddings=66),
            "masked",
            True,
        ),
        HFArch(
            "xlm_roberta",
            "encoder",
            "XLMRobertaForMaskedLM",
            "XLMRobertaConfig",
            _bert_like(pad_token_id=1, max_position_embeddings=66),
            "masked",
            True,
        ),
        HFArch(
            "distilbert",
            "encoder",
            "DistilBertForMaskedLM",
            "DistilBertConfig",
            dict(
                vocab_size=VOCAB,
                dim=64,
                n_layers=2,
                n_heads=4,
                hidden_dim=128,
                max_position_embeddings=64,
                pad_token_id=PAD,
            ),
            "masked",
            True,
        ),
        HFArch(
            "albert",
            "encoder",
            "AlbertForMaskedLM",
            "AlbertConfig",
            _bert_like(embedding_size=32),
            "masked",
            True,
            notes="one layer's weights shared by every layer",
        ),
        HFArch(
            "electra",
            "encoder",
            "ElectraForMaskedLM",
            "ElectraConfig",
            _bert_like(embedding_size=32),
            "masked",
            True,
        ),
        HFArch(
            "deberta_v2",
            "encoder",
            "DebertaV2ForMaskedLM",
            "DebertaV2Config",
            _bert_like(relative_attention=True, position_buckets=16, max_relative_positions=32),
            "masked",
            True,
            notes="disentangled relative attention",
        ),
        HFArch(
            "roformer",
            "encoder",
            "RoFormerForMaskedLM",
            "RoFormerConfig",
            _bert_like(embedding_size=64),
            "masked",
            True,
        ),
        HFArch(
            "mpnet",
            "encoder",
            "MPNetForMaskedLM",
            "MPNetConfig",
            _bert_like(pad_token_id=1, max_position_embeddings=66),
            "masked",
            True,
            notes="relative position bias",
        ),
        # Encoder-decoders.
        HFArch(
            "t5",
            "encoder-decoder",
            "T5ForConditionalGeneration",
            "T5Config",
            dict(
                vocab_size=VOCAB,
                d_model=64,
                d_kv=16,
                d_ff=128,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                decoder_start_token_id=PAD,
                **_IDS,
            ),
            "seq2seq",
            tied=True,
            notes="relative position bias",
        ),
        HFArch(
            "bart",
            "encoder-decoder",
            "BartForConditionalGeneration",
            "BartConfig",
            _bart_like(),
            "seq2seq",
            tied=True,
        ),
        HFArch(
            "mbart",
            "encoder-decoder",
            "MBartForConditionalGeneration",
            "MBartConfig",
            _bart_like(),
            "seq2seq",
            tied=True,
        ),
        HFArch(
            "marian",
            "encoder-decoder",
            "MarianMTModel",
            "MarianConfig",
            _bart_like(decoder_start_token_id=PAD),
            "seq2seq",
            tied=True,
        ),
        HFArch(
            "pegasus",
            "encoder-decoder",
            "PegasusForConditionalGeneration",
            "PegasusConfig",
            _bart_like(decoder_start_token_id=PAD),
            "seq2seq",
            tied=True,
        ),
        HFArch(
            "whisper",
            "encoder-decoder",
            "WhisperForConditionalGeneration",
            "WhisperConfig",
            _bart_like(
                num_mel_bins=16,
                max_source_positions=16,
                max_target_positions=32,
                decoder_start_token_id=1,
            ),
            "speech",
            tied=True,
        ),
        # Vision.
        HFArch("vit", "vision", "ViTForImageClassification", "ViTConfig", _vit_like(), "image"),
        HFArch("deit", "vision", "DeiTForImageClassification", "DeiTConfig", _vit_like(), "image"),
        HFArch(
            "dinov2",
            "vision",
            "Dinov2ForImageClassification",
            "Dinov2Config",
            _vit_like(),
            "image",
        ),
        HFArch(
            "swin",
            "vision",
            "SwinForImageClassification",
            "SwinConfig",
            dict(
                image_size=IMAGE,
                patch_size=4,
                embed_dim=32,
                depths=[1, 1],
                num_heads=[2, 4],
                window_size=4,
                num_labels=CLASSES,
            ),
            "image",
            notes="shifted windows, relative position bias",
        ),
        HFArch(
            "convnext",
            "vision",
            "ConvNextForImageClassification",
            "ConvNextConfig",
            dict(hidden_sizes=[32, 64], depths=[1, 1], num_stages=2, num_labels=CLASSES),
            "image",
        ),
        HFArch(
            "resnet",
            "vision",
            "ResNetForImageClassification",
            "ResNetConfig",
            dict(
                embedding_size=16,
                hidden_sizes=[32, 64],
                depths=[1, 1],
                layer_type="bottleneck",
                num_labels=CLASSES,
            ),
            "image",
        ),
        HFArch(
            "clip",
            "multimodal",
            "CLIPModel",
            "CLIPConfig",
            dict(
                text_config=dict(
                    vocab_size=VOCAB,
                    hidden_size=64,
                    intermediate_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    max_position_embeddings=64,
                    **_IDS,
                ),
                vision_config=dict(
                    hidden_size=64,
                    intermediate_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    image_size=IMAGE,
                    patch_size=8,
                ),
                projection_dim=32,
            ),
            "clip",
        ),
    ]
}

# A quick cross-section: one of each family and of each feature that tends to break tools
# (fused projections, tied embeddings, MoE, relative position bias, convolutions).
CI_SUBSET = ["llama", "phi3", "gpt2", "mixtral", "bert", "t5", "vit", "resnet"]


def names(family: str | None = None) -> list[str]:
    return [n for n, a in ARCHS.items() if family is None or a.family == family]


def decoders() -> list[str]:
    return [n for n, a in ARCHS.items() if a.kind == "causal"]


# Config keys that set a layer's width, scaled by build_model's `width` (heads stay as many).
_WIDTH_KEYS = (
    "hidden_size",
    "intermediate_size",
    "n_embd",
    "dim",
    "hidden_dim",
    "d_model",
    "d_ff",
    "d_kv",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "embed_dim",
    "embedding_size",
    "hidden_sizes",
)


# Config keys that set the number of layers, set by build_model's `layers`.
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def build_model(
    name: str,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    width: int = 1,
    layers: int | None = None,
    library_defaults: bool = False,
) -> nn.Module:
    """The model with random weights (seeded), in training mode with dropout off (so one
    process and N ranks compute the same numbers). width: multiplies every layer width (4 gives
    hidden 256, heads of 64: the benchmarks' scale). layers: the number of layers (2 by
    default; a 4-stage pipeline wants at least 4). library_defaults: only the size fields are
    set; dropout and use_cache stay as the library ships them (what users' configs are)."""
    import transformers

    if name not in ARCHS:
        raise ValueError(f"unknown HF suite architecture {name!r}; available: {', '.join(ARCHS)}")
    arch = ARCHS[name]
    config_cls = getattr(transformers, arch.config_class)
    cfg = dict(arch.config)
    if width != 1:
        for key in _WIDTH_KEYS:
            if isinstance(cfg.get(key), int):
                cfg[key] *= width
            elif isinstance(cfg.get(key), list):
                cfg[key] = [v * width for v in cfg[key]]
    if layers is not None:
        for key in _LAYER_KEYS:
            if isinstance(cfg.get(key), int):
                cfg[key] = layers
        if "attention_types" in cfg:  # GPT-Neo: a pattern repeated to the number of layers
            pattern = cfg["attention_types"][0][0]
            cfg["attention_types"] = [[pattern, max(1, layers // len(pattern))]]
    sub = {k: cfg.pop(k) for k in ("text_config", "vision_config") if k in cfg}
    config = config_cls(**cfg, **sub)
    if not library_defaults:
        _no_dropout(config)
    torch.manual_seed(seed)
    model = getattr(transformers, arch.model_class)(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.train()


def _no_dropout(config: Any) -> None:
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop")):
            setattr(config, key, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _no_dropout(value)  # sub-configs (CLIP's text and vision towers)
    config.use_cache = False


def collated_batch(
    rows: int, length: int, seed: int, vocab: int = VOCAB, pad_id: int = 0
) -> dict[str, torch.Tensor]:
    """What a padding collator (DataCollatorWithPadding) and a causal-LM label mask give for
    token sequences of several lengths: right-padded to the longest (`length`; row 0 is that
    long), attention_mask 0 and labels -100 on the padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, length), generator=g)
    lengths = torch.randint(max(2, length // 2), length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad_id)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def make_inputs(
    name: str, batch: int = BATCH, seq: int = SEQ, seed: int = 1, pad: int = 3
) -> dict[str, Any]:
    """The keyword arguments of one training step, labels included. Token models get a padding
    mask: the last `pad` positions of row 1 are padding (labels -100 there), as a collator
    right-pads a batch."""
    arch = ARCHS[name]
    gen = torch.Generator().manual_seed(seed)
    if arch.kind in ("image", "clip"):
        pixels = torch.randn(batch, 3, IMAGE, IMAGE, generator=gen)
        if arch.kind == "image":
            return {
                "pixel_values": pixels,
                "labels": torch.randint(0, CLASSES, (batch,), generator=gen),
            }
        ids = torch.randint(3, VOCAB, (batch, seq), generator=gen)
        mask = torch.ones(batch, seq, dtype=torch.long)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "pixel_values": pixels,
            "return_loss": True,
        }
    if arch.kind == "speech":
        cfg = arch.config
        feats = torch.randn(
            batch, cfg["num_mel_bins"], 2 * cfg["max_source_positions"], generator=gen
        )
        labels = torch.randint(3, VOCAB, (batch, seq // 2), generator=gen)
        return {"input_features": feats, "labels": labels}
    ids = torch.randint(3, VOCAB, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1 and pad:
        mask[1, seq - pad :] = 0
        ids[1, seq - pad :] = arch.config.get("pad_token_id", PAD)
    if arch.kind == "seq2seq":
        labels = torch.randint(3, VOCAB, (batch, seq // 2), generator=gen)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def build(
    name: str,
    batch: int = BATCH,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    pad: int = 3,
    layers: int | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """(model, keyword inputs with labels): `model(**inputs).loss` is the training loss.
    pad: padded positions at the end of row 1 (0: none)."""
    model = build_model(name, seed=seed, dtype=dtype, layers=layers)
    inputs = make_inputs(name, batch=batch, seed=seed + 1, pad=pad)
    if dtype is not None:
        inputs = {
            k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in inputs.items()
        }
    return model, inputs


def loss_of(output: Any) -> torch.Tensor:
    """The loss an HF model computed from its labels (ModelOutput, dict or tuple)."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)):
        loss = output[0]
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TypeError(f"the model returned no scalar loss ({type(output).__name__})")
    return loss


Builder = Callable[..., tuple[nn.Module, dict[str, Any]]]

__all__ = [
    "ARCHS",
    "CI_SUBSET",
    "HFArch",
    "build",
    "build_model",
    "decoders",
    "loss_of",
    "make_inputs",
    "names",
]
