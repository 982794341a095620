#include "cpu/split_kv_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/vec_math.h"

namespace tp::kernels {
namespace {

constexpr const char* kOp = "torch_plugin::split_kv_attention";
// Cache rows per inner call: a block of V rows stays in L1 while AccumulateRows streams it.
constexpr int64_t kRowBlock = 64;

}  // namespace

namespace detail {

using vec::Load8;
using vec::Store8;
using vec::Sum8;
using vec::V8;

// scores[g * stride + j] = q[g] . k[j] for the `group` query heads that share this KV head:
// each key row is read once for every head of its group (GQA reads the cache once). Dot products
// run four (row, head) pairs at a time: four independent 8-wide chains hide the FMA latency,
// and each pair pays one 8-lane horizontal sum.
TP_MULTIVERSION void ScoreRows(const float* q, int64_t group, const float* k, int64_t rows,
                               int64_t D, float* scores, int64_t stride) {
  const int64_t pairs = rows * group;
  const int64_t D8 = D / 8 * 8;
  for (int64_t p0 = 0; p0 < pairs; p0 += 4) {
    const int np = static_cast<int>(std::min<int64_t>(4, pairs - p0));
    const float* qs[4];
    const float* ks[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t pi = p0 + std::min(i, np - 1);  // pad with the last pair
      qs[i] = q + (pi % group) * D;
      ks[i] = k + (pi / group) * D;
    }
    V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int64_t d = 0; d < D8; d += 8) {
      a0 += Load8(qs[0] + d) * Load8(ks[0] + d);
      a1 += Load8(qs[1] + d) * Load8(ks[1] + d);
      a2 += Load8(qs[2] + d) * Load8(ks[2] + d);
      a3 += Load8(qs[3] + d) * Load8(ks[3] + d);
    }
    const float sums[4] = {Sum8(a0), Sum8(a1), Sum8(a2), Sum8(a3)};
    for (int i = 0; i < np; ++i) {
      float s = sums[i];
      for (int64_t d = D8; d < D; ++d) s += qs[i][d] * ks[i][d];
      const int64_t pi = p0 + i;
      scores[(pi % group) * stride + pi / group] = s;
    }
  }
}

// acc[g * D + d] += w[g * stride + j] * v[j * D + d] over the rows. Per head, 32 output lanes
// stay in four registers while the (L1-resident) block of rows streams past.
TP_MULTIVERSION void AccumulateRows(const float* w, int64_t stride, int64_t group, const float* v,
                                    int64_t rows, int64_t D, float* acc) {
  const int64_t D32 = D / 32 * 32;
  for (int64_t g = 0; g < group; ++g) {
    const float* wg = w + g * stride;
    float* a = acc + g * D;
    for (int64_t d = 0; d < D32; d += 32) {
      V8 r0 = Load8(a + d), r1 = Load8(a + d + 8), r2 = Load8(a + d + 16), r3 = Load8(a + d + 24);
      for (int64_t j = 0; j < rows; ++j) {
        const float* vr = v + j * D + d;
        const float wj = wg[j];
        r0 += wj * Load8(vr);
        r1 += wj * Load8(vr + 8);
        r2 += wj * Load8(vr + 16);
        r3 += wj * Load8(vr + 24);
      }
      Store8(a + d, r0), Store8(a + d + 8, r1), Store8(a + d + 16, r2), Store8(a + d + 24, r3);
    }
    for (int64_t d = D32; d < D; ++d) {
      float s = a[d];
      for (int64_t j = 0; j < rows; ++j) s += wg[j] * v[j * D + d];
      a[d] = s;
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TP_AVX512 __attribute__((target("arch=x86-64-v4")))

typedef float V16 __attribute__((vector_size(64)));

TP_AVX512 __attribute__((always_inline)) inline V16 Load16(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

TP_AVX512 __attribute__((always_inline)) inline void Store16(float* p, V16 v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

TP_AVX512 __attribute__((always_inline)) inline float Sum16(V16 v) {
  V8 lo, hi;
  __builtin_memcpy(&lo, &v, sizeof(lo));
  __builtin_memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
  return Sum8(lo + hi);
}

// The AVX-512 forms of the two loops above, for groups of 4 query heads per KV head (Llama-3's
// 32 / 8) and D a multiple of 16 (64, 80, 128, 256): 16 lanes per register, half the
// instructions of the AVX2 forms. At long context the cache streams from DRAM and what sets
// the rate is how many lines are in flight: each row's dot products run as eight independent
// chains (two halves of the row for each of the four heads), and the row kScorePrefetchRows
// ahead is prefetched into L1 (by the first head quad; the others find the block in L1).
// The accumulate loop prefetches V the same way. On this 2-core EPYC, 32K context, against
// torch.sum's read rate measured around it: 0.83 (median of 40 runs) for the previous form (two
// interleaved K streams, rows j and j + n/2, no prefetch), 0.91 for this one. Prefetching into
// L2 only, and a 4-way shuffle reduction of the sums (through a store), were slower.
constexpr int64_t kScorePrefetchRows = 32;
constexpr int64_t kAccumulatePrefetchRows = 16;

// Into L1, `ahead` floats past p (in integers: the address may lie past the cache's end, which a
// prefetch does not fault on, but pointer arithmetic must not reach).
TP_AVX512 __attribute__((always_inline)) inline void Prefetch(const float* p, int64_t ahead) {
  const auto at = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(ahead) * sizeof(float);
  __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 3);
}

TP_AVX512 void ScoreRowsWide(const float* q, int64_t group, const float* k, int64_t rows,
                             int64_t D, float* scores, int64_t stride) {
  for (int64_t g = 0; g < group; g += 4) {
    const float* q0 = q + g * D;
    const float* q1 = q0 + D;
    const float* q2 = q1 + D;
    const float* q3 = q2 + D;
    float* s = scores + g * stride;
    const bool first = g == 0;
    const int64_t ahead = kScorePrefetchRows * D;
    for (int64_t j = 0; j < rows; ++j) {
      const float* kr = k + j * D;
      V16 a0 = {}, a1 = {}, a2 = {}, a3 = {}, c0 = {}, c1 = {}, c2 = {}, c3 = {};
      int64_t d = 0;
      for (; d + 32 <= D; d += 32) {
        if (first) Prefetch(kr + d, ahead), Prefetch(kr + d + 16, ahead);
        const V16 x = Load16(kr + d), y = Load16(kr + d + 16);
        a0 += Load16(q0 + d) * x, c0 += Load16(q0 + d + 16) * y;
        a1 += Load16(q1 + d) * x, c1 += Load16(q1 + d + 16) * y;
        a2 += Load16(q2 + d) * x, c2 += Load16(q2 + d + 16) * y;
        a3 += Load16(q3 + d) * x, c3 += Load16(q3 + d + 16) * y;
      }
      if (d < D) {  // D an odd multiple of 16 (80, 112): one 16-lane chunk left
        if (first) Prefetch(kr + d, ahead);
        const V16 x = Load16(kr + d);
        a0 += Load16(q0 + d) * x, a1 += Load16(q1 + d) * x;
        a2 += Load16(q2 + d) * x, a3 += Load16(q3 + d) * x;
      }
      s[j] = Sum16(a0 + c0), s[stride + j] = Sum16(a1 + c1);
      s[2 * stride + j] = Sum16(a2 + c2), s[3 * stride + j] = Sum16(a3 + c3);
    }
  }
}

// Row by row (one sequential stream through the V block, as the key loop reads K): `H` heads'
// whole outputs (C registers of 16 lanes each, D = 16 C) accumulate while each row is read once.
// The first tile of a block prefetches the row kAccumulatePrefetchRows ahead (past the block's
// end: the next block's rows, read next); the other tiles find the block in L1.
template <int C, int H>
TP_AVX512 __attribute__((always_inline)) inline void AccumulateRowsTile(
    const float* w, int64_t stride, int64_t g0, const float* v, int64_t rows, float* acc) {
  constexpr int64_t D = 16 * C;
  V16 r[H][C];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) r[h][c] = Load16(acc + (g0 + h) * D + 16 * c);
  for (int64_t j = 0; j < rows; ++j) {
    const float* vr = v + j * D;
    if (g0 == 0)
      for (int c = 0; c < C; ++c) Prefetch(vr + 16 * c, kAccumulatePrefetchRows * D);
    for (int c = 0; c < C; ++c) {
      const V16 x = Load16(vr + 16 * c);
      for (int h = 0; h < H; ++h) r[h][c] += w[(g0 + h) * stride + j] * x;
    }
  }
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) Store16(acc + (g0 + h) * D + 16 * c, r[h][c]);
}

// acc[g * D + d] += w[g * stride + j] * v[j * D + d], as AccumulateRows. head_dim 128 and 64
// (Llama's, Qwen's, ...): 16 accumulators per pass; any other head_dim takes the AVX2 form.
TP_AVX512 void AccumulateRowsWide(const float* w, int64_t stride, int64_t group, const float* v,
                                  int64_t rows, int64_t D, float* acc) {
  if (D == 128) {
    for (int64_t g = 0; g < group; g += 2) AccumulateRowsTile<8, 2>(w, stride, g, v, rows, acc);
  } else if (D == 64) {
    for (int64_t g = 0; g < group; g += 4) AccumulateRowsTile<4, 4>(w, stride, g, v, rows, acc);
  } else {
    AccumulateRows(w, stride, group, v, rows, D, acc);
  }
}

// Whether this CPU runs the AVX-512 forms; TP_SPLIT_KV_CPU=avx2 keeps the AVX2 ones (tests
// run both where both exist).
bool UseWide(int64_t group, int64_t D) {
  if (group % 4 != 0 || D % 16 != 0 || !__builtin_cpu_supports("avx512f")) return false;
  const char* force = std::getenv("TP_SPLIT_KV_CPU");
  return force == nullptr || std::strcmp(force, "avx2") != 0;
}
#else
bool UseWide(int64_t, int64_t) { return false; }
void ScoreRowsWide(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t) {}
void AccumulateRowsWide(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*) {}
#endif

}  // namespace detail

std::tuple<at::Tensor, at::Tensor> SplitKvAttentionCpu(const at::Tensor& q_in,
                                                       const at::Tensor& k_in,
                                                       const at::Tensor& v_in,
                                                       const at::Tensor& lengths_in,
                                                       int64_t num_splits, double scale,
                                                       const std::optional<at::Tensor>& starts_in,
                                                       double softcap) {
  TORCH_CHECK(softcap >= 0, kOp, ": softcap must be >= 0 (0: none), got ", softcap);
  const float cap = static_cast<float>(softcap);
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
  at::Tensor starts_t;
  std::vector<int64_t> zeros;
  const int64_t* first = nullptr;
  if (starts_in.has_value()) {
    TORCH_CHECK(starts_in->dim() == 1 && starts_in->size(0) == B &&
                    starts_in->scalar_type() == at::kLong,
                kOp, ": starts must be int64 [B]");
    starts_t = starts_in->to(at::kCPU).contiguous();
    first = starts_t.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(first[b] >= 0 && first[b] <= len[b], kOp, ": starts[", b, "] = ", first[b],
                  " is outside [0, lengths[", b, "] = ", len[b], "]");
  } else {
    zeros.assign(static_cast<size_t>(B), 0);
    first = zeros.data();
  }
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(D));
  const float fscale = static_cast<float>(scale);
  auto opts = q.options().dtype(at::kFloat);
  at::Tensor out = at::zeros({B, Hq, num_splits, D}, opts);
  at::Tensor lse = at::full({B, Hq, num_splits}, -std::numeric_limits<float>::infinity(), opts);
  float* out_p = out.data_ptr<float>();
  float* lse_p = lse.data_ptr<float>();
  const bool wide = detail::UseWide(group, D);
  auto score_rows = wide ? detail::ScoreRowsWide : detail::ScoreRows;
  auto accumulate_rows = wide ? detail::AccumulateRowsWide : detail::AccumulateRows;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, q.scalar_type(), "split_kv_attention", [&] {
        const scalar_t* qp = q.data_ptr<scalar_t>();
        const scalar_t* kp = k.data_ptr<scalar_t>();
        const scalar_t* vp = v.data_ptr<scalar_t>();
        constexpr bool kFloat = std::is_same_v<scalar_t, float>;
        // One task per (batch, KV head, split), covering the KV head's whole query group:
        // independent, so no synchronisation, and each cache row is read once per task.
        at::parallel_for(0, B * Hkv * num_splits, 1, [&](int64_t begin, int64_t end) {
          std::vector<float> qf(group * D), scores, acc(group * D), m(group), sum(group);
          std::vector<float> rowbuf(kFloat ? 0 : kRowBlock * D);
          // Rows [j, j + n) of a cache as float: in place for fp32, converted otherwise.
          auto rows_as_float = [&](const scalar_t* base, int64_t j, int64_t n) -> const float* {
            if constexpr (kFloat) {
              return reinterpret_cast<const float*>(base + j * D);  // scalar_t is float
            } else {
              const scalar_t* src = base + j * D;
              for (int64_t i = 0; i < n * D; ++i) rowbuf[i] = static_cast<float>(src[i]);
              return rowbuf.data();
            }
          };
          for (int64_t task = begin; task < end; ++task) {
            const int64_t p = task % num_splits, bk = task / num_splits;
            const int64_t b = bk / Hkv, kvh = bk % Hkv;
            const int64_t chunk = (len[b] - first[b] + num_splits - 1) / num_splits;
            const int64_t lo = first[b] + p * chunk, hi = std::min(len[b], lo + chunk);
            if (lo >= hi) continue;  // empty split: out 0, lse -inf
            const int64_t n = hi - lo;
            for (int64_t g = 0; g < group; ++g) {
              const scalar_t* qrow = qp + (b * Hq + kvh * group + g) * D;
              for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(qrow[d]) * fscale;
            }
            const scalar_t* kbase = kp + ((b * Hkv + kvh) * S) * D;
            const scalar_t* vbase = vp + ((b * Hkv + kvh) * S) * D;
            scores.resize(group * n);
            for (int64_t j = lo; j < hi; j += kRowBlock) {
              const int64_t rows = std::min(kRowBlock, hi - j);
              score_rows(qf.data(), group, rows_as_float(kbase, j, rows), rows, D,
                         scores.data() + (j - lo), n);
            }
            if (cap > 0)
              for (int64_t i = 0; i < group * n; ++i)
                scores[i] = cap * std::tanh(scores[i] / cap);
            for (int64_t g = 0; g < group; ++g) {
              float* sg = scores.data() + g * n;
              float mg = -std::numeric_limits<float>::infinity();
              for (int64_t j = 0; j < n; ++j) mg = std::max(mg, sg[j]);
              m[g] = mg, sum[g] = vec::ExpShiftedSum(sg, n, mg);
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t j = lo; j < hi; j += kRowBlock) {
              const int64_t rows = std::min(kRowBlock, hi - j);
              accumulate_rows(scores.data() + (j - lo), n, group, rows_as_float(vbase, j, rows),
                              rows, D, acc.data());
            }
            for (int64_t g = 0; g < group; ++g) {
              const int64_t row = (b * Hq + kvh * group + g) * num_splits + p;
              float* o = out_p + row * D;
              for (int64_t d = 0; d < D; ++d) o[d] = acc[g * D + d] / sum[g];
              lse_p[row] = m[g] + std::log(sum[g]);
            }
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

std::tuple<at::Tensor, at::Tensor> DecodeAttentionCpu(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v,
                                                      const at::Tensor& lengths,
                                                      int64_t num_splits, double scale,
                                                      const std::optional<at::Tensor>& starts,
                                                      double softcap) {
  TORCH_CHECK(num_splits >= 0, "torch_plugin::decode_attention: num_splits must be >= 0 (0: ",
              "chosen for the device), got ", num_splits);
  const int64_t splits =
      num_splits > 0 ? num_splits : std::max<int64_t>(1, std::min<int64_t>(8, k.size(2) / 512));
  auto [part_out, part_lse] =
      SplitKvAttentionCpu(q, k, v, lengths, splits, scale, starts, softcap);
  auto [merged, merged_lse] = MergeAttentionPartialsCpu(part_out, part_lse);
  return {merged.to(q.scalar_type()), merged_lse};
}

}  // namespace tp::kernels
