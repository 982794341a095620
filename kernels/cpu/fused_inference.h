// Fused CPU kernels the placement pass can choose for groups of inference graphs and of training
// graphs' forwards (the "fused" backend): each removes intermediate tensors and memory passes
// that the op-by-op ATen graph pays.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace tp::kernels {

// act(x @ weight_t + bias) for a 2-D x: row blocks are multiplied (BLAS) and their activation
// applied while the block is still in cache; no second [M, N] buffer. act: gelu, gelu_tanh,
// relu, tanh, silu.
at::Tensor LinearActCpu(const at::Tensor& x, const at::Tensor& weight_t, const at::Tensor& bias,
                        c10::string_view act);

// (x + residual, layer_norm(x + residual)) over the last dim in one pass per row; without a
// residual the first output is empty (it would be x itself).
std::tuple<at::Tensor, at::Tensor> AddLayerNormCpu(const at::Tensor& x,
                                                   const std::optional<at::Tensor>& residual,
                                                   const at::Tensor& weight, const at::Tensor& bias,
                                                   double eps);

// The same, also returning the per-row mean and 1/std (shaped like ATen's native_layer_norm
// statistics: x's shape with the last dim 1) that a training graph saves for the backward.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> AddLayerNormStatsCpu(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    const at::Tensor& bias, double eps);

// softmax(scores * scale + mask) over the last dim, mask broadcast to scores (may be absent).
at::Tensor ScaledMaskedSoftmaxCpu(const at::Tensor& scores, double scale,
                                  const std::optional<at::Tensor>& mask);

}  // namespace tp::kernels
