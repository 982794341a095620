// f32 linear layers as three bf16 products (PyTorch's "high" float32 matmul precision).
//
// torch.set_float32_matmul_precision("high") allows "each float32 number as the sum of two
// bfloat16 numbers"; on CPU torch maps it to oneDNN's tf32 mode, which a CPU without TF32
// runs as plain f32. On a CPU with AMX-bf16, a bf16 GEMM runs ~5x an f32 one (2-core Xeon,
// bert-base's shapes): three of them, hi*hi + hi*lo + lo*hi, accumulated in f32, keep ~16
// significant bits (relative error ~4e-6 against f32's ~4e-7) at ~1.5x the f32 GEMM's speed.
// The three products are two GEMMs: x's split [hi | hi | lo] (rows of 3K) against the
// weight's [hi | lo] (made once when the weight is frozen, as many bytes as the f32 weight), the
// first over x's [hi | hi] and the weight's whole rows (K' = 2K), the second adding x's lo
// against the weight's hi (K' = K, the same rows read with a stride of 2K).
#include "cpu/linear_bf16x3.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <dlfcn.h>

#include <cstring>

namespace tp::kernels {
namespace {

// MKL's CBLAS signature (LP64: MKL_INT is int; the enums are ints).
using GemmBf16 = void (*)(int layout, int transa, int transb, int m, int n, int k, float alpha,
                          const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta,
                          float* c, int ldc);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// Looked up in the libraries already loaded (torch's libtorch_cpu exports MKL's CBLAS), not
// linked: a torch without MKL still loads this extension, and the op says it cannot run.
GemmBf16 Gemm() {
  static const GemmBf16 fn = [] {
    void* sym = dlsym(RTLD_DEFAULT, "cblas_gemm_bf16bf16f32");
    if (sym == nullptr) {
      if (void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD)) {
        sym = dlsym(lib, "cblas_gemm_bf16bf16f32");
      }
    }
    return reinterpret_cast<GemmBf16>(sym);
  }();
  return fn;
}

inline uint16_t Bits(c10::BFloat16 v) { return v.x; }

// hi = bf16(v) (round to nearest even), lo = bf16(v - hi); v - hi is exact in f32.
inline void Split(float v, uint16_t* hi, uint16_t* lo) {
  const c10::BFloat16 h(v);
  *hi = Bits(h);
  *lo = Bits(c10::BFloat16(v - static_cast<float>(h)));
}

// Each of `rows` rows of `src` ([rows, k] f32) split into `dst`'s rows of `stride` bf16: hi at
// column 0, lo at column `lo_at`; with `hi_again_at` > 0 hi also there (the activation's
// [hi | hi | lo], whose first GEMM reads [hi | hi]).
void SplitRows(const float* src, int64_t rows, int64_t k, uint16_t* dst, int64_t stride,
               int64_t lo_at, int64_t hi_again_at, int64_t grain) {
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      uint16_t* row = dst + r * stride;
      for (int64_t i = 0; i < k; ++i) Split(src[r * k + i], &row[i], &row[lo_at + i]);
      if (hi_again_at > 0) {
        std::memcpy(row + hi_again_at, row, static_cast<size_t>(k) * sizeof(uint16_t));
      }
    }
  });
}

}  // namespace

bool LinearBf16x3Available() { return Gemm() != nullptr; }

at::Tensor SplitBf16x3WeightCpu(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_cpu(),
              "split_bf16x3_weight: expected a 2-D f32 CPU weight [N, K], got ",
              weight.scalar_type(), " of shape ", weight.sizes());
  const auto w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  auto out = at::empty({n, 2 * k}, w.options().dtype(at::kBFloat16));
  SplitRows(w.data_ptr<float>(), n, k, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()),
            2 * k, /*lo_at=*/k, /*hi_again_at=*/0, /*grain=*/16);
  return out;
}

at::Tensor LinearBf16x3Cpu(const at::Tensor& x, const at::Tensor& weight3,
                           const c10::optional<at::Tensor>& bias) {
  const GemmBf16 gemm = Gemm();
  TORCH_CHECK(gemm != nullptr,
              "linear_bf16x3: this torch build does not export MKL's cblas_gemm_bf16bf16f32; "
              "run the f32 linear instead");
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1,
              "linear_bf16x3: expected an f32 CPU input, got ", x.scalar_type(), " on ",
              x.device());
  TORCH_CHECK(weight3.dim() == 2 && weight3.scalar_type() == at::kBFloat16 &&
                  weight3.size(1) == 2 * x.size(-1),
              "linear_bf16x3: the weight must be split_bf16x3_weight's [N, 2K] for K = ",
              x.size(-1), ", got ", weight3.scalar_type(), " of shape ", weight3.sizes());
  const int64_t k = x.size(-1), n = weight3.size(0);
  const auto a = x.reshape({-1, k}).contiguous();
  const auto w = weight3.contiguous();
  const int64_t m = a.size(0);
  TORCH_CHECK(m < (int64_t{1} << 31) && 3 * k < (int64_t{1} << 31) && n < (int64_t{1} << 31),
              "linear_bf16x3: sizes past 32-bit GEMM dimensions");
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  auto out = at::empty({m, n}, a.options());
  float beta = 0.0f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n && bias->scalar_type() == at::kFloat,
                "linear_bf16x3: bias must be f32 [", n, "], got ", bias->scalar_type(), " of ",
                bias->sizes());
    out.copy_(bias->reshape({1, n}).expand({m, n}));
    beta = 1.0f;
  }
  if (m == 0 || n == 0) return out.reshape(sizes);
  auto split = at::empty({m, 3 * k}, a.options().dtype(at::kBFloat16));
  auto* dst = reinterpret_cast<uint16_t*>(split.data_ptr<at::BFloat16>());
  SplitRows(a.data_ptr<float>(), m, k, dst, 3 * k, /*lo_at=*/2 * k, /*hi_again_at=*/k,
            /*grain=*/8);
  const auto* w_bits = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  // x.hi * w.hi + x.hi * w.lo, then + x.lo * w.hi.
  gemm(kRowMajor, kNoTrans, kTrans, im, in, 2 * ik, 1.0f, dst, 3 * ik, w_bits, 2 * ik, beta,
       out.data_ptr<float>(), in);
  gemm(kRowMajor, kNoTrans, kTrans, im, in, ik, 1.0f, dst + 2 * k, 3 * ik, w_bits, 2 * ik, 1.0f,
       out.data_ptr<float>(), in);
  return out.reshape(sizes);
}

}  // namespace tp::kernels
