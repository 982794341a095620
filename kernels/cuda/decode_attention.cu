// Decode attention (one query token per sequence over a KV cache) on tensor cores, with the
// merge of the KV splits fused into the same launch. Sees only params.h (no torch).
//
// Why this shape (issue 40): decode reads every K/V byte once and does little arithmetic, so the
// kernel must keep HBM busy. One block serves a KV head's whole query group (each K/V row is read
// once for all its query heads), and computes with the roles swapped (S^T = K Q^T, O^T = V^T P^T)
// so that the query heads are the mma's N = 8 side: up to 8 heads per n-tile waste nothing, and
// the output accumulator is D/16 x 4 floats per lane. K/V tiles stream into shared memory with
// 16-byte cp.async, kStages deep; each of the 4 warps takes 16 keys of a 64-key tile and keeps
// its own online softmax, and the warps are combined once at the end. The split count fills the
// device once; the last block of each unit to finish merges the splits (a counter per unit), so
// there is no second launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "launch.h"

namespace tp::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeysPerWarp = 16;
constexpr int kTile = kWarps * kKeysPerWarp;  // keys per pipeline stage
constexpr int kMaxSplits = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
struct Layout {
  static constexpr int kStride = D + 8;  // +16 bytes per row: ldmatrix rows hit distinct banks
  static constexpr int kStages = D <= 128 ? 3 : 2;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kStageElems = kTile * kStride;
  static constexpr int kPipeBytes = 2 * kStages * kStageElems * 2;  // K and V, 2-byte elements
  // The epilogue reuses the same memory: per warp 16 heads of (m, l, D accumulators), and the
  // merge's weights [16][kMaxSplits].
  static constexpr int kCombineBytes = kWarps * 16 * (D + 2) * 4;
  static constexpr int kMergeBytes = 16 * kMaxSplits * 4 + 16 * 4;
  static constexpr int kSmemBytes = kPipeBytes > kCombineBytes + kMergeBytes
                                        ? kPipeBytes
                                        : kCombineBytes + kMergeBytes;
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes zeros (rows past the split).
// kPrefetch256: with the L2::256B hint (the L2 fetches 256-byte blocks from HBM).
//
// Tried and dropped (H100, benchmarks/results/gpu_kernels.json history): rows by Hopper's bulk
// copy engine, one cp.async.bulk per 256-byte row issued by one warp, ran at 0.52-0.59 of the
// read bandwidth against 0.75-0.89 for these 16-byte copies.
template <bool kPrefetch256>
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  if constexpr (kPrefetch256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(bytes));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Transposes the warp's 8x8 b16 matrix held one pair per lane (row lane/4, cols 2(lane%4)+0/1).
__device__ __forceinline__ uint32_t MoveTransposed(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

template <class T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one b16x2 register, the first in the low half (the lower column of a fragment).
template <class T>
__device__ __forceinline__ uint32_t Pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <class T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

__device__ __forceinline__ float ShflXor(float x, int m) {
  return __shfl_xor_sync(0xffffffffu, x, m);
}

// Heads of the query group served by one block: 8 per n-tile.
template <class T, int D, int kHeadTiles, bool kPrefetch256>
__global__ void __launch_bounds__(kThreads) DecodeKernel(DecodeParams p) {
  using L = Layout<D>;
  constexpr int kHeads = 8 * kHeadTiles;
  constexpr int kSteps = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_smem = reinterpret_cast<T*>(smem);
  T* v_smem = k_smem + L::kStages * L::kStageElems;

  const int64_t group = p.heads / p.kv_heads;
  const int64_t chunks = (group + kHeads - 1) / kHeads;
  const int64_t unit = blockIdx.x;
  const int64_t split = blockIdx.y;
  const int64_t chunk_id = unit % chunks, bk = unit / chunks;
  const int64_t b = bk / p.kv_heads, kvh = bk % p.kv_heads;
  const int64_t h_begin = chunk_id * kHeads;
  const int nh = static_cast<int>(group - h_begin < kHeads ? group - h_begin : kHeads);
  const int64_t row0 = b * p.heads + kvh * group + h_begin;  // first [B * Hq] row served

  int64_t len = p.lengths[b];
  len = len < 0 ? 0 : (len > p.seq ? p.seq : len);
  int64_t first = p.starts == nullptr ? 0 : p.starts[b];
  first = first < 0 ? 0 : (first > len ? len : first);
  const int64_t per_split = (len - first + p.splits - 1) / p.splits;
  int64_t lo = first + split * per_split;
  const int64_t hi = len < lo + per_split ? len : lo + per_split;
  if (lo > hi) lo = hi;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  // Q as the B operand of S^T = K Q^T: head g of each n-tile, dims 2t, 2t+1 (+8) of each k-step.
  uint32_t qf[kHeadTiles][kSteps][2];
#pragma unroll
  for (int ht = 0; ht < kHeadTiles; ++ht) {
    const int h = ht * 8 + g;
    const T* qrow = static_cast<const T*>(p.q) + (row0 + h) * D;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      qf[ht][kk][0] = h < nh ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16 + 2 * t) : 0u;
      qf[ht][kk][1] =
          h < nh ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16 + 8 + 2 * t) : 0u;
    }
  }
  // O^T accumulators: [dim tile][c0 (dim g, head 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)].
  float acc[kHeadTiles][kSteps][4];
  float m[kHeadTiles][2], l[kHeadTiles][2];  // log2 units; l is this lane's keys only
