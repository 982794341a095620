// GeLU and its derivative in one place for both devices, computed in float (or double).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define TP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TP_HOST_DEVICE inline
#endif

namespace tp::kernels {

template <class T>
TP_HOST_DEVICE T GeluExact(T v) {
  const T kInvSqrt2 = T(0.70710678118654752440);
  return T(0.5) * v * (T(1) + erf(v * kInvSqrt2));
}

template <class T>
TP_HOST_DEVICE T GeluTanh(T v) {
  const T kSqrt2OverPi = T(0.79788456080286535588);
  const T kCoeff = T(0.044715);
  return T(0.5) * v * (T(1) + tanh(kSqrt2OverPi * (v + kCoeff * v * v * v)));
}

template <class T>
TP_HOST_DEVICE T GeluExactGrad(T v) {
  const T kInvSqrt2 = T(0.70710678118654752440);
  const T kInvSqrt2Pi = T(0.39894228040143267794);
  const T cdf = T(0.5) * (T(1) + erf(v * kInvSqrt2));
  const T pdf = kInvSqrt2Pi * exp(T(-0.5) * v * v);
  return cdf + v * pdf;
}

template <class T>
TP_HOST_DEVICE T GeluTanhGrad(T v) {
  const T kSqrt2OverPi = T(0.79788456080286535588);
  const T kCoeff = T(0.044715);
  const T inner = kSqrt2OverPi * (v + kCoeff * v * v * v);
  const T t = tanh(inner);
  const T dinner = kSqrt2OverPi * (T(1) + T(3) * kCoeff * v * v);
  return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * dinner;
}

}  // namespace tp::kernels
