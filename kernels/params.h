// Plain parameter structs shared by the CPU and CUDA kernels: pointers, sizes, flags.
// No torch here, so device code never includes LibTorch (flash-attention's habit).
#pragma once

#include <cstdint>

namespace tp::kernels {

enum class ScalarKind : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };
enum class GeluApprox : int32_t { kNone = 0, kTanh = 1 };

// out[r, c] = gelu(x[r, c] + bias[c]) over a contiguous [rows, cols] view.
struct BiasGeluParams {
  const void* x = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  ScalarKind kind = ScalarKind::kFloat32;
  GeluApprox approx = GeluApprox::kNone;
};

// grad_in[r, c] = grad[r, c] * gelu'(x[r, c] + bias[c]).
struct BiasGeluBackwardParams {
  const void* grad = nullptr;
  const void* x = nullptr;
  const void* bias = nullptr;
  void* grad_in = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  ScalarKind kind = ScalarKind::kFloat32;
  GeluApprox approx = GeluApprox::kNone;
};

}  // namespace tp::kernels