#pragma unroll
  for (int ht = 0; ht < kHeadTiles; ++ht) {
#pragma unroll
    for (int mt = 0; mt < kSteps; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[ht][mt][e] = 0.0f;
    m[ht][0] = m[ht][1] = -INFINITY;
    l[ht][0] = l[ht][1] = 0.0f;
  }

  const int64_t kv_off = (b * p.kv_heads + kvh) * p.seq * D;
  const T* k_global = static_cast<const T*>(p.k) + kv_off;
  const T* v_global = static_cast<const T*>(p.v) + kv_off;
  const int n_tiles = static_cast<int>((hi - lo + kTile - 1) / kTile);
  const auto load_tile = [&](int tile, int stage) {
    const int64_t key0 = lo + static_cast<int64_t>(tile) * kTile;
    T* kd = k_smem + stage * L::kStageElems;
    T* vd = v_smem + stage * L::kStageElems;
#pragma unroll
    for (int i = 0; i < kTile * L::kChunks / kThreads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int row = c / L::kChunks, col = (c % L::kChunks) * 8;
      const bool valid = key0 + row < hi;
      const int64_t src = (valid ? key0 + row : lo) * D + col;
      CpAsync16<kPrefetch256>(SmemAddr(kd + row * L::kStride + col), k_global + src, valid);
      CpAsync16<kPrefetch256>(SmemAddr(vd + row * L::kStride + col), v_global + src, valid);
    }
  };

#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    CpAsyncCommit();
  }
  const int i4 = lane >> 3, r8 = lane & 7;  // ldmatrix: this lane addresses row r8 of matrix i4
  for (int it = 0; it < n_tiles; ++it) {
    CpAsyncWait<L::kStages - 2>();
    __syncthreads();  // tile `it` visible to all; the stage refilled below is free
    if (it + L::kStages - 1 < n_tiles) load_tile(it + L::kStages - 1, (it + L::kStages - 1) % L::kStages);
    CpAsyncCommit();
    const int stage = it % L::kStages;
    const T* kt = k_smem + stage * L::kStageElems + warp * kKeysPerWarp * L::kStride;
    const T* vt = v_smem + stage * L::kStageElems + warp * kKeysPerWarp * L::kStride;
    const int64_t key_base = lo + static_cast<int64_t>(it) * kTile + warp * kKeysPerWarp;

    // S^T [16 keys x 8 heads] per head tile: A = K rows (ldmatrix), B = Q fragments.
    float sc[kHeadTiles][4];
#pragma unroll
    for (int ht = 0; ht < kHeadTiles; ++ht) sc[ht][0] = sc[ht][1] = sc[ht][2] = sc[ht][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      uint32_t a[4];
      LdMatrixX4(a, SmemAddr(kt + (r8 + 8 * (i4 & 1)) * L::kStride + kk * 16 + 8 * (i4 >> 1)));
#pragma unroll
      for (int ht = 0; ht < kHeadTiles; ++ht) Mma<T>(sc[ht], a, qf[ht][kk][0], qf[ht][kk][1]);
    }
    // Online softmax. sc: [0] (key g, head 2t), [1] (key g, head 2t+1), [2], [3] keys g+8.
    const bool in0 = key_base + g < hi, in1 = key_base + g + 8 < hi;
    uint32_t pf[kHeadTiles][2];
#pragma unroll
    for (int ht = 0; ht < kHeadTiles; ++ht) {
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = sc[ht][e] * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
        x[e] = s * kLog2e;
      }
      if (!in0) x[0] = x[1] = -INFINITY;
      if (!in1) x[2] = x[3] = -INFINITY;
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // head 2t + j: its keys live in the lanes sharing t
        float mx = fmaxf(x[j], x[j + 2]);
        mx = fmaxf(mx, ShflXor(mx, 4));
        mx = fmaxf(mx, ShflXor(mx, 8));
        mx = fmaxf(mx, ShflXor(mx, 16));
        const float m_new = fmaxf(m[ht][j], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2f(m[ht][j] - m_use);
        x[j] = exp2f(x[j] - m_use);
        x[j + 2] = exp2f(x[j + 2] - m_use);
        l[ht][j] = l[ht][j] * corr + x[j] + x[j + 2];
        m[ht][j] = m_new;
#pragma unroll
        for (int mt = 0; mt < kSteps; ++mt) acc[ht][mt][j] *= corr, acc[ht][mt][j + 2] *= corr;
      }
      // P^T as the B operand of O^T = V^T P^T: (keys 2t, 2t+1 | +8; head g) by transposing.
      pf[ht][0] = MoveTransposed(Pack<T>(x[0], x[1]));
      pf[ht][1] = MoveTransposed(Pack<T>(x[2], x[3]));
    }
    // O^T [16 dims x 8 heads] per dim tile: A = V^T (ldmatrix.trans of V rows), B = P^T.
