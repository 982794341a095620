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
//
// Copies (DecodeParams::copy): 16-byte cp.async per thread (rows padded by 16 bytes so ldmatrix
// hits distinct banks), the same with the L2::256B hint, or Hopper's tensor memory accelerator
// (TMA, sm_90): one thread issues 64-key x 64-dim boxes of a 3-D tensor map ([B*Hkv, S, D])
// into 128-byte-swizzled shared memory, completing on an mbarrier per stage. Why TMA was tried
// (issue 40): on an H100 the cp.async kernel reached 84.5% of DRAM throughput with a 35% L2 hit
// rate and the L2 at 86% of its throughput, while cuDNN's decode (1% hits) reached 91.5%. With
// TMA the same kernel reached 0.95-0.98 of the read bandwidth at 32K and more (cp.async:
// 0.89-0.90), 1.00x SDPA at 4 x 32K and 8 x 32K; it is the default on sm_90.
#include <cuda.h>
#include <cudaTypedefs.h>
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

constexpr int kCopyTma = 2;  // DecodeParams::copy: 0 cp.async, 1 cp.async + L2::256B, 2 TMA
constexpr int kBoxElems = kTile * 64;  // TMA: one box, kTile rows of 64 elements (128 bytes)

template <int D, int kCopy>
struct Layout {
  static constexpr bool kTma = kCopy == kCopyTma;
  // cp.async: +16 bytes per row, so ldmatrix rows hit distinct banks. TMA: unpadded 64-column
  // boxes of 128-byte rows, swizzled instead (ElemOffset).
  static constexpr int kStride = kTma ? D : D + 8;
  static constexpr int kStages = D <= 128 ? 3 : 2;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kStageElems = kTile * kStride;
  static constexpr int kPipeBytes = 2 * kStages * kStageElems * 2;  // K and V, 2-byte elements
  // The epilogue reuses the same memory: per warp 16 heads of (m, l, D accumulators), and the
  // merge's weights [16][kMaxSplits].
  static constexpr int kCombineBytes = kWarps * 16 * (D + 2) * 4;
  static constexpr int kMergeBytes = 16 * kMaxSplits * 4 + 16 * 4;
  // The 128-byte swizzle repeats every 1024 bytes, so TMA boxes start 1024-byte aligned: slack
  // to align the dynamic base, which static shared memory may have moved.
  static constexpr int kAlignSlack = kTma ? 1024 : 0;
  static constexpr int kSmemBytes =
      (kPipeBytes > kCombineBytes + kMergeBytes ? kPipeBytes : kCombineBytes + kMergeBytes) +
      kAlignSlack;
};

// Element offset of (row, col) in a K or V stage; col is a multiple of 8 (one 16-byte chunk).
// TMA: box col / 64 holds kTile rows of 128 bytes, and the 128-byte swizzle stores a row's chunk
// c at chunk c ^ (row % 8), so that ldmatrix's 8 rows of one chunk hit distinct banks.
template <int D, int kCopy>
__device__ __forceinline__ int ElemOffset(int row, int col) {
  if constexpr (kCopy == kCopyTma) {
    return (col >> 6) * kBoxElems + row * 64 +
           ((((col & 63) >> 3) ^ (row & 7)) << 3);
  } else {
    return row * Layout<D, kCopy>::kStride + col;
  }
}

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

// Hopper's tensor memory accelerator and mbarriers (sm_90; other targets never launch the TMA
// variant, DecodeAttentionSupported).
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void MbarInitFence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// Waits for the phase of the given parity to complete. A wait that never ends (a byte count the
// copies do not deliver) traps after ~2^26 polls instead of hanging the GPU.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (uint32_t polls = 0;; ++polls) {
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.b32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return;
    if (polls > (1u << 26)) __trap();
  }
#endif
}
// One box of a 3-D tensor map (coordinates innermost first) into shared memory at dst.
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          int c2, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#else
  __trap();
