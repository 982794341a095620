"""Helix-style decoding for `transformers` decoders (issue 28, item 5): attention over the KV
cache split by sequence (as `hf_cache_parallel` does), the output projection and the MLP
tensor-parallel over the same ranks, one all-to-all between them.

    cp = torch_plugin.cache_parallel(hf_model, mesh, helix=True)
    tokens = cp.generate(**prompt, max_new_tokens=32)

Per decoder layer and decode step:
  1. every rank projects q, k, v for all heads (those weights stay whole) and attends over its
     own blocks of the cache: a partial output and log-sum-exp per query head;
  2. one all-to-all: rank r receives every rank's partials for its group of heads
     (H / world of them) and merges them, where plain cache parallelism all-gathers all heads'
     partials and merges all of them on every rank (world times the data, replicated work);
  3. `o_proj` row-parallel on that head group, `gate_proj`/`up_proj` column-parallel,
     `down_proj` row-parallel: each rank holds 1/world of these weights and each ends in one
     all-reduce (Megatron's), where plain cache parallelism keeps every weight on every rank.

The model's o_proj and MLP projections are replaced by this rank's slices (the full weights
are released): the model given is taken over, as `parallelize` takes over the model it shards.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .collectives import Collectives


class ColumnSlice(nn.Module):
    """This rank's output features of a Linear: y_r = x W_r^T + b_r (no communication).
    parts > 1: the outputs are that many stacked projections (Phi-3's gate_up_proj), each split
    alike, so the model's own chunk(parts) of y_r gives this rank's slice of each."""

    def __init__(self, linear: nn.Linear, world: int, rank: int, parts: int = 1) -> None:
        super().__init__()
        n = linear.out_features // (world * parts)

        def mine(t: torch.Tensor) -> torch.Tensor:
            blocks = t.detach().chunk(parts, dim=0)
            return torch.cat([b[rank * n : (rank + 1) * n] for b in blocks]).clone()

        self.in_features, self.out_features = linear.in_features, n * parts
        self.weight = nn.Parameter(mine(linear.weight))
        self.bias = None if linear.bias is None else nn.Parameter(mine(linear.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowSlice(nn.Module):
    """This rank's input features of a Linear, the partial products summed over the ranks:
    y = all_reduce(x_r W_r^T) + b. `x` is either this rank's features (a column-parallel
    producer, or the head group Helix's all-to-all left here) or all of them (the prompt's
    attention, computed whole on every rank), of which it takes its own."""

    def __init__(self, linear: nn.Linear, comm: Collectives) -> None:
        super().__init__()
        world, rank = comm.world, comm.rank
        n = linear.in_features // world
        self.full_in, self.in_features, self.out_features = (
            linear.in_features,
            n,
            linear.out_features,
        )
        self.start = rank * n
        self.comm = comm
        self.weight = nn.Parameter(linear.weight.detach()[:, rank * n : (rank + 1) * n].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == self.full_in and self.full_in != self.in_features:
            x = x[..., self.start : self.start + self.in_features]
        y = self.comm.all_reduce(F.linear(x, self.weight), "helix_row")
        return y if self.bias is None else y + self.bias


def _is_linear(m: Any) -> bool:
    return isinstance(m, nn.Linear)


def shard_helix(model: nn.Module, comm: Collectives) -> dict[str, int]:
    """Replaces every attention's o_proj and every gated MLP's projections by this rank's
    slices. Returns what it replaced; a model without them, or whose sizes do not divide over
    the ranks, is refused naming the module and what to change."""
    name = type(model).__name__
    world = comm.world
    attention, mlps = [], []
    for path, m in model.named_modules():
        if hasattr(m, "layer_idx") and _is_linear(getattr(m, "o_proj", None)):
            attention.append((path, m))
        if _is_linear(getattr(m, "down_proj", None)) and (
            _is_linear(getattr(m, "gate_up_proj", None))
            or all(_is_linear(getattr(m, p, None)) for p in ("gate_proj", "up_proj"))
        ):
            mlps.append((path, m))
    text = (
        model.config.get_text_config(decoder=True)
        if hasattr(model.config, "get_text_config")
        else model.config
    )
    layers = getattr(text, "num_hidden_layers", None)
    if (
        not attention
        or not mlps
        or (layers is not None and (len(attention), len(mlps)) != (layers, layers))
    ):
        raise NotImplementedError(
            f"torch_plugin cache_parallel(helix=True): {name} has {len(attention)} attention "
            f"modules with an `o_proj` and {len(mlps)} MLPs with gate_proj/up_proj (or "
            f"gate_up_proj) and down_proj for "
            f"{layers} layers; Helix splits Llama-style layers (Llama, Mistral, Qwen2/3, Gemma, "
            "Granite, OLMo, Phi-3, ...); MoE experts are not split. Use "
            "cache_parallel(model, mesh) without helix for this model"
        )
    heads = getattr(text, "num_attention_heads", None)
    if heads is None or heads % world:
        raise ValueError(
            f"torch_plugin cache_parallel(helix=True): {name} has {heads} query heads, which do "
            f"not split over {world} ranks; use a world size dividing {heads}, or helix=False"
        )
    for path, m in attention:
        if m.o_proj.in_features % world:
            raise ValueError(
                f"torch_plugin cache_parallel(helix=True): {path}.o_proj takes "
                f"{m.o_proj.in_features} features, which do not split over {world} ranks"
            )
        m.o_proj = RowSlice(m.o_proj, comm)
    for path, m in mlps:
        inner = m.down_proj.in_features
        fused = _is_linear(getattr(m, "gate_up_proj", None))
        outs = (
            [m.gate_up_proj.out_features // 2]
            if fused
            else [m.gate_proj.out_features, m.up_proj.out_features]
        )
        if inner % world or any(o != inner for o in outs):
            raise ValueError(
                f"torch_plugin cache_parallel(helix=True): {path}'s intermediate size {inner} "
                f"does not split over {world} ranks; use a world size dividing it, or helix=False"
            )
        if fused:  # [gate; up] stacked: each half split alike
            m.gate_up_proj = ColumnSlice(m.gate_up_proj, world, comm.rank, parts=2)
        else:
            m.gate_proj = ColumnSlice(m.gate_proj, world, comm.rank)
            m.up_proj = ColumnSlice(m.up_proj, world, comm.rank)
        m.down_proj = RowSlice(m.down_proj, comm)
    return {"attention": len(attention), "mlp": len(mlps), "heads_per_rank": heads // world}


def merge_head_group(comm: Collectives, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Helix's all-to-all: every rank's partials (out [B, H, q, D], lse [B, H, q], float32) for
    this rank's H / world heads, merged: [B, H / world, q, D]."""
    b, h, q, d = out.shape
    w = comm.world
    g = h // w
    packed = torch.cat([out, lse.unsqueeze(-1)], dim=-1)  # [B, H, q, D + 1]
    packed = packed.view(b, w, g, q, d + 1).transpose(0, 1).reshape(w * b, g, q, d + 1)
    got = comm.all_to_all(packed, "helix_partials")  # [w (source), B, g, q, D + 1]
    outs = got[..., :d].movedim(0, -2).contiguous()  # [B, g, q, w, D]
    lses = got[..., d].movedim(0, -1).contiguous()  # [B, g, q, w]
    merged, _ = torch.ops.torch_plugin.merge_attention_partials(outs, lses)
    return merged
