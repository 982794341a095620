// Split-KV decode attention and the merge of partials on CUDA (FlashDecoding). Sees only
// params.h. Matches the CPU twin kernels/cpu/split_kv_attention.cc, which is what CI tests.
//
// One block per (sequence x head, split). Each warp walks keys of the split with an online
// softmax; lanes hold head_dim / 32 elements of q and of the accumulator, so a score is one
// warp reduction. Warps are combined through shared memory at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "launch.h"

namespace tp::kernels {
namespace {

constexpr int kWarps = 4;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float Cap(float score, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(score / softcap) : score;
}

template <class T, int kPerLane>
__global__ void SplitKvKernel(SplitKvParams p) {
  const int64_t bh = blockIdx.x, split = blockIdx.y;
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const int64_t kvh = h / (p.heads / p.kv_heads);
  const int64_t D = p.head_dim;
  const int64_t len = p.lengths[b], first = p.starts == nullptr ? 0 : p.starts[b];
  const int64_t chunk = (len - first + p.splits - 1) / p.splits;
  const int64_t lo = first + split * chunk, hi = len < lo + chunk ? len : lo + chunk;
  float* out = p.out + (bh * p.splits + split) * D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lo >= hi) {  // empty split: out 0, lse -inf
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[d] = 0.0f;
    if (threadIdx.x == 0) p.lse[bh * p.splits + split] = -INFINITY;
    return;
  }
  const T* q = static_cast<const T*>(p.q) + bh * D;
  const T* kbase = static_cast<const T*>(p.k) + (b * p.kv_heads + kvh) * p.seq * D;
  const T* vbase = static_cast<const T*>(p.v) + (b * p.kv_heads + kvh) * p.seq * D;
  float qv[kPerLane], acc[kPerLane];
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    qv[i] = d < D ? ToFloat(q[d]) * p.scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = lo + warp; j < hi; j += kWarps) {
    const T* krow = kbase + j * D;
    float part = 0.0f;
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) part += qv[i] * ToFloat(krow[d]);
    }
    const float score = Cap(WarpSum(part), p.softcap);
    const float m_new = fmaxf(m, score);
    const float correction = __expf(m - m_new), w = __expf(score - m_new);
    s = s * correction + w;
    const T* vrow = vbase + j * D;
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      acc[i] = acc[i] * correction + (d < D ? w * ToFloat(vrow[d]) : 0.0f);
    }
    m = m_new;
  }
  // Combine the warps: shared [kWarps] m, s and [kWarps][D] accumulators.
  extern __shared__ float shared[];
  float* sm = shared;
  float* ss = shared + kWarps;
  float* sacc = shared + 2 * kWarps;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < D) sacc[warp * D + d] = acc[i];
  }
  __syncthreads();
  float big = -INFINITY;
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, sm[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (sm[w] != -INFINITY) total += ss[w] * __expf(sm[w] - big);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (sm[w] != -INFINITY) o += sacc[w * D + d] * __expf(sm[w] - big);
    out[d] = o / total;
  }
  if (threadIdx.x == 0) p.lse[bh * p.splits + split] = big + logf(total);
}

__global__ void MergeKernel(MergePartialsParams p) {
  const int64_t r = blockIdx.x;
  const float* lse = p.lse + r * p.parts;
  float big = -INFINITY;
  for (int64_t i = 0; i < p.parts; ++i) big = fmaxf(big, lse[i]);
  float* merged = p.merged + r * p.head_dim;
  if (big == -INFINITY) {  // nothing attended
    for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) merged[d] = 0.0f;
    if (threadIdx.x == 0) p.merged_lse[r] = -INFINITY;
    return;
  }
  float total = 0.0f;
  for (int64_t i = 0; i < p.parts; ++i)
    if (lse[i] != -INFINITY) total += __expf(lse[i] - big);
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int64_t i = 0; i < p.parts; ++i)
      if (lse[i] != -INFINITY)
        o += p.out[(r * p.parts + i) * p.head_dim + d] * __expf(lse[i] - big);
    merged[d] = o / total;
  }
  if (threadIdx.x == 0) p.merged_lse[r] = big + logf(total);
}

// Grouped variant: one block per (sequence x KV head, split) serving the head's whole query
// group, so with GQA each K/V row is read once, not once per query head (Llama-3-8B: 4x fewer
// bytes). A lane holds kVec contiguous elements of a row, loaded as one vector (8 or 16 bytes),
// and each warp keeps two rows in flight. Used when head_dim == 32 * kVec and the group is
// 1, 2, 4 or 8; the warp-per-head kernel above covers the rest.
template <class T, int N>
struct alignas(sizeof(T) * N) Row {
  T v[N];
};

