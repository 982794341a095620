// Op registry: what the passes know about ATen ops, keyed by "namespace::name.overload".
//
// Each entry gives the op's class (matmul, conv, elementwise, view, ...), its positional
// arity for the verifier, whether it is pure (free of side effects and randomness, so dead
// code elimination may drop it), and a FLOPs/bytes estimate from the node's types. Ops not in
// the table are opaque: kept as they are, never an error. The table is built once and frozen.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace tp::ir {

enum class OpClass {
  kMatmul,
  kConv,
  kAttention,
  kEmbedding,
  kElementwise,
  kReduction,
  kSoftmax,
  kNorm,
  kPool,
  kView,
  kCopy,
  kFactory,
  kRandom,
  kMutation,
  kSymbolic,
  kOther,
};
const char* OpClassName(OpClass cls);

struct OpCost {
  double flops = 0.0;
  double bytes = 0.0;  // bytes read + written in memory
  bool known = false;  // false when a needed size is symbolic without a hint or missing
};

struct OpInfo {
  std::string name;      // "aten::mm"
  std::string overload;  // "default", or "*" for every overload
  OpClass cls = OpClass::kOther;
  int min_args = -1;  // positional arguments; -1 = unchecked
  int max_args = -1;
  bool pure = true;
  double flops_per_element = 0.0;  // elementwise / pooling ops
};

class OpRegistry {
 public:
  // The frozen table of core ATen ops.
  static const OpRegistry& Default();

  // Exact "name.overload" first, then the name's "*" entry; nullptr for unknown ops.
  const OpInfo* Find(const std::string& qualified_op) const;
  // Unknown ops are not pure: dropping them could drop a side effect.
  bool IsPure(const std::string& qualified_op) const;
  OpCost Estimate(const Graph& graph, const Node& node) const;
  size_t size() const { return by_name_.size(); }

  // Splits "aten::add.Tensor" into {"aten::add", "Tensor"}; "default" if no overload.
  static std::pair<std::string, std::string> SplitOverload(const std::string& qualified_op);

 private:
  OpRegistry();
  void Add(OpInfo info);
  std::unordered_map<std::string, OpInfo> by_name_;  // key: name + "." + overload
};

}  // namespace tp::ir
