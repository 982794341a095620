// Fused bias + GeLU forward and backward on CUDA. Sees only params.h (no torch).
// float/half/bf16 tensors take the flat vector kernels: each thread moves 16 bytes per access
// with 1-2 accesses in flight, over the tensor as one flat array, any row length (issue 40:
// the scalar kernel reached 0.2-0.45 of the copy bandwidth). The column-vector kernels (a
// thread owns a column, bias in registers) are kept for comparison (TP_BIAS_GELU=column).
// float64 and unaligned tensors take one thread per element. All compute in float (double for
// float64), matching the CPU twin in kernels/cpu/bias_gelu.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string_view>
#include <type_traits>

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

// 16 bytes of T as N = 16 / sizeof(T) elements.
template <class T>
struct alignas(16) Vec {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

template <class T>
__device__ __forceinline__ float ToF(T x) {
  return Load(&x, 0);
}

constexpr int kUnroll = 4;

// A thread owns one column vector (its bias stays in registers: no per-element modulo or bias
// load) and walks `rows_per_thread` rows from its first, kUnroll loads in flight; a warp's
// threads read consecutive vectors of one row.
template <class T>
__global__ void __launch_bounds__(256) BiasGeluVecKernel(const Vec<T>* __restrict__ x,
                                                         const Vec<T>* __restrict__ bias,
                                                         Vec<T>* __restrict__ out, int64_t rows,
                                                         int64_t cols, int64_t rows_per_thread,
                                                         GeluApprox approx) {
  constexpr int N = Vec<T>::N;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float bf[N];
  const Vec<T> b = bias[c];
#pragma unroll
  for (int e = 0; e < N; ++e) bf[e] = ToF(b.v[e]);
  const int64_t r0 = (static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y) * rows_per_thread;
  const int64_t r1 = rows < r0 + rows_per_thread ? rows : r0 + rows_per_thread;
  for (int64_t r = r0; r < r1; r += kUnroll) {
    Vec<T> xs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (r + u < r1)  // read once: stream past L1
        *reinterpret_cast<float4*>(&xs[u]) =
            __ldcs(reinterpret_cast<const float4*>(x + (r + u) * cols + c));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u >= r1) continue;
      Vec<T> y;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float v = ToF(xs[u].v[e]) + bf[e];
        y.v[e] = Store<T>(approx == GeluApprox::kNone ? GeluExact(v) : GeluTanh(v));
      }
      out[(r + u) * cols + c] = y;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(256) BiasGeluBackwardVecKernel(
    const Vec<T>* __restrict__ grad, const Vec<T>* __restrict__ x,
    const Vec<T>* __restrict__ bias, Vec<T>* __restrict__ grad_in, int64_t rows, int64_t cols,
    int64_t rows_per_thread, GeluApprox approx) {
  constexpr int N = Vec<T>::N;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float bf[N];
  const Vec<T> b = bias[c];
#pragma unroll
  for (int e = 0; e < N; ++e) bf[e] = ToF(b.v[e]);
  const int64_t r0 = (static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y) * rows_per_thread;
  const int64_t r1 = rows < r0 + rows_per_thread ? rows : r0 + rows_per_thread;
  for (int64_t r = r0; r < r1; r += kUnroll) {
    Vec<T> gs[kUnroll], xs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (r + u < r1) {
        *reinterpret_cast<float4*>(&gs[u]) =
            __ldcs(reinterpret_cast<const float4*>(grad + (r + u) * cols + c));
        *reinterpret_cast<float4*>(&xs[u]) =
            __ldcs(reinterpret_cast<const float4*>(x + (r + u) * cols + c));
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u >= r1) continue;
      Vec<T> y;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float v = ToF(xs[u].v[e]) + bf[e];
        const float d = approx == GeluApprox::kNone ? GeluExactGrad(v) : GeluTanhGrad(v);
        y.v[e] = Store<T>(ToF(gs[u].v[e]) * d);
      }
      grad_in[(r + u) * cols + c] = y;
    }
  }
}

// The N bias values of flat vector i: one aligned vector where rows are whole vectors
// (kBiasVec; cols counted in vectors), else N scalars from column (i * N) % cols on, wrapping at
// the row's end (cols counted in elements). Read through the read-only cache: the bias is tiny
// and every block reads it.
template <class T, class I, bool kBiasVec>
__device__ __forceinline__ void LoadBias(const T* __restrict__ bias, I i, I cols,
                                         float (&bf)[Vec<T>::N]) {
  constexpr int N = Vec<T>::N;
  if constexpr (kBiasVec) {
    const float4 raw = __ldg(reinterpret_cast<const float4*>(bias) + i % cols);
    const Vec<T> b = *reinterpret_cast<const Vec<T>*>(&raw);
#pragma unroll
    for (int e = 0; e < N; ++e) bf[e] = ToF(b.v[e]);
  } else {
    I c = (i * N) % cols;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      bf[e] = ToF(__ldg(bias + c));
      c = c + 1 == cols ? 0 : c + 1;
    }
  }
}

