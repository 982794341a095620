#include "passes/placement_dp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "pattern/candidates.h"

namespace tp::passes {
namespace {

// A random DAG on n nodes (edges only from lower to higher index), with two single-op
// backends and random convex groups of 2-4 connected nodes on a third, with a cost table.
PlacementProblem RandomProblem(int n, std::mt19937_64& rng) {
  PlacementProblem p;
  p.num_nodes = n;
  p.preds.resize(static_cast<size_t>(n));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int v = 1; v < n; ++v) {
    for (int w = 0; w < v; ++w) {
      if (u(rng) < 0.3) p.preds[static_cast<size_t>(v)].push_back(w);
    }
  }
  std::vector<std::vector<ir::NodeId>> succ(static_cast<size_t>(n));
  for (int v = 0; v < n; ++v) {
    for (int w : p.preds[static_cast<size_t>(v)]) succ[static_cast<size_t>(w)].push_back(v);
  }
  for (int v = 0; v < n; ++v) {
    p.options.push_back({static_cast<int>(p.options.size()), {v}, 1.0 + u(rng), "aten"});
    if (u(rng) < 0.7)
      p.options.push_back({static_cast<int>(p.options.size()), {v}, 0.5 + u(rng), "fast"});
  }
  std::set<std::vector<int>> seen;
  for (int tries = 0; tries < 6 * n; ++tries) {
    // Grow a connected group from a random node along random edges.
    std::vector<int> group{static_cast<int>(rng() % static_cast<uint64_t>(n))};
    const int size = 2 + static_cast<int>(rng() % 3);
    for (int step = 0; step < 8 && static_cast<int>(group.size()) < size; ++step) {
      const int from = group[rng() % group.size()];
      std::vector<int> nb = p.preds[static_cast<size_t>(from)];
      for (int s : succ[static_cast<size_t>(from)]) nb.push_back(s);
      if (nb.empty()) break;
      const int next = nb[rng() % nb.size()];
      if (std::find(group.begin(), group.end(), next) == group.end()) group.push_back(next);
    }
    std::sort(group.begin(), group.end());
    if (group.size() < 2 || !seen.insert(group).second) continue;
    std::vector<ir::NodeId> ids(group.begin(), group.end());
    if (!pattern::IsConvex(succ, ids)) continue;
    p.options.push_back({static_cast<int>(p.options.size()), group,
                         0.3 * static_cast<double>(group.size()) + u(rng), "fused"});
  }
  p.switch_penalty = 0.25;
  return p;
}

// Every exact cover by the options whose group graph is acyclic; the cheapest cost.
double BruteForce(const PlacementProblem& p) {
  const int n = p.num_nodes;
  std::vector<int> owner(static_cast<size_t>(n), -1);
  std::vector<int> chosen;
  double best = std::numeric_limits<double>::infinity();
  std::function<void()> rec = [&] {
    int first = 0;
    while (first < n && owner[static_cast<size_t>(first)] >= 0) ++first;
    if (first == n) {
      // Acyclic quotient: repeatedly remove groups whose outside predecessors are all removed.
      std::vector<bool> done(chosen.size(), false);
      for (size_t round = 0; round < chosen.size(); ++round) {
        for (size_t g = 0; g < chosen.size(); ++g) {
          if (done[g]) continue;
          bool ready = true;
          for (int v : p.options[static_cast<size_t>(chosen[g])].nodes) {
            for (int q : p.preds[static_cast<size_t>(v)]) {
              const int og = owner[static_cast<size_t>(q)];
              if (og != static_cast<int>(g) && !done[static_cast<size_t>(og)]) ready = false;
            }
          }
          if (ready) done[g] = true;
        }
      }
      if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) {
        best = std::min(best, PlacementCost(p, chosen));
      }
      return;
    }
    for (size_t o = 0; o < p.options.size(); ++o) {
      const auto& nodes = p.options[o].nodes;
      if (std::find(nodes.begin(), nodes.end(), first) == nodes.end()) continue;
      bool free = true;
      for (int v : nodes) free &= owner[static_cast<size_t>(v)] < 0;
      if (!free) continue;
      for (int v : nodes) owner[static_cast<size_t>(v)] = static_cast<int>(chosen.size());
      chosen.push_back(static_cast<int>(o));
      rec();
      chosen.pop_back();
      for (int v : nodes) owner[static_cast<size_t>(v)] = -1;
    }
  };
  rec();
  return best;
}

