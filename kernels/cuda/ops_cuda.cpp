// CUDA registrations of torch_plugin ops (built only when torch has CUDA): validate tensors,
// fill the POD params, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../checks.h"
#include "launch.h"

namespace tp::kernels {
namespace {

at::Tensor BiasGeluCuda(const at::Tensor& x_in, const at::Tensor& bias_in,
                        c10::string_view approximate) {
  CheckBiasGelu("torch_plugin::bias_gelu", x_in, bias_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous();
  at::Tensor bias = bias_in.contiguous();
  at::Tensor out = at::empty_like(x);
  BiasGeluParams p;
  p.x = x.const_data_ptr();
  p.bias = bias.const_data_ptr();
  p.out = out.mutable_data_ptr();
  p.cols = x.size(-1);
  p.rows = p.cols == 0 ? 0 : x.numel() / p.cols;
  p.kind = KindOf(x);
  p.approx = ParseApprox(approximate);
  cudaError_t err = LaunchBiasGelu(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "torch_plugin::bias_gelu: CUDA launch failed: ",
              cudaGetErrorString(err));
  return out;
}

at::Tensor BiasGeluBackwardCuda(const at::Tensor& grad_t, const at::Tensor& x_in,
                                const at::Tensor& bias_in, c10::string_view approximate) {
  CheckBiasGelu("torch_plugin::bias_gelu_backward", x_in, bias_in);
  TORCH_CHECK(grad_t.sizes() == x_in.sizes() && grad_t.scalar_type() == x_in.scalar_type(),
              "torch_plugin::bias_gelu_backward: grad must have x's shape and dtype");
  c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor grad = grad_t.contiguous();
  at::Tensor x = x_in.contiguous();
  at::Tensor bias = bias_in.contiguous();
  at::Tensor out = at::empty_like(x);
  BiasGeluBackwardParams p;
  p.grad = grad.const_data_ptr();
  p.x = x.const_data_ptr();
  p.bias = bias.const_data_ptr();
  p.grad_in = out.mutable_data_ptr();
  p.cols = x.size(-1);
  p.rows = p.cols == 0 ? 0 : x.numel() / p.cols;
  p.kind = KindOf(x);
  p.approx = ParseApprox(approximate);
  cudaError_t err = LaunchBiasGeluBackward(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "torch_plugin::bias_gelu_backward: CUDA launch failed: ",
              cudaGetErrorString(err));
  return out;
}

}  // namespace
}  // namespace tp::kernels

TORCH_LIBRARY_IMPL(torch_plugin, CUDA, m) {
  m.impl("bias_gelu", &tp::kernels::BiasGeluCuda);
  m.impl("bias_gelu_backward", &tp::kernels::BiasGeluBackwardCuda);
}
