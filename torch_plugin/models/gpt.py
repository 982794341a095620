"""A Megatron-style GPT (separate q/k/v projections, GELU MLP, pre-LayerNorm, learned positions)
at the published GPT-3 shapes, for the sharding benchmark and tests.

Attention reshapes with `-1` heads, so the same module runs under a tensor-parallel plan that
leaves each rank a slice of the heads (ours, or a hand-written DTensor one).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    dim: int = 1024
    n_layers: int = 24
    n_heads: int = 16
    vocab_size: int = 50304
    seq_len: int = 1024
    lm_head: bool = True  # False: the model returns the final hidden states

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


# GPT-3 paper sizes (Brown et al. 2020, table 2.1) at sequence 1024.
SIZES: dict[str, GPTConfig] = {
    "350m": GPTConfig(1024, 24, 16),
    "1.3b": GPTConfig(2048, 24, 16),
    "6.7b": GPTConfig(4096, 32, 32),
    "13b": GPTConfig(5120, 40, 40),
}


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.k = nn.Linear(cfg.dim, cfg.dim)
        self.v = nn.Linear(cfg.dim, cfg.dim)
        self.o = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, -1, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.fc1 = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.fc2 = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.seq_len = cfg.vocab_size, cfg.seq_len
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.seq_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False) if cfg.lm_head else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.head(x) if self.head is not None else x


def build_gpt(small: bool = False, size: str = "350m", **kw: object) -> GPT:
    cfg = GPTConfig(64, 2, 4, 1000, 16) if small else SIZES[size]
    return GPT(dataclasses.replace(cfg, **kw))


def megatron_constraints(model: GPT) -> dict[str, str]:
    """The hand-written Megatron-LM plan of this model as pins: q/k/v and fc1 column-parallel
    (weight rows, bias split), o and fc2 row-parallel (weight columns); the rest replicated."""
    pins: dict[str, str] = {}
    for i in range(len(model.blocks)):
        p = f"blocks.{i}."
        for lin in ("attn.q", "attn.k", "attn.v", "fc1"):
            pins[p + lin + ".weight"] = "S(0)"
            pins[p + lin + ".bias"] = "S(0)"
        for lin in ("attn.o", "fc2"):
            pins[p + lin + ".weight"] = "S(1)"
            pins[p + lin + ".bias"] = "R"
    return pins