constexpr int kGroupedWarps = 8;

template <class T, int kVec, int kGroup>
__device__ __forceinline__ void Attend(const Row<T, kVec>& kr, const Row<T, kVec>& vr,
                                       const float (&qv)[kGroup][kVec], float softcap,
                                       float (&m)[kGroup], float (&s)[kGroup],
                                       float (&acc)[kGroup][kVec]) {
  float kf[kVec], vf[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) kf[i] = ToFloat(kr.v[i]), vf[i] = ToFloat(vr.v[i]);
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) part += qv[g][i] * kf[i];
    const float score = Cap(WarpSum(part), softcap);
    const float m_new = fmaxf(m[g], score);
    const float correction = __expf(m[g] - m_new), w = __expf(score - m_new);
    s[g] = s[g] * correction + w;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][i] = acc[g][i] * correction + w * vf[i];
    m[g] = m_new;
  }
}

template <class T, int kVec, int kGroup>
__global__ void __launch_bounds__(32 * kGroupedWarps) GroupedSplitKvKernel(SplitKvParams p) {
  constexpr int D = 32 * kVec;
  const int64_t bk = blockIdx.x, split = blockIdx.y;
  const int64_t b = bk / p.kv_heads, kvh = bk % p.kv_heads;
  const int64_t len = p.lengths[b], first = p.starts == nullptr ? 0 : p.starts[b];
  const int64_t chunk = (len - first + p.splits - 1) / p.splits;
  const int64_t lo = first + split * chunk, hi = len < lo + chunk ? len : lo + chunk;
  const int64_t bh0 = b * p.heads + kvh * kGroup;  // first query head of the group
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lo >= hi) {
    for (int g = 0; g < kGroup; ++g) {
      float* out = p.out + ((bh0 + g) * p.splits + split) * D;
      for (int d = threadIdx.x; d < D; d += blockDim.x) out[d] = 0.0f;
      if (threadIdx.x == 0) p.lse[(bh0 + g) * p.splits + split] = -INFINITY;
    }
    return;
  }
  const T* kbase = static_cast<const T*>(p.k) + (b * p.kv_heads + kvh) * p.seq * D + lane * kVec;
  const T* vbase = static_cast<const T*>(p.v) + (b * p.kv_heads + kvh) * p.seq * D + lane * kVec;
  float qv[kGroup][kVec], acc[kGroup][kVec], m[kGroup], s[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const Row<T, kVec> qr =
        *reinterpret_cast<const Row<T, kVec>*>(static_cast<const T*>(p.q) + (bh0 + g) * D +
                                               lane * kVec);
#pragma unroll
    for (int i = 0; i < kVec; ++i) qv[g][i] = ToFloat(qr.v[i]) * p.scale, acc[g][i] = 0.0f;
    m[g] = -INFINITY, s[g] = 0.0f;
  }
  using R = Row<T, kVec>;
  int64_t j = lo + warp;
  for (; j + kGroupedWarps < hi; j += 2 * kGroupedWarps) {  // two rows in flight
    const R k0 = *reinterpret_cast<const R*>(kbase + j * D);
    const R v0 = *reinterpret_cast<const R*>(vbase + j * D);
    const R k1 = *reinterpret_cast<const R*>(kbase + (j + kGroupedWarps) * D);
    const R v1 = *reinterpret_cast<const R*>(vbase + (j + kGroupedWarps) * D);
    Attend<T, kVec, kGroup>(k0, v0, qv, p.softcap, m, s, acc);
    Attend<T, kVec, kGroup>(k1, v1, qv, p.softcap, m, s, acc);
  }
  if (j < hi) {
    const R k0 = *reinterpret_cast<const R*>(kbase + j * D);
    const R v0 = *reinterpret_cast<const R*>(vbase + j * D);
    Attend<T, kVec, kGroup>(k0, v0, qv, p.softcap, m, s, acc);
  }
  // Combine the warps per query head through shared memory, one head at a time.
  __shared__ float sm[kGroupedWarps], ss[kGroupedWarps];
  __shared__ float sacc[kGroupedWarps][D];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (lane == 0) sm[warp] = m[g], ss[warp] = s[g];
