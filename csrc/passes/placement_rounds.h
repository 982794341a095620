// The finer placement search's rounds (Collage §2.5 after the op-level DP): which graph-level
// compilers get an evolutionary round and in what order, each round's share of the time
// budget, how a round's bits decode into regions, which finalist is kept, and whether the
// placed graph is kept over eager.
//
// Python compiles and measures (it has the backends); these functions decide from what it
// measured, so the search's choices are tested with fixed figures.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tp::passes {

struct PlacementRoundOptions {
  // One compiler's round only (PlacementOptions.evolve_backend); empty: every graph compiler.
  std::string only;
  // The placed graph is kept only when it is at most this fraction slower than eager, measured
  // side by side (a re-measured near tie must not flip a warm compile's verdict either way).
  double keep_eager_margin = 0.02;
  // The DP's placement is not built when its own prediction is over this multiple of the
  // time the caller's placement already measured (BuildsDpPlacement).
  double hopeless_ratio = 2.0;
};

struct RoundCompiler {
  std::string name;
  double expected_compile_s = 0.0;  // <= 0: unknown, after every known one
};

// The compilers that get a round, cheapest expected compile first (ties keep the given
// order): each round gets an equal share of what is left of the budget, so a fast compiler's
// round leaves time for the slow one's whole-graph individual. With `only`, that compiler
// alone, or none when it is not among them.
std::vector<std::string> PlacementRoundOrder(const std::vector<RoundCompiler>& compilers,
                                             const PlacementRoundOptions& options);

// A round's budget: an equal share of what is left over the rounds still to run.
double RoundBudget(double remaining_s, int rounds_left);

// An individual's bits over the current groups, decoded: runs of consecutive set bits become
// one region each ([begin, end) over the groups; consecutive groups of a topological order are
// a convex region); a clear bit keeps its group.
std::vector<std::pair<int, int>> OffloadedRuns(const std::vector<bool>& bits);

struct FinalistPick {
  int index = 0;
  // Per finalist, its median over the turns in seconds; -1 where it was not measured.
  std::vector<double> medians_s;
};

// The finalists (the seed, then per round its compiler's whole graph and the round's result),
// each timed in turns side by side; empty turns: not measured (wrong numbers, a duplicate of
// an earlier finalist, or it failed to build). The fastest median is kept; when none was
// measured, the seed (index 0), which the caller checks against eager.
FinalistPick PickFinalist(const std::vector<std::vector<double>>& turns_s);

// Whether eager is kept over the placed graph, both measured side by side.
bool KeepsEager(double placed_s, double eager_s, const PlacementRoundOptions& options);

// Whether the finer search builds the DP's placement, and evolves from it, for a graph that
// already runs in `beat_s` (the explicit pass's whole-graph pick; <= 0: nothing to beat). Not
// when the DP's predicted cost, the sum of its groups' timings alone, is over hopeless_ratio
// times that: on NasNet it predicted 2.1 ms (5.9 ms measured) against ONNX Runtime's whole
// graph at 0.35-0.53 ms, and building it took 8.7-25 s of a 120 s budget. The margin, since
// the prediction misses glue both ways (cache-cold group timings over-count a model larger
// than the cache).
bool BuildsDpPlacement(double dp_cost_s, double beat_s, const PlacementRoundOptions& options);

}  // namespace tp::passes
