// TORCH_LIBRARY(torch_plugin): schemas of our kernels and their CPU implementations.
// CUDA implementations register from kernels/cuda/ops_cuda.cpp when built with CUDA.
// Fake (meta) kernels and autograd formulas live in torch_plugin/ops.py.
#include <torch/library.h>

#include "cpu/bias_gelu.h"
#include "cpu/flash_attention.h"
#include "cpu/fused_inference.h"
#include "cpu/linear_bf16x3.h"
#include "cpu/output_compare.h"
#include "cpu/split_kv_attention.h"

TORCH_LIBRARY(torch_plugin, m) {
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate=\"none\") -> Tensor");
  m.def(
      "bias_gelu_backward(Tensor grad, Tensor x, Tensor bias, str approximate=\"none\") -> "
      "Tensor");
  m.def(
      "split_kv_attention(Tensor q, Tensor k, Tensor v, Tensor lengths, int num_splits, "
      "float scale=0.0, Tensor? starts=None, float softcap=0.0) -> (Tensor, Tensor)");
  m.def("merge_attention_partials(Tensor out, Tensor lse) -> (Tensor, Tensor)");
  // Split-KV decode with the merge done: out [B, Hq, D] in q's dtype, lse [B, Hq] float32.
  m.def(
      "decode_attention(Tensor q, Tensor k, Tensor v, Tensor lengths, int num_splits=0, "
      "float scale=0.0, Tensor? starts=None, float softcap=0.0) -> (Tensor, Tensor)");
  // Kernels of the placement pass's "fused" backend (forward / inference graphs).
  m.def("linear_act(Tensor x, Tensor weight_t, Tensor bias, str act) -> Tensor");
  m.def(
      "add_layer_norm(Tensor x, Tensor? residual, Tensor weight, Tensor bias, float eps) -> "
      "(Tensor, Tensor)");
  m.def(
      "add_layer_norm_stats(Tensor x, Tensor? residual, Tensor weight, Tensor bias, float eps) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("scaled_masked_softmax(Tensor scores, float scale, Tensor? mask) -> Tensor");
  m.def(
      "attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
      "bool is_causal=False, float? scale=None) -> (Tensor, Tensor)");
  // The whole-graph search's output check (torch_plugin/placement/precision.py): float64 [4].
  m.def("compare_outputs(Tensor got, Tensor want, float rtol, float atol) -> Tensor");
  // f32 linears as three bf16 products under "high" matmul precision (placement/bf16x3.py).
  m.def("linear_bf16x3_available() -> bool", &tp::kernels::LinearBf16x3Available);
  m.def("split_bf16x3_weight(Tensor weight) -> Tensor");
  m.def("linear_bf16x3(Tensor x, Tensor weight3, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(torch_plugin, CPU, m) {
  m.impl("bias_gelu", &tp::kernels::BiasGeluCpu);
  m.impl("bias_gelu_backward", &tp::kernels::BiasGeluBackwardCpu);
  m.impl("split_kv_attention", &tp::kernels::SplitKvAttentionCpu);
  m.impl("merge_attention_partials", &tp::kernels::MergeAttentionPartialsCpu);
  m.impl("decode_attention", &tp::kernels::DecodeAttentionCpu);
  m.impl("linear_act", &tp::kernels::LinearActCpu);
  m.impl("add_layer_norm", &tp::kernels::AddLayerNormCpu);
  m.impl("add_layer_norm_stats", &tp::kernels::AddLayerNormStatsCpu);
  m.impl("scaled_masked_softmax", &tp::kernels::ScaledMaskedSoftmaxCpu);
  m.impl("attention", &tp::kernels::FlashAttentionCpu);
  m.impl("compare_outputs", &tp::kernels::CompareOutputsCpu);
  m.impl("split_bf16x3_weight", &tp::kernels::SplitBf16x3WeightCpu);
  m.impl("linear_bf16x3", &tp::kernels::LinearBf16x3Cpu);
}