#pragma unroll
    for (int i = 0; i < kVec; ++i) sacc[warp][lane * kVec + i] = acc[g][i];
    __syncthreads();
    float big = -INFINITY;
    for (int w = 0; w < kGroupedWarps; ++w) big = fmaxf(big, sm[w]);
    float total = 0.0f;
    for (int w = 0; w < kGroupedWarps; ++w)
      if (sm[w] != -INFINITY) total += ss[w] * __expf(sm[w] - big);
    float* out = p.out + ((bh0 + g) * p.splits + split) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kGroupedWarps; ++w)
        if (sm[w] != -INFINITY) o += sacc[w][d] * __expf(sm[w] - big);
      out[d] = o / total;
    }
    if (threadIdx.x == 0) p.lse[(bh0 + g) * p.splits + split] = big + logf(total);
    __syncthreads();  // before the next head overwrites the shared partials
  }
}

template <class T, int kVec>
cudaError_t LaunchGroupedVec(const SplitKvParams& p, int64_t group, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), static_cast<unsigned>(p.splits));
  const dim3 block(32 * kGroupedWarps);
  switch (group) {
    case 1:
      GroupedSplitKvKernel<T, kVec, 1><<<grid, block, 0, stream>>>(p);
      break;
    case 2:
      GroupedSplitKvKernel<T, kVec, 2><<<grid, block, 0, stream>>>(p);
      break;
    case 4:
      GroupedSplitKvKernel<T, kVec, 4><<<grid, block, 0, stream>>>(p);
      break;
    case 8:
      GroupedSplitKvKernel<T, kVec, 8><<<grid, block, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// cudaErrorNotSupported: this shape is for the warp-per-head kernel.
template <class T>
cudaError_t LaunchGrouped(const SplitKvParams& p, cudaStream_t stream) {
  const int64_t group = p.heads / p.kv_heads;
  if (p.heads % p.kv_heads != 0 || (group != 1 && group != 2 && group != 4 && group != 8))
    return cudaErrorNotSupported;
  // Rows are loaded as vectors: every base pointer must be aligned to one lane's slice.
  const auto aligned = [&](int64_t vec) {
    const uintptr_t bytes = sizeof(T) * vec;
    return reinterpret_cast<uintptr_t>(p.q) % bytes == 0 &&
           reinterpret_cast<uintptr_t>(p.k) % bytes == 0 &&
           reinterpret_cast<uintptr_t>(p.v) % bytes == 0;
  };
  switch (p.head_dim) {
    case 64:
      return aligned(2) ? LaunchGroupedVec<T, 2>(p, group, stream) : cudaErrorNotSupported;
    case 128:
      return aligned(4) ? LaunchGroupedVec<T, 4>(p, group, stream) : cudaErrorNotSupported;
    case 256:
      return aligned(8) ? LaunchGroupedVec<T, 8>(p, group, stream) : cudaErrorNotSupported;
    default:
      return cudaErrorNotSupported;
  }
}

template <class T>
cudaError_t LaunchTyped(const SplitKvParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>(p.splits));
  const size_t shared = (2 * kWarps + kWarps * p.head_dim) * sizeof(float);
  if (p.head_dim <= 64) {
    SplitKvKernel<T, 2><<<grid, 32 * kWarps, shared, stream>>>(p);
  } else if (p.head_dim <= 128) {
    SplitKvKernel<T, 4><<<grid, 32 * kWarps, shared, stream>>>(p);
  } else if (p.head_dim <= 256) {
    SplitKvKernel<T, 8><<<grid, 32 * kWarps, shared, stream>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSplitKvAttention(const SplitKvParams& p, cudaStream_t stream,
                                   SplitKvVariant variant) {
  if (p.batch * p.heads == 0) return cudaSuccess;
  if (variant != SplitKvVariant::kWarpPerHead) {
    cudaError_t err = cudaErrorNotSupported;
    switch (p.kind) {
      case ScalarKind::kFloat32:
        err = LaunchGrouped<float>(p, stream);
        break;
      case ScalarKind::kFloat16:
        err = LaunchGrouped<__half>(p, stream);
        break;
      case ScalarKind::kBFloat16:
        err = LaunchGrouped<__nv_bfloat16>(p, stream);
        break;
      default:
        break;
    }
    if (err != cudaErrorNotSupported || variant == SplitKvVariant::kGrouped) return err;
  }
  switch (p.kind) {
    case ScalarKind::kFloat32:
      return LaunchTyped<float>(p, stream);
    case ScalarKind::kFloat16:
      return LaunchTyped<__half>(p, stream);
    case ScalarKind::kBFloat16:
      return LaunchTyped<__nv_bfloat16>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchMergeAttentionPartials(const MergePartialsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  MergeKernel<<<static_cast<unsigned>(p.rows), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tp::kernels
