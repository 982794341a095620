#include "passes/schedule_tune.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <stdexcept>

namespace tp::passes {
namespace {

// A concave score over a 3-variable grid with one invalid corner (a constraint between
// variables) and a failing point: the optimum is at (3, 1, 4).
std::optional<double> Score(const std::vector<int>& p) {
  if (p[0] == 0 && p[1] == 0) return std::nullopt;  // invalid combination
  if (p[0] == 5 && p[2] == 0) return std::nullopt;  // "out of memory"
  return -std::pow(p[0] - 3, 2) - 2 * std::pow(p[1] - 1, 2) - std::pow(p[2] - 4, 2);
}

TEST(ScheduleTune, ExhaustiveVisitsEveryPointOnceAndFindsTheOptimum) {
  Context ctx;
  TuneOptions opts;
  auto r = TuneSchedule({6, 3, 7}, Score, opts, ctx);
  EXPECT_EQ(r.space_size, 6 * 3 * 7);
  EXPECT_EQ(static_cast<int>(r.trials.size()), 6 * 3 * 7);
  std::set<std::vector<int>> distinct;
  for (const auto& t : r.trials) distinct.insert(t.point);
  EXPECT_EQ(distinct.size(), r.trials.size());
  EXPECT_EQ(r.best, (std::vector<int>{3, 1, 4}));
  EXPECT_DOUBLE_EQ(r.best_score, 0.0);
}

TEST(ScheduleTune, CoordinateDescentFindsTheOptimumWithFewerEvaluations) {
  Context ctx;
  TuneOptions opts;
  opts.method = TuneOptions::Method::kCoordinateDescent;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    opts.seed = seed;
    auto r = TuneSchedule({6, 3, 7}, Score, opts, ctx);
    EXPECT_EQ(r.best, (std::vector<int>{3, 1, 4})) << "seed " << seed;
    EXPECT_LT(r.trials.size(), 6u * 3u * 7u / 2) << "seed " << seed;
  }
}

TEST(ScheduleTune, BudgetStopsTheSearchAndKeepsTheBestSoFar) {
  Context ctx;
  TuneOptions opts;
  opts.max_evaluations = 10;  // the first 7 points are invalid
  auto r = TuneSchedule({6, 3, 7}, Score, opts, ctx);
  EXPECT_EQ(r.trials.size(), 10u);
  EXPECT_TRUE(r.stopped_by_budget);
  ASSERT_FALSE(r.best.empty());
  for (const auto& t : r.trials) {
    if (t.score) {
      EXPECT_LE(*t.score, r.best_score);
    }
  }
}

TEST(ScheduleTune, NothingValidGivesAnEmptyBestAndBadSpacesAreErrors) {
  Context ctx;
  TuneOptions opts;
  opts.method = TuneOptions::Method::kCoordinateDescent;
  auto r = TuneSchedule(
      {2, 2}, [](const std::vector<int>&) { return std::optional<double>(); }, opts, ctx);
  EXPECT_TRUE(r.best.empty());
  EXPECT_EQ(r.trials.size(), 4u);
  EXPECT_THROW(TuneSchedule({}, Score, opts, ctx), std::invalid_argument);
  EXPECT_THROW(TuneSchedule({3, 0}, Score, opts, ctx), std::invalid_argument);
}

}  // namespace
}  // namespace tp::passes
