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
    case at::kFloat: return ScalarKind::kFloat32;
    case at::kHalf: return ScalarKind::kFloat16;
    case at::kBFloat16: return ScalarKind::kBFloat16;
    case at::kDouble: return ScalarKind::kFloat64;
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

}  // namespace tp::kernels