#endif
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
// k_map / v_map: the caches as 3-D tensor maps for the TMA variant (unused by the others).
template <class T, int D, int kHeadTiles, int kCopy>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(const DecodeParams p, const __grid_constant__ CUtensorMap k_map,
                 const __grid_constant__ CUtensorMap v_map) {
  using L = Layout<D, kCopy>;
  constexpr bool kTma = L::kTma;
  constexpr int kHeads = 8 * kHeadTiles;
  constexpr int kSteps = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[L::kStages];  // TMA: one mbarrier per stage
  unsigned char* pipe = smem;
  if constexpr (kTma) pipe += (1024 - SmemAddr(smem) % 1024) % 1024;
  T* k_smem = reinterpret_cast<T*>(pipe);
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
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < L::kStages; ++s) MbarInit(SmemAddr(&full[s]), 1);
      MbarInitFence();
    }
    __syncthreads();
  }
  // TMA: one thread issues the stage's boxes; rows past the cache (S) arrive as zeros, rows past
  // `hi` inside it are the next split's or unwritten cache (zeroed in V before use, below).
  const auto load_tile = [&](int tile, int stage) {
    const int64_t key0 = lo + static_cast<int64_t>(tile) * kTile;
    T* kd = k_smem + stage * L::kStageElems;
    T* vd = v_smem + stage * L::kStageElems;
    if constexpr (kTma) {
      if (threadIdx.x == 0) {
        const uint32_t bar = SmemAddr(&full[stage]);
        MbarExpectTx(bar, 2 * L::kStageElems * 2);
        const int row = static_cast<int>(key0), bh = static_cast<int>(b * p.kv_heads + kvh);
#pragma unroll
        for (int box = 0; box < D / 64; ++box) {
          TmaLoad3d(SmemAddr(kd + box * kBoxElems), &k_map, box * 64, row, bh, bar);
          TmaLoad3d(SmemAddr(vd + box * kBoxElems), &v_map, box * 64, row, bh, bar);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kTile * L::kChunks / kThreads; ++i) {
        const int c = threadIdx.x + i * kThreads;
        const int row = c / L::kChunks, col = (c % L::kChunks) * 8;
        const bool valid = key0 + row < hi;
        const int64_t src = (valid ? key0 + row : lo) * D + col;
        CpAsync16<kCopy == 1>(SmemAddr(kd + ElemOffset<D, kCopy>(row, col)), k_global + src,
                              valid);
        CpAsync16<kCopy == 1>(SmemAddr(vd + ElemOffset<D, kCopy>(row, col)), v_global + src,
                              valid);
      }
    }
  };

#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    if constexpr (!kTma) CpAsyncCommit();
  }
  const int i4 = lane >> 3, r8 = lane & 7;  // ldmatrix: this lane addresses row r8 of matrix i4
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % L::kStages;
    const int64_t tile_key0 = lo + static_cast<int64_t>(it) * kTile;
    if constexpr (kTma) {
      MbarWait(SmemAddr(&full[stage]), (it / L::kStages) & 1);
      if (tile_key0 + kTile > hi) {  // V rows past the split: zeros, so that P = 0 meets no NaN
        T* vd = v_smem + stage * L::kStageElems;
        const int first_row = static_cast<int>(hi - tile_key0);
        for (int c = threadIdx.x; c < (kTile - first_row) * L::kChunks; c += kThreads) {
          const int row = first_row + c / L::kChunks, col = (c % L::kChunks) * 8;
          *reinterpret_cast<uint4*>(vd + ElemOffset<D, kCopy>(row, col)) = make_uint4(0, 0, 0, 0);
        }
      }
    } else {
      CpAsyncWait<L::kStages - 2>();
    }
    __syncthreads();  // tile `it` visible to all; the stage refilled below is free
    if (it + L::kStages - 1 < n_tiles)
      load_tile(it + L::kStages - 1, (it + L::kStages - 1) % L::kStages);
    if constexpr (!kTma) CpAsyncCommit();
    const T* kt = k_smem + stage * L::kStageElems;
    const T* vt = v_smem + stage * L::kStageElems;
    const int wrow = warp * kKeysPerWarp;  // this warp's 16 keys of the tile
    const int64_t key_base = tile_key0 + wrow;

    // S^T [16 keys x 8 heads] per head tile: A = K rows (ldmatrix), B = Q fragments.
    float sc[kHeadTiles][4];
#pragma unroll
    for (int ht = 0; ht < kHeadTiles; ++ht) sc[ht][0] = sc[ht][1] = sc[ht][2] = sc[ht][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      uint32_t a[4];
      LdMatrixX4(a, SmemAddr(kt + ElemOffset<D, kCopy>(wrow + r8 + 8 * (i4 & 1),
                                                         kk * 16 + 8 * (i4 >> 1))));
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
      LdMatrixX4Trans(a, SmemAddr(vt + ElemOffset<D, kCopy>(wrow + r8 + 8 * (i4 >> 1),
                                                            mt * 16 + 8 * (i4 & 1))));
#pragma unroll
      for (int ht = 0; ht < kHeadTiles; ++ht) Mma<T>(acc[ht][mt], a, pf[ht][0], pf[ht][1]);
    }
  }
  if constexpr (!kTma) CpAsyncWait<0>();  // (TMA: every issued tile was waited for above)
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

// The kernel for p.copy and its dynamic shared memory.
template <class T, int D, int kHeadTiles, int kCopy>
cudaError_t LaunchCopy(const DecodeParams& p, const CUtensorMap& k_map, const CUtensorMap& v_map,
                       int64_t units, cudaStream_t stream) {
  const auto kernel = DecodeKernel<T, D, kHeadTiles, kCopy>;
  const int smem = Layout<D, kCopy>::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(units), static_cast<unsigned>(p.splits));
  kernel<<<grid, kThreads, smem, stream>>>(p, k_map, v_map);
  return cudaGetLastError();
}

