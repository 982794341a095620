#include "passes/pipeline_graph.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "pipeline_test_graphs.h"

namespace tp::pipeline {
namespace {

using testing::Block;

// Every node's children range must be convex: no path leaves the set and comes back.
bool Convex(const CostGraph& g, const std::vector<int>& blocks) {
  std::set<int> in(blocks.begin(), blocks.end());
  const auto consumers = g.Consumers();
  // Nodes reachable from the set that are outside it must not reach back into it.
  std::vector<char> out_reach(g.size(), 0);
  for (int v = 0; v < g.size(); ++v) {
    bool from_set = false;
    for (int u : g.nodes[v].inputs) from_set = from_set || in.count(u) || out_reach[u];
    if (!in.count(v) && from_set) out_reach[v] = 1;
    if (in.count(v)) {
      for (int u : g.nodes[v].inputs)
        if (out_reach[u]) return false;
    }
  }
  return true;
}

void ExpectAllRangesConvex(const CostGraph& g, const SpTree& t) {
  for (int id = 0; id < static_cast<int>(t.nodes.size()); ++id) {
    const auto& node = t.nodes[id];
    const int k = static_cast<int>(node.children.size());
    for (int l = 0; l < k; ++l)
      for (int r = l; r < k; ++r) EXPECT_TRUE(Convex(g, t.Blocks(id, l, r))) << t.ToString();
  }
}

TEST(SeriesParallel, DiamondIsSeriesOfParallel) {
  CostGraph g;
  g.nodes = {Block("s", {}, 1), Block("a", {0}, 1), Block("b", {0}, 1), Block("t", {1, 2}, 1)};
  const SpTree t = DecomposeSeriesParallel(g);
  EXPECT_EQ(t.ToString(), "S(0 P(1 2) 3)");
  EXPECT_EQ(t.linearised_regions, 0);
}

TEST(SeriesParallel, BranchesWithoutCommonSource) {
  const CostGraph g = testing::Branches(3, 2);
  const SpTree t = DecomposeSeriesParallel(g);
  EXPECT_EQ(t.ToString(), "S(P(S(0 1) S(2 3) S(4 5)) 6 7)");
  ExpectAllRangesConvex(g, t);
}

TEST(SeriesParallel, NonSpRegionIsLinearised) {
  // a->c, a->d, b->c, b->d (the "N"/K2,2 shape) under a common source and sink.
  CostGraph g;
  g.nodes = {Block("s", {}, 1),     Block("a", {0}, 1),    Block("b", {0}, 1),
             Block("c", {1, 2}, 1), Block("d", {1, 2}, 1), Block("t", {3, 4}, 1)};
  const SpTree t = DecomposeSeriesParallel(g);
  EXPECT_EQ(t.linearised_regions, 1);
  EXPECT_EQ(t.ToString(), "S(0 1 2 3 4 5)");
  ExpectAllRangesConvex(g, t);
  CostGraph n;
  n.nodes = {Block("a", {}, 1),  Block("b", {}, 1),  Block("c", {0, 1}, 1),
             Block("d", {1}, 1), Block("e", {0}, 1), Block("t", {2, 3, 4}, 1)};
  const SpTree tn = DecomposeSeriesParallel(n);
  ExpectAllRangesConvex(n, tn);
}

TEST(SeriesParallel, RandomSpGraphsDecomposeWithoutLinearising) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const CostGraph g = testing::RandomSp(rng, 4 + trial % 20);
    const SpTree t = DecomposeSeriesParallel(g);
    EXPECT_EQ(t.linearised_regions, 0) << t.ToString();
    std::vector<int> blocks = t.Blocks(t.root);
    std::sort(blocks.begin(), blocks.end());
    ASSERT_EQ(static_cast<int>(blocks.size()), g.size());
    for (int i = 0; i < g.size(); ++i) EXPECT_EQ(blocks[i], i);
    ExpectAllRangesConvex(g, t);
  }
}