constexpr int kFlatThreads = 256;

// Flat and grid-stride, any row length (issue 40: the column kernels above left a partial last
// wave of blocks, and rows that are not whole vectors fell to one thread per element). Thread t
// moves vectors base + u * 256 (u < U, all loads in flight first), so a warp's accesses are 512
// contiguous bytes and a block's U * 4 KB; the n % N elements past the last whole vector are
// block 0's. I: 32-bit indices where they fit (their modulo is several times cheaper). U: 2
// for large tensors, 1 for small ones, which would otherwise get too few blocks to fill the GPU.
// kStream: x (and grad) loaded with the evict-first streaming hint (ld.global.cs), else plain
// (the default: 1-4% faster on an H100).
template <class T>
__device__ __forceinline__ float4 LoadVec(const Vec<T>* p, bool stream) {
  return stream ? __ldcs(reinterpret_cast<const float4*>(p))
                : *reinterpret_cast<const float4*>(p);
}

template <class T, class I, bool kBiasVec, int U, bool kStream>
__global__ void __launch_bounds__(kFlatThreads)
    BiasGeluFlatKernel(const Vec<T>* __restrict__ x, const T* __restrict__ bias,
                       Vec<T>* __restrict__ out, I nvec, I cols, I tail, GeluApprox approx) {
  constexpr int N = Vec<T>::N;
  const I step = static_cast<I>(gridDim.x) * (kFlatThreads * U);
  for (I base = static_cast<I>(blockIdx.x) * (kFlatThreads * U) + threadIdx.x; base < nvec;
       base += step) {
    Vec<T> xs[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + u * kFlatThreads;
      if (i < nvec)  // read once: stream past L1
        *reinterpret_cast<float4*>(&xs[u]) = LoadVec(x + i, kStream);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + u * kFlatThreads;
      if (i >= nvec) continue;
      float bf[N];
      LoadBias<T, I, kBiasVec>(bias, i, cols, bf);
      Vec<T> y;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float v = ToF(xs[u].v[e]) + bf[e];
        y.v[e] = Store<T>(approx == GeluApprox::kNone ? GeluExact(v) : GeluTanh(v));
      }
      out[i] = y;
    }
  }
  if (blockIdx.x == 0 && static_cast<I>(threadIdx.x) < tail) {  // (kBiasVec: tail is 0)
    const I e = nvec * N + threadIdx.x;
    const float v = Load(reinterpret_cast<const T*>(x), e) + Load(bias, e % cols);
    reinterpret_cast<T*>(out)[e] =
        Store<T>(approx == GeluApprox::kNone ? GeluExact(v) : GeluTanh(v));
  }
}

template <class T, class I, bool kBiasVec, int U, bool kStream>
__global__ void __launch_bounds__(kFlatThreads)
    BiasGeluBackwardFlatKernel(const Vec<T>* __restrict__ grad, const Vec<T>* __restrict__ x,
                               const T* __restrict__ bias, Vec<T>* __restrict__ grad_in, I nvec,
                               I cols, I tail, GeluApprox approx) {
  constexpr int N = Vec<T>::N;
  const I step = static_cast<I>(gridDim.x) * (kFlatThreads * U);
  for (I base = static_cast<I>(blockIdx.x) * (kFlatThreads * U) + threadIdx.x; base < nvec;
       base += step) {
    Vec<T> gs[U], xs[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + u * kFlatThreads;
      if (i < nvec) {
        *reinterpret_cast<float4*>(&gs[u]) = LoadVec(grad + i, kStream);
        *reinterpret_cast<float4*>(&xs[u]) = LoadVec(x + i, kStream);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + u * kFlatThreads;
      if (i >= nvec) continue;
      float bf[N];
      LoadBias<T, I, kBiasVec>(bias, i, cols, bf);
      Vec<T> y;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float v = ToF(xs[u].v[e]) + bf[e];
        const float d = approx == GeluApprox::kNone ? GeluExactGrad(v) : GeluTanhGrad(v);
        y.v[e] = Store<T>(ToF(gs[u].v[e]) * d);
      }
      grad_in[i] = y;
    }
  }
  if (blockIdx.x == 0 && static_cast<I>(threadIdx.x) < tail) {
    const I e = nvec * N + threadIdx.x;
    const float v = Load(reinterpret_cast<const T*>(x), e) + Load(bias, e % cols);
    const float d = approx == GeluApprox::kNone ? GeluExactGrad(v) : GeluTanhGrad(v);
    reinterpret_cast<T*>(grad_in)[e] = Store<T>(Load(reinterpret_cast<const T*>(grad), e) * d);
  }
}

