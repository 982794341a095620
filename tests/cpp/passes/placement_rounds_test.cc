#include "passes/placement_rounds.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tp::passes {
namespace {

TEST(PlacementRounds, CheapestCompileFirstUnknownLastTiesKeepTheirOrder) {
  std::vector<RoundCompiler> compilers = {
      {"inductor", 2.5}, {"tvm", 0.0}, {"onnxruntime", 1.5}, {"openvino", 0.1}, {"xla", 1.5}};
  EXPECT_EQ(PlacementRoundOrder(compilers, {}),
            (std::vector<std::string>{"openvino", "onnxruntime", "xla", "inductor", "tvm"}));
}

TEST(PlacementRounds, OnlyTheNamedCompilerOrNone) {
  std::vector<RoundCompiler> compilers = {{"inductor", 2.5}, {"openvino", 0.1}};
  PlacementRoundOptions only;
  only.only = "inductor";
  EXPECT_EQ(PlacementRoundOrder(compilers, only), (std::vector<std::string>{"inductor"}));
  only.only = "tensorrt";
  EXPECT_TRUE(PlacementRoundOrder(compilers, only).empty());
}

TEST(PlacementRounds, EachRoundAnEqualShareOfWhatIsLeft) {
  EXPECT_DOUBLE_EQ(RoundBudget(9.0, 3), 3.0);
  EXPECT_DOUBLE_EQ(RoundBudget(9.0, 1), 9.0);
  EXPECT_DOUBLE_EQ(RoundBudget(-1.0, 2), 0.0);  // past the deadline
  EXPECT_DOUBLE_EQ(RoundBudget(5.0, 0), 0.0);
}

TEST(PlacementRounds, SetRunsBecomeRegions) {
  using Runs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(OffloadedRuns({false, true, true, false, true}), (Runs{{1, 3}, {4, 5}}));
  EXPECT_EQ(OffloadedRuns({true, true, true}), (Runs{{0, 3}}));
  EXPECT_TRUE(OffloadedRuns({false, false}).empty());
  EXPECT_TRUE(OffloadedRuns({}).empty());
}

TEST(PlacementRounds, FastestMedianKeptUnmeasuredSkipped) {
  // The seed 2 ms; a whole graph with one fast outlier turn but a slower median; a wrong one.
  FinalistPick pick = PickFinalist({{2e-3, 2.1e-3, 1.9e-3}, {0.5e-3, 3e-3, 3e-3}, {}, {1.5e-3}});
  EXPECT_EQ(pick.index, 3);
  EXPECT_EQ(pick.medians_s, (std::vector<double>{2e-3, 3e-3, -1.0, 1.5e-3}));
  // Even turns: the mean of the middle two.
  EXPECT_DOUBLE_EQ(PickFinalist({{1.0, 3.0}}).medians_s[0], 2.0);
}

TEST(PlacementRounds, NothingMeasuredKeepsTheSeed) {
  FinalistPick pick = PickFinalist({{}, {}, {}});
  EXPECT_EQ(pick.index, 0);
  EXPECT_EQ(pick.medians_s, (std::vector<double>{-1.0, -1.0, -1.0}));
}

TEST(PlacementRounds, EagerKeptOnlyBeyondTheMargin) {
  PlacementRoundOptions options;
  EXPECT_FALSE(KeepsEager(1.01, 1.0, options));
  EXPECT_TRUE(KeepsEager(1.03, 1.0, options));
  options.keep_eager_margin = 0.05;
  EXPECT_FALSE(KeepsEager(1.03, 1.0, options));
}

TEST(PlacementRounds, TheDpPlacementIsBuiltUnlessItPredictsFarSlowerThanWhatRuns) {
  PlacementRoundOptions options;
  // NasNet: the DP predicted 2.1 ms against ONNX Runtime's whole graph at 0.53 ms.
  EXPECT_FALSE(BuildsDpPlacement(2.1e-3, 0.53e-3, options));
  // Within the margin the prediction may be wrong either way: built.
  EXPECT_TRUE(BuildsDpPlacement(0.9e-3, 0.53e-3, options));
  EXPECT_TRUE(BuildsDpPlacement(0.1e-3, 0.53e-3, options));
  // Nothing to beat (no whole-graph pick measured): always built.
  EXPECT_TRUE(BuildsDpPlacement(2.1e-3, 0.0, options));
  options.hopeless_ratio = 5.0;
  EXPECT_TRUE(BuildsDpPlacement(2.1e-3, 0.53e-3, options));
}

}  // namespace
}  // namespace tp::passes
