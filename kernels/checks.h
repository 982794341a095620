// Input validation shared by the CPU and CUDA registrations: a clear error, never a crash.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "params.h"

namespace tp::kernels {

inline GeluApprox ParseApprox(c10::string_view approximate) {
  if (approximate == "none") return GeluApprox::kNone;
  if (approximate == "tanh") return GeluApprox::kTanh;
  TORCH_CHECK(false, "torch_plugin::bias_gelu: approximate must be 'none' or 'tanh', got '",
              std::string(approximate), "'");
}

inline ScalarKind KindOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ScalarKind::kFloat32;
    case at::kHalf:
      return ScalarKind::kFloat16;
    case at::kBFloat16:
      return ScalarKind::kBFloat16;
    case at::kDouble:
      return ScalarKind::kFloat64;
    default:
      TORCH_CHECK(false, "torch_plugin::bias_gelu: dtype ", t.scalar_type(),
                  " is not supported (use float32, float16, bfloat16 or float64)");
  }
}

inline void CheckBiasGelu(const char* op, const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), op,
              ": bias must be 1-D with size x.size(-1) = ", x.size(-1), ", got shape ",
              bias.sizes());
  TORCH_CHECK(x.scalar_type() == bias.scalar_type(), op, ": x and bias must share a dtype, got ",
              x.scalar_type(), " and ", bias.scalar_type());
  TORCH_CHECK(x.device() == bias.device(), op, ": x and bias must be on the same device, got ",
              x.device(), " and ", bias.device());
  KindOf(x);
}

// Split-KV decode attention inputs (CPU and CUDA): shapes, GQA ratio, dtypes, lengths' type.
inline void CheckSplitKv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& lengths, int64_t num_splits) {
  constexpr const char* op = "torch_plugin::split_kv_attention";
  TORCH_CHECK(q.dim() == 3, op, ": q must be [batch, heads, head_dim], got shape ", q.sizes());
  TORCH_CHECK(k.dim() == 4 && v.dim() == 4, op,
              ": k and v must be [batch, kv_heads, seq, head_dim], got ", k.sizes(), " and ",
              v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), op, ": k and v shapes differ: ", k.sizes(), " vs ",
              v.sizes());
  TORCH_CHECK(k.size(0) == q.size(0), op, ": batch of q (", q.size(0), ") and k (", k.size(0),
              ") differ");
  TORCH_CHECK(k.size(3) == q.size(2), op, ": head_dim of q (", q.size(2), ") and k (", k.size(3),
              ") differ");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, op, ": query heads (", q.size(1),
              ") must be a multiple of kv heads (", k.size(1), ")");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), op,
              ": q, k, v must share a dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  const auto st = q.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, op, ": dtype ", st,
              " is not supported (use float32, float16 or bfloat16)");
  TORCH_CHECK(q.device() == k.device() && k.device() == v.device(), op,
              ": q, k, v must be on one device, got ", q.device(), ", ", k.device(), ", ",
              v.device());
  TORCH_CHECK(
      lengths.dim() == 1 && lengths.size(0) == q.size(0) && lengths.scalar_type() == at::kLong, op,
      ": lengths must be int64 of shape [batch] = [", q.size(0), "], got ", lengths.scalar_type(),
      " ", lengths.sizes());
  TORCH_CHECK(num_splits >= 1, op, ": num_splits must be >= 1, got ", num_splits);
}

// Merge inputs: out [..., P, D] and lse [..., P], float32, one device.
inline void CheckMergePartials(const at::Tensor& out, const at::Tensor& lse) {
  constexpr const char* op = "torch_plugin::merge_attention_partials";
  TORCH_CHECK(out.dim() >= 2 && lse.dim() == out.dim() - 1, op,
              ": out must be [..., P, D] and lse [..., P], got ", out.sizes(), " and ",
              lse.sizes());
  TORCH_CHECK(out.sizes().slice(0, out.dim() - 1) == lse.sizes(), op, ": out's leading shape ",
              out.sizes(), " does not match lse ", lse.sizes());
  TORCH_CHECK(out.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat, op,
              ": partials must be float32, got ", out.scalar_type(), " and ", lse.scalar_type());
  TORCH_CHECK(out.device() == lse.device(), op, ": out and lse must be on one device");
}

}  // namespace tp::kernels
