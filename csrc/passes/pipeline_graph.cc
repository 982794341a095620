#include "passes/pipeline_graph.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

#include "ir/op_registry.h"

namespace tp::pipeline {
namespace {

using Bits = std::vector<uint64_t>;

bool Test(const Bits& b, int i) { return (b[i >> 6] >> (i & 63)) & 1u; }
void Set(Bits& b, int i) { b[i >> 6] |= uint64_t{1} << (i & 63); }

// desc[u] = every node reachable from u (not u itself). Nodes are topologically ordered.
std::vector<Bits> Descendants(const CostGraph& g) {
  const int n = g.size();
  const size_t words = (n + 63) / 64;
  std::vector<Bits> desc(n, Bits(words, 0));
  const auto consumers = g.Consumers();
  for (int u = n - 1; u >= 0; --u) {
    for (int v : consumers[u]) {
      Set(desc[u], v);
      for (size_t w = 0; w < words; ++w) desc[u][w] |= desc[v][w];
    }
  }
  return desc;
}

std::string ScopePrefix(const std::string& scope, int depth) {
  if (scope.empty()) return "";
  int parts = 0;
  for (size_t i = 0; i < scope.size(); ++i) {
    if (scope[i] == '.' && ++parts == depth) return scope.substr(0, i);
  }
  return scope;
}

std::string CommonScope(const std::string& a, const std::string& b) {
  size_t i = 0, last_dot = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) {
    if (a[i] == '.') last_dot = i;
    ++i;
  }
  if (i == a.size() && (i == b.size() || b[i] == '.')) return a;
  if (i == b.size() && a[i] == '.') return b;
  return a.substr(0, last_dot);
}

// Groups (ids < num_groups) that Kahn's algorithm cannot order in the quotient graph: those on
// a cycle and those after one. Empty when the grouping induces a DAG.
std::vector<int> UnorderableGroups(const CostGraph& g, const std::vector<int>& group,
                                   int num_groups) {
  std::vector<std::set<int>> succ(num_groups);
  std::vector<int> indegree(num_groups, 0);
  for (int v = 0; v < g.size(); ++v)
    for (int u : g.nodes[v].inputs)
      if (group[u] != group[v] && succ[group[u]].insert(group[v]).second) ++indegree[group[v]];
  std::vector<int> ready;
  for (int q = 0; q < num_groups; ++q)
    if (indegree[q] == 0) ready.push_back(q);
  std::vector<char> placed(num_groups, 0);
  while (!ready.empty()) {
    const int q = ready.back();
    ready.pop_back();
    placed[q] = 1;
    for (int s : succ[q])
      if (--indegree[s] == 0) ready.push_back(s);
  }
  std::vector<int> stuck;
  for (int q = 0; q < num_groups; ++q)
    if (!placed[q]) stuck.push_back(q);
  return stuck;
}

// Builds the quotient graph of `group` (node -> group id). Groups must induce a DAG.
CostGraph Merge(const CostGraph& g, const std::vector<int>& group) {
  const int n = g.size();
  const int num_groups = *std::max_element(group.begin(), group.end()) + 1;
  // Topological order of groups: Kahn's algorithm, smallest first member first.
  std::vector<std::set<int>> preds(num_groups);
  std::vector<int> first_member(num_groups, n);
  for (int v = 0; v < n; ++v) {
    first_member[group[v]] = std::min(first_member[group[v]], v);
    for (int u : g.nodes[v].inputs)
      if (group[u] != group[v]) preds[group[v]].insert(group[u]);
  }
  std::vector<std::vector<int>> succs(num_groups);
  std::vector<int> indegree(num_groups, 0);
  for (int q = 0; q < num_groups; ++q) {
    indegree[q] = static_cast<int>(preds[q].size());
    for (int p : preds[q]) succs[p].push_back(q);
  }
  std::set<std::pair<int, int>> ready;
  for (int q = 0; q < num_groups; ++q)
    if (indegree[q] == 0) ready.insert({first_member[q], q});
  std::vector<int> order_of(num_groups, -1);
  int next = 0;
  while (!ready.empty()) {
    const int q = ready.begin()->second;
    ready.erase(ready.begin());
    order_of[q] = next++;
    for (int s : succs[q])
      if (--indegree[s] == 0) ready.insert({first_member[s], s});
  }
  if (next != num_groups) throw std::logic_error("pipeline coarsening produced a cycle");

  const auto consumers = g.Consumers();
  CostGraph out;
  out.nodes.resize(num_groups);
  std::vector<bool> named(num_groups, false);
  for (int v = 0; v < n; ++v) {
    const CostNode& src = g.nodes[v];
    CostNode& dst = out.nodes[order_of[group[v]]];
    if (!named[group[v]]) {
      dst.name = src.name;
      dst.scope = src.scope;
      named[group[v]] = true;
    } else {
      dst.scope = CommonScope(dst.scope, src.scope);
    }
    AddCosts(dst, src);
    dst.is_output = dst.is_output || src.is_output;
    bool leaves = src.is_output;
    for (int c : consumers[v]) leaves = leaves || group[c] != group[v];
    if (leaves) dst.out_bytes += src.out_bytes;
    const std::vector<int> members = src.members.empty() ? std::vector<int>{v} : src.members;
    dst.members.insert(dst.members.end(), members.begin(), members.end());
    for (int u : src.inputs) {
      const int pu = order_of[group[u]];
      if (group[u] != group[v] &&
          std::find(dst.inputs.begin(), dst.inputs.end(), pu) == dst.inputs.end())
        dst.inputs.push_back(pu);
    }
  }
  for (auto& node : out.nodes) {
    std::sort(node.inputs.begin(), node.inputs.end());
    std::sort(node.members.begin(), node.members.end());
    if (node.members.size() > 1 && !node.scope.empty()) node.name = node.scope;
  }
  // Names must stay unique: suffix repeats.
  std::map<std::string, int> seen;
  for (auto& node : out.nodes) {
    const int k = seen[node.name]++;
    if (k > 0) node.name += "#" + std::to_string(k);
  }
  return out;
}

}  // namespace