#pragma unroll
    for (int mt = 0; mt < kSteps; ++mt) {
      uint32_t a[4];
      LdMatrixX4Trans(a,
                      SmemAddr(vt + (r8 + 8 * (i4 >> 1)) * L::kStride + mt * 16 + 8 * (i4 & 1)));
#pragma unroll
      for (int ht = 0; ht < kHeadTiles; ++ht) Mma<T>(acc[ht][mt], a, pf[ht][0], pf[ht][1]);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the pipeline's memory before it is reused

  // Combine the warps: shared m, l [kWarps][16] and accumulators [kWarps][16][D].
  float* cm = reinterpret_cast<float*>(smem);
  float* cl = cm + kWarps * 16;
  float* co = cl + kWarps * 16;
#pragma unroll
  for (int ht = 0; ht < kHeadTiles; ++ht) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float lt = l[ht][j];
      lt += ShflXor(lt, 4);
      lt += ShflXor(lt, 8);
      lt += ShflXor(lt, 16);
      if (g == 0) {
        cm[warp * 16 + ht * 8 + 2 * t + j] = m[ht][j];
        cl[warp * 16 + ht * 8 + 2 * t + j] = lt;
      }
    }
#pragma unroll
    for (int mt = 0; mt < kSteps; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int head = ht * 8 + 2 * t + (e & 1), dim = mt * 16 + g + 8 * (e >> 1);
        co[(warp * 16 + head) * D + dim] = acc[ht][mt][e];
      }
  }
  __syncthreads();
  const bool direct = p.splits == 1;
  for (int idx = threadIdx.x; idx < nh * D; idx += kThreads) {
    const int h = idx / D, d = idx % D;
    float big = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) big = fmaxf(big, cm[w * 16 + h]);
    float total = 0.0f, o = 0.0f;
    if (big != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(cm[w * 16 + h] - big);
        total += cl[w * 16 + h] * f;
        o += co[(w * 16 + h) * D + d] * f;
      }
    }
    const bool any = total > 0.0f;
    const float value = any ? o / total : 0.0f;
    const float lse = any ? (big + log2f(total)) * kLn2 : -INFINITY;
    const int64_t row = row0 + h;
    if (direct) {
      static_cast<T*>(p.out)[row * D + d] = FromFloat<T>(value);
      if (d == 0) p.lse[row] = lse;
    } else {
      p.part_out[(row * p.splits + split) * D + d] = value;
      if (d == 0) p.part_lse[row * p.splits + split] = lse;
    }
  }
  if (direct) return;

  // The last block of this unit to finish merges the splits (threadFenceReduction's pattern).
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(p.counters + unit, 1) == p.splits - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (threadIdx.x == 0) p.counters[unit] = 0;  // reusable by the next call
  float* weight = reinterpret_cast<float*>(smem) + L::kCombineBytes / 4;  // [16][splits]
  float* final_lse = weight + 16 * kMaxSplits;                            // [16]
  const int splits = static_cast<int>(p.splits);
  constexpr int kPerLane = kMaxSplits / 32;
  for (int h = warp; h < nh; h += kWarps) {  // a warp per head, lanes over the splits
    const float* lse_in = p.part_lse + (row0 + h) * splits;
    float lv[kPerLane];  // all of a lane's loads in flight at once: one L2 round trip
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int s = lane + 32 * i;
      lv[i] = s < splits ? __ldcg(lse_in + s) : -INFINITY;
    }
    float big = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) big = fmaxf(big, lv[i]);
    for (int o = 16; o > 0; o /= 2) big = fmaxf(big, ShflXor(big, o));
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      lv[i] = big == -INFINITY ? 0.0f : __expf(lv[i] - big);
      total += lv[i];
    }
    for (int o = 16; o > 0; o /= 2) total += ShflXor(total, o);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int s = lane + 32 * i;
      if (s < splits) weight[h * kMaxSplits + s] = total > 0.0f ? lv[i] / total : 0.0f;
    }
    if (lane == 0) final_lse[h] = total > 0.0f ? big + logf(total) : -INFINITY;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * (D / 4); idx += kThreads) {  // 4 dims per thread
    const int h = idx / (D / 4), d = (idx % (D / 4)) * 4;
    const float* src = p.part_out + (row0 + h) * splits * D + d;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
    for (int s = 0; s < splits; ++s) {
      const float w = weight[h * kMaxSplits + s];
      const float4 part = __ldcg(reinterpret_cast<const float4*>(src + s * D));
      o.x += w * part.x, o.y += w * part.y, o.z += w * part.z, o.w += w * part.w;
    }
    T* dst = static_cast<T*>(p.out) + (row0 + h) * D + d;
    dst[0] = FromFloat<T>(o.x), dst[1] = FromFloat<T>(o.y);
    dst[2] = FromFloat<T>(o.z), dst[3] = FromFloat<T>(o.w);
    if (d == 0) p.lse[row0 + h] = final_lse[h];
  }
}

