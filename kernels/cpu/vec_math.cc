#include "cpu/vec_math.h"

#include <cmath>
#include <limits>

namespace tp::kernels::vec {
namespace {

typedef int32_t V8I __attribute__((vector_size(32)));

// Cephes-style expf: range reduction by ln 2, degree-6 polynomial, exponent by bit shift
// (~2 ulp). Below -87 (where expf is under 1.6e-38) it returns 0, so a -inf mask weighs
// exactly nothing; NaN stays NaN.
inline float ExpOne(float v) {
  if (v != v) return v;  // NaN: the int conversion below would be undefined
  if (v < -87.0f) return 0.0f;
  const float fn = std::floor(v * 1.44269504088896341f + 0.5f);
  const float r = v - fn * 0.693359375f + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// The same on eight lanes, written with vector types: GCC did not vectorise the scalar loop
// (its floor and bit cast), which left the exp the costliest part of flash attention.
__attribute__((always_inline)) inline V8 Exp8(V8 v) {
  const V8 in = v;
  v = v < -87.0f ? V8{} - 87.0f : v;  // keeps the exponent in range; those lanes give 0 below
  const V8 fx = v * 1.44269504088896341f + 0.5f;
  V8 fn = __builtin_convertvector(__builtin_convertvector(fx, V8I), V8);  // truncated
  fn += __builtin_convertvector(fn > fx, V8);  // floor: -1 where truncation rounded up
  const V8 r = v - fn * 0.693359375f + fn * 2.12194440e-4f;
  V8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V8 y = p * r * r + r + 1.0f;
  const V8I bits = (__builtin_convertvector(fn, V8I) + 127) << 23;
  const V8 e = y * (V8)bits;  // a cast between same-size vector types keeps the bits
  return in < -87.0f ? V8{} : e;  // NaN lanes compare false and stay NaN
}

}  // namespace

TP_MULTIVERSION float ExpShiftedSum(float* x, int64_t n, float shift) {
  V8 lanes = {};  // the sum in eight lanes: float addition does not reassociate on its own
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V8 e = Exp8(Load8(x + i) - shift);
    Store8(x + i, e);
    lanes += e;
  }
  float total = Sum8(lanes);
  for (; i < n; ++i) {
    x[i] = ExpOne(x[i] - shift);
    total += x[i];
  }
  return total;
}

TP_MULTIVERSION float MaxOf(const float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  V8 m0 = V8{} + kNegInf, m1 = m0;  // two chains: a compare-and-select per step has latency
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const V8 a = Load8(x + i), b = Load8(x + i + 8);
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
  }
  if (i + 8 <= n) {
    const V8 a = Load8(x + i);
    m0 = a > m0 ? a : m0;
    i += 8;
  }
  m0 = m1 > m0 ? m1 : m0;
  float best = kNegInf;
  for (int k = 0; k < 8; ++k) best = m0[k] > best ? m0[k] : best;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

}  // namespace tp::kernels::vec
