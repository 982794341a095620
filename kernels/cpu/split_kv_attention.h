// Split-KV decode attention (FlashDecoding) and the merge of its partial results, CPU twins of
// the CUDA kernels that cache parallelism needs (issue 7).
//
// One query token per sequence attends to a KV cache split along the sequence into
// `num_splits` chunks; each chunk yields a normalised partial output and the log-sum-exp of
// its scores. Merging partials (from splits, or from ranks that each hold a slice of the cache)
// weights them by exp(lse - max lse): exact softmax attention, in any grouping.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace tp::kernels {

// q [B, Hq, D]; k, v [B, Hkv, S, D] with Hq % Hkv == 0 (GQA); lengths [B] int64, valid cache
// entries per sequence (<= S); starts [B] int64 (optional, default 0): entries before it are
// not attended (left padding, keys out of a sliding window). softcap > 0 caps each scaled score
// s as softcap * tanh(s / softcap) (Gemma-2). Returns out [B, Hq, P, D] and lse [B, Hq, P],
// float32; an empty split has out 0 and lse -inf.
std::tuple<at::Tensor, at::Tensor> SplitKvAttentionCpu(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v,
                                                       const at::Tensor& lengths,
                                                       int64_t num_splits, double scale,
                                                       const std::optional<at::Tensor>& starts,
                                                       double softcap);

// out [..., P, D], lse [..., P] (float32) -> merged out [..., D] and lse [...].
std::tuple<at::Tensor, at::Tensor> MergeAttentionPartialsCpu(const at::Tensor& out,
                                                             const at::Tensor& lse);

// Both steps in one call: out [B, Hq, D] in q's dtype and lse [B, Hq] (float32). num_splits 0
// picks up to 8 chunks of at least 512 entries. The CUDA twin fuses the merge into the kernel.
std::tuple<at::Tensor, at::Tensor> DecodeAttentionCpu(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v,
                                                      const at::Tensor& lengths,
                                                      int64_t num_splits, double scale,
                                                      const std::optional<at::Tensor>& starts,
                                                      double softcap);

}  // namespace tp::kernels