// TP_BIAS_GELU=column: the column-vector kernels where they apply; flat:U:plain|cs forces the
// flat kernels' unroll (1, 2, 4) and load hint (benchmarks compare them with the default: flat,
// unroll chosen by size, plain loads). On an H100 (benchmarks/results/gpu_kernels.json, 58d8312)
// plain loads beat the evict-first hint by 1-4% on large tensors, unroll 2 was the best
// compromise there across dtypes (fp32 1.00x Inductor, bf16 1.06x, fp16 1.10x), and unroll 1
// on tensors under ~35 MB.
struct FlatChoice {
  bool column = false;
  int unroll = 0;  // 0: by size
  bool stream = false;
};
FlatChoice FlatChoiceFromEnv() {
  FlatChoice c;
  const char* v = std::getenv("TP_BIAS_GELU");
  if (v == nullptr) return c;
  const std::string_view s(v);
  if (s == "column") {
    c.column = true;
  } else if (s.size() >= 7 && s.substr(0, 5) == "flat:") {
    c.unroll = s[5] == '1' ? 1 : (s[5] == '2' ? 2 : 4);
    c.stream = s.substr(7) == "cs";
  }
  return c;
}

// Launches a flat kernel: fn(T{}, I{}, unroll, bias_vec, nvec, cols, tail, blocks), with I the
// index type and unroll 2 where unroll 4 would still give 16 blocks per SM, else 1.
template <class T, class Fn>
void LaunchFlat(int64_t n, int64_t cols, bool bias_aligned, int forced_unroll, Fn&& fn) {
  constexpr int N = Vec<T>::N;
  const int64_t nvec = n / N;
  const bool bias_vec = cols % N == 0 && bias_aligned;
  int device = 0, sms = 132;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  int unroll = nvec >= int64_t{16} * sms * kFlatThreads * 4 ? 2 : 1;
  if (forced_unroll > 0) unroll = forced_unroll;
  const int64_t per_block = int64_t{kFlatThreads} * unroll;
  const int64_t blocks64 = (nvec + per_block - 1) / per_block;
  const unsigned blocks = static_cast<unsigned>(blocks64 < (1 << 20) ? (blocks64 > 0 ? blocks64 : 1)
                                                                     : (1 << 20));
  const int64_t c = bias_vec ? cols / N : cols;
  if (n < (int64_t{1} << 31)) {
    fn(uint32_t{}, unroll, bias_vec, static_cast<uint32_t>(nvec), static_cast<uint32_t>(c),
       static_cast<uint32_t>(n - nvec * N), blocks);
  } else {
    fn(int64_t{}, unroll, bias_vec, nvec, c, n - nvec * N, blocks);
  }
}

// The flat kernel for (bias_vec, unroll, stream). The forced variants (unroll 4, streaming
// loads) exist for 32-bit indices only, what benchmarks measure; 64-bit indices take the
// defaults (unroll 1 or 2, plain loads).
template <template <class, class, bool, int, bool> class K, class T, class I>
auto PickFlat(bool bias_vec, int unroll, bool stream) {
  if constexpr (std::is_same_v<I, uint32_t>) {
    if (stream) {
      if (unroll == 4) return bias_vec ? K<T, I, true, 4, true>::fn : K<T, I, false, 4, true>::fn;
      if (unroll == 2) return bias_vec ? K<T, I, true, 2, true>::fn : K<T, I, false, 2, true>::fn;
      return bias_vec ? K<T, I, true, 1, true>::fn : K<T, I, false, 1, true>::fn;
    }
    if (unroll == 4) return bias_vec ? K<T, I, true, 4, false>::fn : K<T, I, false, 4, false>::fn;
  }
  if (unroll == 1) return bias_vec ? K<T, I, true, 1, false>::fn : K<T, I, false, 1, false>::fn;
  return bias_vec ? K<T, I, true, 2, false>::fn : K<T, I, false, 2, false>::fn;
}
template <class T, class I, bool B, int U, bool S>
struct FwdFlat {
  static constexpr auto fn = BiasGeluFlatKernel<T, I, B, U, S>;
};
template <class T, class I, bool B, int U, bool S>
struct BwdFlat {
  static constexpr auto fn = BiasGeluBackwardFlatKernel<T, I, B, U, S>;
};