std::vector<std::vector<int>> CostGraph::Consumers() const {
  std::vector<std::vector<int>> consumers(nodes.size());
  for (int v = 0; v < size(); ++v)
    for (int u : nodes[v].inputs) consumers[u].push_back(v);
  for (auto& c : consumers) c.erase(std::unique(c.begin(), c.end()), c.end());
  return consumers;
}

void CostGraph::Validate() const {
  for (int v = 0; v < size(); ++v) {
    for (int u : nodes[v].inputs) {
      if (u < 0 || u >= v)
        throw std::invalid_argument("cost graph node '" + nodes[v].name + "' reads node index " +
                                    std::to_string(u) +
                                    ", which is not an earlier node (nodes must be topological)");
    }
    const CostNode& c = nodes[v];
    if (c.fwd_flops < 0 || c.bwd_flops < 0 || c.act_bytes < 0 || c.out_bytes < 0 ||
        c.param_bytes < 0 || c.io_bytes < 0)
      throw std::invalid_argument("cost graph node '" + c.name + "' has a negative cost");
  }
}

CostGraph CostGraphFromIr(const ir::Graph& graph, int64_t batch) {
  if (batch <= 0) throw std::invalid_argument("CostGraphFromIr: batch must be positive");
  const auto& registry = ir::OpRegistry::Default();
  const double per = 1.0 / static_cast<double>(batch);
  CostGraph cg;
  std::vector<int> node_of_value(graph.values().size(), -1);
  std::vector<bool> param_seen(graph.values().size(), false);
  std::set<ir::ValueId> param_values;
  for (const auto& in : graph.inputs())
    if (in.kind == ir::InputKind::kParameter || in.kind == ir::InputKind::kBuffer)
      param_values.insert(in.value);
  const auto outputs = graph.OutputValues();
  const std::set<ir::ValueId> output_set(outputs.begin(), outputs.end());
  for (const auto& node : graph.nodes()) {
    CostNode c;
    c.name = node.name;
    c.scope = node.scope;
    const ir::OpCost cost = registry.Estimate(graph, node);
    const ir::OpInfo* info = registry.Find(node.op);
    const bool is_view =
        info && (info->cls == ir::OpClass::kView || info->cls == ir::OpClass::kSymbolic);
    c.fwd_flops = cost.flops * per;
    c.bwd_flops = 2 * c.fwd_flops;
    c.io_bytes = cost.bytes * per;
    c.kernels = is_view ? 0 : 1;
    node.ForEachInput([&](ir::ValueId v) {
      if (node_of_value[v] >= 0) {
        if (std::find(c.inputs.begin(), c.inputs.end(), node_of_value[v]) == c.inputs.end())
          c.inputs.push_back(node_of_value[v]);
      } else if (param_values.count(v) && !param_seen[v]) {
        param_seen[v] = true;
        const auto b = graph.type(v).is_tensor() ? graph.type(v).tensor.BytesHint() : std::nullopt;
        c.param_bytes += b ? static_cast<double>(*b) : 0.0;
      }
    });
    std::sort(c.inputs.begin(), c.inputs.end());
    for (ir::ValueId v : node.outputs) {
      node_of_value[v] = cg.size();
      const auto& t = graph.type(v);
      const auto b = t.is_tensor() ? t.tensor.BytesHint() : std::nullopt;
      const double bytes = b ? static_cast<double>(*b) * per : 0.0;
      c.out_bytes += bytes;
      if (!is_view) c.act_bytes += bytes;
      if (output_set.count(v)) c.is_output = true;
    }
    cg.nodes.push_back(std::move(c));
  }
  return cg;
}