TEST(Coarsen, ScopeGroupsMergeAndCostsAreKept) {
  const CostGraph g = testing::Branches(2, 3);
  CoarsenOptions o;
  o.scope_depth = 2;
  const CostGraph c = Coarsen(g, o);
  ASSERT_EQ(c.size(), 4);  // branches.0, branches.1, cat, head
  EXPECT_EQ(c.nodes[0].name, "branches.0");
  EXPECT_EQ(c.nodes[0].members, (std::vector<int>{0, 1, 2}));
  double flops = 0, cflops = 0;
  for (const auto& n : g.nodes) flops += n.fwd_flops;
  for (const auto& n : c.nodes) cflops += n.fwd_flops;
  EXPECT_DOUBLE_EQ(flops, cflops);
  // Only the branch end's output leaves the merged block.
  EXPECT_DOUBLE_EQ(c.nodes[0].out_bytes, g.nodes[2].out_bytes);
  EXPECT_EQ(c.nodes[2].inputs, (std::vector<int>{0, 1}));
}

TEST(Coarsen, NonConvexScopeGroupStaysSplit) {
  // x0 (scope m) -> y (scope other) -> x1 (scope m): merging m would make a cycle.
  CostGraph g;
  g.nodes = {Block("x0", {}, 1, 1, "m"), Block("y", {0}, 1, 1, "o"), Block("x1", {1}, 1, 1, "m")};
  CoarsenOptions o;
  o.scope_depth = 1;
  const CostGraph c = Coarsen(g, o);
  EXPECT_EQ(c.size(), 3);
}

TEST(Coarsen, MutuallyDependentScopeGroupsStaySplit) {
  // Found by pipeline_partition_fuzzer: a0 -> b0 and b1 -> a1 make scopes a and b each convex
  // but dependent on each other both ways; merging both would be a cycle.
  CostGraph g;
  g.nodes = {Block("a0", {}, 1, 1, "a"), Block("b1", {}, 1, 1, "b"), Block("b0", {0}, 1, 1, "b"),
             Block("a1", {1}, 1, 1, "a")};
  CoarsenOptions o;
  o.scope_depth = 1;
  o.cheap_fraction = 0;
  const CostGraph c = Coarsen(g, o);
  c.Validate();
  EXPECT_GE(c.size(), 3);
  DecomposeSeriesParallel(c);
}

TEST(Coarsen, ChainContractionReachesMaxBlocks) {
  const CostGraph g = testing::Branches(2, 8);
  CoarsenOptions o;
  o.max_blocks = 8;
  const CostGraph c = Coarsen(g, o);
  EXPECT_LE(c.size(), 8);
  c.Validate();
  EXPECT_EQ(DecomposeSeriesParallel(c).linearised_regions, 0);
}

TEST(Coarsen, CheapBlocksFoldIntoTheirProducer) {
  // linear -> relu -> linear -> relu: the ReLUs (no FLOPs to speak of) join their linears.
  CostGraph g;
  g.nodes = {Block("fc0", {}, 1e9), Block("relu0", {0}, 1e3), Block("fc1", {1}, 1e9),
             Block("relu1", {2}, 1e3)};
  CoarsenOptions o;
  const CostGraph c = Coarsen(g, o);
  ASSERT_EQ(c.size(), 2);
  EXPECT_EQ(c.nodes[0].members, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.nodes[1].inputs, (std::vector<int>{0}));
  o.cheap_fraction = 0;
  EXPECT_EQ(Coarsen(g, o).size(), 4);
}

TEST(SeriesParallel, AbsorbedJoinGoesToTheHeaviestBranch) {
  const CostGraph g = testing::Branches(3, 2);  // branch 2 is the heaviest (skew)
  const SpTree t = DecomposeSeriesParallel(g, /*absorb_joins=*/true);
  EXPECT_EQ(t.ToString(), "P(S(0 1) S(2 3) S(4 5 6 7))");
  EXPECT_EQ(t.nodes[t.root].join, 6);  // the concat, not the head after it
  ExpectAllRangesConvex(g, t);
}

TEST(CostGraph, ValidateNamesTheNode) {
  CostGraph g;
  g.nodes = {Block("a", {1}, 1), Block("b", {}, 1)};
  try {
    g.Validate();
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos);
  }
}

}  // namespace
}  // namespace tp::pipeline
