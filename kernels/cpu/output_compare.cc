// A candidate graph's outputs against eager's in one pass (torch_plugin/placement/precision.py).
//
// The whole-graph search checks every compiled graph's outputs against eager's: a relative L2
// error and torch.allclose with an absolute part scaled by eager's largest finite magnitude.
// In torch ops that is ten passes and a dozen temporaries (two float64 copies among them):
// 1.25 s a check for GPT-2's batch-8 logits (8 x 128 x 50257 floats) on the 2-core Xeon. Here
// it is two passes over eager's output and one over the candidate's, with no temporaries.
#include "cpu/output_compare.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace tp::kernels {
namespace {

constexpr int64_t kGrain = 1 << 16;

// Each chunk's partials, in a fixed order: the sums do not depend on the thread count.
template <class Partial, class Fn>
std::vector<Partial> Chunked(int64_t n, Fn fn) {
  const int64_t chunks = std::max<int64_t>(1, (n + kGrain - 1) / kGrain);
  std::vector<Partial> out(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      out[static_cast<size_t>(c)] = fn(c * kGrain, std::min(n, (c + 1) * kGrain));
    }
  });
  return out;
}

struct Reference {
  double sq = 0.0;
  double max_abs = 0.0;  // finite values only
};

struct Apart {
  double sq = 0.0;
  int64_t count = 0;
};

template <class scalar_t>
void Compare(const scalar_t* a, const scalar_t* b, int64_t n, double rtol, double atol,
             double* out) {
  double ref_sq = 0.0, scale = 0.0;
  for (const auto& p : Chunked<Reference>(n, [&](int64_t lo, int64_t hi) {
         Reference r;
         for (int64_t i = lo; i < hi; ++i) {
           const double v = static_cast<double>(b[i]);
           r.sq += v * v;
           if (std::isfinite(v)) r.max_abs = std::max(r.max_abs, std::fabs(v));
         }
         return r;
       })) {
    ref_sq += p.sq;
    scale = std::max(scale, p.max_abs);
  }
  const double allowed = atol * std::max(1.0, scale);
  double diff_sq = 0.0;
  int64_t apart = 0;
  for (const auto& p : Chunked<Apart>(n, [&](int64_t lo, int64_t hi) {
         Apart r;
         for (int64_t i = lo; i < hi; ++i) {
           const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
           const double d = x - y;
           r.sq += d * d;
           // torch.isclose with equal_nan: equal (infinities too), both NaN, or a finite
           // difference within atol + rtol * |want|.
           const bool close = x == y || (std::isnan(x) && std::isnan(y)) ||
                              (std::isfinite(d) && std::fabs(d) <= allowed + rtol * std::fabs(y));
           r.count += close ? 0 : 1;
         }
         return r;
       })) {
    diff_sq += p.sq;
    apart += p.count;
  }
  out[0] = diff_sq;
  out[1] = ref_sq;
  out[2] = static_cast<double>(apart);
  out[3] = scale;
}

}  // namespace

at::Tensor CompareOutputsCpu(const at::Tensor& got, const at::Tensor& want, double rtol,
                             double atol) {
  TORCH_CHECK(got.sizes() == want.sizes(), "torch_plugin::compare_outputs: shapes differ, ",
              got.sizes(), " against ", want.sizes());
  TORCH_CHECK(got.scalar_type() == want.scalar_type(),
              "torch_plugin::compare_outputs: dtypes differ, ", got.scalar_type(), " against ",
              want.scalar_type());
  TORCH_CHECK(got.is_floating_point(), "torch_plugin::compare_outputs: floating outputs only, got ",
              got.scalar_type());
  const at::Tensor a = got.contiguous(), b = want.contiguous();
  at::Tensor out = at::empty({4}, got.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, a.scalar_type(), "compare_outputs", [&] {
        Compare<scalar_t>(a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(), a.numel(),
                          rtol, atol, out.mutable_data_ptr<double>());
      });
  return out;
}

}  // namespace tp::kernels
