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
  3. the attention's output projection (o_proj, out_proj, dense or c_proj) row-parallel on
     that head group, the MLP's up projections (gate/up, gate_up, c_fc, fc_in, dense_h_to_4h,
     fc1) column-parallel and its down projection row-parallel: each rank holds 1/world of
     these weights, and the two row-parallel ones end in one all-reduce each (Megatron's),
     where plain cache parallelism keeps every weight on every rank. MoE experts (3-D
     gate_up_proj / down_proj: Mixtral, Qwen3-MoE, OLMoE) split the same way inside every
     expert, the router whole, one all-reduce after the experts.

The model's projections are replaced by this rank's slices (the full weights are released):
the model given is taken over, as `parallelize` takes over the model it shards.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runtime.collectives import Collectives
from ..runtime.spmd_ops import _block


def _weights(proj: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [out, in], bias) of an nn.Linear or of transformers' Conv1D (GPT-2's, whose
    weight is stored [in, out])."""
    w = proj.weight.detach()
    return (w if isinstance(proj, nn.Linear) else w.t()), proj.bias


def is_conv1d(m: Any) -> bool:
    """transformers' Conv1D (GPT-2's projections): a linear layer with its weight [in, out]."""
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and hasattr(m, "nx")


def _is_proj(m: Any) -> bool:
    return isinstance(m, nn.Linear) or is_conv1d(m)


def _stacked(name: str) -> int:
    """How many projections a weight stacks along its outputs (Phi-3's gate_up_proj: two)."""
    return 2 if name == "gate_up_proj" else 1


def _features(proj: nn.Module) -> tuple[int, int]:
    w, _ = _weights(proj)
    return int(w.shape[1]), int(w.shape[0])  # in, out


class ColumnSlice(nn.Module):
    """This rank's output features of a Linear: y_r = x W_r^T + b_r (no communication).
    parts > 1: the outputs are that many stacked projections (Phi-3's gate_up_proj), each split
    alike, so the model's own chunk(parts) of y_r gives this rank's slice of each."""

    def __init__(self, proj: nn.Module, world: int, rank: int, parts: int = 1) -> None:
        super().__init__()
        weight, bias = _weights(proj)
        self.weight = nn.Parameter(_block(weight, 0, parts, world, rank).clone())
        self.bias = (
            None
            if bias is None
            else nn.Parameter(_block(bias.detach(), 0, parts, world, rank).clone())
        )
        self.out_features, self.in_features = self.weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowSlice(nn.Module):
    """This rank's input features of a Linear, the partial products summed over the ranks:
    y = all_reduce(x_r W_r^T) + b. `x` is either this rank's features (a column-parallel
    producer, or the head group Helix's all-to-all left here) or all of them (the prompt's
    attention, computed whole on every rank), of which it takes its own."""

    def __init__(self, proj: nn.Module, comm: Collectives) -> None:
        super().__init__()
        weight, bias = _weights(proj)
        self.comm = comm
        self.weight = nn.Parameter(_block(weight, 1, 1, comm.world, comm.rank).clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.out_features, self.in_features = self.weight.shape
        self.full_in = weight.shape[1]
        self.start = comm.rank * self.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == self.full_in and self.full_in != self.in_features:
            x = x[..., self.start : self.start + self.in_features]
        y = self.comm.all_reduce(F.linear(x, self.weight), "helix_row")
        return y if self.bias is None else y + self.bias


# An attention's output projection, by the names transformers' decoders give it.
_OUT_PROJ = ("o_proj", "out_proj", "dense", "c_proj")
# An MLP's (up, down) pair when it is not gated: GPT-2 / StarCoder2 / GPT-BigCode, GPT-J /
# CodeGen, GPT-NeoX / BLOOM, OPT / BioGPT (in the decoder layer itself). An elementwise
# activation sits between them, so each rank's slice of `up` feeds its slice of `down`.
_MLP_PAIRS = (
    ("c_fc", "c_proj"),
    ("fc_in", "fc_out"),
    ("dense_h_to_4h", "dense_4h_to_h"),
    ("fc1", "fc2"),
)


def _mlp_kind(m: nn.Module) -> tuple[str, ...] | None:
    """The names of m's MLP projections, ups first and the down last, or None."""
    if _is_proj(getattr(m, "down_proj", None)):
        if _is_proj(getattr(m, "gate_up_proj", None)):
            return ("gate_up_proj", "down_proj")
        if _is_proj(getattr(m, "gate_proj", None)) and _is_proj(getattr(m, "up_proj", None)):
            return ("gate_proj", "up_proj", "down_proj")
    for up, down in _MLP_PAIRS:
        if _is_proj(getattr(m, up, None)) and _is_proj(getattr(m, down, None)):
            return (up, down)
    return None


def _is_experts(m: nn.Module) -> bool:
    """transformers' MoE experts stored as 3-D tensors (Mixtral, Qwen3-MoE, OLMoE):
    gate_up_proj [E, 2I, H] (gate and up stacked) and down_proj [E, H, I], no biases."""
    gate_up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    return (
        isinstance(gate_up, nn.Parameter)
        and isinstance(down, nn.Parameter)
        and gate_up.dim() == 3
        and down.dim() == 3
        and gate_up.shape[0] == down.shape[0]
        and gate_up.shape[1] == 2 * down.shape[2]
        and gate_up.shape[2] == down.shape[1]
        and not any("bias" in n for n, _ in m.named_parameters(recurse=False))
    )


def _split_experts(m: nn.Module, comm: Collectives) -> None:
    """Every expert's MLP tensor-parallel like a dense one: this rank's slice of the
    intermediate features (of gate and of up alike, and the matching inputs of down), the
    experts' output (each expert's partial products, weighted by its router weight and added
    up by token) summed over the ranks. The router stays whole: every rank routes alike."""
    inner = int(m.down_proj.shape[2])
    m.gate_up_proj = nn.Parameter(_block(m.gate_up_proj.detach(), 1, 2, comm.world, comm.rank))
    m.down_proj = nn.Parameter(_block(m.down_proj.detach(), 2, 1, comm.world, comm.rank))
    if hasattr(m, "intermediate_dim"):
        m.intermediate_dim = inner // comm.world

    def reduce(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        return comm.all_reduce(out, "helix_row")

    m.register_forward_hook(reduce)


def shard_helix(model: nn.Module, comm: Collectives) -> dict[str, int]:
    """Replaces every attention's output projection and every MLP's projections by this rank's
    slices. Returns what it replaced; a model without them, or whose sizes do not divide over
    the ranks, is refused naming the module and what to change (nothing is replaced then)."""
    name = type(model).__name__
    world = comm.world
    attention: list[tuple[str, nn.Module, str]] = []
    mlps: list[tuple[str, nn.Module, tuple[str, ...]]] = []
    experts: list[tuple[str, nn.Module]] = []
    for path, m in model.named_modules():
        if hasattr(m, "layer_idx"):
            out = next((n for n in _OUT_PROJ if _is_proj(getattr(m, n, None))), None)
            if out is not None:
                attention.append((path, m, out))
        kind = _mlp_kind(m)
        if kind is not None:
            mlps.append((path, m, kind))
        elif _is_experts(m):
            experts.append((path, m))
    text = (
        model.config.get_text_config(decoder=True)
        if hasattr(model.config, "get_text_config")
        else model.config
    )
    layers = getattr(text, "num_hidden_layers", None)
    ffns = len(mlps) + len(experts)
    counts_match = layers is None or (len(attention), ffns) == (layers, layers)
    if not attention or not ffns or not counts_match:
        raise NotImplementedError(
            f"torch_plugin cache_parallel(helix=True): {name} has {len(attention)} attention "
            f"modules with an output projection ({', '.join(_OUT_PROJ)}), {len(mlps)} dense "
            f"MLPs and {len(experts)} MoE expert sets (3-D gate_up_proj and down_proj) for "
            f"{layers} layers; Helix splits one MLP or expert set per layer. Use "
            "cache_parallel(model, mesh) without helix for this model"
        )
    heads = getattr(text, "num_attention_heads", None)
    if heads is None or heads % world:
        raise ValueError(
            f"torch_plugin cache_parallel(helix=True): {name} has {heads} query heads, which do "
            f"not split over {world} ranks; use a world size dividing {heads}, or helix=False"
        )
    for path, m, out in attention:
        width = _features(getattr(m, out))[0]
        if width % heads:
            raise NotImplementedError(
                f"torch_plugin cache_parallel(helix=True): {path}.{out} takes {width} features, "
                f"not a whole number per each of the {heads} heads; use helix=False"
            )
    for path, m, kind in mlps:
        inner = _features(getattr(m, kind[-1]))[0]
        ups = [_features(getattr(m, n))[1] // _stacked(n) for n in kind[:-1]]
        if inner % world or any(u != inner for u in ups):
            raise ValueError(
                f"torch_plugin cache_parallel(helix=True): {path}'s intermediate size {inner} "
                f"does not split over {world} ranks; use a world size dividing it, or helix=False"
            )
    for path, m in experts:
        inner = int(m.down_proj.shape[2])
        if inner % world:
            raise ValueError(
                f"torch_plugin cache_parallel(helix=True): {path}'s expert intermediate size "
                f"{inner} does not split over {world} ranks; use a world size dividing it, or "
                "helix=False"
            )
    # Checked: replace.
    for _, m, out in attention:
        setattr(m, out, RowSlice(getattr(m, out), comm))
    for _, m, kind in mlps:
        for n in kind[:-1]:  # gate_up_proj: [gate; up] stacked, each half split alike
            setattr(m, n, ColumnSlice(getattr(m, n), world, comm.rank, _stacked(n)))
        setattr(m, kind[-1], RowSlice(getattr(m, kind[-1]), comm))
    for _, m in experts:
        _split_experts(m, comm)
    return {
        "attention": len(attention),
        "mlp": len(mlps),
        "experts": len(experts),
        "heads_per_rank": heads // world,
    }


def merge_head_group(comm: Collectives, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Helix's all-to-all: every rank's partials (out [B, H, q, D], lse [B, H, q], float32) for
    this rank's H / world heads, merged, in [B, H, q, D] (the other heads zero)."""
    b, h, q, d = out.shape
    w = comm.world
    g = h // w
    packed = torch.cat([out, lse.unsqueeze(-1)], dim=-1)  # [B, H, q, D + 1]
    packed = packed.view(b, w, g, q, d + 1).transpose(0, 1).reshape(w * b, g, q, d + 1)
    got = comm.all_to_all(packed, "helix_partials")  # [w (source), B, g, q, D + 1]
    outs = got[..., :d].movedim(0, -2).contiguous()  # [B, g, q, w, D]
    lses = got[..., d].movedim(0, -1).contiguous()  # [B, g, q, w]
    merged, _ = torch.ops.torch_plugin.merge_attention_partials(outs, lses)
    # Every head's slot, this rank's group filled: the model reshapes its attention output as
    # it always does, and the output projection's RowSlice takes this rank's columns.
    full = merged.new_zeros((b, h, q, d))
    full[:, comm.rank * g : (comm.rank + 1) * g] = merged
    return full
