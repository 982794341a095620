#include "pattern/candidates.h"

#include <algorithm>
#include <iomanip>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tp::pattern {
namespace {

std::string TypeSignature(const ir::ValueType& t) {
  if (t.kind != ir::ValueKind::kTensor) return std::string(ir::ValueKindName(t.kind)) + t.expr;
  std::string s = ir::DTypeShortName(t.tensor.dtype);
  s += "[";
  for (size_t i = 0; i < t.tensor.shape.size(); ++i) {
    s += (i ? "," : "") + t.tensor.shape[i].ToString();
  }
  return s + "]" + (t.tensor.device == "cpu" ? "" : "@" + t.tensor.device);
}

// Prints an argument with values renamed: %k for the k-th value made inside the group, $i for
// the i-th input, so the text does not depend on where the group sits in the graph.
void ArgSignature(std::ostringstream& os, const ir::Arg& a,
                  const std::unordered_map<ir::ValueId, std::string>& local) {
  using K = ir::Arg::Kind;
  switch (a.kind) {
    case K::kNone:
      os << "None";
      break;
    case K::kBool:
      os << (a.b ? "T" : "F");
      break;
    case K::kInt:
      os << a.i;
      break;
    case K::kDouble:
      os << std::setprecision(17) << a.d;
      break;
    case K::kValue: {
      auto it = local.find(a.value());
      os << (it == local.end() ? "?" : it->second);
      break;
    }
    case K::kList:
    case K::kTuple:
      os << (a.kind == K::kList ? "[" : "(");
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (i) os << ",";
        ArgSignature(os, a.items[i], local);
      }
      os << (a.kind == K::kList ? "]" : ")");
      break;
    case K::kOpaque:
      os << "opaque";
      break;
    default:
      os << std::quoted(a.s);
  }
}

// The groups a fusion rule grows from one anchor match: every chain of up to max_chain matches
// of `chain`, each reading the previous group member's first output.
void GrowChains(const Matcher& matcher, const Rule& rule, const std::vector<ir::NodeId>& group,
                ir::NodeId tail, int depth, const std::vector<std::vector<ir::NodeId>>& users,
                std::vector<std::vector<ir::NodeId>>* out) {
  out->push_back(group);
  if (depth >= rule.max_chain) return;
  const ir::Graph& g = matcher.graph();
  const ir::Node& node = g.node(tail);
  if (node.outputs.empty()) return;
  for (ir::NodeId user : users[static_cast<size_t>(node.outputs[0])]) {
    if (std::binary_search(group.begin(), group.end(), user)) continue;
    auto m = matcher.MatchAt(rule.chain, user);
    if (!m) continue;
    std::vector<ir::NodeId> next = group;
    next.insert(next.end(), m->nodes.begin(), m->nodes.end());
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    GrowChains(matcher, rule, next, user, depth + 1, users, out);
  }
}

}  // namespace

Rule PatternRule(std::string name, Pattern pattern) {
  Rule r;
  r.kind = Rule::Kind::kPattern;
  r.name = std::move(name);
  r.pattern = std::move(pattern);
  return r;
}

Rule FusionRule(std::string name, Pattern anchor, Pattern chain, int max_chain) {
  Rule r;
  r.kind = Rule::Kind::kFusion;
  r.name = std::move(name);
  r.pattern = std::move(anchor);
  r.chain = std::move(chain);
  r.max_chain = max_chain;
  return r;
}

