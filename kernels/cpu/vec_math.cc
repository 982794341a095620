#include "cpu/vec_math.h"

#include <cmath>
#include <limits>

namespace tp::kernels::vec {
namespace {

typedef int32_t V8I __attribute__((vector_size(32)));

// Cephes-style expf: range reduction by ln 2, degree-6 polynomial, exponent by bit shift
// (~2 ulp); v >= -87, so the exponent never underflows.
inline float ExpOne(float v) {
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
inline V8 Exp8(V8 v) {
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
  return y * (V8)bits;  // a cast between same-size vector types keeps the bits
}

}  // namespace

TP_MULTIVERSION float ExpShiftedSum(float* x, int64_t n, float shift) {
  V8 lanes = {};  // the sum in eight lanes: float addition does not reassociate on its own
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 v = Load8(x + i) - shift;
    v = v < -87.0f ? V8{} - 87.0f : v;
    const V8 e = Exp8(v);
    Store8(x + i, e);
    lanes += e;
  }
  float total = Sum8(lanes);
  for (; i < n; ++i) {
    const float v = x[i] - shift;
    x[i] = ExpOne(v < -87.0f ? -87.0f : v);
    total += x[i];
  }
  return total;
}

TP_MULTIVERSION float MaxOf(const float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  V8 m = V8{} + kNegInf;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V8 v = Load8(x + i);
    m = v > m ? v : m;
  }
  float best = kNegInf;
  for (int k = 0; k < 8; ++k) best = m[k] > best ? m[k] : best;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

}  // namespace tp::kernels::vec