template <class T, int D, int kHeadTiles>
cudaError_t LaunchShape(const DecodeParams& p, int64_t units, cudaStream_t stream) {
  const auto kernel = p.copy == 1 ? DecodeKernel<T, D, kHeadTiles, true>
                                  : DecodeKernel<T, D, kHeadTiles, false>;
  const int smem = Layout<D>::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(units), static_cast<unsigned>(p.splits));
  kernel<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <class T, int D, int kHeadTiles>
int ResidentBlocks() {
  const auto kernel = DecodeKernel<T, D, kHeadTiles, false>;
  const int smem = Layout<D>::kSmemBytes;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
      cudaSuccess)
    return 1;
  int blocks = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem) !=
      cudaSuccess)
    return 1;
  return blocks > 0 ? blocks : 1;
}

// Calls fn.template Run<T, D, kHeadTiles>() for the shape, or returns NotSupported.
template <class Fn>
cudaError_t Dispatch(const DecodeParams& p, const Fn& fn) {
  const int64_t group = p.heads / p.kv_heads;
  const bool two = group > 8 && p.head_dim <= 128;
  const auto by_dim = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    switch (p.head_dim) {
      case 64:
        return two ? fn.template Run<T, 64, 2>() : fn.template Run<T, 64, 1>();
      case 128:
        return two ? fn.template Run<T, 128, 2>() : fn.template Run<T, 128, 1>();
      case 256:
        return fn.template Run<T, 256, 1>();
      default:
        return cudaErrorNotSupported;
    }
  };
  switch (p.kind) {
    case ScalarKind::kBFloat16:
      return by_dim(__nv_bfloat16{});
    case ScalarKind::kFloat16:
      return by_dim(__half{});
    default:
      return cudaErrorNotSupported;
  }
}

