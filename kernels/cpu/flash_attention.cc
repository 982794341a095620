#include "cpu/flash_attention.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/vec_math.h"

namespace tp::kernels {
namespace {

constexpr const char* kOp = "torch_plugin::attention";
// Query rows per task, and keys per online-softmax step: a [32 x 128] score block (16 KiB)
// stays in L1 between the two products.
constexpr int64_t kQBlock = 32;
constexpr int64_t kKBlock = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

using vec::Load8;
using vec::Store8;
using vec::V8;

// s[i * lds + j] = q[i] . key j for rows4 (a multiple of 4) query rows and n16 (a multiple of
// 16) keys, packed as GEMM packs its B operand: panels of 16 keys, each [D, 16] contiguous, so a
// tile streams one 4 KiB panel (head_dim 64) rather than 64 rows a key block apart. A 4 x 16
// tile keeps eight accumulators in registers; each step loads two key vectors for eight FMAs
// (a dot product per pair would pay a horizontal sum per score).
TP_MULTIVERSION void ScoreTile(const float* q, int64_t rows4, int64_t D, const float* panels,
                               int64_t n16, float* s, int64_t lds) {
  for (int64_t i = 0; i < rows4; i += 4) {
    const float* q0 = q + i * D;
    const float* q1 = q0 + D;
    const float* q2 = q1 + D;
    const float* q3 = q2 + D;
    for (int64_t j = 0; j < n16; j += 16) {
      const float* kp = panels + j * D;  // panel j / 16
      V8 c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
      for (int64_t d = 0; d < D; ++d) {
        const V8 b0 = Load8(kp + d * 16), b1 = Load8(kp + d * 16 + 8);
        const float a0 = q0[d], a1 = q1[d], a2 = q2[d], a3 = q3[d];
        c00 += a0 * b0, c01 += a0 * b1, c10 += a1 * b0, c11 += a1 * b1;
        c20 += a2 * b0, c21 += a2 * b1, c30 += a3 * b0, c31 += a3 * b1;
      }
      float* r = s + i * lds + j;
      Store8(r, c00), Store8(r + 8, c01), Store8(r + lds, c10), Store8(r + lds + 8, c11);
      Store8(r + 2 * lds, c20), Store8(r + 2 * lds + 8, c21);
      Store8(r + 3 * lds, c30), Store8(r + 3 * lds + 8, c31);
    }
  }
}

// o[i * ldo + c] += p[i * ldp + j] * v[j * ldv + c] for rows4 rows, n keys, Dv columns: 4 rows
// x 16 columns per tile, each value row loaded once for four output rows.
TP_MULTIVERSION void AccumulateTile(const float* p, int64_t ldp, int64_t rows4, const float* v,
                                    int64_t ldv, int64_t n, int64_t Dv, float* o, int64_t ldo) {
  const int64_t Dv16 = Dv / 16 * 16;
  for (int64_t i = 0; i < rows4; i += 4) {
    const float* p0 = p + i * ldp;
    const float* p1 = p0 + ldp;
    const float* p2 = p1 + ldp;
    const float* p3 = p2 + ldp;
    float* o0 = o + i * ldo;
    for (int64_t c = 0; c < Dv16; c += 16) {
      V8 a00 = Load8(o0 + c), a01 = Load8(o0 + c + 8);
      V8 a10 = Load8(o0 + ldo + c), a11 = Load8(o0 + ldo + c + 8);
      V8 a20 = Load8(o0 + 2 * ldo + c), a21 = Load8(o0 + 2 * ldo + c + 8);
      V8 a30 = Load8(o0 + 3 * ldo + c), a31 = Load8(o0 + 3 * ldo + c + 8);
      for (int64_t j = 0; j < n; ++j) {
        const V8 b0 = Load8(v + j * ldv + c), b1 = Load8(v + j * ldv + c + 8);
        const float w0 = p0[j], w1 = p1[j], w2 = p2[j], w3 = p3[j];
        a00 += w0 * b0, a01 += w0 * b1, a10 += w1 * b0, a11 += w1 * b1;
        a20 += w2 * b0, a21 += w2 * b1, a30 += w3 * b0, a31 += w3 * b1;
      }
      Store8(o0 + c, a00), Store8(o0 + c + 8, a01);
      Store8(o0 + ldo + c, a10), Store8(o0 + ldo + c + 8, a11);
      Store8(o0 + 2 * ldo + c, a20), Store8(o0 + 2 * ldo + c + 8, a21);
      Store8(o0 + 3 * ldo + c, a30), Store8(o0 + 3 * ldo + c + 8, a31);
    }
    for (int64_t r = 0; r < 4; ++r) {
      const float* pr = p + (i + r) * ldp;
      float* orow = o + (i + r) * ldo;
      for (int64_t c = Dv16; c < Dv; ++c) {
        float acc = orow[c];
        for (int64_t j = 0; j < n; ++j) acc += pr[j] * v[j * ldv + c];
        orow[c] = acc;
      }
    }
  }
}

at::Tensor UnitLastStride(const at::Tensor& t) {
  return t.stride(-1) == 1 || t.size(-1) == 1 ? t : t.contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> FlashAttentionCpu(const at::Tensor& q_in,
                                                     const at::Tensor& k_in,
                                                     const at::Tensor& v_in,
                                                     const std::optional<at::Tensor>& attn_mask,
                                                     bool is_causal, std::optional<double> scale) {
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, kOp,
              ": q, k, v must be [batch, heads, seq, head_dim], got ", q_in.sizes(), ", ",
              k_in.sizes(), ", ", v_in.sizes());
  for (const at::Tensor* t : {&q_in, &k_in, &v_in}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, kOp, ": float32 only (the fused backend's rule ",
                "matches float32 graphs), got ", t->scalar_type());
    TORCH_CHECK(t->device().is_cpu(), kOp, ": the CPU kernel got a tensor on ", t->device());
  }
  const int64_t B = q_in.size(0), H = q_in.size(1), Sq = q_in.size(2), D = q_in.size(3);
  const int64_t Hkv = k_in.size(1), Sk = k_in.size(2), Dv = v_in.size(3);
  TORCH_CHECK(k_in.size(0) == B && v_in.size(0) == B, kOp, ": batch sizes differ: ",
              q_in.sizes(), ", ", k_in.sizes(), ", ", v_in.sizes());
  TORCH_CHECK(k_in.size(3) == D, kOp, ": head_dim of q (", D, ") and k (", k_in.size(3),
              ") differ");
  TORCH_CHECK(v_in.size(1) == Hkv && v_in.size(2) == Sk, kOp, ": k ", k_in.sizes(), " and v ",
              v_in.sizes(), " differ in heads or length");
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, kOp, ": query heads (", H,
              ") must be a multiple of key/value heads (", Hkv, ")");
  at::Tensor mask;
  if (attn_mask.has_value() && attn_mask->defined()) {
    TORCH_CHECK(attn_mask->scalar_type() == at::kFloat, kOp,
                ": attn_mask must be an additive float32 mask, got ", attn_mask->scalar_type());
    TORCH_CHECK(at::is_expandable_to(attn_mask->sizes(), {B, H, Sq, Sk}), kOp, ": attn_mask ",
                attn_mask->sizes(), " does not broadcast to [", B, ", ", H, ", ", Sq, ", ", Sk,
                "]");
    mask = attn_mask->expand({B, H, Sq, Sk});
  }
  const at::Tensor q = UnitLastStride(q_in), k = UnitLastStride(k_in), v = UnitLastStride(v_in);
  const float fscale =
      static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(D)));

  // Laid out as the query (ATen's flash kernel does the same), unless that has no unit stride.
  at::Tensor out = Dv == D ? at::empty_like(q_in) : at::Tensor();
  if (!out.defined() || out.stride(3) != 1) out = at::empty({B, H, Sq, Dv}, q.options());
  at::Tensor lse = at::empty({B, Sq, H}, q.options()).transpose(1, 2);
  if (out.numel() == 0) return {out.zero_(), lse.zero_()};

  // Keys packed as [Sk16 / 16] panels of [D, 16], zero-padded to whole panels, per thread
  // and (batch, KV head): a thread's tasks are consecutive, so it packs a head once and its
  // query blocks (and grouped heads) read it from cache, not from a whole-batch buffer.
  const int64_t Sk16 = RoundUp(std::max<int64_t>(Sk, 1), 16);
  const float* kp = k.data_ptr<float>();
  // Values are copied to contiguous [Sk, Dv] rows alongside: a head split's layout puts a
  // head's rows H * Dv apart, and the value tile ran at half speed over such strided rows.
  const float* vp = v.data_ptr<float>();
  auto pack_head = [&](int64_t b, int64_t hk, float* kdst, float* vdst) {
    const float* ksrc = kp + b * k.stride(0) + hk * k.stride(1);
    for (int64_t j = 0; j < Sk; ++j) {
      const float* row = ksrc + j * k.stride(2);
      float* col = kdst + (j / 16) * D * 16 + j % 16;
      for (int64_t d = 0; d < D; ++d) col[d * 16] = row[d];
    }
    const float* vsrc = vp + b * v.stride(0) + hk * v.stride(1);
    for (int64_t j = 0; j < Sk; ++j) {
      std::copy(vsrc + j * v.stride(2), vsrc + j * v.stride(2) + Dv, vdst + j * Dv);
    }
  };

  const float* qp = q.data_ptr<float>();
  const float* mp = mask.defined() ? mask.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const int64_t group = H / Hkv, nqb = (Sq + kQBlock - 1) / kQBlock;
  at::parallel_for(0, B * H * nqb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qbuf(kQBlock * D), scores(kQBlock * kKBlock), acc(kQBlock * Dv);
    std::vector<float> mrow(kQBlock), lrow(kQBlock);
    std::vector<float> kt(static_cast<size_t>(D * Sk16), 0.0f), vt(Sk * Dv);
    int64_t packed = -1;  // the (batch, KV head) whose keys and values kt and vt hold
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (H * nqb), h = task / nqb % H, i0 = task % nqb * kQBlock;
      const int64_t m = std::min(kQBlock, Sq - i0), rows4 = RoundUp(m, 4);
      const int64_t hk = h / group;
      for (int64_t r = 0; r < rows4; ++r) {
        float* dst = qbuf.data() + r * D;
        if (r >= m) {
          std::fill(dst, dst + D, 0.0f);  // padding rows: computed, never read
          continue;
        }
        const float* src = qp + b * q.stride(0) + h * q.stride(1) + (i0 + r) * q.stride(2);
        for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * fscale;
      }
      std::fill(acc.begin(), acc.begin() + rows4 * Dv, 0.0f);
      std::fill(mrow.begin(), mrow.end(), kNegInf);
      std::fill(lrow.begin(), lrow.end(), 0.0f);
      // Causal: the block's last row sees keys up to its own index; later blocks are skipped.
      const int64_t kend = is_causal ? std::min(Sk, i0 + m) : Sk;
      if (b * Hkv + hk != packed) {
        pack_head(b, hk, kt.data(), vt.data());
        packed = b * Hkv + hk;
      }
      for (int64_t j0 = 0; j0 < kend; j0 += kKBlock) {
        const int64_t n = std::min(kKBlock, kend - j0);
        ScoreTile(qbuf.data(), rows4, D, kt.data() + j0 * D, RoundUp(n, 16), scores.data(),
                  kKBlock);
        for (int64_t r = 0; r < m; ++r) {
          float* s = scores.data() + r * kKBlock;
          const int64_t qi = i0 + r;
          if (mp != nullptr) {
            const float* mr =
                mp + b * mask.stride(0) + h * mask.stride(1) + qi * mask.stride(2);
            const int64_t ms = mask.stride(3);
            for (int64_t j = 0; j < n; ++j) s[j] += mr[(j0 + j) * ms];
          }
          if (is_causal) {
            for (int64_t j = std::max<int64_t>(0, qi - j0 + 1); j < n; ++j) s[j] = kNegInf;
          }
          const float mx = vec::MaxOf(s, n);
          const float new_m = std::max(mrow[r], mx);  // NaN once the row has turned NaN
          if (new_m == kNegInf) {  // no key seen yet: this block adds nothing to the row
            // ...unless it holds NaN, which MaxOf skips: the row becomes NaN, as in ATen.
            // (Elsewhere NaN scores reach the exp, and through it the sum and the output.)
            if (std::any_of(s, s + n, [](float x) { return x != x; })) {
              mrow[r] = lrow[r] = std::numeric_limits<float>::quiet_NaN();
            }
            std::fill(s, s + n, 0.0f);
            continue;
          }
          const float alpha = std::exp(mrow[r] - new_m);  // 0 for the first keys seen
          const float sum = vec::ExpShiftedSum(s, n, new_m);
          lrow[r] = lrow[r] * alpha + sum;
          mrow[r] = new_m;
          if (alpha != 1.0f) {
            float* a = acc.data() + r * Dv;
            for (int64_t c = 0; c < Dv; ++c) a[c] *= alpha;
          }
        }
        for (int64_t r = m; r < rows4; ++r) {
          std::fill(scores.data() + r * kKBlock, scores.data() + r * kKBlock + n, 0.0f);
        }
        AccumulateTile(scores.data(), kKBlock, rows4, vt.data() + j0 * Dv, Dv, n, Dv, acc.data(),
                       Dv);
      }
      for (int64_t r = 0; r < m; ++r) {
        const int64_t qi = i0 + r;
        float* o = op + b * out.stride(0) + h * out.stride(1) + qi * out.stride(2);
        float* l = lp + b * lse.stride(0) + h * lse.stride(1) + qi * lse.stride(2);
        if (lrow[r] == 0.0f) {  // the row saw no key (masked out, or causal with Sk == 0)
          std::fill(o, o + Dv, 0.0f);
          *l = 0.0f;
          continue;
        }
        const float inv = 1.0f / lrow[r];
        const float* a = acc.data() + r * Dv;
        for (int64_t c = 0; c < Dv; ++c) o[c] = a[c] * inv;
        *l = mrow[r] + std::log(lrow[r]);
      }
    }
  });
  return {out, lse};
}

}  // namespace tp::kernels
