#include "passes/placement_dp.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace tp::passes {
namespace {

using Bits = std::vector<uint64_t>;

struct BitsHash {
  size_t operator()(const Bits& b) const {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t w : b) h = (h ^ w) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

bool Test(const Bits& b, int i) { return (b[static_cast<size_t>(i) / 64] >> (i % 64)) & 1u; }
void Set(Bits* b, int i) { (*b)[static_cast<size_t>(i) / 64] |= uint64_t{1} << (i % 64); }

struct PreparedOption {
  Bits nodes;
  Bits outside_preds;  // predecessors outside the group: must be placed first
  double cost = 0.0;
};

struct Entry {
  double cost = std::numeric_limits<double>::infinity();
  int parent = -1;
  int option = -1;
};

std::string NodeName(const PlacementProblem& p, int n) {
  if (static_cast<size_t>(n) < p.node_names.size()) return p.node_names[static_cast<size_t>(n)];
  return "#" + std::to_string(n);
}

// One run of the program; returns false when `max_states` was exceeded.
bool Search(const PlacementProblem& problem, const std::vector<PreparedOption>& prepared,
            const std::vector<std::vector<int>>& by_first, bool bounded, int64_t max_states,
            OpLevelPlacement* out) {
  const int n = problem.num_nodes;
  const size_t words = (static_cast<size_t>(n) + 63) / 64;
  std::vector<Bits> states;
  std::vector<Entry> entries;
  std::unordered_map<Bits, int, BitsHash> index;
  std::vector<std::vector<int>> by_depth(static_cast<size_t>(n) + 1);
  std::vector<int> depth_of;

  auto add_state = [&](Bits bits, int depth) {
    auto [it, inserted] = index.emplace(bits, static_cast<int>(states.size()));
    if (inserted) {
      states.push_back(std::move(bits));
      entries.emplace_back();
      depth_of.push_back(depth);
      by_depth[static_cast<size_t>(depth)].push_back(it->second);
    }
    return it->second;
  };
  entries.reserve(1024);
  const int start = add_state(Bits(words, 0), 0);
  entries[static_cast<size_t>(start)].cost = 0.0;

  for (int depth = 0; depth < n; ++depth) {
    for (size_t k = 0; k < by_depth[static_cast<size_t>(depth)].size(); ++k) {
      const int s = by_depth[static_cast<size_t>(depth)][k];
      const Bits state = states[static_cast<size_t>(s)];
      const double base = entries[static_cast<size_t>(s)].cost;
      if (base == std::numeric_limits<double>::infinity()) continue;
      // A group's first node reads only placed nodes, so it is a frontier node. In the bounded
      // form only the first unplaced node may start the next group.
      for (int v = 0; v < n; ++v) {
        if (Test(state, v)) continue;
        bool ready = true;
        for (int p : problem.preds[static_cast<size_t>(v)]) ready &= Test(state, p);
        if (!ready && bounded) break;
        if (!ready) continue;
        for (int o : by_first[static_cast<size_t>(v)]) {
          const PreparedOption& opt = prepared[static_cast<size_t>(o)];
          bool fits = true;
          for (size_t w = 0; w < words && fits; ++w) {
            fits = (state[w] & opt.nodes[w]) == 0 &&
                   (state[w] & opt.outside_preds[w]) == opt.outside_preds[w];
          }
          if (!fits) continue;
          Bits next = state;
          int added = 0;
          for (size_t w = 0; w < words; ++w) {
            next[w] |= opt.nodes[w];
            added += __builtin_popcountll(opt.nodes[w]);
          }
          const int t = add_state(std::move(next), depth + added);
          Entry& e = entries[static_cast<size_t>(t)];
          const double cost = base + opt.cost;
          if (cost < e.cost) e = Entry{cost, s, o};
        }
        if (bounded) break;
      }
      if (static_cast<int64_t>(states.size()) > max_states) return false;
    }
  }
  Bits full(words, 0);
  for (int v = 0; v < n; ++v) Set(&full, v);
  auto it = index.find(full);
  out->states = static_cast<int64_t>(states.size());
  if (it == index.end() || entries[static_cast<size_t>(it->second)].parent < 0) {
    if (n == 0) return true;
    // Name the first node that no reachable state covered.
    Bits covered(words, 0);
    for (const auto& st : states) {
      for (size_t w = 0; w < words; ++w) covered[w] |= st[w];
    }
    int missing = 0;
    while (missing < n && Test(covered, missing)) ++missing;
    throw PassError("placement_dp", NodeName(problem, std::min(missing, n - 1)),
                    "no candidate group can place this node after its predecessors",
                    "every node needs at least a single-op group; the aten backend provides one");
  }
  out->cost = entries[static_cast<size_t>(it->second)].cost;
  out->chosen.clear();
  for (int s = it->second; entries[static_cast<size_t>(s)].parent >= 0;
       s = entries[static_cast<size_t>(s)].parent) {
    out->chosen.push_back(entries[static_cast<size_t>(s)].option);
  }
  std::reverse(out->chosen.begin(), out->chosen.end());
  return true;
}

}  // namespace

PlacementProblem PlacementProblemFor(const ir::Graph& graph) {
  PlacementProblem p;
  p.num_nodes = static_cast<int>(graph.nodes().size());
  p.preds = NodePredecessors(graph);
  for (const auto& n : graph.nodes()) p.node_names.push_back(n.name);
  return p;
}

std::vector<std::vector<int>> NodePredecessors(const ir::Graph& graph) {
  std::vector<std::vector<int>> preds(graph.nodes().size());
  for (const auto& node : graph.nodes()) {
    auto& p = preds[static_cast<size_t>(node.id)];
    node.ForEachInput([&](ir::ValueId v) {
      const ir::NodeId producer = graph.value(v).producer;
      if (producer != ir::kNoNode) p.push_back(producer);
    });
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  return preds;
}

double PlacementCost(const PlacementProblem& problem, const std::vector<int>& chosen) {
  double total = 0.0;
  for (int o : chosen) {
    const auto& opt = problem.options[static_cast<size_t>(o)];
    total += opt.cost + (opt.backend == problem.inline_backend ? 0.0 : problem.switch_penalty);
  }
  return total;
}

OpLevelPlacement PlaceOpLevel(const PlacementProblem& problem, const PlacementDpOptions& options,
                              Context& ctx) {
  const int n = problem.num_nodes;
  if (static_cast<int>(problem.preds.size()) != n) {
    throw PassError("placement_dp", "",
                    "preds has " + std::to_string(problem.preds.size()) + " entries for " +
                        std::to_string(n) + " nodes");
  }
  const size_t words = (static_cast<size_t>(n) + 63) / 64;
  std::vector<PreparedOption> prepared;
  std::vector<std::vector<int>> by_first(static_cast<size_t>(n));
  for (size_t o = 0; o < problem.options.size(); ++o) {
    const auto& opt = problem.options[o];
    PreparedOption p;
    p.nodes.assign(words, 0);
    p.outside_preds.assign(words, 0);
    p.cost = opt.cost + (opt.backend == problem.inline_backend ? 0.0 : problem.switch_penalty);
    if (opt.nodes.empty()) continue;
    bool valid = true;
    for (int v : opt.nodes) {
      valid &= v >= 0 && v < n;
      if (valid) Set(&p.nodes, v);
    }
    if (!valid || !(opt.cost >= 0.0)) continue;  // out of range or NaN/negative: unusable
    for (int v : opt.nodes) {
      for (int q : problem.preds[static_cast<size_t>(v)]) {
        if (!Test(p.nodes, q)) Set(&p.outside_preds, q);
      }
    }
    const int first = *std::min_element(opt.nodes.begin(), opt.nodes.end());
    by_first[static_cast<size_t>(first)].push_back(static_cast<int>(prepared.size()));
    prepared.push_back(std::move(p));
  }
  // Map prepared indices back to option indices.
  std::vector<int> option_of;
  for (size_t o = 0; o < problem.options.size(); ++o) {
    const auto& opt = problem.options[o];
    bool valid = !opt.nodes.empty() && opt.cost >= 0.0;
    for (int v : opt.nodes) valid &= v >= 0 && v < n;
    if (valid) option_of.push_back(static_cast<int>(o));
  }

  OpLevelPlacement out;
  if (!Search(problem, prepared, by_first, /*bounded=*/false, options.max_states, &out)) {
    ctx.Log("placement_dp: more than " + std::to_string(options.max_states) +
            " states; searching again with groups that start at the first unplaced node");
    out = OpLevelPlacement{};
    out.exact = false;
    Search(problem, prepared, by_first, /*bounded=*/true, std::numeric_limits<int64_t>::max(),
           &out);
  }
  for (int& c : out.chosen) c = option_of[static_cast<size_t>(c)];
  ctx.Log("placement_dp: " + std::to_string(out.chosen.size()) + " groups over " +
          std::to_string(n) + " nodes, cost " + std::to_string(out.cost * 1e6) + " us, " +
          std::to_string(out.states) + " states" + (out.exact ? "" : " (bounded)"));
  return out;
}

}  // namespace tp::passes
