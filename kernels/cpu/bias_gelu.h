// CPU twin of the fused bias + GeLU kernel (the tested reference for the CUDA one).
#pragma once

#include <ATen/ATen.h>

namespace tp::kernels {

at::Tensor BiasGeluCpu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate);
at::Tensor BiasGeluBackwardCpu(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias,
                               c10::string_view approximate);

}  // namespace tp::kernels
