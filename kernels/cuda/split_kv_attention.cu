// Split-KV decode attention and the merge of partials on CUDA (FlashDecoding). Sees only
// params.h. Matches the CPU twin kernels/cpu/split_kv_attention.cc, which is what CI tests.
//
// One block per (sequence x head, split). Each warp walks keys of the split with an online
// softmax; lanes hold head_dim / 32 elements of q and of the accumulator, so a score is one
// warp reduction. Warps are combined through shared memory at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

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

template <class T, int kPerLane>
__global__ void SplitKvKernel(SplitKvParams p) {
  const int64_t bh = blockIdx.x, split = blockIdx.y;
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const int64_t kvh = h / (p.heads / p.kv_heads);
  const int64_t D = p.head_dim;
  const int64_t len = p.lengths[b];
  const int64_t chunk = (len + p.splits - 1) / p.splits;
  const int64_t lo = split * chunk, hi = len < lo + chunk ? len : lo + chunk;
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
    const float score = WarpSum(part);
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

cudaError_t LaunchSplitKvAttention(const SplitKvParams& p, cudaStream_t stream) {
  if (p.batch * p.heads == 0) return cudaSuccess;
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
