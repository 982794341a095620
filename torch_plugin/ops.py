"""Python side of torch.ops.torch_plugin.*: fake kernels (for tracing) and autograd formulas.

The schemas and CPU/CUDA kernels are registered in C++ (kernels/ops.cpp).
"""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  (loads the library that defines the ops)


@torch.library.register_fake("torch_plugin::bias_gelu")
def _bias_gelu_fake(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1], lambda: "bias must match x[-1]")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("torch_plugin::bias_gelu_backward")
def _bias_gelu_backward_fake(
    grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _bias_gelu_setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    x, bias, approximate = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate = approximate


def _bias_gelu_backward(ctx, grad: torch.Tensor):  # type: ignore[no-untyped-def]
    x, bias = ctx.saved_tensors
    grad_pre = torch.ops.torch_plugin.bias_gelu_backward(
        grad.contiguous(), x, bias, ctx.approximate
    )
    grad_bias = grad_pre.reshape(-1, grad_pre.shape[-1]).sum(0) if bias.requires_grad else None
    return grad_pre, grad_bias, None


torch.library.register_autograd(
    "torch_plugin::bias_gelu", _bias_gelu_backward, setup_context=_bias_gelu_setup_context
)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias) in one pass; bias is 1-D over x's last dimension."""
    return torch.ops.torch_plugin.bias_gelu(x, bias, approximate)


@torch.library.register_fake("torch_plugin::split_kv_attention")
def _split_kv_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    num_splits: int,
    scale: float = 0.0,
    starts: torch.Tensor | None = None,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, d = q.shape
    out = q.new_empty((b, h, num_splits, d), dtype=torch.float32)
    return out, q.new_empty((b, h, num_splits), dtype=torch.float32)


@torch.library.register_fake("torch_plugin::merge_attention_partials")
def _merge_attention_partials_fake(
    out: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return out.new_empty((*out.shape[:-2], out.shape[-1])), lse.new_empty(lse.shape[:-1])


@torch.library.register_fake("torch_plugin::decode_attention")
def _decode_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    num_splits: int = 0,
    scale: float = 0.0,
    starts: torch.Tensor | None = None,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def default_num_splits(
    device: torch.device, batch: int, kv_heads: int, length: int, sms: int | None = None
) -> int:
    """Split-KV chunks per (sequence, KV head) for a cache of `length` entries. CPU: up to 8
    chunks of at least 512 entries (one task per chunk over a few cores). CUDA: about 8 blocks
    (one per sequence x KV head x chunk) per multiprocessor, chunks of at least 1024 entries.
    On an H200 (132 SMs; Llama-3-8B heads, bf16; benchmarks/results/gpu_kernels.json) the best
    measured counts were 32 at batch 1 x 32K, 32 at 4 x 32K, 16 at 8 x 32K and 64-128 at
    1 x 128K; this picks 32, 32, 17 and 128 (8 x 4K: 4, not measured; 8 and 16 tied there)."""
    if device.type != "cuda":
        return max(1, min(8, length // 512))
    if sms is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-8 * sms // max(1, batch * kv_heads))
    return max(1, min(want, length // 1024))


def split_kv_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    num_splits: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention of one query token per sequence over a KV cache, FlashDecoding-style.

    q [B, Hq, D]; caches [B, Hkv, S, D] (GQA when Hq > Hkv); lengths [B] valid entries. The
    cache is split into `num_splits` chunks whose partial results are merged exactly; across
    ranks, gather (out, lse) partials and call `merge_attention_partials` the same way.
    Returns [B, Hq, D] in q's dtype. num_splits: None picks `default_num_splits` on the CPU
    and the count that fills the device once on CUDA.
    """
    if q.device.type == "cuda":
        # One launch: the tensor-core kernel picks its split count from the device and merges
        # the splits itself (kernels/cuda/decode_attention.cu) where it applies.
        out, _ = torch.ops.torch_plugin.decode_attention(
            q, k_cache, v_cache, lengths, num_splits or 0, 0.0 if scale is None else scale
        )
        return out
    merged, _ = decode_partials(
        q, k_cache, v_cache, lengths, num_splits, 0.0 if scale is None else scale
    )
    return merged.to(q.dtype)


def decode_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    num_splits: int | None,
    scale: float,
    starts: torch.Tensor | None = None,
    softcap: float = 0.0,
    length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's (or process's) merged decode attention as a partial for a further merge:
    out [B, Hq, D] float32 and lse [B, Hq]. CUDA: the tensor-core kernel with its split merge
    fused (one launch, no host sync); CPU: split kernel then merge, `length` (the attended
    entries, default the cache's) sizing the default split count."""
    if q.device.type == "cuda":
        out, lse = torch.ops.torch_plugin.decode_attention(
            q, k_cache, v_cache, lengths, num_splits or 0, scale, starts, softcap
        )
        return out.float(), lse
    if num_splits is None:
        n = k_cache.shape[2] if length is None else length
        num_splits = default_num_splits(q.device, q.shape[0], k_cache.shape[1], n)
    out, lse = torch.ops.torch_plugin.split_kv_attention(
        q, k_cache, v_cache, lengths, num_splits, scale, starts, softcap
    )
    return torch.ops.torch_plugin.merge_attention_partials(out, lse)


# Inference kernels of the placement pass's "fused" backend (kernels/cpu/fused_inference.cc).
@torch.library.register_fake("torch_plugin::linear_act")
def _linear_act_fake(
    x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor, act: str
) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight_t.shape[1]))


@torch.library.register_fake("torch_plugin::add_layer_norm_stats")
def _add_layer_norm_stats_fake(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # Without a residual the kernel's sum is empty (it would be x itself).
    stat = (*x.shape[:-1], 1)
    return (
        torch.empty_like(x) if residual is not None else x.new_empty((0,)),
        torch.empty_like(x),
        x.new_empty(stat),
        x.new_empty(stat),
    )


@torch.library.register_fake("torch_plugin::add_layer_norm")
def _add_layer_norm_fake(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    total, out, _, _ = _add_layer_norm_stats_fake(x, residual, weight, bias, eps)
    return total, out


@torch.library.register_fake("torch_plugin::scaled_masked_softmax")
def _scaled_masked_softmax_fake(
    scores: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> torch.Tensor:
    return torch.empty_like(scores)


@torch.library.register_fake("torch_plugin::attention")
def _attention_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The kernel's layouts: out as the query's when the widths agree, lse stored [B, Sq, H].
    b, h, sq, d = query.shape
    out = torch.empty_like(query) if value.shape[-1] == d else None
    if out is None or out.stride(-1) != 1:
        out = query.new_empty((b, h, sq, value.shape[-1]))
    return out, query.new_empty((b, sq, h)).transpose(1, 2)


@torch.library.register_fake("torch_plugin::compare_outputs")
def _compare_outputs_fake(
    got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float
) -> torch.Tensor:
    return got.new_empty((4,), dtype=torch.float64)


@torch.library.register_fake("torch_plugin::split_bf16x3_weight")
def _split_bf16x3_weight_fake(weight: torch.Tensor) -> torch.Tensor:
    return weight.new_empty((weight.shape[0], 2 * weight.shape[1]), dtype=torch.bfloat16)


@torch.library.register_fake("torch_plugin::linear_bf16x3")
def _linear_bf16x3_fake(
    x: torch.Tensor, weight3: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight3.shape[0]))
