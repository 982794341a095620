// Vector helpers shared by our CPU attention kernels (split-KV decode, flash prefill).
//
// Inner loops are compiled twice (x86-64-v3, i.e. AVX2+FMA, and baseline) and picked at load
// time by GCC's target_clones resolver, so the build runs on any x86-64 and uses AVX2 where it
// exists. ("arch=haswell" would not do: its resolver tests the CPU model, so AMD never gets it.)
#pragma once

#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TP_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TP_MULTIVERSION
#endif

namespace tp::kernels::vec {

// GCC vector extensions: 8 floats in one register on AVX2, two on SSE, in every clone; loads
// go through memcpy, so rows need no alignment. (The type itself keeps its natural alignment:
// declared 4-aligned, GCC kept a 4 x 16 tile's accumulators on the stack, a load and a store
// per FMA, 7x slower than ATen's flash attention on BERT's shapes.)
typedef float V8 __attribute__((vector_size(32)));

// always_inline: a 32-byte vector passed by value between an AVX2 clone and a baseline one
// would not agree on the calling convention.
__attribute__((always_inline)) inline V8 Load8(const float* p) {
  V8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

__attribute__((always_inline)) inline void Store8(float* p, V8 v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

__attribute__((always_inline)) inline float Sum8(V8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// x[i] = exp(x[i] - shift) (x[i] <= shift), returning the sum. A branch-free Cephes-style expf
// (range reduction by ln 2, degree-6 polynomial, exponent by bit shift; ~2 ulp) on eight lanes;
// libm's expf is a call per element. Inputs below shift - 87 (a -inf mask) give exactly 0;
// NaN stays NaN.
float ExpShiftedSum(float* x, int64_t n, float shift);

// max(x[0..n)) over its non-NaN elements; -inf for n == 0 or all NaN. (Propagating NaN here
// cost 8% of flash attention; its caller finds NaN where it matters, see there.)
float MaxOf(const float* x, int64_t n);

}  // namespace tp::kernels::vec
