"""GraphPipe's multi-branch models (thesis section 3.10.3): MMT, DLRM and CANDLE-Uno.

Defaults are the thesis's shapes; `small=True` keeps the branch topology at test size.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def feed_forward(dims: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


class TransformerLayer(nn.Module):
    """Pre-norm transformer encoder layer: attention through SDPA, GELU MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (
            self.qkv(self.ln1(x))
            .view(b, s, 3, self.heads, h // self.heads)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class MultiModalTransformer(nn.Module):
    """Parallel transformer branches (one per modality), concatenated at the end."""

    def __init__(
        self,
        branches: int = 4,
        layers_per_branch: int = 8,
        hidden: int = 1024,
        heads: int = 16,
        ffn: int = 4096,
        seq_len: int = 256,
        num_classes: int = 1000,
    ):
        super().__init__()
        self.seq_len, self.hidden, self.num_branches = seq_len, hidden, branches
        self.branches = nn.ModuleList(
            nn.Sequential(*(TransformerLayer(hidden, heads, ffn) for _ in range(layers_per_branch)))
            for _ in range(branches)
        )
        self.head = nn.Linear(branches * hidden, num_classes)

    def forward(self, *modalities: torch.Tensor) -> torch.Tensor:
        pooled = [
            branch(x).mean(dim=1) for branch, x in zip(self.branches, modalities, strict=True)
        ]
        return self.head(torch.cat(pooled, dim=-1))


def build_mmt(small: bool = False, **kw: object) -> MultiModalTransformer:
    cfg = (
        dict(layers_per_branch=2, hidden=32, heads=4, ffn=64, seq_len=8, num_classes=10)
        if small
        else {}
    )
    cfg.update(kw)
    return MultiModalTransformer(**cfg)  # type: ignore[arg-type]


def mmt_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(batch, model.seq_len, model.hidden) for _ in range(model.num_branches))


class DLRM(nn.Module):
    """Dense branches (feed-forward) and sparse branches (embedding bags, embeddings of a bag
    concatenated), concatenated and post-processed by a top feed-forward stack."""

    def __init__(
        self,
        dense_branches: int = 7,
        sparse_branches: int = 7,
        dense_in: int = 4096,
        hidden: int = 4096,
        layers_per_branch: int = 4,
        embedding_dim: int = 64,
        bag_size: int = 100,
        num_embeddings: int = 1_000_000,
        top_layers: int = 4,
    ):
        super().__init__()
        self.dense_in, self.bag_size, self.num_embeddings = dense_in, bag_size, num_embeddings
        self.num_dense, self.num_sparse = dense_branches, sparse_branches
        self.dense = nn.ModuleList(
            feed_forward([dense_in] + [hidden] * layers_per_branch) for _ in range(dense_branches)
        )
        self.sparse = nn.ModuleList(
            nn.Embedding(num_embeddings, embedding_dim) for _ in range(sparse_branches)
        )
        interaction = dense_branches * hidden + sparse_branches * bag_size * embedding_dim
        self.top = feed_forward([interaction] + [hidden] * top_layers)
        self.out = nn.Linear(hidden, 1)

    def forward(self, dense: list[torch.Tensor], sparse: list[torch.Tensor]) -> torch.Tensor:
        feats = [f(x) for f, x in zip(self.dense, dense, strict=True)]
        feats += [emb(idx).flatten(1) for emb, idx in zip(self.sparse, sparse, strict=True)]
        return self.out(self.top(torch.cat(feats, dim=1)))


def build_dlrm(small: bool = False, **kw: object) -> DLRM:
    cfg = (
        dict(dense_in=16, hidden=32, embedding_dim=8, bag_size=4, num_embeddings=100)
        if small
        else {}
    )
    cfg.update(kw)
    return DLRM(**cfg)  # type: ignore[arg-type]


def dlrm_inputs(model: nn.Module, batch: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    dense = [torch.randn(batch, model.dense_in) for _ in range(model.num_dense)]
    sparse = [
        torch.randint(0, model.num_embeddings, (batch, model.bag_size))
        for _ in range(model.num_sparse)
    ]
    return (dense, sparse)


class CandleUno(nn.Module):
    """Seven feature branches of feed-forward layers, concatenated, then a top stack -> 1."""

    def __init__(
        self,
        branches: int = 7,
        feature_dim: int = 4096,
        hidden: int = 4096,
        layers_per_branch: int = 4,
        top_layers: int = 4,
    ):
        super().__init__()
        self.feature_dim, self.num_branches = feature_dim, branches
        self.branches = nn.ModuleList(
            feed_forward([feature_dim] + [hidden] * layers_per_branch) for _ in range(branches)
        )
        self.top = feed_forward([branches * hidden] + [hidden] * top_layers)
        self.out = nn.Linear(hidden, 1)

    def forward(self, *features: torch.Tensor) -> torch.Tensor:
        h = torch.cat([b(x) for b, x in zip(self.branches, features, strict=True)], dim=1)
        return self.out(self.top(h))


def build_candle_uno(small: bool = False, **kw: object) -> CandleUno:
    cfg = dict(feature_dim=16, hidden=32) if small else {}
    cfg.update(kw)
    return CandleUno(**cfg)  # type: ignore[arg-type]


def candle_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(batch, model.feature_dim) for _ in range(model.num_branches))
