#include "passes/placement_evolve.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>

namespace tp::passes {

EvolveResult EvolvePlacement(const std::vector<bool>& seed, const FitnessFn& fitness,
                             const EvolveOptions& options, Context& ctx,
                             const ProgressFn& progress) {
  if (!fitness) throw PassError("placement_evolve", "", "no fitness function given");
  const size_t bits = seed.size();
  std::mt19937_64 rng(options.seed);
  std::map<std::vector<bool>, double> evaluated;
  EvolveResult result;

  auto budget_left = [&] {
    if (ctx.PastDeadline()) {
      result.stopped_by_deadline = true;
      return false;
    }
    return options.max_evaluations <= 0 ||
           static_cast<int>(evaluated.size()) < options.max_evaluations;
  };
  // Returns +inf for individuals that could not be evaluated within the budget.
  auto eval = [&](const std::vector<bool>& x) {
    auto it = evaluated.find(x);
    if (it != evaluated.end()) return it->second;
    if (!budget_left()) return std::numeric_limits<double>::infinity();
    double f = fitness(x);
    if (!std::isfinite(f)) f = std::numeric_limits<double>::infinity();
    evaluated.emplace(x, f);
    return f;
  };

  result.seed_fitness = fitness(seed);
  evaluated.emplace(seed, result.seed_fitness);
  result.best = seed;
  result.best_fitness = result.seed_fitness;
  if (bits == 0 || options.population < 2) {
    result.evaluations = 1;
    return result;
  }
  const double rate = options.mutation_rate >= 0.0 ? options.mutation_rate : 1.0 / bits;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<size_t> pick_bit(0, bits - 1);

  auto mutate = [&](std::vector<bool> x) {
    bool changed = false;
    for (size_t i = 0; i < bits; ++i) {
      if (unit(rng) < rate) {
        x[i] = !x[i];
        changed = true;
      }
    }
    if (!changed) {
      const size_t i = pick_bit(rng);
      x[i] = !x[i];
    }
    return x;
  };

  // Initial population: the seed, all-on and all-off (the two single-backend extremes), and
  // mutants of the seed. All-on, the whole graph as one region of the compiler, is evaluated
  // even past the deadline or the evaluation budget: with it the result is never slower than
  // that compiler alone, whatever the seed cost to measure (on a wide graph the seed alone can
  // take the whole budget).
  struct Individual {
    std::vector<bool> x;
    double f;
  };
  std::vector<Individual> pop;
  pop.push_back({seed, result.seed_fitness});
  const std::vector<bool> all_on(bits, true);
  if (all_on != seed && !evaluated.count(all_on)) {
    double f = fitness(all_on);
    if (!std::isfinite(f)) f = std::numeric_limits<double>::infinity();
    evaluated.emplace(all_on, f);
    pop.push_back({all_on, f});
  }
  const std::vector<bool> all_off(bits, false);
  if (all_off != seed) pop.push_back({all_off, eval(all_off)});
  while (static_cast<int>(pop.size()) < options.population && budget_left()) {
    auto x = mutate(seed);
    pop.push_back({x, eval(x)});
  }

  auto tournament = [&]() -> const Individual& {
    std::uniform_int_distribution<size_t> pick(0, pop.size() - 1);
    const Individual& a = pop[pick(rng)];
    const Individual& b = pop[pick(rng)];
    return a.f <= b.f ? a : b;
  };

  for (int gen = 0; gen < options.generations && budget_left(); ++gen) {
    std::sort(pop.begin(), pop.end(), [](const auto& a, const auto& b) { return a.f < b.f; });
    std::vector<Individual> next(pop.begin(), pop.begin() + std::min<size_t>(2, pop.size()));
    while (static_cast<int>(next.size()) < options.population && budget_left()) {
      std::vector<bool> child = tournament().x;
      const std::vector<bool>& other = tournament().x;
      if (bits >= 2) {  // two-point crossover
        size_t a = pick_bit(rng), b = pick_bit(rng);
        if (a > b) std::swap(a, b);
        for (size_t i = a; i <= b; ++i) child[i] = other[i];
      }
      child = mutate(child);
      next.push_back({child, eval(child)});
    }
    pop = std::move(next);
    result.generations = gen + 1;
    double best = std::numeric_limits<double>::infinity();
    for (const auto& [x, f] : evaluated) best = std::min(best, f);
    if (progress) progress(gen, best, static_cast<int>(evaluated.size()));
  }

  for (const auto& [x, f] : evaluated) {
    if (f < result.best_fitness && f < result.seed_fitness * (1.0 - options.min_improvement)) {
      result.best = x;
      result.best_fitness = f;
    }
  }
  result.evaluations = static_cast<int>(evaluated.size());
  ctx.Log("placement_evolve: " + std::to_string(result.evaluations) + " evaluations, " +
          std::to_string(result.generations) + " generations, seed " +
          std::to_string(result.seed_fitness * 1e3) + " ms, best " +
          std::to_string(result.best_fitness * 1e3) + " ms");
  return result;
}

}  // namespace tp::passes
