// Fused bias + GeLU forward and backward on CUDA. Sees only params.h (no torch).
// One thread per element with a grid-stride loop; half/bf16 load and store in their type and
// compute in float, matching the CPU twin in kernels/cpu/bias_gelu.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../gelu_math.h"
#include "launch.h"

namespace tp::kernels {
namespace {

template <class T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };

template <class T>
__device__ __forceinline__ typename Compute<T>::type Load(const T* p, int64_t i) {
  return static_cast<typename Compute<T>::type>(p[i]);
}
template <>
__device__ __forceinline__ float Load<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
template <>
__device__ __forceinline__ float Load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

template <class T> __device__ __forceinline__ T Store(float v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half Store<__half>(float v) { return __float2half(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

template <class T>
__global__ void BiasGeluKernel(const T* x, const T* bias, T* out, int64_t n, int64_t cols,
                               GeluApprox approx) {
  using C = typename Compute<T>::type;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const C v = Load(x, i) + Load(bias, i % cols);
    const C y = approx == GeluApprox::kNone ? GeluExact(v) : GeluTanh(v);
    if constexpr (std::is_same_v<T, double>) {
      out[i] = y;
    } else {
      out[i] = Store<T>(static_cast<float>(y));
    }
  }
}

template <class T>
__global__ void BiasGeluBackwardKernel(const T* grad, const T* x, const T* bias, T* grad_in,
                                       int64_t n, int64_t cols, GeluApprox approx) {
  using C = typename Compute<T>::type;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const C v = Load(x, i) + Load(bias, i % cols);
    const C d = approx == GeluApprox::kNone ? GeluExactGrad(v) : GeluTanhGrad(v);
    const C g = Load(grad, i) * d;
    if constexpr (std::is_same_v<T, double>) {
      grad_in[i] = g;
    } else {
      grad_in[i] = Store<T>(static_cast<float>(g));
    }
  }
}

dim3 GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return dim3(static_cast<unsigned>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8));
}

// Calls fn with a value of the element type named by `kind`, then reports the launch status.
template <class Fn>
cudaError_t DispatchKind(ScalarKind kind, Fn&& fn) {
  switch (kind) {
    case ScalarKind::kFloat32: fn(float{}); break;
    case ScalarKind::kFloat64: fn(double{}); break;
    case ScalarKind::kFloat16: fn(__half{}); break;
    case ScalarKind::kBFloat16: fn(__nv_bfloat16{}); break;
  }
  return cudaGetLastError();
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t LaunchBiasGelu(const BiasGeluParams& p, cudaStream_t stream) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return cudaSuccess;
  return DispatchKind(p.kind, [&](auto tag) {
    using T = decltype(tag);
    BiasGeluKernel<T><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(p.x), static_cast<const T*>(p.bias), static_cast<T*>(p.out), n,
        p.cols, p.approx);
  });
}

cudaError_t LaunchBiasGeluBackward(const BiasGeluBackwardParams& p, cudaStream_t stream) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return cudaSuccess;
  return DispatchKind(p.kind, [&](auto tag) {
    using T = decltype(tag);
    BiasGeluBackwardKernel<T><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(p.grad), static_cast<const T*>(p.x), static_cast<const T*>(p.bias),
        static_cast<T*>(p.grad_in), n, p.cols, p.approx);
  });
}

}  // namespace tp::kernels
