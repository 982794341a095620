#include "cost/cpu_peak.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TP_X86 1
#endif

namespace tp::cost {
namespace {

// Each kernel runs `iters` steps of 16 independent FMA chains (more than latency x pipes on
// any current core, so the pipes stay full) and returns the FLOPs done.
// Unrolled in full, so the chains live in registers (rolled, GCC kept them in memory: a third
// of the rate).
constexpr int kChains = 16;
#if defined(__clang__)
#define TP_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define TP_UNROLL _Pragma("GCC unroll 16")
#else
#define TP_UNROLL
#endif

#ifdef TP_X86
__attribute__((target("avx512f"))) double Avx512(long iters, float* sink) {
  __m512 acc[kChains];
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (long it = 0; it < iters; ++it) {
    TP_UNROLL
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  float lanes[16];  // (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized)
  _mm512_storeu_ps(lanes, s);
  *sink = lanes[0] + lanes[15];
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx2,fma"))) double Avx2(long iters, float* sink) {
  __m256 acc[kChains];
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  for (long it = 0; it < iters; ++it) {
    TP_UNROLL
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  *sink = lanes[0] + lanes[7];
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}
#endif

double Scalar(long iters, float* sink) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = static_cast<float>(i);
  for (long it = 0; it < iters; ++it) {
    TP_UNROLL
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  }
  float s = 0;
  for (int i = 0; i < kChains; ++i) s += acc[i];
  *sink = s;
  return 2.0 * kChains * static_cast<double>(iters);
}

using Kernel = double (*)(long, float*);

Kernel Widest() {
#ifdef TP_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Avx2;
#endif
  return Scalar;
}

}  // namespace

double MeasureF32Peak(int threads, double seconds, int tries) {
  threads = std::max(1, threads);
  Kernel kernel = Widest();
  using Clock = std::chrono::steady_clock;
  auto elapsed = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // Steps for about `seconds` on one thread, from a short calibration run.
  std::vector<float> sinks(threads);
  long iters = 1 << 16;
  for (;;) {
    auto t0 = Clock::now();
    kernel(iters, &sinks[0]);
    double s = elapsed(t0);
    if (s >= seconds / 8 || iters > (1L << 40)) {
      iters = std::max(1L, static_cast<long>(iters * seconds / std::max(s, 1e-9)));
      break;
    }
    iters *= 4;
  }
  double best = 0.0;
  for (int t = 0; t < std::max(1, tries); ++t) {
    std::vector<std::thread> pool;
    std::vector<double> flops(threads, 0.0);
    auto t0 = Clock::now();
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&, i] { flops[i] = kernel(iters, &sinks[i]); });
    }
    for (auto& th : pool) th.join();
    double s = elapsed(t0);
    double total = 0.0;
    for (double f : flops) total += f;
    if (s > 0) best = std::max(best, total / s);
  }
  return best;
}

}  // namespace tp::cost
