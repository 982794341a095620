// CUDA registrations of torch_plugin ops (built only when torch has CUDA): validate tensors,
// fill the POD params, launch on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>
#include <utility>
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

// decode_attention's merge counters: one zeroed int32 buffer per (device, stream), which the
// kernel's merging blocks leave zeroed. A fresh buffer per call needed a memset, a second
// launch on every decoded token. Kept for the process (never freed: the CUDA context may be
// gone at static destruction); grown when a shape needs more units.
int32_t* ZeroedCounters(const at::Tensor& like, int64_t units) {
  static std::mutex mu;
  static auto* buffers = new std::map<std::pair<int, int64_t>, at::Tensor>();
  const auto stream = c10::cuda::getCurrentCUDAStream(like.get_device());
  std::lock_guard<std::mutex> lock(mu);
  at::Tensor& buf = (*buffers)[{like.get_device(), stream.id()}];
  if (!buf.defined() || buf.numel() < units)
    buf = at::zeros({std::max<int64_t>(units, 1024)}, like.options().dtype(at::kInt));
  return buf.mutable_data_ptr<int32_t>();
}

// TP_DECODE_COPY=cp_async|l2_256|tma picks decode_attention's copies (benchmarks compare them);
// unset: TMA where the device has it (sm_90; on an H100 0.95-0.98 of the read bandwidth at 32K
// and more against 0.89-0.90 for cp.async), else cp.async.
int32_t DecodeCopyFromEnv() {
  const char* v = std::getenv("TP_DECODE_COPY");
  if (v == nullptr || std::string_view(v) == "tma") return 2;
  if (std::string_view(v) == "cp_async") return 0;
  if (std::string_view(v) == "l2_256") return 1;
  TORCH_CHECK(std::string_view(v) == "l2_256",
              "TP_DECODE_COPY must be cp_async, l2_256 or tma, got '", v, "'");
  return 1;
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

// decode_attention: the tensor-core kernel with the split merge fused where it applies
// (DecodeAttentionSupported: sm_80+, float16/bfloat16, head_dim 64/128/256); elsewhere, or
// under TP_SPLIT_KV_CUDA=warp_per_head|grouped, the split kernel and then the merge kernel.
// Device-resident lengths/starts are clamped in the kernel rather than checked here: reading
// them back would stall the stream on every decoded token. CPU ones are checked.
std::tuple<at::Tensor, at::Tensor> DecodeAttentionCuda(const at::Tensor& q_in,
                                                       const at::Tensor& k_in,
                                                       const at::Tensor& v_in,
                                                       const at::Tensor& lengths_in,
                                                       int64_t num_splits, double scale,
                                                       const std::optional<at::Tensor>& starts,
                                                       double softcap) {
  constexpr const char* op = "torch_plugin::decode_attention";
  TORCH_CHECK(num_splits >= 0, op, ": num_splits must be >= 0 (0: chosen for the device), got ",
              num_splits);
  CheckSplitKv(q_in, k_in, v_in, lengths_in, num_splits > 0 ? num_splits : 1);
  TORCH_CHECK(softcap >= 0, op, ": softcap must be >= 0 (0: none), got ", softcap);
  TORCH_CHECK(q_in.is_cuda(), op, ": the CUDA kernel got q on ", q_in.device());
  c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  if (lengths_in.is_cpu()) {
    const auto lo = lengths_in.min().item<int64_t>(), hi = lengths_in.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi <= k.size(2), op, ": lengths in [", lo, ", ", hi,
                "] are outside the cache [0, ", k.size(2), "]");
  }
  const at::Tensor lengths = lengths_in.to(q.device()).contiguous();
  at::Tensor first;
  if (starts.has_value()) {
    TORCH_CHECK(starts->dim() == 1 && starts->size(0) == q.size(0) &&
                    starts->scalar_type() == at::kLong,
                op, ": starts must be int64 [B]");
    if (starts->is_cpu() && lengths_in.is_cpu())
      TORCH_CHECK(starts->ge(0).all().item<bool>() && starts->le(lengths_in).all().item<bool>(),
                  op, ": starts must lie in [0, lengths]");
    first = starts->to(q.device()).contiguous();
  }
  DecodeParams p;
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.lengths = lengths.const_data_ptr<int64_t>();
  p.starts = first.defined() ? first.const_data_ptr<int64_t>() : nullptr;
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.kv_heads = k.size(1);
  p.seq = k.size(2);
  p.head_dim = q.size(2);
  p.scale = static_cast<float>(scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(2))));
  p.softcap = static_cast<float>(softcap);
  p.kind = KindOf(q);
  p.copy = DecodeCopyFromEnv();
  const char* env = std::getenv("TP_SPLIT_KV_CUDA");
  const bool older = env != nullptr && (std::string_view(env) == "warp_per_head" ||
                                        std::string_view(env) == "grouped");
  if (p.copy == 2 && !DecodeAttentionSupported(p)) p.copy = 0;  // TMA: sm_90 only
  if (!older && DecodeAttentionSupported(p)) {
    p.splits = num_splits > 0 ? std::min<int64_t>(num_splits, 256) : DecodeAttentionSplits(p);
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
    at::Tensor part_out, part_lse, counters;
    if (p.splits > 1) {
      part_out = at::empty({q.size(0), q.size(1), p.splits, q.size(2)}, lse.options());
      part_lse = at::empty({q.size(0), q.size(1), p.splits}, lse.options());
      p.part_out = part_out.mutable_data_ptr<float>();
      p.part_lse = part_lse.mutable_data_ptr<float>();
      // TP_DECODE_MEMSET=1: a fresh buffer zeroed by a memset per call (benchmarks compare).
      const char* memset = std::getenv("TP_DECODE_MEMSET");
      if (memset != nullptr && std::string_view(memset) == "1") {
        counters = at::empty({DecodeAttentionUnits(p)}, q.options().dtype(at::kInt));
        p.counters = counters.mutable_data_ptr<int32_t>();
      } else {
        p.counters = ZeroedCounters(q, DecodeAttentionUnits(p));
        p.counters_zeroed = true;
      }
    }
    p.out = out.mutable_data_ptr();
    p.lse = lse.mutable_data_ptr<float>();
    cudaError_t err = LaunchDecodeAttention(p, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return {out, lse};
  }
  int64_t splits = num_splits;
  if (splits == 0) {  // about 8 blocks per SM, chunks of at least 1024 entries
    int sms = 1;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, q.get_device());
    const int64_t want = (8 * sms + p.batch * p.kv_heads - 1) / (p.batch * p.kv_heads);
    splits = std::max<int64_t>(1, std::min<int64_t>(want, p.seq / 1024));
  }
  auto [part_out, part_lse] =
      SplitKvAttentionCuda(q, k, v, lengths_in, splits, scale, starts, softcap);
  auto [merged, merged_lse] = MergeAttentionPartialsCuda(part_out, part_lse);
  return {merged.to(q.scalar_type()), merged_lse};
}

}  // namespace
}  // namespace tp::kernels

TORCH_LIBRARY_IMPL(torch_plugin, CUDA, m) {
  m.impl("split_kv_attention", &tp::kernels::SplitKvAttentionCuda);
  m.impl("merge_attention_partials", &tp::kernels::MergeAttentionPartialsCuda);
  m.impl("decode_attention", &tp::kernels::DecodeAttentionCuda);
  m.impl("bias_gelu", &tp::kernels::BiasGeluCuda);
  m.impl("bias_gelu_backward", &tp::kernels::BiasGeluBackwardCuda);
}
