// The core ATen op table and the FLOPs/bytes estimates.
//
// FLOPs count a multiply-add as 2. Bytes are a roofline estimate: every tensor input read once
// and every tensor output written once (views move no data). Estimates use the capture-time
// hint of symbolic sizes; without a hint the cost is reported as unknown.
#include "ir/op_registry.h"

#include <algorithm>

namespace tp::ir {
namespace {

struct Sizes {
  bool ok = true;
  const TensorType* Tensor(const Graph& g, const Node& node, size_t i) {
    if (i >= node.args.size() || !node.args[i].is_value()) {
      ok = false;
      return nullptr;
    }
    const ValueType& t = g.type(node.args[i].value());
    if (!t.is_tensor()) {
      ok = false;
      return nullptr;
    }
    return &t.tensor;
  }
  double Numel(const TensorType* t) {
    if (!t) return 0.0;
    auto n = t->NumelHint();
    if (!n) ok = false;
    return n ? static_cast<double>(*n) : 0.0;
  }
  double Dim(const TensorType* t, int64_t d) {
    if (!t || t->rank() == 0) {
      ok = false;
      return 0.0;
    }
    if (d < 0) d += t->rank();
    if (d < 0 || d >= t->rank()) {
      ok = false;
      return 0.0;
    }
    auto h = t->shape[static_cast<size_t>(d)].hint();
    if (!h) ok = false;
    return h ? static_cast<double>(*h) : 0.0;
  }
};

double TensorBytes(const Graph& g, ValueId v, bool* ok) {
  const ValueType& t = g.type(v);
  if (!t.is_tensor()) return 0.0;
  auto b = t.tensor.BytesHint();
  if (!b) *ok = false;
  return b ? static_cast<double>(*b) : 0.0;
}

double InputBytes(const Graph& g, const Node& node, bool* ok) {
  double bytes = 0.0;
  node.ForEachInput([&](ValueId v) { bytes += TensorBytes(g, v, ok); });
  return bytes;
}

double OutputBytes(const Graph& g, const Node& node, bool* ok) {
  double bytes = 0.0;
  for (ValueId v : node.outputs) bytes += TensorBytes(g, v, ok);
  return bytes;
}

const TensorType* FirstTensorOutput(const Graph& g, const Node& node) {
  for (ValueId v : node.outputs) {
    if (g.type(v).is_tensor()) return &g.type(v).tensor;
  }
  return nullptr;
}

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

const char* OpClassName(OpClass cls) {
  switch (cls) {
    case OpClass::kMatmul: return "matmul";
    case OpClass::kConv: return "conv";
    case OpClass::kAttention: return "attention";
    case OpClass::kEmbedding: return "embedding";
    case OpClass::kElementwise: return "elementwise";
    case OpClass::kReduction: return "reduction";
    case OpClass::kSoftmax: return "softmax";
    case OpClass::kNorm: return "norm";
    case OpClass::kPool: return "pool";
    case OpClass::kView: return "view";
    case OpClass::kCopy: return "copy";
    case OpClass::kFactory: return "factory";
    case OpClass::kRandom: return "random";
    case OpClass::kMutation: return "mutation";
    case OpClass::kSymbolic: return "symbolic";
    case OpClass::kOther: return "other";
  }
  return "other";
}

std::pair<std::string, std::string> OpRegistry::SplitOverload(const std::string& qualified_op) {
  const size_t ns = qualified_op.find("::");
  const size_t dot = qualified_op.find('.', ns == std::string::npos ? 0 : ns + 2);
  if (dot == std::string::npos) return {qualified_op, "default"};
  return {qualified_op.substr(0, dot), qualified_op.substr(dot + 1)};
}

void OpRegistry::Add(OpInfo info) {
  std::string key = info.name + "." + info.overload;
  by_name_[key] = std::move(info);
}

const OpRegistry& OpRegistry::Default() {
  static const OpRegistry* registry = new OpRegistry();  // frozen after construction
  return *registry;
}

const OpInfo* OpRegistry::Find(const std::string& qualified_op) const {
  auto it = by_name_.find(qualified_op);
  if (it != by_name_.end()) return &it->second;
  auto [name, overload] = SplitOverload(qualified_op);
  it = by_name_.find(name + "." + overload);
  if (it != by_name_.end()) return &it->second;
  it = by_name_.find(name + ".*");
  return it == by_name_.end() ? nullptr : &it->second;
}

bool OpRegistry::IsPure(const std::string& qualified_op) const {
  const OpInfo* info = Find(qualified_op);
  return info != nullptr && info->pure;
}

OpRegistry::OpRegistry() {
  using C = OpClass;
  // {name, overload, class, min_args, max_args, pure, flops_per_element}
  const std::vector<OpInfo> table = {
      // Matmul family.
      {"aten::mm", "default", C::kMatmul, 2, 2, true, 0},
      {"aten::addmm", "default", C::kMatmul, 3, 5, true, 0},
      {"aten::bmm", "default", C::kMatmul, 2, 2, true, 0},
      {"aten::baddbmm", "default", C::kMatmul, 3, 5, true, 0},
      {"aten::matmul", "default", C::kMatmul, 2, 2, true, 0},
      {"aten::linear", "default", C::kMatmul, 2, 3, true, 0},
      {"aten::mv", "default", C::kMatmul, 2, 2, true, 0},
      {"aten::addmv", "default", C::kMatmul, 3, 5, true, 0},
      // Convolution.
      {"aten::convolution", "default", C::kConv, 9, 9, true, 0},
      {"aten::_convolution", "default", C::kConv, 12, 13, true, 0},
      {"aten::convolution_backward", "default", C::kConv, 11, 11, true, 0},
      // Attention.
      {"aten::scaled_dot_product_attention", "default", C::kAttention, 3, 8, true, 0},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", "default", C::kAttention, 3, 6, true,
       0},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", "default", C::kAttention,
       8, 11, true, 0},
      {"aten::_scaled_dot_product_flash_attention", "*", C::kAttention, -1, -1, true, 0},
      {"aten::_scaled_dot_product_efficient_attention", "*", C::kAttention, -1, -1, true, 0},
      {"aten::_scaled_dot_product_cudnn_attention", "*", C::kAttention, -1, -1, true, 0},
      {"aten::_scaled_dot_product_flash_attention_backward", "*", C::kAttention, -1, -1, true, 0},
      {"aten::_scaled_dot_product_efficient_attention_backward", "*", C::kAttention, -1, -1,
       true, 0},
      // Embedding and gathers.
      {"aten::embedding", "default", C::kEmbedding, 2, 5, true, 0},
      {"aten::embedding_dense_backward", "default", C::kEmbedding, 5, 5, true, 0},
      {"aten::_embedding_bag", "*", C::kEmbedding, -1, -1, true, 0},
      {"aten::_embedding_bag_backward", "*", C::kEmbedding, -1, -1, true, 0},
      {"aten::index_select", "default", C::kEmbedding, 3, 3, true, 0},
      {"aten::gather", "default", C::kEmbedding, 3, 4, true, 0},
      {"aten::index", "Tensor", C::kEmbedding, 2, 2, true, 0},
      // Softmax.
      {"aten::_softmax", "default", C::kSoftmax, 3, 3, true, 0},
      {"aten::_log_softmax", "default", C::kSoftmax, 3, 3, true, 0},
      {"aten::softmax", "int", C::kSoftmax, 2, 3, true, 0},
      {"aten::_softmax_backward_data", "default", C::kSoftmax, 4, 4, true, 0},
      {"aten::_log_softmax_backward_data", "default", C::kSoftmax, 4, 4, true, 0},
      // Norms.
      {"aten::native_layer_norm", "default", C::kNorm, 5, 5, true, 0},
      {"aten::native_layer_norm_backward", "default", C::kNorm, 8, 8, true, 0},
      {"aten::layer_norm", "default", C::kNorm, 2, 6, true, 0},
      {"aten::_fused_rms_norm", "default", C::kNorm, 2, 4, true, 0},
      {"aten::_fused_rms_norm_backward", "default", C::kNorm, -1, -1, true, 0},
      {"aten::rms_norm", "default", C::kNorm, 2, 4, true, 0},
      {"aten::native_batch_norm", "default", C::kNorm, 8, 8, true, 0},
      {"aten::_native_batch_norm_legit_functional", "default", C::kNorm, 8, 8, true, 0},
      {"aten::_native_batch_norm_legit_no_training", "default", C::kNorm, 7, 7, true, 0},
      {"aten::_native_batch_norm_legit", "*", C::kNorm, -1, -1, false, 0},
      {"aten::native_batch_norm_backward", "default", C::kNorm, 10, 10, true, 0},
      {"aten::native_group_norm", "default", C::kNorm, 8, 8, true, 0},
      {"aten::native_group_norm_backward", "default", C::kNorm, 10, 10, true, 0},
      // Reductions and losses.
      {"aten::sum", "*", C::kReduction, -1, -1, true, 0},
      {"aten::mean", "*", C::kReduction, -1, -1, true, 0},
      {"aten::amax", "default", C::kReduction, 1, 3, true, 0},
      {"aten::amin", "default", C::kReduction, 1, 3, true, 0},
      {"aten::max", "*", C::kReduction, -1, -1, true, 0},
      {"aten::min", "*", C::kReduction, -1, -1, true, 0},
      {"aten::argmax", "default", C::kReduction, 1, 3, true, 0},
      {"aten::argmin", "default", C::kReduction, 1, 3, true, 0},
      {"aten::var_mean", "*", C::kReduction, -1, -1, true, 0},
      {"aten::var", "*", C::kReduction, -1, -1, true, 0},
      {"aten::std", "*", C::kReduction, -1, -1, true, 0},
      {"aten::any", "*", C::kReduction, -1, -1, true, 0},
      {"aten::all", "*", C::kReduction, -1, -1, true, 0},
      {"aten::prod", "*", C::kReduction, -1, -1, true, 0},
      {"aten::cumsum", "default", C::kReduction, 2, 3, true, 0},
      {"aten::nll_loss_forward", "default", C::kReduction, 5, 5, true, 0},
      {"aten::nll_loss_backward", "default", C::kReduction, 7, 7, true, 0},
      {"aten::mse_loss", "default", C::kReduction, 2, 3, true, 0},
      {"aten::mse_loss_backward", "default", C::kReduction, 4, 4, true, 0},
      // Pooling.
      {"aten::max_pool2d_with_indices", "default", C::kPool, 2, 6, true, 1},
      {"aten::max_pool2d_with_indices_backward", "default", C::kPool, 8, 8, true, 1},
      {"aten::avg_pool2d", "default", C::kPool, 2, 7, true, 1},
      {"aten::avg_pool2d_backward", "default", C::kPool, 8, 8, true, 1},
      {"aten::_adaptive_avg_pool2d", "default", C::kPool, 2, 2, true, 1},
      {"aten::_adaptive_avg_pool2d_backward", "default", C::kPool, 2, 2, true, 1},
      {"aten::adaptive_avg_pool2d", "default", C::kPool, 2, 2, true, 1},
      // Elementwise, with FLOPs per output element.
      {"aten::add", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::sub", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::rsub", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::mul", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::div", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::neg", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::abs", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::exp", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::log", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::sqrt", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::rsqrt", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::reciprocal", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::pow", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::tanh", "default", C::kElementwise, 1, 1, true, 4},
      {"aten::sigmoid", "default", C::kElementwise, 1, 1, true, 4},
      {"aten::erf", "default", C::kElementwise, 1, 1, true, 4},
      {"aten::sin", "default", C::kElementwise, 1, 1, true, 4},
      {"aten::cos", "default", C::kElementwise, 1, 1, true, 4},
      {"aten::relu", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::gelu", "default", C::kElementwise, 1, 2, true, 8},
      {"aten::silu", "default", C::kElementwise, 1, 1, true, 4},
      {"aten::leaky_relu", "default", C::kElementwise, 1, 2, true, 2},
      {"aten::hardtanh", "default", C::kElementwise, 1, 3, true, 2},
      {"aten::clamp", "*", C::kElementwise, -1, -1, true, 2},
      {"aten::clamp_min", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::clamp_max", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::maximum", "default", C::kElementwise, 2, 2, true, 1},
      {"aten::minimum", "default", C::kElementwise, 2, 2, true, 1},
      {"aten::where", "self", C::kElementwise, 3, 3, true, 1},
      {"aten::masked_fill", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::eq", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::ne", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::lt", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::le", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::gt", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::ge", "*", C::kElementwise, -1, -1, true, 1},
      {"aten::logical_not", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::logical_and", "default", C::kElementwise, 2, 2, true, 1},
      {"aten::bitwise_not", "default", C::kElementwise, 1, 1, true, 1},
      {"aten::threshold_backward", "default", C::kElementwise, 3, 3, true, 1},
      {"aten::gelu_backward", "default", C::kElementwise, 2, 3, true, 12},
      {"aten::silu_backward", "default", C::kElementwise, 2, 2, true, 6},
      {"aten::sigmoid_backward", "default", C::kElementwise, 2, 2, true, 3},
      {"aten::tanh_backward", "default", C::kElementwise, 2, 2, true, 3},
      {"aten::leaky_relu_backward", "default", C::kElementwise, 4, 4, true, 2},
      {"aten::hardtanh_backward", "default", C::kElementwise, 4, 4, true, 2},
      // Views: no data moved.
      {"aten::view", "default", C::kView, 2, 2, true, 0},
      {"aten::_unsafe_view", "default", C::kView, 2, 2, true, 0},
      {"aten::reshape", "default", C::kView, 2, 2, true, 0},
      {"aten::permute", "default", C::kView, 2, 2, true, 0},
      {"aten::transpose", "int", C::kView, 3, 3, true, 0},
      {"aten::t", "default", C::kView, 1, 1, true, 0},
      {"aten::expand", "default", C::kView, 2, 3, true, 0},
      {"aten::unsqueeze", "default", C::kView, 2, 2, true, 0},
      {"aten::squeeze", "*", C::kView, -1, -1, true, 0},
      {"aten::slice", "Tensor", C::kView, 1, 5, true, 0},
      {"aten::select", "int", C::kView, 3, 3, true, 0},
      {"aten::alias", "default", C::kView, 1, 1, true, 0},
      {"aten::as_strided", "default", C::kView, 3, 4, true, 0},
      {"aten::split", "Tensor", C::kView, 2, 3, true, 0},
      {"aten::split_with_sizes", "default", C::kView, 2, 3, true, 0},
      {"aten::unbind", "int", C::kView, 1, 2, true, 0},
      {"aten::chunk", "default", C::kView, 2, 3, true, 0},
      {"aten::detach", "default", C::kView, 1, 1, true, 0},
      {"aten::unfold", "default", C::kView, 4, 4, true, 0},
      {"aten::narrow", "default", C::kView, 4, 4, true, 0},
      {"aten::view_as_real", "default", C::kView, 1, 1, true, 0},
      {"aten::view_as_complex", "default", C::kView, 1, 1, true, 0},
      // Copies.
      {"aten::clone", "default", C::kCopy, 1, 1, true, 0},
      {"aten::contiguous", "default", C::kCopy, 1, 1, true, 0},
      {"aten::_to_copy", "default", C::kCopy, 1, 1, true, 0},
      {"aten::cat", "default", C::kCopy, 1, 2, true, 0},
      {"aten::stack", "default", C::kCopy, 1, 2, true, 0},
      {"aten::constant_pad_nd", "default", C::kCopy, 2, 3, true, 0},
      {"aten::slice_scatter", "default", C::kCopy, 2, 6, true, 0},
      {"aten::select_scatter", "default", C::kCopy, 4, 4, true, 0},
      {"aten::scatter", "*", C::kCopy, -1, -1, true, 0},
      {"aten::scatter_add", "default", C::kCopy, 4, 4, true, 0},
      {"aten::index_put", "default", C::kCopy, 3, 4, true, 0},
      {"aten::index_copy", "default", C::kCopy, 4, 4, true, 0},
      {"aten::repeat_interleave", "*", C::kCopy, 1, 4, true, 0},
      {"aten::new_zeros", "default", C::kFactory, 2, 2, true, 0},
      {"aten::new_empty", "default", C::kFactory, 2, 2, true, 0},
      {"aten::new_ones", "default", C::kFactory, 2, 2, true, 0},
      // Factories.
      {"aten::zeros", "default", C::kFactory, 1, 1, true, 0},
      {"aten::ones", "default", C::kFactory, 1, 1, true, 0},
      {"aten::tril", "default", C::kElementwise, 1, 2, true, 0},
      {"aten::triu", "default", C::kElementwise, 1, 2, true, 0},
      {"aten::full", "default", C::kFactory, 2, 2, true, 0},
      {"aten::empty", "memory_format", C::kFactory, 1, 1, true, 0},
      {"aten::empty_strided", "default", C::kFactory, 2, 2, true, 0},
      {"aten::arange", "*", C::kFactory, -1, -1, true, 0},
      {"aten::zeros_like", "default", C::kFactory, 1, 1, true, 0},
      {"aten::ones_like", "default", C::kFactory, 1, 1, true, 0},
      {"aten::full_like", "default", C::kFactory, 2, 2, true, 0},
      {"aten::empty_like", "default", C::kFactory, 1, 1, true, 0},
      {"aten::scalar_tensor", "default", C::kFactory, 1, 1, true, 0},
      {"aten::lift_fresh_copy", "default", C::kFactory, 1, 1, true, 0},
      // Random: not pure, dropping one shifts the RNG stream for every later random op.
      {"aten::native_dropout", "default", C::kRandom, 3, 3, false, 2},
      {"aten::native_dropout_backward", "default", C::kElementwise, 3, 3, true, 2},
      {"aten::bernoulli", "*", C::kRandom, -1, -1, false, 2},
      {"aten::rand", "*", C::kRandom, -1, -1, false, 2},
      {"aten::randn", "*", C::kRandom, -1, -1, false, 2},
      {"aten::rand_like", "*", C::kRandom, -1, -1, false, 2},
      {"aten::randn_like", "*", C::kRandom, -1, -1, false, 2},
      {"aten::randint", "*", C::kRandom, -1, -1, false, 2},
      {"aten::uniform", "*", C::kRandom, -1, -1, false, 2},
      {"aten::normal", "*", C::kRandom, -1, -1, false, 2},
      // In place (dropout traces to empty_like + bernoulli_): random before they are mutations.
      {"aten::bernoulli_", "*", C::kRandom, -1, -1, false, 2},
      {"aten::uniform_", "*", C::kRandom, -1, -1, false, 2},
      {"aten::normal_", "*", C::kRandom, -1, -1, false, 2},
      // Activation checkpointing's functionalised RNG: the forward runs a random op and returns
      // the generator state it ran from (it draws); the backward's run_with_rng_state runs it
      // again from that state and sets the generator back (no draw: not listed).
      {"higher_order::run_and_save_rng_state", "*", C::kRandom, -1, -1, false, 0},
      // Mutations.
      {"aten::copy_", "default", C::kMutation, 2, 3, false, 0},
      {"aten::add_", "*", C::kMutation, -1, -1, false, 1},
      {"aten::mul_", "*", C::kMutation, -1, -1, false, 1},
      {"aten::copy", "default", C::kCopy, 2, 3, true, 0},
      // Symbolic size queries.
      {"aten::sym_size", "int", C::kSymbolic, 2, 2, true, 0},
      {"aten::sym_stride", "int", C::kSymbolic, 2, 2, true, 0},
      {"aten::sym_numel", "default", C::kSymbolic, 1, 1, true, 0},
      {"aten::sym_storage_offset", "default", C::kSymbolic, 1, 1, true, 0},
      // Our own kernels.
      {"torch_plugin::bias_gelu", "default", C::kElementwise, 2, 3, true, 9},
      {"torch_plugin::bias_gelu_backward", "default", C::kElementwise, 3, 4, true, 13},
  };
  for (const auto& info : table) Add(info);
}

OpCost OpRegistry::Estimate(const Graph& graph, const Node& node) const {
  OpCost cost;
  const OpInfo* info = Find(node.op);
  if (info == nullptr) return cost;  // opaque op: unknown cost
  Sizes s;
  bool bytes_ok = true;
  const TensorType* out = FirstTensorOutput(graph, node);
  const double out_numel = s.Numel(out);
  const bool backward = Contains(node.op, "backward");
  double flops = 0.0;
  bool move_bytes = true;

  switch (info->cls) {
    case OpClass::kMatmul: {
      // The operand whose last dim is contracted: addmm/baddbmm/addmv take the bias first.
      const bool bias_first = Contains(node.op, "::add") || Contains(node.op, "::badd");
      const TensorType* a = s.Tensor(graph, node, bias_first ? 1 : 0);
      flops = 2.0 * out_numel * s.Dim(a, -1);
      const bool linear_bias = Contains(node.op, "::linear") && node.args.size() > 2 &&
                               node.args[2].is_value();
      if (bias_first || linear_bias) flops += out_numel;
      break;
    }
    case OpClass::kConv: {
      const TensorType* w = s.Tensor(graph, node, backward ? 2 : 1);
      double per_output = 1.0;
      if (w) {
        for (int64_t d = 1; d < w->rank(); ++d) per_output *= s.Dim(w, d);
      }
      // Backward computes the input and the weight gradient, each as costly as forward; its
      // output count is grad_output's.
      const double outputs = backward ? s.Numel(s.Tensor(graph, node, 0)) : out_numel;
      flops = 2.0 * outputs * per_output * (backward ? 2.0 : 1.0);
      break;
    }
    case OpClass::kAttention: {
      const size_t q_index = backward ? 1 : 0;
      const TensorType* q = s.Tensor(graph, node, q_index);
      const TensorType* k = s.Tensor(graph, node, q_index + 1);
      const TensorType* v = s.Tensor(graph, node, q_index + 2);
      const double d = s.Dim(q, -1);
      const double rows = d > 0 ? s.Numel(q) / d : 0.0;  // batch * heads * query length
      const double lk = s.Dim(k, -2);
      const double dv = s.Dim(v, -1);
      const double forward = 2.0 * rows * lk * d + 2.0 * rows * lk * dv + 5.0 * rows * lk;
      flops = backward ? 2.5 * forward : forward;
      break;
    }
    case OpClass::kEmbedding: {
      // Reads only the gathered rows, not the whole table.
      move_bytes = false;
      double index_bytes = 0.0;
      if (!backward && node.args.size() > 1 && node.args[1].is_value()) {
        index_bytes = TensorBytes(graph, node.args[1].value(), &bytes_ok);
      }
      const double out_bytes = OutputBytes(graph, node, &bytes_ok);
      if (backward) {
        flops = s.Numel(s.Tensor(graph, node, 0));
        cost.bytes = InputBytes(graph, node, &bytes_ok) + out_bytes;
      } else {
        cost.bytes = 2.0 * out_bytes + index_bytes;
      }
      break;
    }
    case OpClass::kElementwise:
    case OpClass::kRandom:
    case OpClass::kMutation:
      flops = out_numel * info->flops_per_element;
      break;
    case OpClass::kPool:
      flops = s.Numel(s.Tensor(graph, node, 0)) * info->flops_per_element;
      break;
    case OpClass::kReduction:
      flops = s.Numel(s.Tensor(graph, node, 0));
      break;
    case OpClass::kSoftmax:
      flops = 5.0 * out_numel;
      break;
    case OpClass::kNorm:
      flops = 8.0 * s.Numel(s.Tensor(graph, node, 0)) * (backward ? 2.0 : 1.0);
      break;
    case OpClass::kView:
    case OpClass::kSymbolic:
      move_bytes = false;
      break;
    case OpClass::kFactory:
      move_bytes = false;
      cost.bytes = OutputBytes(graph, node, &bytes_ok);
      break;
    case OpClass::kCopy:
      break;
    case OpClass::kOther:
      return cost;
  }
  if (move_bytes) cost.bytes = InputBytes(graph, node, &bytes_ok) + OutputBytes(graph, node, &bytes_ok);
  cost.flops = flops;
  const bool needs_sizes = info->cls != OpClass::kView && info->cls != OpClass::kSymbolic;
  cost.known = bytes_ok && (s.ok || !needs_sizes);
  if (!cost.known) cost.flops = cost.bytes = 0.0;
  return cost;
}

}  // namespace tp::ir
