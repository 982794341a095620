// Pass: sharding_ilp (issue 5): one sharding strategy per node on the tp axis of a mesh, and
// per parameter whether its optimizer state is sharded (ZeRO-1) over the ranks holding copies
// (tp replicas and the dp axis), chosen by one ILP on CBC (Rhino's formulation, Alpa's costs).
//
// Variables: x[n][s] = node n runs strategy s (ir/sharding.h; graph inputs choose a spec);
// z1[p][s] + z2[p][s] <= x[p][s] = parameter p under spec s also shards its optimizer state
// (ZeRO-1), or its gradient and optimizer state over dp (ZeRO-2);
// y[e][s][t] >= x[p][s] + x[c][t] - 1 carries the resharding cost of edge e when producer p
// emits one spec and consumer c needs another (collectives priced alpha-beta on the device
// profile). Objective: per-rank compute + resharding + (training) the gradient all-reduce of
// every replicated parameter. Constraints: one strategy per node, memory per rank under the
// budget (parameters x optimizer-state factor when training, plus the activations saved for
// the backward under each node's strategy), pinned specs.
// Graph outputs must end Replicate. Infeasible memory -> ShardingError with the minimum needed.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cost/device_profile.h"
#include "ir/graph.h"
#include "ir/sharding.h"

namespace tp::passes {

struct ShardingOptions {
  int world = 1;
  std::string device = "a100";
  bool training = true;            // price gradient sync of replicated parameters
  double state_bytes_factor = 4;   // training: param + grad + two Adam moments per element
  double memory_budget_bytes = 0;  // per rank, parameters (and state); 0 = unlimited
  // Training: the activations the forward keeps for the backward count against the budget too,
  // per rank under each node's strategy (every tensor output of a non-view op, once; a
  // sharded output costs 1/world). 0 leaves them out. Inference keeps no activations.
  double activation_bytes_factor = 1.0;
  // Data parallelism (a 2-D mesh's dp axis): `dp` replicas each run this graph on their slice of
  // the batch (the graph is one replica's), and every parameter block's gradient is summed over
  // them. Training only; 1 = no dp axis.
  int dp = 1;
  // ZeRO: 1 lets the ILP shard a parameter's optimizer state (the state_bytes_factor - 2 part:
  // Adam's moments) over the ranks that hold copies of its block (dp x, and world x when it is
  // replicated over tp): memory (2 + (f - 2) / copies) x block instead of f x block, for an
  // all-gather of the updated block after each step. 2 also offers ZeRO-2 over the dp axis:
  // the gradient is reduce-scattered as soon as backward produces it (the whole one freed) and
  // the optimizer state sharded, (1 + (f - 1) / dp) x block, for a reduce-scatter and an
  // all-gather per parameter in place of its share of the bucketed all-reduce. 0 keeps whole
  // state on every rank.
  int max_zero_stage = 1;
  double time_limit_s = 30;
  // Memory as the second objective: among plans whose modelled step is within this fraction of
  // the fastest one, the one minimising time + parameter state per rank, each relative to the
  // fastest plan's (1% of memory is worth 1% of time). Small models are latency-bound, where
  // the fastest plan replicates whatever a collective would cost to shard; a user splitting a
  // model over ranks expects it split. 0: the fastest plan, whatever it holds.
  double memory_slack = 0.1;
  // The runtime's collective library has a reduce-scatter (NCCL, gloo). Without one a partial
  // sum becomes a block by all-reduce, and is priced so: the plan prices what runs.
  bool reduce_scatter = true;
  // "exact": one ILP variable set per node. "fast": nodes with identical neighbourhoods (the
  // repeats of a layer) share one, so a 96-layer model costs about one layer's ILP (Rhino's
  // coarse level; exact within that restriction). "auto": fast above `auto_fast_above` entities.
  std::string level = "auto";
  size_t auto_fast_above = 600;
  // Pinned specs: graph input source ("fc.weight") or node name -> spec of its (first) output.
  std::map<std::string, ir::ShardSpec> pinned;
  // Strategies fixed by name: node (or input value) name -> strategy name, as a plan's
  // `strategy` gives them, and parameter -> ZeRO stage, as its `zero_stage`: the same program at
  // another size. A name whose strategy this graph lacks at its sizes is free. Where every node
  // and input is fixed (here or by `pinned`), no ILP is built: the plan is read off and priced
  // (status "fixed"); otherwise the fixed ones are constraints of the ILP.
  std::map<std::string, std::string> fixed_strategies;
  std::map<std::string, int> fixed_zero;
};

struct Collective {
  std::string kind;      // "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
  std::string value;     // the value resharded
  std::string consumer;  // the node (or "output") that needed the other spec
  ir::ShardSpec from, to;
  double bytes = 0, seconds = 0;
};

struct ShardingPlan {
  std::map<std::string, std::string> strategy;      // node name -> strategy name
  std::map<std::string, ir::ShardStrategy> chosen;  // node name -> the strategy itself
  std::map<std::string, double> node_compute_s;     // node name -> modelled per-rank time
  std::map<std::string, ir::ShardSpec> spec;        // value name (and input source) -> spec
  std::vector<Collective> collectives;              // forward resharding
  double compute_s = 0, comm_s = 0, grad_sync_s = 0, objective = 0;
  double fastest_objective = 0;  // the fastest plan's modelled step (see memory_slack)
  double param_bytes_per_rank = 0;
  // Training: parameters, gradients and optimizer state per rank, after ZeRO (the budget's part).
  double state_bytes_per_rank = 0;
  // Parameters (input source, else name) whose optimizer state the plan shards, with the number
  // of ranks it is spread over and the stage (1, or 2: the gradient too, over dp); the extra
  // time per step (ZeRO-1's all-gathers, ZeRO-2's per-parameter collectives over the bucket).
  std::map<std::string, int> zero_copies;
  std::map<std::string, int> zero_stage;
  double zero_gather_s = 0;
  double activation_bytes_per_rank = 0;  // training: kept for the backward (see the options)
  int variables = 0, constraints = 0;
  int classes = 0;  // decision units after tying repeated layers (= entities at the exact level)
  std::string level;
  std::string status;

  // Costs, then every value's spec and strategy, then the collectives: the readable form (repr,
  // golden files). Times in microseconds.
  std::string ToString() const;
};

class ShardingError : public std::runtime_error {
 public:
  ShardingError(const std::string& what, double min_bytes)
      : std::runtime_error(what), min_bytes_(min_bytes) {}
  double min_bytes() const { return min_bytes_; }

 private:
  double min_bytes_;
};

// Throws ShardingError (infeasible memory, a pin naming nothing or an impossible spec).
ShardingPlan PlanSharding(const ir::Graph& graph, const ShardingOptions& options);

}  // namespace tp::passes