std::vector<std::vector<ir::NodeId>> NodeSuccessors(const ir::Graph& graph) {
  const auto users = graph.ComputeUsers();
  std::vector<std::vector<ir::NodeId>> succ(graph.nodes().size());
  for (const auto& node : graph.nodes()) {
    auto& s = succ[static_cast<size_t>(node.id)];
    for (ir::ValueId v : node.outputs) {
      const auto& u = users[static_cast<size_t>(v)];
      s.insert(s.end(), u.begin(), u.end());
    }
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
  return succ;
}

bool IsConvex(const std::vector<std::vector<ir::NodeId>>& succ,
              const std::vector<ir::NodeId>& nodes) {
  if (nodes.size() <= 1) return true;
  const std::set<ir::NodeId> inside(nodes.begin(), nodes.end());
  const ir::NodeId last = *inside.rbegin();
  // Walk forward from every edge that leaves the group; nodes are topologically numbered, so
  // nothing past the group's last node can lead back into it.
  std::vector<ir::NodeId> stack;
  std::set<ir::NodeId> seen;
  for (ir::NodeId n : nodes) {
    for (ir::NodeId s : succ[static_cast<size_t>(n)]) {
      if (!inside.count(s) && s < last && seen.insert(s).second) stack.push_back(s);
    }
  }
  while (!stack.empty()) {
    const ir::NodeId n = stack.back();
    stack.pop_back();
    for (ir::NodeId s : succ[static_cast<size_t>(n)]) {
      if (inside.count(s)) return false;
      if (s < last && seen.insert(s).second) stack.push_back(s);
    }
  }
  return true;
}

Candidate DescribeGroup(const ir::Graph& graph, std::vector<ir::NodeId> nodes,
                        const std::vector<std::vector<ir::NodeId>>& users) {
  std::sort(nodes.begin(), nodes.end());
  Candidate c;
  c.nodes = nodes;
  const std::set<ir::NodeId> inside(nodes.begin(), nodes.end());
  std::unordered_map<ir::ValueId, std::string> local;
  std::ostringstream os;
  int made = 0;
  for (ir::NodeId n : nodes) {
    const ir::Node& node = graph.node(n);
    node.ForEachInput([&](ir::ValueId v) {
      if (local.count(v)) return;
      local[v] = "$" + std::to_string(c.inputs.size());
      c.inputs.push_back(v);
    });
    os << node.op << "(";
    for (const auto& a : node.args) {
      ArgSignature(os, a, local);
      os << ",";
    }
    for (const auto& kw : node.kwargs) {
      os << kw.name << "=";
      ArgSignature(os, kw.value, local);
      os << ",";
    }
    os << ")->";
    for (ir::ValueId v : node.outputs) {
      local[v] = "%" + std::to_string(made++);
      os << local[v] << ":" << TypeSignature(graph.type(v)) << " ";
    }
    os << ";";
  }
  std::set<ir::ValueId> graph_outputs;
  for (ir::ValueId v : graph.OutputValues()) graph_outputs.insert(v);
  for (ir::NodeId n : nodes) {
    for (ir::ValueId v : graph.node(n).outputs) {
      bool used_outside = graph_outputs.count(v) > 0;
      for (ir::NodeId u : users[static_cast<size_t>(v)]) used_outside |= !inside.count(u);
      if (used_outside) c.outputs.push_back(v);
    }
  }
  os << "in:";
  for (ir::ValueId v : c.inputs) os << TypeSignature(graph.type(v)) << ",";
  os << "out:";
  for (ir::ValueId v : c.outputs) os << local[v] << ",";
  c.signature = os.str();
  return c;
}

CandidateSet GenerateCandidates(const ir::Graph& graph, const std::vector<BackendRules>& backends,
                                int64_t max_candidates) {
  CandidateSet result;
  const Matcher matcher(graph);
  const auto users = graph.ComputeUsers();
  const auto succ = NodeSuccessors(graph);
  for (const auto& backend : backends) {
    std::set<std::vector<ir::NodeId>> seen;
    for (const auto& rule : backend.rules) {
      for (const auto& node : graph.nodes()) {
        auto m = matcher.MatchAt(rule.pattern, node.id);
        if (!m) continue;
        std::vector<std::vector<ir::NodeId>> groups;
        if (rule.kind == Rule::Kind::kFusion) {
          GrowChains(matcher, rule, m->nodes, node.id, 0, users, &groups);
        } else {
          groups.push_back(m->nodes);
        }
        for (auto& group : groups) {
          if (!seen.insert(group).second) continue;
          if (!IsConvex(succ, group)) {
            ++result.rejected_cyclic;
            continue;
          }
          if (static_cast<int64_t>(result.candidates.size()) >= max_candidates) {
            ++result.rejected_too_many;
            continue;
          }
          Candidate c = DescribeGroup(graph, std::move(group), users);
          c.id = static_cast<int>(result.candidates.size());
          c.backend = backend.backend;
          c.rule = rule.name;
          result.candidates.push_back(std::move(c));
        }
      }
    }
  }
  return result;
}

}  // namespace tp::pattern
