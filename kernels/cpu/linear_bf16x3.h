// f32 linear layers as three bf16 products (PyTorch's "high" float32 matmul precision).
#pragma once

#include <ATen/ATen.h>

namespace tp::kernels {

// Whether this process can run LinearBf16x3Cpu: torch's MKL exports its bf16 GEMM with f32
// output (cblas_gemm_bf16bf16f32). Not every torch build links MKL.
bool LinearBf16x3Available();

// f32 weight [N, K] -> bf16 [N, 2K]: [hi | lo], hi = bf16(w), lo = bf16(w - hi); as many bytes
// as the f32 weight.
at::Tensor SplitBf16x3WeightCpu(const at::Tensor& weight);

// f32 x [..., K] times the split weight [N, 2K], plus an optional f32 bias [N]: x is split the
// same way, and two GEMMs sum hi*hi + hi*lo + lo*hi in f32 (the lo*lo term, ~2^-18 relative,
// is dropped). Result f32 [..., N].
at::Tensor LinearBf16x3Cpu(const at::Tensor& x, const at::Tensor& weight3,
                           const c10::optional<at::Tensor>& bias);

}  // namespace tp::kernels
