"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention through SDPA, SwiGLU) with a
preallocated KV cache held in buffers.

`model(tokens)` runs the whole sequence without the cache (training); `model(tokens, start_pos)`
writes this step's keys/values into the cache at `start_pos` and attends over positions
[0, start_pos + len) (prefill, then one-token decode steps). Defaults: TinyLlama-1.1B shape.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class LlamaConfig:
    dim: int = 2048
    n_layers: int = 22
    n_heads: int = 32
    n_kv_heads: int = 4
    ffn_dim: int = 5632
    vocab_size: int = 32000
    max_seq_len: int = 2048
    max_batch: int = 4
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seq_len: int = 128  # length of the example inputs
    # How the KV heads reach the query heads in cached attention, as models write it: "sdpa"
    # (enable_gqa), "repeat_interleave", or "repeat_kv" (transformers: expand + reshape).
    gqa: str = "sdpa"
    # How the cache is written, as models write it: "slice" (cache[:, :, a:b] = k), or at
    # positions "index_copy" (StaticCache's index_copy_) / "index_put" (cache[:, :, pos] = k).
    cache_write: str = "slice"
    # Attention reads "prefix" [0, end) of the cache, or the "whole" cache under a mask over it
    # (StaticCache's way).
    cache_read: str = "prefix"
    sliding_window: int | None = None  # Mistral: keys within the last `window` positions


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(
            x
        ) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.gqa = cfg.gqa
        self.cache_write, self.cache_read = cfg.cache_write, cfg.cache_read
        self.window = cfg.sliding_window
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)
        cache_shape = (cfg.max_batch, cfg.n_kv_heads, cfg.max_seq_len, self.head_dim)
        self.register_buffer("cache_k", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("cache_v", torch.zeros(cache_shape), persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start_pos: int | None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if start_pos is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            end = start_pos + s
            if self.cache_write == "slice":
                self.cache_k[:b, :, start_pos:end] = k
                self.cache_v[:b, :, start_pos:end] = v
            else:
                pos = torch.arange(start_pos, end, device=x.device)
                if self.cache_write == "index_copy":
                    self.cache_k[:b].index_copy_(2, pos, k)
                    self.cache_v[:b].index_copy_(2, pos, v)
                else:
                    self.cache_k[:b, :, pos] = k
                    self.cache_v[:b, :, pos] = v
            n = end if self.cache_read == "prefix" else self.cache_k.shape[2]
            keys, values = self.cache_k[:b, :, :n], self.cache_v[:b, :, :n]
            if self.cache_read == "whole":
                keys, values = self.cache_k[:b], self.cache_v[:b]
            mask = self._mask(s, n, start_pos, attention_mask, x)
            keys, values = self._expand(keys), self._expand(values)
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, enable_gqa=self.gqa == "sdpa"
            )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def _mask(
        self,
        s: int,
        n: int,
        start_pos: int,
        attention_mask: torch.Tensor | None,
        x: torch.Tensor,
    ) -> torch.Tensor:
        """Query i sits at position start_pos + i and sees keys up to it (a bool tril); with a
        window only the last `window` of them, with a padding mask ([b, >= n], 1 = token) not
        the padding: then additive, HF's way (the dtype's minimum, so no row is all -inf)."""
        causal = torch.ones(s, n, dtype=torch.bool, device=x.device).tril(diagonal=start_pos)
        if self.window is None and attention_mask is None:
            return causal
        if self.window is not None:
            recent = torch.ones(s, n, dtype=torch.bool, device=x.device)
            causal = causal & recent.triu(diagonal=start_pos - self.window + 1)
        allowed = causal[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask[: x.shape[0], None, None, :n].bool()
        zeros = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        return zeros.masked_fill(~allowed, torch.finfo(x.dtype).min)

    def _expand(self, kv: torch.Tensor) -> torch.Tensor:
        """[b, kv_heads, s, d] -> [b, heads, s, d] the way cfg.gqa says (sdpa: unexpanded)."""
        rep = self.n_heads // self.n_kv_heads
        if self.gqa == "repeat_interleave":
            return kv.repeat_interleave(rep, dim=1)
        if self.gqa == "repeat_kv":
            b, h, s, d = kv.shape
            return kv[:, :, None, :, :].expand(b, h, rep, s, d).reshape(b, h * rep, s, d)
        return kv


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        start_pos: int | None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, start_pos, attention_mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.vocab_size, self.seq_len = cfg.vocab_size, cfg.seq_len
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        head_dim = cfg.dim // cfg.n_heads
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(cfg.max_seq_len).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)

    def forward(
        self,
        tokens: torch.Tensor,
        start_pos: int | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """attention_mask: (decoding only) [batch, >= start_pos + s], 1 for tokens, 0 for
        padding, as HF passes it."""
        s = tokens.shape[1]
        first = 0 if start_pos is None else start_pos
        if first + s > self.config.max_seq_len:
            raise ValueError(
                f"sequence end {first + s} exceeds the cache capacity max_seq_len="
                f"{self.config.max_seq_len}; build the model with a larger max_seq_len"
            )
        cos, sin = self.rope_cos[first : first + s], self.rope_sin[first : first + s]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, start_pos, attention_mask)
        return self.output(self.norm(h))


def build_llama(small: bool = False, **kw: object) -> Llama:
    cfg = (
        LlamaConfig(
            dim=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            ffn_dim=128,
            vocab_size=1000,
            max_seq_len=64,
            max_batch=4,
            seq_len=16,
        )
        if small
        else LlamaConfig()
    )
    cfg = dataclasses.replace(cfg, **kw)
    return Llama(cfg)


def llama_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor]:
    return (torch.randint(0, model.vocab_size, (batch, model.seq_len)),)
