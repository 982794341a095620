// Host-side launchers of the CUDA kernels; torch-free so nvcc compiles them alone in CI.
#pragma once

#include <cuda_runtime.h>

#include "../params.h"

namespace tp::kernels {

cudaError_t LaunchBiasGelu(const BiasGeluParams& p, cudaStream_t stream);
cudaError_t LaunchBiasGeluBackward(const BiasGeluBackwardParams& p, cudaStream_t stream);
// kAuto: the grouped kernel (one block per KV head, reading each row once for its whole query
// group) where it applies, else the warp-per-head one. kGrouped returns cudaErrorNotSupported
// where it does not apply. head_dim <= 256.
enum class SplitKvVariant { kAuto, kWarpPerHead, kGrouped };
cudaError_t LaunchSplitKvAttention(const SplitKvParams& p, cudaStream_t stream,
                                   SplitKvVariant variant = SplitKvVariant::kAuto);
cudaError_t LaunchMergeAttentionPartials(const MergePartialsParams& p, cudaStream_t stream);

// Decode attention on tensor cores with the merge of splits fused (decode_attention.cu): sm_80+,
// float16/bfloat16, head_dim 64/128/256, q/k/v 16-byte aligned (DecodeAttentionSupported).
// DecodeAttentionSplits: the split count that fills the device once for this shape;
// DecodeAttentionUnits: the (sequence, KV head, head chunk) units, one counter each.
bool DecodeAttentionSupported(const DecodeParams& p);
int64_t DecodeAttentionSplits(const DecodeParams& p);
int64_t DecodeAttentionUnits(const DecodeParams& p);
cudaError_t LaunchDecodeAttention(const DecodeParams& p, cudaStream_t stream);

}  // namespace tp::kernels
