"""The Python face of the layout planner: HF models (or configs) to a TransformerSpec, checked
against the model's parameter count, and the two C++ entry points with keyword options."""

from __future__ import annotations

from typing import Any

import torch

from .. import _C

# Relative difference allowed between the spec's parameter count and the model's: a few biases
# the layout model does not price (Qwen2's on q, k, v), which cost nothing at scale.
PARAM_TOLERANCE = 5e-3
# Decoders made of attention (q, k, v, o), a gated MLP (gate, up, down), two norms per layer,
# an embedding and an output layer: the architecture TransformerSpec prices.
LLAMA_FAMILY = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"})


def _config_of(model: Any) -> Any:
    config = getattr(model, "config", model)
    if not hasattr(config, "to_dict"):
        raise TypeError(
            f"transformer_spec: expected a transformers model or config, got "
            f"{type(model).__name__}; build a TransformerSpec by hand for other models"
        )
    return config


def transformer_spec(model: Any, name: str | None = None) -> Any:
    """The sizes of a `transformers` decoder (Llama/Mistral/Qwen2/Gemma family, GPT-2) as a
    `TransformerSpec`. Given a module (build it on the meta device: nothing is allocated), the
    spec's parameter count is checked against the module's own."""
    c = _config_of(model)
    get = c.to_dict().get
    if get("model_type") in ("gpt2",):
        hidden = c.n_embd
        spec = _C.TransformerSpec(
            layers=c.n_layer,
            hidden=hidden,
            ffn=c.n_inner or 4 * hidden,
            heads=c.n_head,
            kv_heads=c.n_head,
            vocab=c.vocab_size,
            gated_mlp=False,
            tied_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
            biases=True,
            positions=c.n_positions,
        )
    else:
        if get("model_type") not in LLAMA_FAMILY:
            raise ValueError(
                f"transformer_spec: a {get('model_type')!r} model is not one the layout model "
                f"describes (Llama-family decoders: {', '.join(sorted(LLAMA_FAMILY))}; GPT-2); "
                "build a TransformerSpec by hand"
            )
        heads = c.num_attention_heads
        spec = _C.TransformerSpec(
            layers=c.num_hidden_layers,
            hidden=c.hidden_size,
            ffn=c.intermediate_size,
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            vocab=c.vocab_size,
            head_dim=get("head_dim") or 0,
            gated_mlp=True,
            tied_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
        )
    spec.name = name or str(get("_name_or_path") or get("model_type") or "model")
    if isinstance(model, torch.nn.Module):
        actual = sum(p.numel() for p in model.parameters())
        if abs(spec.params - actual) > PARAM_TOLERANCE * actual:
            raise ValueError(
                f"transformer_spec: the layout model prices {spec.params:.4g} parameters but "
                f"{type(model).__name__} has {actual:.4g}; its architecture has parts the model "
                f"does not describe (experts, cross-attention, ...), so a plan would be wrong"
            )
    return spec


def cluster_profile(name_or_profile: str | Any = "h100-roce", **overrides: Any) -> Any:
    """A preset (`_C.cluster_profile_names()`) with optional field overrides."""
    if isinstance(name_or_profile, str):
        profile = _C.cluster_profile(name_or_profile)
    else:
        profile = name_or_profile
    if overrides:
        profile = _C.ClusterProfile(**{**profile.to_dict(), **overrides})
    return profile


def _spec(model: Any) -> Any:
    return model if isinstance(model, _C.TransformerSpec) else transformer_spec(model)


def estimate_training_step(
    model: Any,
    layout: Any,
    *,
    seq_len: int,
    global_batch: int,
    cluster: str | Any = "h100-roce",
) -> Any:
    """The modelled step of `layout` (a `TrainingLayout` or a dict of its fields); the world
    size is the product of its degrees."""
    if isinstance(layout, dict):
        layout = _C.TrainingLayout(**layout)
    world = layout.tp * layout.cp * layout.pp * layout.dp
    job = _C.TrainingJob(world=world, seq_len=seq_len, global_batch=global_batch)
    return _C.estimate_training_step(_spec(model), job, layout, cluster_profile(cluster))


def plan_at_scale(
    model: Any,
    world_size: int,
    *,
    seq_len: int,
    global_batch: int,
    cluster: str | Any = "h100-roce",
    **search: Any,
) -> Any:
    """The fastest layout (tp, cp, pp, dp, interleaving, micro-batch, ZeRO stage, recomputation)
    that fits the cluster's memory, by the C++ model. Keyword `search` fields pin or narrow a
    decision: `tp=[8]`, `recompute="none"`, `order="tp-cp-pp-dp"`, `keep=10`."""
    lists = {
        k: v if isinstance(v, (list, tuple)) else [v]
        for k, v in search.items()
        if k in ("tp", "cp", "pp", "chunks", "micro_batch", "zero", "recompute")
    }
    rest = {k: v for k, v in search.items() if k not in lists}
    job = _C.TrainingJob(world=world_size, seq_len=seq_len, global_batch=global_batch)
    return _C.plan_training_layout(
        _spec(model), job, cluster_profile(cluster), _C.LayoutSearch(**lists, **rest)
    )
