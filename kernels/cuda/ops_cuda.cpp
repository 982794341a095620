// CUDA registrations of torch_plugin ops (built only when torch has CUDA): validate tensors,
// fill the POD params, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>
#include <cstdlib>
#include <string_view>
#include <tuple>
#include <vector>

#include "../checks.h"
#include "launch.h"

namespace tp::kernels {
namespace {

// TP_SPLIT_KV_CUDA=warp_per_head|grouped picks one kernel (benchmarks/gpu_kernels.py compares
// them); unset, the grouped kernel runs where it applies.
SplitKvVariant VariantFromEnv() {
  const char* v = std::getenv("TP_SPLIT_KV_CUDA");
  if (v == nullptr || std::string_view(v) == "auto") return SplitKvVariant::kAuto;
  if (std::string_view(v) == "warp_per_head") return SplitKvVariant::kWarpPerHead;
  TORCH_CHECK(std::string_view(v) == "grouped",
              "TP_SPLIT_KV_CUDA must be auto, warp_per_head or grouped, got '", v, "'");
  return SplitKvVariant::kGrouped;
}

at::Tensor BiasGeluCuda(const at::Tensor& x_in, const at::Tensor& bias_in,
                        c10::string_view approximate) {
  CheckBiasGelu("torch_plugin::bias_gelu", x_in, bias_in);
  c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous();
  at::Tensor bias = bias_in.contiguous();
  at::Tensor out = at::empty_like(x);
  BiasGeluParams p;
  p.x = x.const_data_ptr();
  p.bias = bias.const_data_ptr();
  p.out = out.mutable_data_ptr();
  p.cols = x.size(-1);
  p.rows = p.cols == 0 ? 0 : x.numel() / p.cols;
  p.kind = KindOf(x);
  p.approx = ParseApprox(approximate);
  cudaError_t err = LaunchBiasGelu(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess,
              "torch_plugin::bias_gelu: CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

at::Tensor BiasGeluBackwardCuda(const at::Tensor& grad_t, const at::Tensor& x_in,
                                const at::Tensor& bias_in, c10::string_view approximate) {
  CheckBiasGelu("torch_plugin::bias_gelu_backward", x_in, bias_in);
  TORCH_CHECK(grad_t.sizes() == x_in.sizes() && grad_t.scalar_type() == x_in.scalar_type(),
              "torch_plugin::bias_gelu_backward: grad must have x's shape and dtype");
  c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor grad = grad_t.contiguous();
  at::Tensor x = x_in.contiguous();
  at::Tensor bias = bias_in.contiguous();
  at::Tensor out = at::empty_like(x);
  BiasGeluBackwardParams p;
  p.grad = grad.const_data_ptr();
  p.x = x.const_data_ptr();
  p.bias = bias.const_data_ptr();
  p.grad_in = out.mutable_data_ptr();
  p.cols = x.size(-1);
  p.rows = p.cols == 0 ? 0 : x.numel() / p.cols;
  p.kind = KindOf(x);
  p.approx = ParseApprox(approximate);
  cudaError_t err = LaunchBiasGeluBackward(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess,
              "torch_plugin::bias_gelu_backward: CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

std::tuple<at::Tensor, at::Tensor> SplitKvAttentionCuda(const at::Tensor& q_in,
                                                        const at::Tensor& k_in,
                                                        const at::Tensor& v_in,
                                                        const at::Tensor& lengths_in,
                                                        int64_t num_splits, double scale,
                                                        const std::optional<at::Tensor>& starts,
                                                        double softcap) {
  CheckSplitKv(q_in, k_in, v_in, lengths_in, num_splits);
  TORCH_CHECK(softcap >= 0, "torch_plugin::split_kv_attention: softcap must be >= 0 (0: none), "
              "got ", softcap);
  TORCH_CHECK(q_in.is_cuda() && q_in.size(2) <= 256,
              "torch_plugin::split_kv_attention: the CUDA kernel needs CUDA tensors and "
              "head_dim <= 256, got ",
              q_in.device(), " and head_dim ", q_in.size(2));
  c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor lengths = lengths_in.to(q.device()).contiguous();
  // Lengths are checked on the host: a bad one would read outside the cache.
  const auto lo = lengths.min().item<int64_t>(), hi = lengths.max().item<int64_t>();
  TORCH_CHECK(lo >= 0 && hi <= k.size(2), "torch_plugin::split_kv_attention: lengths in [", lo,
              ", ", hi, "] are outside the cache [0, ", k.size(2), "]");
  at::Tensor first;
  if (starts.has_value()) {
    TORCH_CHECK(starts->dim() == 1 && starts->size(0) == q.size(0) &&
                    starts->scalar_type() == at::kLong,
                "torch_plugin::split_kv_attention: starts must be int64 [B]");
    first = starts->to(q.device()).contiguous();
    TORCH_CHECK(first.ge(0).all().item<bool>() && first.le(lengths).all().item<bool>(),
                "torch_plugin::split_kv_attention: starts must lie in [0, lengths]");
  }
  auto opts = q.options().dtype(at::kFloat);
  at::Tensor out = at::empty({q.size(0), q.size(1), num_splits, q.size(2)}, opts);
  at::Tensor lse = at::empty({q.size(0), q.size(1), num_splits}, opts);
  SplitKvParams p;
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.lengths = lengths.const_data_ptr<int64_t>();
  p.starts = first.defined() ? first.const_data_ptr<int64_t>() : nullptr;
  p.softcap = static_cast<float>(softcap);
  p.out = out.mutable_data_ptr<float>();
  p.lse = lse.mutable_data_ptr<float>();
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.kv_heads = k.size(1);
  p.seq = k.size(2);
  p.head_dim = q.size(2);
  p.splits = num_splits;
  p.scale = static_cast<float>(scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(2))));
  p.kind = KindOf(q);
  cudaError_t err = LaunchSplitKvAttention(p, c10::cuda::getCurrentCUDAStream(), VariantFromEnv());
  TORCH_CHECK(err == cudaSuccess,
              "torch_plugin::split_kv_attention: CUDA launch failed: ", cudaGetErrorString(err));
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> MergeAttentionPartialsCuda(const at::Tensor& out_in,
                                                              const at::Tensor& lse_in) {
  CheckMergePartials(out_in, lse_in);
  TORCH_CHECK(out_in.is_cuda(), "torch_plugin::merge_attention_partials: the CUDA kernel got ",
              out_in.device());
  c10::cuda::CUDAGuard guard(out_in.device());
  const at::Tensor out = out_in.contiguous(), lse = lse_in.contiguous();
  std::vector<int64_t> lead(out.sizes().begin(), out.sizes().end() - 2);
  std::vector<int64_t> mshape = lead;
  mshape.push_back(out.size(-1));
  at::Tensor merged = at::empty(mshape, out.options());
  at::Tensor merged_lse = at::empty(lead, out.options());
  MergePartialsParams p;
  p.out = out.const_data_ptr<float>();
  p.lse = lse.const_data_ptr<float>();
  p.merged = merged.mutable_data_ptr<float>();
  p.merged_lse = merged_lse.mutable_data_ptr<float>();
  p.parts = out.size(-2);
  p.head_dim = out.size(-1);
  p.rows = p.parts == 0 ? 0 : lse.numel() / p.parts;
  cudaError_t err = LaunchMergeAttentionPartials(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "torch_plugin::merge_attention_partials: CUDA launch failed: ",
              cudaGetErrorString(err));
  return {merged, merged_lse};
}

}  // namespace
}  // namespace tp::kernels

TORCH_LIBRARY_IMPL(torch_plugin, CUDA, m) {
  m.impl("split_kv_attention", &tp::kernels::SplitKvAttentionCuda);
  m.impl("merge_attention_partials", &tp::kernels::MergeAttentionPartialsCuda);
  m.impl("bias_gelu", &tp::kernels::BiasGeluCuda);
  m.impl("bias_gelu_backward", &tp::kernels::BiasGeluBackwardCuda);
}
