// Inference kernels of the "fused" placement backend. Float32 rows are vectorised with at::vec
// and split across threads with at::parallel_for; other dtypes are refused by the checks (the
// backend's patterns only offer float32 groups).
#include "cpu/fused_inference.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "checks.h"

namespace tp::kernels {
namespace {

using Vec = at::vec::Vectorized<float>;

void ApplyActInPlace(at::Tensor& block, c10::string_view act) {
  if (act == "gelu") {
    at::gelu_(block);
  } else if (act == "gelu_tanh") {
    at::gelu_(block, "tanh");
  } else if (act == "relu") {
    at::relu_(block);
  } else if (act == "tanh") {
    at::tanh_(block);
  } else if (act == "silu") {
    at::silu_(block);
  } else if (act != "none") {
    TORCH_CHECK(false, "torch_plugin::linear_act: unknown activation '", std::string(act),
                "'; use gelu, gelu_tanh, relu, tanh, silu or none");
  }
}

}  // namespace

at::Tensor LinearActCpu(const at::Tensor& x, const at::Tensor& weight_t, const at::Tensor& bias,
                        c10::string_view act) {
  TORCH_CHECK(x.dim() == 2 && weight_t.dim() == 2 && x.size(1) == weight_t.size(0),
              "torch_plugin::linear_act: x ", x.sizes(), " and weight_t ", weight_t.sizes(),
              " do not multiply (x must be [M, K], weight_t [K, N])");
  TORCH_CHECK(bias.dim() <= 1, "torch_plugin::linear_act: bias must be [N] or a scalar");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "torch_plugin::linear_act: float32 only");
  const int64_t m = x.size(0), n = weight_t.size(1);
  // One BLAS call into our buffer, then the activation in place: no second [M, N] tensor.
  // (Row-blocking to keep blocks in cache measured slower: small GEMMs thread badly.)
  at::Tensor out = at::empty({m, n}, x.options());
  at::addmm_out(out, bias, x, weight_t);
  ApplyActInPlace(out, act);
  return out;
}

