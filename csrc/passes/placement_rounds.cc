#include "passes/placement_rounds.h"

#include <algorithm>
#include <limits>
#include <map>

#include "passes/placement_search.h"

namespace tp::passes {

std::vector<std::string> PlacementRoundOrder(const std::vector<RoundCompiler>& compilers,
                                             const PlacementRoundOptions& options) {
  std::vector<std::string> order;
  std::map<std::string, double> expected_s;
  for (const auto& c : compilers) {
    if (!options.only.empty() && c.name != options.only) continue;
    order.push_back(c.name);
    expected_s[c.name] = c.expected_compile_s;
  }
  SortByExpectedCost(&order, expected_s);
  return order;
}

double RoundBudget(double remaining_s, int rounds_left) {
  return rounds_left > 0 ? std::max(0.0, remaining_s) / rounds_left : 0.0;
}

std::vector<std::pair<int, int>> OffloadedRuns(const std::vector<bool>& bits) {
  std::vector<std::pair<int, int>> runs;
  int n = static_cast<int>(bits.size());
  for (int i = 0; i < n;) {
    if (!bits[static_cast<size_t>(i)]) {
      ++i;
      continue;
    }
    int j = i;
    while (j < n && bits[static_cast<size_t>(j)]) ++j;
    runs.emplace_back(i, j);
    i = j;
  }
  return runs;
}

FinalistPick PickFinalist(const std::vector<std::vector<double>>& turns_s) {
  FinalistPick pick;
  double best = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < turns_s.size(); ++k) {
    if (turns_s[k].empty()) {
      pick.medians_s.push_back(-1.0);
      continue;
    }
    double m = Median(turns_s[k]);
    pick.medians_s.push_back(m);
    if (m < best) best = m, pick.index = static_cast<int>(k);
  }
  return pick;
}

bool KeepsEager(double placed_s, double eager_s, const PlacementRoundOptions& options) {
  return placed_s > eager_s * (1.0 + options.keep_eager_margin);
}

bool BuildsDpPlacement(double dp_cost_s, double beat_s, const PlacementRoundOptions& options) {
  return beat_s <= 0 || dp_cost_s <= options.hopeless_ratio * beat_s;
}

}  // namespace tp::passes
