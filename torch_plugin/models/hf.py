"""BERT-base and GPT-2-small from `transformers` configs, random weights, nothing downloaded."""

from __future__ import annotations

import torch
import torch.nn as nn


class HFWrapper(nn.Module):
    """Calls a transformers model on token ids and returns one tensor (logits / hidden states)."""

    def __init__(self, model: nn.Module, output_key: str, vocab_size: int, seq_len: int):
        super().__init__()
        self.model = model
        self.output_key = output_key
        self.vocab_size = vocab_size
        self.seq_len = seq_len

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids), self.output_key)


def build_bert(small: bool = False, seq_len: int | None = None, **kw: object) -> HFWrapper:
    from transformers import BertConfig, BertModel

    cfg = (
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=1000,
            max_position_embeddings=64,
        )
        if small
        else {}
    )
    cfg.update(kw)
    config = BertConfig(**cfg)
    config._attn_implementation = "sdpa"
    model = BertModel(config, add_pooling_layer=False)
    return HFWrapper(
        model, "last_hidden_state", config.vocab_size, seq_len or (16 if small else 128)
    )


def build_gpt2(small: bool = False, seq_len: int | None = None, **kw: object) -> HFWrapper:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = (
        dict(
            n_embd=64,
            n_layer=2,
            n_head=4,
            vocab_size=1000,
            n_positions=64,
            bos_token_id=999,
            eos_token_id=999,
        )
        if small
        else {}
    )
    cfg.update(kw)
    config = GPT2Config(use_cache=False, **cfg)
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config)
    return HFWrapper(model, "logits", config.vocab_size, seq_len or (16 if small else 128))


def token_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor]:
    return (torch.randint(0, model.vocab_size, (batch, model.seq_len)),)