namespace {

// The row loop of both layer-norm kernels; `mean_out` / `rstd_out` (one float per row) are
// written when not null.
std::tuple<at::Tensor, at::Tensor> AddLayerNormRows(const at::Tensor& x,
                                                    const std::optional<at::Tensor>& residual,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps,
                                                    float* mean_out, float* rstd_out) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "torch_plugin::add_layer_norm: float32 only");
  const int64_t cols = x.size(-1);
  TORCH_CHECK(weight.numel() == cols && bias.numel() == cols,
              "torch_plugin::add_layer_norm: weight and bias must have ", cols, " elements");
  const bool has_res = residual.has_value() && residual->defined();
  at::Tensor xc = x.contiguous();
  at::Tensor rc;
  at::Tensor sum;
  if (has_res) {
    TORCH_CHECK(residual->sizes() == x.sizes(), "torch_plugin::add_layer_norm: residual ",
                residual->sizes(), " must match x ", x.sizes());
    rc = residual->contiguous();
    sum = at::empty_like(xc);
  } else {
    sum = xc;
  }
  at::Tensor out = at::empty_like(xc);
  at::Tensor wc = weight.contiguous(), bc = bias.contiguous();
  const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
  const float* xp = xc.data_ptr<float>();
  const float* rp = has_res ? rc.data_ptr<float>() : nullptr;
  float* sp = sum.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  const float* bp = bc.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * cols;
      float* sr = sp + r * cols;
      const float* row = has_res ? sr : xr;
      // Pass 1: the residual sum (written once) and its total.
      Vec acc(0.0f);
      int64_t c = 0;
      for (; c + Vec::size() <= cols; c += Vec::size()) {
        Vec v = Vec::loadu(xr + c);
        if (has_res) {
          v = v + Vec::loadu(rp + r * cols + c);
          v.store(sr + c);
        }
        acc = acc + v;
      }
      float total = at::vec::vec_reduce_all([](Vec a, Vec b) { return a + b; }, acc);
      for (; c < cols; ++c) {
        const float v = has_res ? (sr[c] = xr[c] + rp[r * cols + c]) : xr[c];
        total += v;
      }
      const float mean = total / cols;
      // Pass 2 (row in L1): the centred variance, numerically stable.
      Vec vacc(0.0f);
      c = 0;
      for (; c + Vec::size() <= cols; c += Vec::size()) {
        const Vec d = Vec::loadu(row + c) - Vec(mean);
        vacc = at::vec::fmadd(d, d, vacc);
      }
      float var = at::vec::vec_reduce_all([](Vec a, Vec b) { return a + b; }, vacc);
      for (; c < cols; ++c) var += (row[c] - mean) * (row[c] - mean);
      const float rstd = 1.0f / std::sqrt(var / cols + feps);
      if (mean_out != nullptr) {
        mean_out[r] = mean;
        rstd_out[r] = rstd;
      }
      // Pass 3: normalise and apply the affine parameters.
      float* orow = op + r * cols;
      c = 0;
      const Vec vmean(mean), vrstd(rstd);
      for (; c + Vec::size() <= cols; c += Vec::size()) {
        const Vec y = (Vec::loadu(row + c) - vmean) * vrstd;
        at::vec::fmadd(y, Vec::loadu(wp + c), Vec::loadu(bp + c)).store(orow + c);
      }
      for (; c < cols; ++c) orow[c] = (row[c] - mean) * rstd * wp[c] + bp[c];
    }
  });
  // Without a residual the sum is x itself; an empty tensor stands in (outputs must not alias
  // inputs).
  return {has_res ? sum : at::empty({0}, x.options()), out};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> AddLayerNormCpu(const at::Tensor& x,
                                                   const std::optional<at::Tensor>& residual,
                                                   const at::Tensor& weight, const at::Tensor& bias,
                                                   double eps) {
  return AddLayerNormRows(x, residual, weight, bias, eps, nullptr, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> AddLayerNormStatsCpu(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    const at::Tensor& bias, double eps) {
  TORCH_CHECK(x.dim() >= 1, "torch_plugin::add_layer_norm_stats: x needs a last dim");
  // ATen's layout of the statistics: x's shape with the normalised dim kept as 1.
  std::vector<int64_t> stat_shape(x.sizes().begin(), x.sizes().end());
  stat_shape.back() = 1;
  at::Tensor mean = at::empty(stat_shape, x.options());
  at::Tensor rstd = at::empty(stat_shape, x.options());
  auto [sum, out] = AddLayerNormRows(x, residual, weight, bias, eps, mean.data_ptr<float>(),
                                     rstd.data_ptr<float>());
  return {sum, out, mean, rstd};
}

at::Tensor ScaledMaskedSoftmaxCpu(const at::Tensor& scores, double scale,
                                  const std::optional<at::Tensor>& mask) {
  TORCH_CHECK(scores.scalar_type() == at::kFloat && scores.dim() >= 1,
              "torch_plugin::scaled_masked_softmax: float32 scores with at least one dim");
  const bool has_mask = mask.has_value() && mask->defined();
  at::Tensor sc = scores.contiguous();
  at::Tensor out = at::empty_like(sc);
  const int64_t cols = sc.size(-1);
  const int64_t rows = cols == 0 ? 0 : sc.numel() / cols;
  // The mask, broadcast as a view (stride 0 on broadcast dims, no copy): each row finds its
  // mask row from the strides of the leading dims.
  at::Tensor mexp;
  std::vector<int64_t> lead_sizes, lead_strides;
  int64_t mask_col_stride = 0;
  if (has_mask) {
    TORCH_CHECK(mask->scalar_type() == at::kFloat,
                "torch_plugin::scaled_masked_softmax: the mask must be float32 (additive)");
    mexp = mask->expand(sc.sizes());
    for (int64_t d = 0; d + 1 < sc.dim(); ++d) {
      lead_sizes.push_back(sc.size(d));
      lead_strides.push_back(mexp.stride(d));
    }
    mask_col_stride = mexp.stride(-1);
  }
  const float* sp = sc.data_ptr<float>();
  const float* mp = has_mask ? mexp.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> mrow(has_mask && mask_col_stride != 1 ? cols : 0);
    for (int64_t r = begin; r < end; ++r) {
      float* orow = op + r * cols;
      const float* srow = sp + r * cols;
      const float* m = nullptr;
      if (has_mask) {
        int64_t offset = 0, rem = r;
        for (int64_t d = static_cast<int64_t>(lead_sizes.size()) - 1; d >= 0; --d) {
          offset +=
              (rem % lead_sizes[static_cast<size_t>(d)]) * lead_strides[static_cast<size_t>(d)];
          rem /= lead_sizes[static_cast<size_t>(d)];
        }
        m = mp + offset;
        if (mask_col_stride != 1) {
          for (int64_t c = 0; c < cols; ++c) mrow[static_cast<size_t>(c)] = m[c * mask_col_stride];
          m = mrow.data();
        }
      }
      // Pass 1: scaled + masked scores, and their max.
      const Vec vscale(fscale);
      Vec vmax(-std::numeric_limits<float>::infinity());
      float mx = -std::numeric_limits<float>::infinity();
      int64_t c = 0;
      for (; c + Vec::size() <= cols; c += Vec::size()) {
        Vec v = Vec::loadu(srow + c) * vscale;
        if (m) v = v + Vec::loadu(m + c);
        v.store(orow + c);
        vmax = at::vec::maximum(vmax, v);
      }
      for (; c < cols; ++c) {
        orow[c] = srow[c] * fscale + (m ? m[c] : 0.0f);
        mx = std::max(mx, orow[c]);
      }
      mx = std::max(
          mx, at::vec::vec_reduce_all([](Vec a, Vec b) { return at::vec::maximum(a, b); }, vmax));
      // Pass 2: exponentials and their sum; pass 3: normalise. A fully masked row (all -inf)
      // gives NaN, as ATen's softmax does.
      Vec vsum(0.0f);
      float total = 0.0f;
      c = 0;
      const Vec vmx(mx);
      for (; c + Vec::size() <= cols; c += Vec::size()) {
        const Vec e = (Vec::loadu(orow + c) - vmx).exp_u20();
        e.store(orow + c);
        vsum = vsum + e;
      }
      for (; c < cols; ++c) total += (orow[c] = std::exp(orow[c] - mx));
      total += at::vec::vec_reduce_all([](Vec a, Vec b) { return a + b; }, vsum);
      const Vec vinv(1.0f / total);
      c = 0;
      for (; c + Vec::size() <= cols; c += Vec::size())
        (Vec::loadu(orow + c) * vinv).store(orow + c);
      for (; c < cols; ++c) orow[c] /= total;
    }
  });
  return out;
}

}  // namespace tp::kernels
