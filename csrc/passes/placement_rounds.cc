#include "passes/placement_rounds.h"

#include <algorithm>
#include <limits>

namespace tp::passes {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<std::string> PlacementRoundOrder(const std::vector<RoundCompiler>& compilers,
                                             const PlacementRoundOptions& options) {
  std::vector<RoundCompiler> order = compilers;
  auto cost = [](const RoundCompiler& c) {
    return c.expected_compile_s > 0 ? c.expected_compile_s
                                    : std::numeric_limits<double>::infinity();
  };
  std::stable_sort(order.begin(), order.end(), [&](const RoundCompiler& a, const RoundCompiler& b) {
    return cost(a) < cost(b);
  });
  std::vector<std::string> out;
  for (const auto& c : order) {
    if (options.only.empty() || c.name == options.only) out.push_back(c.name);
  }
  return out;
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

}  // namespace tp::passes
