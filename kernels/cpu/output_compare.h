// A candidate graph's outputs against eager's in one pass (torch_plugin/placement/precision.py).
#pragma once

#include <ATen/ATen.h>

namespace tp::kernels {

// float64 [4]: sum of (got - want)^2, sum of want^2 (both accumulated in double; NaN where
// either holds one), the count of elements torch.allclose(got, want, rtol, atol * max(1, s),
// equal_nan=True) would find apart, and s, the largest finite |want| (0 if none).
at::Tensor CompareOutputsCpu(const at::Tensor& got, const at::Tensor& want, double rtol,
                             double atol);

}  // namespace tp::kernels