CostGraph Coarsen(const CostGraph& graph, const CoarsenOptions& options) {
  graph.Validate();
  CostGraph g = graph;
  const int n = g.size();
  if (n == 0) return g;
  if (options.scope_depth > 0) {
    std::map<std::string, int> key_to_group;
    std::vector<int> group(n);
    int next = 0;
    for (int v = 0; v < n; ++v) {
      const std::string key = ScopePrefix(g.nodes[v].scope, options.scope_depth);
      if (key.empty()) {
        group[v] = next++;
      } else {
        auto it = key_to_group.find(key);
        group[v] = it == key_to_group.end() ? (key_to_group[key] = next++) : it->second;
      }
    }
    // A group is convex iff no outside node is both a descendant and an ancestor of it.
    const auto desc = Descendants(g);
    std::vector<std::vector<int>> members(next);
    for (int v = 0; v < n; ++v) members[group[v]].push_back(v);
    const size_t words = (n + 63) / 64;
    const int scope_groups = next;
    for (int q = 0; q < scope_groups; ++q) {
      if (members[q].size() < 2) continue;
      Bits below(words, 0);
      for (int v : members[q])
        for (size_t w = 0; w < words; ++w) below[w] |= desc[v][w];
      bool convex = true;
      for (int u = 0; u < n && convex; ++u) {
        if (group[u] == q || !Test(below, u)) continue;
        for (int v : members[q]) {
          if (Test(desc[u], v)) {
            convex = false;
            break;
          }
        }
      }
      if (!convex) {
        for (size_t i = 1; i < members[q].size(); ++i) group[members[q][i]] = next++;
      }
    }
    // Convex groups can still depend on each other both ways (a1 -> b1 and b2 -> a2): split
    // every group the quotient's topological sort cannot place, until it places them all.
    for (std::vector<int> stuck = UnorderableGroups(g, group, next); !stuck.empty();
         stuck = UnorderableGroups(g, group, next)) {
      for (int q : stuck) {
        bool first = true;
        for (int v = 0; v < n; ++v) {
          if (group[v] != q) continue;
          if (!first) group[v] = next++;
          first = false;
        }
      }
    }
    // Renumber densely.
    std::map<int, int> dense;
    for (int v = 0; v < n; ++v) {
      auto it = dense.find(group[v]);
      group[v] =
          it == dense.end() ? (dense[group[v]] = static_cast<int>(dense.size())) : it->second;
    }
    g = Merge(g, group);
  }
  // Fold cheap chain blocks into their producers (one pass; merges are independent).
  if (options.cheap_fraction > 0 && g.size() > 1) {
    double total = 0;
    for (const auto& node : g.nodes) total += node.fwd_flops;
    const double cheap = options.cheap_fraction * total / g.size();
    const auto consumers = g.Consumers();
    std::vector<int> group(g.size());
    std::iota(group.begin(), group.end(), 0);
    bool merged = false;
    for (int v = 0; v < g.size(); ++v) {
      if (g.nodes[v].inputs.size() != 1 || g.nodes[v].fwd_flops > cheap) continue;
      const int u = g.nodes[v].inputs[0];
      if (consumers[u].size() != 1) continue;
      group[v] = group[u];
      merged = true;
    }
    if (merged) {
      std::map<int, int> dense;
      for (int& q : group) {
        auto it = dense.find(q);
        q = it == dense.end() ? (dense[q] = static_cast<int>(dense.size())) : it->second;
      }
      g = Merge(g, group);
    }
  }
  // Chain contraction: merge u -> v when v's only producer is u and u's only consumer is v.
  while (g.size() > std::max(1, options.max_blocks)) {
    const auto consumers = g.Consumers();
    int best = -1;
    double best_cost = 0;
    for (int v = 0; v < g.size(); ++v) {
      if (g.nodes[v].inputs.size() != 1) continue;
      const int u = g.nodes[v].inputs[0];
      if (consumers[u].size() != 1) continue;
      const double cost = g.nodes[u].fwd_flops + g.nodes[v].fwd_flops;
      if (best < 0 || cost < best_cost) best = v, best_cost = cost;
    }
    if (best < 0) break;
    std::vector<int> group(g.size());
    std::iota(group.begin(), group.end(), 0);
    group[best] = g.nodes[best].inputs[0];
    for (int v = best + 1; v < g.size(); ++v) group[v] = v - 1;
    g = Merge(g, group);
  }
  return g;
}