TEST(PlacementDp, EqualsBruteForceOnRandomGraphs) {
  std::mt19937_64 rng(20261123);
  Context ctx;
  int with_groups = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 3 + trial % 10;  // 3..12 nodes
    PlacementProblem p = RandomProblem(n, rng);
    const double expected = BruteForce(p);
    OpLevelPlacement got = PlaceOpLevel(p, {}, ctx);
    EXPECT_TRUE(got.exact);
    EXPECT_NEAR(got.cost, expected, 1e-9) << "trial " << trial << " n " << n;
    EXPECT_NEAR(PlacementCost(p, got.chosen), got.cost, 1e-9);
    // The chosen groups cover every node exactly once.
    std::vector<int> count(static_cast<size_t>(n), 0);
    for (int o : got.chosen) {
      for (int v : p.options[static_cast<size_t>(o)].nodes) ++count[static_cast<size_t>(v)];
      with_groups += p.options[static_cast<size_t>(o)].nodes.size() > 1;
    }
    EXPECT_TRUE(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }));
  }
  EXPECT_GT(with_groups, 10);  // the test exercises multi-node groups, not only singletons
}

// x -> {y, z}: z's group {x, z} needs y placed first, and y needs x: no order exists. The
// program must not pick that pair even though it is the cheapest cover on paper.
TEST(PlacementDp, RefusesCoversWithCyclesBetweenGroups) {
  PlacementProblem p;
  p.num_nodes = 3;
  p.preds = {{}, {0}, {0, 1}};  // 0 -> 1 -> 2 and 0 -> 2
  p.options = {{0, {0}, 1.0, "aten"},
               {1, {1}, 1.0, "aten"},
               {2, {2}, 1.0, "aten"},
               {3, {0, 2}, 0.1, "fused"}};
  Context ctx;
  auto got = PlaceOpLevel(p, {}, ctx);
  EXPECT_DOUBLE_EQ(got.cost, 3.0);
}

TEST(PlacementDp, SwitchPenaltyFavoursStayingInline) {
  PlacementProblem p;
  p.num_nodes = 2;
  p.preds = {{}, {0}};
  p.options = {{0, {0}, 1.0, "aten"},
               {1, {1}, 1.0, "aten"},
               {2, {0}, 0.9, "fused"},
               {3, {1}, 0.9, "fused"},
               {4, {0, 1}, 1.9, "fused"}};
  Context ctx;
  p.switch_penalty = 0.0;
  EXPECT_NEAR(PlaceOpLevel(p, {}, ctx).cost, 1.8, 1e-12);
  p.switch_penalty = 0.2;  // two fused singletons pay twice, the pair once
  EXPECT_NEAR(PlaceOpLevel(p, {}, ctx).cost, 2.0, 1e-12);
  p.switch_penalty = 0.5;
  auto got = PlaceOpLevel(p, {}, ctx);
  EXPECT_NEAR(got.cost, 2.0, 1e-12);
  EXPECT_EQ(got.chosen, (std::vector<int>{0, 1}));
}

TEST(PlacementDp, BoundedSearchStillCoversWideGraphs) {
  // 40 independent nodes: 2^40 predecessor-closed sets; the bounded form takes over.
  PlacementProblem p;
  p.num_nodes = 40;
  p.preds.resize(40);
  for (int v = 0; v < 40; ++v) p.options.push_back({v, {v}, 1.0, "aten"});
  Context ctx;
  auto got = PlaceOpLevel(p, {.max_states = 1000}, ctx);
  EXPECT_FALSE(got.exact);
  EXPECT_DOUBLE_EQ(got.cost, 40.0);
}

TEST(PlacementDp, NamesTheNodeNoGroupCovers) {
  PlacementProblem p;
  p.num_nodes = 2;
  p.preds = {{}, {0}};
  p.node_names = {"mm", "softmax"};
  p.options = {{0, {0}, 1.0, "aten"}};
  Context ctx;
  try {
    PlaceOpLevel(p, {}, ctx);
    FAIL() << "expected PassError";
  } catch (const PassError& e) {
    EXPECT_EQ(e.node(), "softmax");
  }
}

}  // namespace
}  // namespace tp::passes
