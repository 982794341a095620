// Host-side launchers of the CUDA kernels; torch-free so nvcc compiles them alone in CI.
#pragma once

#include <cuda_runtime.h>

#include "../params.h"

namespace tp::kernels {

cudaError_t LaunchBiasGelu(const BiasGeluParams& p, cudaStream_t stream);
cudaError_t LaunchBiasGeluBackward(const BiasGeluBackwardParams& p, cudaStream_t stream);
// head_dim <= 256.
cudaError_t LaunchSplitKvAttention(const SplitKvParams& p, cudaStream_t stream);
cudaError_t LaunchMergeAttentionPartials(const MergePartialsParams& p, cudaStream_t stream);

}  // namespace tp::kernels
