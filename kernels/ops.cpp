// TORCH_LIBRARY(torch_plugin): schemas of our kernels and their CPU implementations.
// CUDA implementations register from kernels/cuda/ops_cuda.cpp when built with CUDA.
// Fake (meta) kernels and autograd formulas live in torch_plugin/ops.py.
#include <torch/library.h>

#include "cpu/bias_gelu.h"

TORCH_LIBRARY(torch_plugin, m) {
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate=\"none\") -> Tensor");
  m.def(
      "bias_gelu_backward(Tensor grad, Tensor x, Tensor bias, str approximate=\"none\") -> "
      "Tensor");
}

TORCH_LIBRARY_IMPL(torch_plugin, CPU, m) {
  m.impl("bias_gelu", &tp::kernels::BiasGeluCpu);
  m.impl("bias_gelu_backward", &tp::kernels::BiasGeluBackwardCpu);
}
