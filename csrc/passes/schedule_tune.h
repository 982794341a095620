// Schedule auto-tuning (Slapo §3.4): a search over the symbolic variables of a schedule
// (checkpoint ratio, micro-batch size, whether to shard or fuse a module, ...), each a finite
// list of candidates, scored by a user-given evaluation (throughput, higher is better).
//
// A point assigns one candidate index per variable. The caller's `evaluate` returns nothing
// for a point that is invalid (a constraint between variables, which is how dependent domains
// make a polygonal space) or that failed (out of memory, an error), so the search prunes it
// and goes on. Each distinct point is evaluated at most once.
//
// Two methods: exhaustive (every point, in order) and randomized coordinate descent (Nesterov):
// from a random valid point, sweep the variables in a random order, try every candidate of one
// variable with the others fixed, move to the best; stop after a sweep that improves nothing,
// at the evaluation budget, or at the deadline.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "passes/pass.h"

namespace tp::passes {

struct TuneOptions {
  enum class Method { kExhaustive, kCoordinateDescent };
  Method method = Method::kExhaustive;
  int max_evaluations = 0;  // distinct evaluations; <= 0: no limit
  uint64_t seed = 0;
  int restarts = 1;  // coordinate descent: independent starts
};

struct TuneTrial {
  std::vector<int> point;
  std::optional<double> score;  // empty: invalid or failed
};

struct TuneResult {
  std::vector<int> best;  // empty when no point was valid
  double best_score = 0.0;
  std::vector<TuneTrial> trials;  // in evaluation order
  int space_size = 0;             // number of points (valid or not)
  bool stopped_by_budget = false;
};

using TuneEvalFn = std::function<std::optional<double>(const std::vector<int>&)>;
// Called after each evaluation with (trial number, point, score or empty, best so far).
using TuneProgressFn =
    std::function<void(int, const std::vector<int>&, std::optional<double>, std::optional<double>)>;

// `sizes[k]` is the number of candidates of variable k (each >= 1). Throws
// std::invalid_argument for an empty space.
TuneResult TuneSchedule(const std::vector<int>& sizes, const TuneEvalFn& evaluate,
                        const TuneOptions& options, Context& ctx,
                        const TuneProgressFn& progress = nullptr);

}  // namespace tp::passes
