#include "cpu/split_kv_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"

namespace tp::kernels {
namespace {

constexpr const char* kOp = "torch_plugin::split_kv_attention";

}  // namespace

std::tuple<at::Tensor, at::Tensor> SplitKvAttentionCpu(const at::Tensor& q_in,
                                                       const at::Tensor& k_in,
                                                       const at::Tensor& v_in,
                                                       const at::Tensor& lengths_in,
                                                       int64_t num_splits, double scale) {
  CheckSplitKv(q_in, k_in, v_in, lengths_in, num_splits);
  TORCH_CHECK(q_in.device().is_cpu(), kOp, ": the CPU kernel got a tensor on ", q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor lengths = lengths_in.to(at::kCPU).contiguous();
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.size(1), S = k.size(2);
  const int64_t group = Hq / Hkv;
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(len[b] >= 0 && len[b] <= S, kOp, ": lengths[", b, "] = ", len[b],
                " is outside the cache [0, ", S, "]");
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(D));
  const float fscale = static_cast<float>(scale);
  auto opts = q.options().dtype(at::kFloat);
  at::Tensor out = at::zeros({B, Hq, num_splits, D}, opts);
  at::Tensor lse = at::full({B, Hq, num_splits}, -std::numeric_limits<float>::infinity(), opts);
  float* out_p = out.data_ptr<float>();
  float* lse_p = lse.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, q.scalar_type(), "split_kv_attention", [&] {
        const scalar_t* qp = q.data_ptr<scalar_t>();
        const scalar_t* kp = k.data_ptr<scalar_t>();
        const scalar_t* vp = v.data_ptr<scalar_t>();
        // One task per (batch, head, split): independent, so no synchronisation.
        at::parallel_for(0, B * Hq * num_splits, 1, [&](int64_t begin, int64_t end) {
          std::vector<float> qf(D), scores, acc(D);
          for (int64_t task = begin; task < end; ++task) {
            const int64_t p = task % num_splits, bh = task / num_splits;
            const int64_t b = bh / Hq, h = bh % Hq, kvh = h / group;
            const int64_t chunk = (len[b] + num_splits - 1) / num_splits;
            const int64_t lo = p * chunk, hi = std::min(len[b], lo + chunk);
            if (lo >= hi) continue;  // empty split: out 0, lse -inf
            const scalar_t* qrow = qp + (b * Hq + h) * D;
            for (int64_t d = 0; d < D; ++d) qf[d] = static_cast<float>(qrow[d]) * fscale;
            const scalar_t* kbase = kp + ((b * Hkv + kvh) * S) * D;
            const scalar_t* vbase = vp + ((b * Hkv + kvh) * S) * D;
            scores.resize(hi - lo);
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t j = lo; j < hi; ++j) {
              const scalar_t* krow = kbase + j * D;
              float s = 0;
              for (int64_t d = 0; d < D; ++d) s += qf[d] * static_cast<float>(krow[d]);
              scores[j - lo] = s;
              m = std::max(m, s);
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            float sum = 0;
            for (int64_t j = lo; j < hi; ++j) {
              const float w = std::exp(scores[j - lo] - m);
              sum += w;
              const scalar_t* vrow = vbase + j * D;
              for (int64_t d = 0; d < D; ++d) acc[d] += w * static_cast<float>(vrow[d]);
            }
            float* o = out_p + task * D;
            for (int64_t d = 0; d < D; ++d) o[d] = acc[d] / sum;
            lse_p[task] = m + std::log(sum);
          }
        });
      });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> MergeAttentionPartialsCpu(const at::Tensor& out_in,
                                                             const at::Tensor& lse_in) {
  CheckMergePartials(out_in, lse_in);
  TORCH_CHECK(out_in.device().is_cpu(), "torch_plugin::merge_attention_partials: the CPU kernel ",
              "got a tensor on ", out_in.device());
  const at::Tensor out = out_in.contiguous(), lse = lse_in.contiguous();
  const int64_t D = out.size(-1), P = out.size(-2), rows = lse.numel() / std::max<int64_t>(P, 1);
  auto lead = out.sizes().slice(0, out.dim() - 2).vec();
  std::vector<int64_t> mshape = lead;
  mshape.push_back(D);
  at::Tensor merged = at::zeros(mshape, out.options());
  at::Tensor mlse = at::full(lead, -std::numeric_limits<float>::infinity(), out.options());
  const float* op_ = out.data_ptr<float>();
  const float* lp = lse.data_ptr<float>();
  float* mp = merged.data_ptr<float>();
  float* mlp = mlse.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* l = lp + r * P;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < P; ++p) m = std::max(m, l[p]);
      if (m == -std::numeric_limits<float>::infinity()) continue;  // nothing attended: zeros
      float total = 0;
      float* dst = mp + r * D;
      for (int64_t p = 0; p < P; ++p) {
        if (l[p] == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp(l[p] - m);
        total += w;
        const float* src = op_ + (r * P + p) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] += w * src[d];
      }
      for (int64_t d = 0; d < D; ++d) dst[d] /= total;
      mlp[r] = m + std::log(total);
    }
  });
  return {merged, mlse};
}

}  // namespace tp::kernels
