#include "passes/placement_evolve.h"

#include <gtest/gtest.h>

#include <random>

namespace tp::passes {
namespace {

// Separable cost: bit i on saves gain[i] (may be negative) plus measurement noise.
TEST(PlacementEvolve, ImprovesOnItsSeedAndNeverReturnsWorse) {
  const std::vector<double> gain = {0.3, -0.2, 0.5, 0.1, -0.4, 0.2, 0.0, 0.3};
  std::mt19937_64 noise_rng(1);
  std::normal_distribution<double> noise(0.0, 0.01);
  auto fitness = [&](const std::vector<bool>& x) {
    double f = 10.0;
    for (size_t i = 0; i < x.size(); ++i) f -= x[i] ? gain[i] : 0.0;
    return f + noise(noise_rng);
  };
  std::vector<bool> seed(gain.size(), false);
  Context ctx;
  EvolveOptions opts;
  opts.seed = 3;
  opts.generations = 20;
  auto r = EvolvePlacement(seed, fitness, opts, ctx);
  EXPECT_LE(r.best_fitness, r.seed_fitness);
  // The optimum turns on every positive-gain bit: 10 - 1.4.
  EXPECT_LT(r.best_fitness, 10.0 - 1.2);
  EXPECT_GT(r.evaluations, 10);
}

TEST(PlacementEvolve, KeepsTheSeedWhenNothingBeatsItByTheMargin) {
  // Every individual measures within 1% of the seed: noise, not an improvement.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.99, 1.01);
  auto fitness = [&](const std::vector<bool>&) { return u(rng); };
  std::vector<bool> seed = {true, false, true, false};
  Context ctx;
  EvolveOptions opts;
  opts.min_improvement = 0.02;
  auto r = EvolvePlacement(seed, fitness, opts, ctx);
  EXPECT_EQ(r.best, seed);
  EXPECT_EQ(r.best_fitness, r.seed_fitness);
}

TEST(PlacementEvolve, StopsAtTheEvaluationBudgetAndDeadline) {
  int calls = 0;
  auto fitness = [&](const std::vector<bool>& x) {
    ++calls;
    return 1.0 + (x[0] ? 0.0 : 1.0);
  };
  Context ctx;
  EvolveOptions opts;
  opts.max_evaluations = 5;
  auto r = EvolvePlacement(std::vector<bool>(6, false), fitness, opts, ctx);
  EXPECT_LE(calls, 5);
  EXPECT_EQ(r.evaluations, calls);
  ctx.deadline = std::chrono::steady_clock::now();
  calls = 0;
  auto r2 = EvolvePlacement(std::vector<bool>(6, false), fitness, EvolveOptions{}, ctx);
  // Past the deadline: the seed and the whole graph on the compiler (all-on), which is faster.
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(r2.stopped_by_deadline);
  EXPECT_EQ(r2.best, std::vector<bool>(6, true));
}

}  // namespace
}  // namespace tp::passes
