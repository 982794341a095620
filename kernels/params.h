// Plain parameter structs shared by the CPU and CUDA kernels: pointers, sizes, flags.
// No torch here, so device code never includes LibTorch (flash-attention's habit).
#pragma once

#include <cstdint>

namespace tp::kernels {

enum class ScalarKind : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };
enum class GeluApprox : int32_t { kNone = 0, kTanh = 1 };

// out[r, c] = gelu(x[r, c] + bias[c]) over a contiguous [rows, cols] view.
struct BiasGeluParams {
  const void* x = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  ScalarKind kind = ScalarKind::kFloat32;
  GeluApprox approx = GeluApprox::kNone;
};

// grad_in[r, c] = grad[r, c] * gelu'(x[r, c] + bias[c]).
struct BiasGeluBackwardParams {
  const void* grad = nullptr;
  const void* x = nullptr;
  const void* bias = nullptr;
  void* grad_in = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  ScalarKind kind = ScalarKind::kFloat32;
  GeluApprox approx = GeluApprox::kNone;
};

// Split-KV decode attention: q [B, Hq, D], k/v [B, Hkv, S, D] (contiguous), lengths [B] int64.
// out [B, Hq, splits, D] and lse [B, Hq, splits] are float32 (see
// kernels/cpu/split_kv_attention.h).
struct SplitKvParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int64_t* lengths = nullptr;
  const int64_t* starts = nullptr;  // [B] first attended entry; null: 0 (left padding skipped)
  float* out = nullptr;
  float* lse = nullptr;
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0, splits = 1;
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: score = softcap * tanh(score / softcap) (Gemma-2)
  ScalarKind kind = ScalarKind::kFloat32;
};

// Merge of partials: out [rows, P, D], lse [rows, P] -> merged [rows, D], merged_lse [rows].
struct MergePartialsParams {
  const float* out = nullptr;
  const float* lse = nullptr;
  float* merged = nullptr;
  float* merged_lse = nullptr;
  int64_t rows = 0, parts = 0, head_dim = 0;
};

// Decode attention with the merge of splits fused (kernels/cuda/decode_attention.cu): q [B, Hq, D]
// in float16/bfloat16, k/v [B, Hkv, S, D] contiguous, lengths/starts [B] int64 (clamped to
// [0, S] and [0, length] in the kernel: checking them on the host would stall the stream).
// out [B, Hq, D] in q's dtype, lse [B, Hq] float32 (natural log; -inf where nothing was
// attended). With splits > 1 the partials go to part_out [B, Hq, splits, D] and part_lse
// [B, Hq, splits] (float32), and the last block of each (sequence, KV head, head chunk) to
// finish merges them; `counters` holds one int32 per such unit: zero on entry (the launcher
// zeroes them unless counters_zeroed says they already are), and the merging block leaves them
// zero again, so a caller that keeps one buffer per stream needs no memset launch per call.
struct DecodeParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int64_t* lengths = nullptr;
  const int64_t* starts = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  float* part_out = nullptr;
  float* part_lse = nullptr;
  int32_t* counters = nullptr;
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0, splits = 1;
  float scale = 1.0f;
  float softcap = 0.0f;
  ScalarKind kind = ScalarKind::kBFloat16;
  // 0: 16-byte cp.async; 1: the same with the L2::256B prefetch hint; 2: TMA tensor-map boxes
  // (sm_90; DecodeAttentionSupported says whether it can run; the op's default there).
  int32_t copy = 0;
  bool counters_zeroed = false;
};

}  // namespace tp::kernels