// Launch shape of the vector kernels over rows x cols column vectors: blockDim.x covers up to
// 256 vectors of a row (whole warps), blockDim.y the rest of 256 threads; each thread walks
// 16 rows (more where the grid's y limit requires).
struct VecLaunch {
  dim3 grid, block;
  int64_t rows_per_thread;
};

VecLaunch VecShape(int64_t rows, int64_t cols) {
  const int64_t bx = cols >= 256 ? 256 : (cols + 31) / 32 * 32;
  const int64_t by = 256 / bx;
  int64_t per = 16;
  while ((rows + by * per - 1) / (by * per) > 65535) per *= 2;
  VecLaunch v;
  v.block = dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  v.grid = dim3(static_cast<unsigned>((cols + bx - 1) / bx),
                static_cast<unsigned>((rows + by * per - 1) / (by * per)));
  v.rows_per_thread = per;
  return v;
}

// Whether the vector kernels apply: float/half/bf16, rows a whole number of vectors, and
// every pointer 16-byte aligned.
bool Aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

bool Vectorizable(ScalarKind kind, int64_t cols, std::initializer_list<const void*> ptrs) {
  if (kind == ScalarKind::kFloat64) return false;
  const int64_t n = kind == ScalarKind::kFloat32 ? 4 : 8;
  return cols % n == 0 && Aligned16(ptrs);
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
  const FlatChoice choice = FlatChoiceFromEnv();
  if (p.kind != ScalarKind::kFloat64 && Aligned16({p.x, p.out}) && !choice.column) {
    return DispatchKind(p.kind, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        const auto launch = [&](auto itag, int unroll, bool bias_vec, auto nvec, auto cols,
                                auto tail, unsigned blocks) {
          using I = decltype(itag);
          const auto kernel = PickFlat<FwdFlat, T, I>(bias_vec, unroll, choice.stream);
          kernel<<<blocks, kFlatThreads, 0, stream>>>(
              static_cast<const Vec<T>*>(p.x), static_cast<const T*>(p.bias),
              static_cast<Vec<T>*>(p.out), nvec, cols, tail, p.approx);
        };
        LaunchFlat<T>(n, p.cols, Aligned16({p.bias}), choice.unroll, launch);
      }
    });
  }
  if (Vectorizable(p.kind, p.cols, {p.x, p.bias, p.out})) {
    return DispatchKind(p.kind, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        const VecLaunch v = VecShape(p.rows, p.cols / Vec<T>::N);
        BiasGeluVecKernel<T><<<v.grid, v.block, 0, stream>>>(
            static_cast<const Vec<T>*>(p.x), static_cast<const Vec<T>*>(p.bias),
            static_cast<Vec<T>*>(p.out), p.rows, p.cols / Vec<T>::N, v.rows_per_thread, p.approx);
      }
    });
  }
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
  const FlatChoice choice = FlatChoiceFromEnv();
  if (p.kind != ScalarKind::kFloat64 && Aligned16({p.grad, p.x, p.grad_in}) && !choice.column) {
    return DispatchKind(p.kind, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        const auto launch = [&](auto itag, int unroll, bool bias_vec, auto nvec, auto cols,
                                auto tail, unsigned blocks) {
          using I = decltype(itag);
          const auto kernel = PickFlat<BwdFlat, T, I>(bias_vec, unroll, choice.stream);
          kernel<<<blocks, kFlatThreads, 0, stream>>>(
              static_cast<const Vec<T>*>(p.grad), static_cast<const Vec<T>*>(p.x),
              static_cast<const T*>(p.bias), static_cast<Vec<T>*>(p.grad_in), nvec, cols, tail,
              p.approx);
        };
        LaunchFlat<T>(n, p.cols, Aligned16({p.bias}), choice.unroll, launch);
      }
    });
  }
  if (Vectorizable(p.kind, p.cols, {p.grad, p.x, p.bias, p.grad_in})) {
    return DispatchKind(p.kind, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        const VecLaunch v = VecShape(p.rows, p.cols / Vec<T>::N);
        BiasGeluBackwardVecKernel<T><<<v.grid, v.block, 0, stream>>>(
            static_cast<const Vec<T>*>(p.grad), static_cast<const Vec<T>*>(p.x),
            static_cast<const Vec<T>*>(p.bias), static_cast<Vec<T>*>(p.grad_in), p.rows,
            p.cols / Vec<T>::N, v.rows_per_thread, p.approx);
      }
    });
  }
  return DispatchKind(p.kind, [&](auto tag) {
    using T = decltype(tag);
    BiasGeluBackwardKernel<T><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(p.grad), static_cast<const T*>(p.x), static_cast<const T*>(p.bias),
        static_cast<T*>(p.grad_in), n, p.cols, p.approx);
  });
}

}  // namespace tp::kernels