template <class T, int D, int kHeadTiles>
cudaError_t LaunchShape(const DecodeParams& p, const CUtensorMap& k_map, const CUtensorMap& v_map,
                        int64_t units, cudaStream_t stream) {
  switch (p.copy) {
    case 1:
      return LaunchCopy<T, D, kHeadTiles, 1>(p, k_map, v_map, units, stream);
    case kCopyTma:
      return LaunchCopy<T, D, kHeadTiles, kCopyTma>(p, k_map, v_map, units, stream);
    default:
      return LaunchCopy<T, D, kHeadTiles, 0>(p, k_map, v_map, units, stream);
  }
}

template <class T, int D, int kHeadTiles, int kCopy>
int ResidentBlocksOf() {
  const auto kernel = DecodeKernel<T, D, kHeadTiles, kCopy>;
  const int smem = Layout<D, kCopy>::kSmemBytes;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
      cudaSuccess)
    return 1;
  int blocks = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem) !=
      cudaSuccess)
    return 1;
  return blocks > 0 ? blocks : 1;
}

template <class T, int D, int kHeadTiles>
int ResidentBlocks(int copy) {
  return copy == kCopyTma ? ResidentBlocksOf<T, D, kHeadTiles, kCopyTma>()
                          : ResidentBlocksOf<T, D, kHeadTiles, 0>();
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
  int copy;
  template <class T, int D, int kHeadTiles>
  cudaError_t Run() const {
    *resident = ResidentBlocks<T, D, kHeadTiles>(copy);
    return cudaSuccess;
  }
};

struct Launch {  // Dispatch's visitor: launches the shape's kernel
  const DecodeParams* p;
  const CUtensorMap* k_map;
  const CUtensorMap* v_map;
  int64_t units;
  cudaStream_t stream;
  template <class T, int D, int kHeadTiles>
  cudaError_t Run() const {
    return LaunchShape<T, D, kHeadTiles>(*p, *k_map, *v_map, units, stream);
  }
};

// cuTensorMapEncodeTiled from the driver, found through the runtime (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A cache [B, Hkv, S, D] as a 3-D tensor map over (D, S, B * Hkv), boxes of 64 dims (128 bytes,
// the swizzle's span) x kTile keys x 1; keys past S read as zeros.
cudaError_t CacheTensorMap(CUtensorMap* map, const DecodeParams& p, const void* cache) {
  const auto encode = EncodeTiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.head_dim),
                              static_cast<cuuint64_t>(p.seq),
                              static_cast<cuuint64_t>(p.batch * p.kv_heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.head_dim * 2),
                                 static_cast<cuuint64_t>(p.seq * p.head_dim * 2)};
  const cuuint32_t box[3] = {64, kTile, 1};
  const cuuint32_t unit_strides[3] = {1, 1, 1};
  const CUresult r = encode(
      map, p.kind == ScalarKind::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      3, const_cast<void*>(cache), dims, strides, box, unit_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

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
  if (p.copy == kCopyTma && (major < 9 || EncodeTiled() == nullptr)) return false;
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
  Dispatch(p, Occupancy{&resident, p.copy});
  const int64_t units = DecodeAttentionUnits(p);
  // One wave: a split count whose blocks all fit at once (a second, partial wave of blocks
  // cost up to 19% on an H100 at 4 x 32K, benchmarks/results/gpu_kernels.json).
  int64_t fill = static_cast<int64_t>(sms) * resident / units;
  // Few units (long single sequences): one block per SM when that still gives 8 splits or more.
  // On an H100 (TMA copies) 1 x 32K and 1 x 128K ran 5% and 3% faster at 16 splits than at the
  // 33 of two resident blocks per SM (fewer partials to merge, one block already saturates the
  // copies); rows with fewer splits per unit ran best at the two-block fill.
  if (static_cast<int64_t>(sms) / units >= 8) fill = static_cast<int64_t>(sms) / units;
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
  if (p.splits > 1 && !p.counters_zeroed) {  // the merge's counters start at zero
    const cudaError_t err = cudaMemsetAsync(p.counters, 0, units * sizeof(int32_t), stream);
    if (err != cudaSuccess) return err;
  }
  CUtensorMap k_map{}, v_map{};
  if (p.copy == kCopyTma) {
    cudaError_t err = CacheTensorMap(&k_map, p, p.k);
    if (err == cudaSuccess) err = CacheTensorMap(&v_map, p, p.v);
    if (err != cudaSuccess) return err;
  }
  return Dispatch(p, Launch{&p, &k_map, &v_map, units, stream});
}

}  // namespace tp::kernels
