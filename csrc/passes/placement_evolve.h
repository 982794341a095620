// Graph-level placement (Collage §2.5): an evolutionary search over which op-level groups to
// hand to a graph-level compiler (Inductor, OpenVINO), whose whole-region fusions the
// per-group costs of the dynamic program cannot see.
//
// An individual is a bit string, one bit per unit (a group of the op-level placement): set
// means "offload to the graph-level compiler". Fitness is end-to-end latency measured by the
// caller (lower is better), evaluated once per distinct individual. The seed (the op-level
// result) is evaluated first and kept in the population; a challenger replaces it only when
// it is faster by at least `min_improvement` (relative), so measurement noise cannot make the
// search return something worse than its seed. All-on (the whole graph as one region of the
// compiler) is always evaluated, so the result is never slower than that compiler alone.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "passes/pass.h"

namespace tp::passes {

struct EvolveOptions {
  int population = 12;
  int generations = 10;
  double mutation_rate = -1.0;  // per bit; < 0 means 1 / number of bits
  double min_improvement = 0.02;
  uint64_t seed = 0;
  // Stop after this many distinct fitness evaluations (the expensive part); <= 0: no limit. The
  // seed and the all-on individual are evaluated whatever the budget or deadline.
  int max_evaluations = 0;
};

struct EvolveResult {
  std::vector<bool> best;
  double best_fitness = 0.0;
  double seed_fitness = 0.0;
  int evaluations = 0;
  int generations = 0;
  bool stopped_by_deadline = false;
};

using FitnessFn = std::function<double(const std::vector<bool>&)>;
// Called after each generation with (generation, best fitness so far, evaluations).
using ProgressFn = std::function<void(int, double, int)>;

// Mutation, tournament selection and two-point crossover, elitist; stops at ctx.deadline.
EvolveResult EvolvePlacement(const std::vector<bool>& seed, const FitnessFn& fitness,
                             const EvolveOptions& options, Context& ctx,
                             const ProgressFn& progress = nullptr);

}  // namespace tp::passes