struct Occupancy {  // Dispatch's visitor: resident blocks per SM of the shape's kernel
  int* resident;
  template <class T, int D, int kHeadTiles>
  cudaError_t Run() const {
    *resident = ResidentBlocks<T, D, kHeadTiles>();
    return cudaSuccess;
  }
};

struct Launch {  // Dispatch's visitor: launches the shape's kernel
  const DecodeParams* p;
  int64_t units;
  cudaStream_t stream;
  template <class T, int D, int kHeadTiles>
  cudaError_t Run() const {
    return LaunchShape<T, D, kHeadTiles>(*p, units, stream);
  }
};

int64_t HeadsPerBlock(const DecodeParams& p) {
  const int64_t group = p.heads / p.kv_heads;
  return group > 8 && p.head_dim <= 128 ? 16 : 8;
}

}  // namespace

bool DecodeAttentionSupported(const DecodeParams& p) {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return false;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return major >= 8 && p.kv_heads > 0 && p.heads % p.kv_heads == 0 &&
         (p.kind == ScalarKind::kBFloat16 || p.kind == ScalarKind::kFloat16) &&
         (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && aligned(p.q) &&
         aligned(p.k) && aligned(p.v);
}

int64_t DecodeAttentionUnits(const DecodeParams& p) {
  const int64_t group = p.heads / p.kv_heads;
  const int64_t per = HeadsPerBlock(p);
  return p.batch * p.kv_heads * ((group + per - 1) / per);
}

int64_t DecodeAttentionSplits(const DecodeParams& p) {
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  int resident = 1;
  Dispatch(p, Occupancy{&resident});
  const int64_t units = DecodeAttentionUnits(p);
  // One wave: a split count whose blocks all fit at once (a second, partial wave of blocks
  // cost up to 19% on an H100 at 4 x 32K, benchmarks/results/gpu_kernels.json).
  const int64_t fill = static_cast<int64_t>(sms) * resident / units;
  // At least two tiles per split, so that a split's pipeline runs at all.
  const int64_t most = (p.seq + 2 * kTile - 1) / (2 * kTile);
  int64_t splits = fill < most ? fill : most;
  splits = splits < 1 ? 1 : splits;
  return splits > kMaxSplits ? kMaxSplits : splits;
}

cudaError_t LaunchDecodeAttention(const DecodeParams& p, cudaStream_t stream) {
  if (p.batch * p.heads == 0) return cudaSuccess;
  if (p.splits < 1 || p.splits > kMaxSplits) return cudaErrorInvalidValue;
  const int64_t units = DecodeAttentionUnits(p);
  if (p.splits > 1) {  // the merge's counters start at zero (and the merging block resets them)
    const cudaError_t err = cudaMemsetAsync(p.counters, 0, units * sizeof(int32_t), stream);
    if (err != cudaSuccess) return err;
  }
  return Dispatch(p, Launch{&p, units, stream});
}

}  // namespace tp::kernels
