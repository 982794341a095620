// Fused bias + GeLU on CPU: one pass over memory instead of two (add, then gelu).
//
// Rows are split across threads with at::parallel_for; float rows are vectorised with
// at::vec. Half and bfloat16 compute in float, like ATen's own kernels.
#include "cpu/bias_gelu.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include "checks.h"
#include "gelu_math.h"

namespace tp::kernels {
namespace {

using Vec = at::vec::Vectorized<float>;

// Vectorised float row: out = gelu(x + b).
void ForwardRowFloat(const float* x, const float* b, float* out, int64_t cols, GeluApprox approx) {
  int64_t c = 0;
  const Vec half(0.5f), one(1.0f), inv_sqrt2(0.70710678118654752440f);
  const Vec k_sqrt2_over_pi(0.79788456080286535588f), k_coeff(0.044715f);
  for (; c + Vec::size() <= cols; c += Vec::size()) {
    Vec v = Vec::loadu(x + c) + Vec::loadu(b + c);
    Vec y = approx == GeluApprox::kNone
                ? half * v * (one + (v * inv_sqrt2).erf())
                : half * v * (one + (k_sqrt2_over_pi * (v + k_coeff * v * v * v)).tanh());
    y.store(out + c);
  }
  for (; c < cols; ++c) {
    const float v = x[c] + b[c];
    out[c] = approx == GeluApprox::kNone ? GeluExact(v) : GeluTanh(v);
  }
}

template <class scalar_t>
void Forward(const at::Tensor& x, const at::Tensor& bias, at::Tensor& out, GeluApprox approx) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* bp = bias.const_data_ptr<scalar_t>();
  scalar_t* op = out.mutable_data_ptr<scalar_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if constexpr (std::is_same_v<scalar_t, float>) {
        ForwardRowFloat(xp + r * cols, bp, op + r * cols, cols, approx);
      } else {
        for (int64_t c = 0; c < cols; ++c) {
          const opmath_t v = opmath_t(xp[r * cols + c]) + opmath_t(bp[c]);
          op[r * cols + c] = scalar_t(approx == GeluApprox::kNone ? GeluExact(v) : GeluTanh(v));
        }
      }
    }
  });
}

template <class scalar_t>
void Backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias,
              at::Tensor& grad_in, GeluApprox approx) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const scalar_t* gp = grad.const_data_ptr<scalar_t>();
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* bp = bias.const_data_ptr<scalar_t>();
  scalar_t* out = grad_in.mutable_data_ptr<scalar_t>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = r * cols + c;
        const opmath_t v = opmath_t(xp[i]) + opmath_t(bp[c]);
        const opmath_t d = approx == GeluApprox::kNone ? GeluExactGrad(v) : GeluTanhGrad(v);
        out[i] = scalar_t(opmath_t(gp[i]) * d);
      }
    }
  });
}

}  // namespace

at::Tensor BiasGeluCpu(const at::Tensor& x_in, const at::Tensor& bias_in,
                       c10::string_view approximate) {
  CheckBiasGelu("torch_plugin::bias_gelu", x_in, bias_in);
  const GeluApprox approx = ParseApprox(approximate);
  at::Tensor x = x_in.contiguous();
  at::Tensor bias = bias_in.contiguous();
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_cpu",
                                  [&] { Forward<scalar_t>(x, bias, out, approx); });
  return out;
}

at::Tensor BiasGeluBackwardCpu(const at::Tensor& grad_in_t, const at::Tensor& x_in,
                               const at::Tensor& bias_in, c10::string_view approximate) {
  CheckBiasGelu("torch_plugin::bias_gelu_backward", x_in, bias_in);
  TORCH_CHECK(grad_in_t.sizes() == x_in.sizes(),
              "torch_plugin::bias_gelu_backward: grad must have x's shape ", x_in.sizes(),
              ", got ", grad_in_t.sizes());
  TORCH_CHECK(grad_in_t.scalar_type() == x_in.scalar_type(),
              "torch_plugin::bias_gelu_backward: grad must have x's dtype");
  const GeluApprox approx = ParseApprox(approximate);
  at::Tensor grad = grad_in_t.contiguous();
  at::Tensor x = x_in.contiguous();
  at::Tensor bias = bias_in.contiguous();
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(),
                                  "bias_gelu_backward_cpu",
                                  [&] { Backward<scalar_t>(grad, x, bias, out, approx); });
  return out;
}

}  // namespace tp::kernels
