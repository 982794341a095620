// The graph the pipeline passes work on: blocks (layers or single ops) with per-sample costs,
// their data edges, and the series-parallel (SP) decomposition GraphPipe's partitioner recurses
// over (thesis §3.5).
//
// A CostGraph comes from the IR (CostGraphFromIr: ATen nodes costed by the op registry) or from
// Python (module-level FX nodes costed by a FLOP counter). Coarsen() merges it to layer-level
// blocks; DecomposeSeriesParallel() turns the block DAG into a tree whose every subtree, and
// every contiguous range of a subtree's children, is a convex set of blocks (condition C1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace tp::pipeline {

struct CostNode {
  std::string name;          // unique; FX node name or "scope" of a merged block
  std::string scope;         // module path; "" for top-level code
  std::vector<int> inputs;   // producer node indices (each < this node's index)
  double fwd_flops = 0;      // per sample
  double bwd_flops = 0;      // per sample
  double io_bytes = 0;       // memory traffic per sample, forward
  double act_bytes = 0;      // activations kept for backward, per sample
  double out_bytes = 0;      // output bytes per sample (sent if it crosses a stage boundary)
  double param_bytes = 0;    // parameters owned (fp32 bytes), independent of the batch
  double kernels = 0;        // forward kernel launches
  bool is_output = false;    // feeds the model's output (or loss)
  std::vector<int> members;  // original node indices merged into this block
};

// Adds the additive costs of `src` (FLOPs, traffic, activations, parameters, kernels) to any
// record with those fields: merged blocks and stage totals sum the same way.
template <class Costs>
void AddCosts(Costs& dst, const CostNode& src) {
  dst.fwd_flops += src.fwd_flops;
  dst.bwd_flops += src.bwd_flops;
  dst.io_bytes += src.io_bytes;
  dst.act_bytes += src.act_bytes;
  dst.param_bytes += src.param_bytes;
  dst.kernels += src.kernels;
}

struct CostGraph {
  std::vector<CostNode> nodes;  // topological order

  int size() const { return static_cast<int>(nodes.size()); }
  std::vector<std::vector<int>> Consumers() const;
  // Throws std::invalid_argument naming the node for out-of-order or dangling inputs.
  void Validate() const;
};

// ATen-level IR (forward graph) to a cost graph; per-sample figures divide by `batch`.
CostGraph CostGraphFromIr(const ir::Graph& graph, int64_t batch);

struct CoarsenOptions {
  int scope_depth = -1;  // merge nodes sharing the first `scope_depth` scope components (-1: off)
  // Then fold cheap blocks (below this fraction of the mean block's FLOPs: activations, views,
  // pooling) into their sole producer when it has no other consumer.
  double cheap_fraction = 0.05;
  int max_blocks = 256;  // then contract chains (sole producer -> sole consumer) down to this
};
// Merges nodes into blocks. Every merge keeps the block graph acyclic (a scope group that would
// not be convex stays split).
CostGraph Coarsen(const CostGraph& graph, const CoarsenOptions& options);

struct SpTree {
  enum class Kind { kLeaf, kSeries, kParallel };
  struct Node {
    Kind kind = Kind::kLeaf;
    int block = -1;             // leaves: the CostGraph node
    std::vector<int> children;  // series: in dependency order; parallel: independent parts
    int join = -1;              // parallel: the join block absorbed into one of the branches
  };
  std::vector<Node> nodes;
  int root = -1;
  int linearised_regions = 0;        // non-SP regions that were turned into chains
  bool join_choice_matters = false;  // heaviest and lightest branch differ somewhere

  // Blocks under `node`, children [first, last] only (inclusive); all children by default.
  std::vector<int> Blocks(int node, int first = 0, int last = -1) const;
  std::string ToString() const;
};

// The SP tree of `graph`. Series splits happen at cut blocks (every other block is an ancestor
// or a descendant); parallel splits at weakly connected components. A region that is neither is
// linearised in topological order, which is still a valid (sequential) pipeline.
//
// With `absorb_joins`, a join block that follows a parallel part (a concat of the branches) is
// moved onto the end of the heaviest branch, so one stage may hold a branch's last layers and
// the join, as in GraphPipe's case study; ranges stay convex.
// `lightest`: give the join to the lightest branch instead (then a stage may hold the light
// branches, the join and what follows, keeping their outputs off the network - DLRM's sparse
// embeddings). `SpTree::join_choice_matters` says whether the two choices differ at all.
SpTree DecomposeSeriesParallel(const CostGraph& graph, bool absorb_joins = false,
                               bool lightest = false);

// The same graph as one chain in topological order: the sequential (SPP) view.
SpTree LinearChain(const CostGraph& graph);

}  // namespace tp::pipeline
