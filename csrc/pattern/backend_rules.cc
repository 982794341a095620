#include "pattern/backend_rules.h"

#include <stdexcept>

namespace tp::pattern {
namespace {

using C = ir::OpClass;

std::vector<Rule> GraphCompilerRules() {
  // Compute ops worth a compiled kernel, alone or followed by a chain of cheap ops that a
  // graph compiler fuses into their epilogue.
  const Pattern compute = IsOpClass({C::kMatmul, C::kConv, C::kAttention, C::kNorm, C::kSoftmax,
                                     C::kReduction, C::kPool, C::kElementwise, C::kEmbedding});
  const Pattern chain = IsOpClass({C::kElementwise, C::kView, C::kCopy, C::kSoftmax, C::kNorm});
  return {FusionRule("fusion", compute, chain, 4)};
}

std::vector<Rule> FusedKernelRules() {
  const Pattern linear =
      Alt({IsOp({"aten::addmm"}),
           IsOp({"aten::view", "aten::reshape", "aten::_unsafe_view"}, {IsOp({"aten::addmm"})})});
  const Pattern act_of_linear =
      IsOp({"aten::gelu", "aten::relu", "aten::tanh", "aten::silu"}, {linear});
  const Pattern layer_norm = IsOp({"aten::native_layer_norm"});
  const Pattern add_layer_norm = IsOp({"aten::native_layer_norm"}, {IsOp({"aten::add.Tensor"})});
  const Pattern scores =
      Alt({IsOp({"aten::add.Tensor"}, {IsOp({"aten::div.Tensor", "aten::mul.Tensor"})}),
           IsOp({"aten::div.Tensor", "aten::mul.Tensor"}), IsOp({"aten::add.Tensor"})});
  const Pattern softmax_of_scores = IsOp({"aten::_softmax"}, {scores});
  // SDPA as ATen lowers it on CPU (AOT decomposes F.scaled_dot_product_attention to it).
  const Pattern sdpa = IsOp({"aten::_scaled_dot_product_flash_attention_for_cpu"});
  return {PatternRule("linear_act", HasDType(act_of_linear, {ir::DType::kFloat32})),
          PatternRule("add_layer_norm", HasDType(add_layer_norm, {ir::DType::kFloat32})),
          PatternRule("layer_norm", HasDType(layer_norm, {ir::DType::kFloat32})),
          PatternRule("softmax", HasDType(softmax_of_scores, {ir::DType::kFloat32})),
          PatternRule("softmax", HasDType(IsOp({"aten::_softmax"}), {ir::DType::kFloat32})),
          PatternRule("attention", HasDType(sdpa, {ir::DType::kFloat32}))};
}

}  // namespace

std::vector<std::string> KnownRuleSets() {
  return {"aten", "inductor", "openvino", "onnxruntime", "fused"};
}

std::vector<Rule> DefaultRules(const std::string& backend) {
  if (backend == "aten") return {PatternRule("op", AnyOp())};
  if (backend == "inductor" || backend == "openvino" || backend == "onnxruntime") {
    return GraphCompilerRules();
  }
  if (backend == "fused") return FusedKernelRules();
  std::string known;
  for (const auto& k : KnownRuleSets()) known += (known.empty() ? "" : ", ") + k;
  throw std::invalid_argument("no pattern rules for backend '" + backend + "'; known: " + known);
}

}  // namespace tp::pattern
