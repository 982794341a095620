// Sharding specs and per-op sharding rules over a 1-D device mesh (issue 5, first slice).
//
// A tensor is Replicate (every rank holds it), Shard(d) (split in equal blocks along dim d) or
// Partial (every rank holds a summand; the value is their sum). A strategy of a node assigns a
// spec to each of its tensor inputs and outputs such that running the op on the local pieces
// gives the output in the stated spec, with `compute_fraction` of the op's work on each rank.
// Ops without a rule get only the all-Replicate strategy: correct, never faster.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace tp::ir {

struct ShardSpec {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = -1;  // kShard only

  static ShardSpec R() { return {}; }
  static ShardSpec S(int d) { return {Kind::kShard, d}; }
  static ShardSpec P() { return {Kind::kPartial, -1}; }
  bool operator==(const ShardSpec& o) const { return kind == o.kind && dim == o.dim; }
  bool operator!=(const ShardSpec& o) const { return !(*this == o); }
  std::string ToString() const;  // "R", "S(1)", "P"
};

struct ShardStrategy {
  std::string name;                // "replicate", "col", "row", "batch", "heads", ...
  std::vector<ShardSpec> inputs;   // one per TensorInputs(node) entry
  std::vector<ShardSpec> outputs;  // one per node output
  double compute_fraction = 1.0;   // of the op's FLOPs and bytes per rank
};

// The tensor values a node reads, in argument order (nested lists flattened); duplicates kept.
std::vector<ValueId> TensorInputs(const Graph& graph, const Node& node);

// Every strategy the rules allow for `node` on `world` ranks (the all-Replicate one first).
// Shard(d) is offered only where the dim's size (hint) is divisible by `world`.
std::vector<ShardStrategy> ShardingStrategies(const Graph& graph, const Node& node, int world);

// Specs a graph input may take: Replicate, and Shard(d) for every divisible dim.
std::vector<ShardSpec> InputSpecs(const TensorType& type, int world);

}  // namespace tp::ir
