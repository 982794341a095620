// Pass: sharding_materialize (issue 5): turns a sharding plan into the SPMD graph every rank
// runs on its local shards.
//
// The plan (sharding_ilp.h) assigns each node a strategy (a spec per tensor input and output)
// and each graph input a spec. This pass:
//   - gives sharded parameters and buffers their local type (a rank holds only its block);
//     user inputs arrive whole and are sliced in the graph (a free local reshard);
//   - inserts `torch_plugin::reshard.default(x, from, to, group, op)` (op: ir::ReshardOpFor's
//     name, the step the runtime runs as priced) wherever a consumer needs a
//     spec other than its producer's (one per value and target spec, shared by consumers);
//   - rewrites the size arguments of view/reshape nodes whose output is sharded, and turns
//     views into reshapes (a local block need not have the strides the view relied on);
//   - reshards every graph output to Replicate;
//   - when training, routes the replicated parameters through one
//     `torch_plugin::grad_sync.default([p...], group)` node (a tuple of the same tensors; its
//     backward all-reduces their gradients in one bucket) and each float output through
//     `torch_plugin::replicated_output.default(x, group)`.
//
// Gradient convention (what makes plain autograd on the local graph correct): the gradient a
// rank holds for a Replicate value is its summand of the true gradient, for Shard(d) its block,
// for Partial the whole gradient. Local ops preserve this (their backward is linear in the
// incoming gradient with the same Jacobian on every rank); each reshard's backward is the dual
// reshard (all_gather <-> reduce_scatter, all_reduce <-> all_reduce, slice <-> zero-pad);
// replicated_output scales the seed by 1/world so the summands add up to the loss's gradient,
// and grad_sync all-reduces the replicated parameters' summands.
#pragma once

#include <cstdint>

#include "ir/graph.h"
#include "passes/sharding_ilp.h"

namespace tp::passes {

struct MaterializeOptions {
  int world = 1;
  int64_t group = 0;     // runtime handle of the process group the collectives use
  bool training = true;  // insert grad_sync / replicated_output
};

struct MaterializeStats {
  int reshards = 0, grad_syncs = 0, views_rewritten = 0;  // grad_syncs: parameters synced
};

// Throws ShardingError naming the node when the plan does not fit the graph (a strategy with
// the wrong arity, a symbolic size on a sharded dim).
ir::Graph MaterializeSharding(const ir::Graph& graph, const ShardingPlan& plan,
                              const MaterializeOptions& options, MaterializeStats* stats = nullptr);

// The type one rank holds of a value of `type` in `spec` on `world` ranks.
ir::ValueType LocalType(const ir::ValueType& type, const ir::ShardSpec& spec, int world);

}  // namespace tp::passes