std::vector<int> SpTree::Blocks(int node, int first, int last) const {
  std::vector<int> out;
  const Node& t = nodes.at(node);
  if (t.kind == Kind::kLeaf) return {t.block};
  if (last < 0) last = static_cast<int>(t.children.size()) - 1;
  for (int i = first; i <= last; ++i) {
    auto sub = Blocks(t.children[i]);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::string SpTree::ToString() const {
  std::function<std::string(int)> rec = [&](int id) -> std::string {
    const Node& t = nodes[id];
    if (t.kind == Kind::kLeaf) return std::to_string(t.block);
    std::string s = t.kind == Kind::kSeries ? "S(" : "P(";
    for (size_t i = 0; i < t.children.size(); ++i) s += (i ? " " : "") + rec(t.children[i]);
    return s + ")";
  };
  return root < 0 ? "()" : rec(root);
}

SpTree DecomposeSeriesParallel(const CostGraph& graph, bool absorb_joins, bool lightest) {
  graph.Validate();
  SpTree tree;
  const int n = graph.size();
  if (n == 0) return tree;
  const auto desc = Descendants(graph);
  std::function<int(const std::vector<int>&)> build = [&](const std::vector<int>& h) -> int {
    if (h.size() == 1) {
      tree.nodes.push_back({SpTree::Kind::kLeaf, h[0], {}, -1});
      return static_cast<int>(tree.nodes.size()) - 1;
    }
    const int size = static_cast<int>(h.size());
    // anc/desc counts inside h (h is convex, so global reachability is reachability in h).
    std::vector<int> cuts;
    for (int v : h) {
      int related = 0;
      for (int u : h) related += (u != v) && (Test(desc[u], v) || Test(desc[v], u));
      if (related == size - 1) cuts.push_back(v);
    }
    auto add = [&](SpTree::Kind kind, std::vector<int> children) {
      std::vector<int> flat;
      for (int c : children) {
        if (tree.nodes[c].kind == kind) {
          flat.insert(flat.end(), tree.nodes[c].children.begin(), tree.nodes[c].children.end());
        } else {
          flat.push_back(c);
        }
      }
      tree.nodes.push_back({kind, -1, flat, -1});
      return static_cast<int>(tree.nodes.size()) - 1;
    };
    if (!cuts.empty()) {
      // Segments between consecutive cut blocks, in order.
      std::vector<int> children;
      std::vector<std::vector<int>> segments(cuts.size() + 1);
      for (int v : h) {
        if (std::find(cuts.begin(), cuts.end(), v) != cuts.end()) continue;
        size_t k = 0;
        while (k < cuts.size() && Test(desc[cuts[k]], v)) ++k;
        segments[k].push_back(v);
      }
      for (size_t k = 0; k <= cuts.size(); ++k) {
        if (!segments[k].empty()) children.push_back(build(segments[k]));
        if (k < cuts.size()) children.push_back(build({cuts[k]}));
      }
      return add(SpTree::Kind::kSeries, children);
    }
    // Weakly connected components.
    std::map<int, int> index;
    for (int i = 0; i < size; ++i) index[h[i]] = i;
    std::vector<int> parent(size);
    std::iota(parent.begin(), parent.end(), 0);
    std::function<int(int)> find = [&](int x) {
      return parent[x] == x ? x : parent[x] = find(parent[x]);
    };
    for (int v : h)
      for (int u : graph.nodes[v].inputs)
        if (index.count(u)) parent[find(index[u])] = find(index[v]);
    std::map<int, std::vector<int>> comps;
    for (int i = 0; i < size; ++i) comps[find(i)].push_back(h[i]);
    if (comps.size() > 1) {
      std::vector<std::vector<int>> parts;
      for (auto& [root, members] : comps) parts.push_back(members);
      std::sort(parts.begin(), parts.end());
      std::vector<int> children;
      for (auto& p : parts) children.push_back(build(p));
      return add(SpTree::Kind::kParallel, children);
    }
    // Not series-parallel here: a chain in topological order is still a valid pipeline.
    ++tree.linearised_regions;
    std::vector<int> children;
    for (int v : h) children.push_back(build({v}));
    return add(SpTree::Kind::kSeries, children);
  };
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  tree.root = build(all);
  if (!absorb_joins) return tree;
  auto flops = [&](int id) {
    double f = 0;
    for (int b : tree.Blocks(id)) f += graph.nodes[b].fwd_flops + graph.nodes[b].bwd_flops;
    return f;
  };
  std::function<bool(int)> has_join = [&](int id) {
    if (tree.nodes[id].join >= 0) return true;
    for (int c : tree.nodes[id].children)
      if (has_join(c)) return true;
    return false;
  };
  const int original = static_cast<int>(tree.nodes.size());
  std::map<int, int> absorbed_into;  // parallel node -> branch index holding its join
  for (int id = 0; id < original; ++id) {
    if (tree.nodes[id].kind != SpTree::Kind::kSeries) continue;
    std::vector<int> kids = tree.nodes[id].children;
    std::vector<int> out;
    for (size_t i = 0; i < kids.size(); ++i) {
      // The join (first leaf after the parallel part) and the leaves after it go onto the
      // branch; the join alone is where the other branches' outputs arrive.
      const bool join = i > 0 && tree.nodes[kids[i]].kind == SpTree::Kind::kLeaf &&
                        tree.nodes[out.back()].kind == SpTree::Kind::kParallel;
      if (!join) {
        out.push_back(kids[i]);
        continue;
      }
      // The heaviest branch that holds no absorbed join of its own takes this join.
      const int parallel = out.back();
      const std::vector<int> branches = tree.nodes[parallel].children;
      if (tree.nodes[parallel].join >= 0) {  // a leaf after the join: same branch
        const int jb = absorbed_into[parallel];
        tree.nodes[tree.nodes[parallel].children[jb]].children.push_back(kids[i]);
        continue;
      }
      int heaviest = -1, light = -1;
      for (size_t b = 0; b < branches.size(); ++b) {
        if (has_join(branches[b])) continue;
        if (heaviest < 0 || flops(branches[b]) > flops(branches[heaviest]))
          heaviest = static_cast<int>(b);
        if (light < 0 || flops(branches[b]) < flops(branches[light])) light = static_cast<int>(b);
      }
      if (heaviest >= 0 && flops(branches[heaviest]) != flops(branches[light]))
        tree.join_choice_matters = true;
      if (lightest) heaviest = light;
      if (heaviest < 0) {
        out.push_back(kids[i]);
        continue;
      }
      const int branch = branches[heaviest];
      if (tree.nodes[branch].kind == SpTree::Kind::kSeries) {
        tree.nodes[branch].children.push_back(kids[i]);
      } else {
        tree.nodes.push_back({SpTree::Kind::kSeries, -1, {branch, kids[i]}, -1});
        tree.nodes[parallel].children[heaviest] = static_cast<int>(tree.nodes.size()) - 1;
      }
      tree.nodes[parallel].join = tree.nodes[kids[i]].block;
      absorbed_into[parallel] = heaviest;
    }
    tree.nodes[id].children = out;
  }
  // A series left with one child is that child.
  for (auto& node : tree.nodes)
    for (int& c : node.children)
      while (tree.nodes[c].kind == SpTree::Kind::kSeries && tree.nodes[c].children.size() == 1)
        c = tree.nodes[c].children[0];
  while (tree.nodes[tree.root].kind == SpTree::Kind::kSeries &&
         tree.nodes[tree.root].children.size() == 1)
    tree.root = tree.nodes[tree.root].children[0];
  return tree;
}

SpTree LinearChain(const CostGraph& graph) {
  SpTree tree;
  const int n = graph.size();
  if (n == 0) return tree;
  std::vector<int> children;
  for (int v = 0; v < n; ++v) {
    tree.nodes.push_back({SpTree::Kind::kLeaf, v, {}, -1});
    children.push_back(v);
  }
  if (n == 1) {
    tree.root = 0;
  } else {
    tree.nodes.push_back({SpTree::Kind::kSeries, -1, children, -1});
    tree.root = n;
  }
  return tree;
}

}  // namespace tp::pipeline
