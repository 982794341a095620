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

// Strided sharding (Rhino): dim d holds `sections` equal parts packed together (a fused QKV
// projection's [q | k | v]); each rank holds its block of every part, in part order, so a later
// split into the parts leaves each part plainly Shard(d).
struct ShardSpec {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = -1;      // kShard only
  int sections = 1;  // kShard only; > 1: strided

  static ShardSpec R() { return {}; }
  static ShardSpec S(int d, int sections = 1) { return {Kind::kShard, d, sections}; }
  static ShardSpec P() { return {Kind::kPartial, -1, 1}; }
  bool strided() const { return kind == Kind::kShard && sections > 1; }
  bool operator==(const ShardSpec& o) const {
    return kind == o.kind && dim == o.dim && sections == o.sections;
  }
  bool operator!=(const ShardSpec& o) const { return !(*this == o); }
  std::string ToString() const;  // "R", "S(1)", "S(1)x3", "P"
};

// How a value held as `from` becomes `to` on every rank: the one step the cost model prices
// (sharding_ilp.cc), the materialiser names in each reshard node, and the runtime
// (torch_plugin/runtime/spmd_ops.py) runs as named.
enum class ReshardOp {
  kNone,            // the same spec
  kSlice,           // R -> S: this rank's block (local)
  kZeroPad,         // S -> P: the block in place, zeros elsewhere (local)
  kKeepOnRankZero,  // R -> P: rank 0 keeps the value, the others hold zero summands (local)
  kAllGather,       // S -> R
  kGatherSlice,     // S(d) -> S(d) of other sections: all-gather, then this rank's block
  kAllToAll,        // S(d) -> S(e), e != d
  kAllReduce,       // P -> R
  kReduceScatter,   // P -> S (a backend without one runs an all-reduce and keeps its block)
};
ReshardOp ReshardOpFor(const ShardSpec& from, const ShardSpec& to);
const char* ReshardOpName(ReshardOp op);
// The spec of a value's gradient: R <-> P, a shard stays itself (sharding_materialize.h).
ShardSpec GradientSpec(const ShardSpec& spec);

// Section counts offered for strided sharding (packed q/k/v, packed gate/up).
constexpr int kStridedSections[] = {2, 3};

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

// Specs a graph input may take: Replicate, Shard(d) for every divisible dim, and (`strided`,
// for parameters) Shard(d) x sections for the kStridedSections that divide.
std::vector<ShardSpec> InputSpecs(const TensorType& type, int world, bool strided = false);

}  // namespace tp::ir
