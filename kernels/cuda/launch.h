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

}  // namespace tp::kernels
