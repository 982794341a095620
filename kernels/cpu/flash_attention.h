// Prefill attention for the placement pass's "fused" backend: softmax(q k^T * scale + mask) v
// in one pass over key blocks (FlashAttention's online softmax), never materialising the
// [Sq, Sk] score matrix of a head. Same contract as ATen's
// _scaled_dot_product_flash_attention_for_cpu, which the "attention" rule replaces.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace tp::kernels {

// q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (H % Hkv == 0: grouped-query heads
// share a KV head), float32, any strides with unit stride along the last dim (others are
// copied). attn_mask: additive float32, broadcastable to [B, H, Sq, Sk]. is_causal: key j is
// seen by query i only if j <= i (top-left aligned, as ATen). scale: default 1/sqrt(D).
// Returns out [B, H, Sq, Dv] (laid out as q when Dv == D) and logsumexp [B, H, Sq] (stored as
// [B, Sq, H], as ATen's). A row that sees no key gets out 0 and logsumexp 0, as ATen's.
std::tuple<at::Tensor, at::Tensor> FlashAttentionCpu(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v,
                                                     const std::optional<at::Tensor>& attn_mask,
                                                     bool is_causal, std::optional<double> scale);

}  // namespace tp::kernels
