// Pass: sharding_ilp; see sharding_ilp.h.
#include "passes/sharding_ilp.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "cost/decode_model.h"
#include "ir/op_registry.h"
#include "solver/cbc.h"

namespace tp::passes {
namespace {

using ir::ShardSpec;
using Kind = ir::ShardSpec::Kind;

// A decision unit: a graph input choosing its spec, or a node choosing a strategy.
struct Entity {
  std::string name;    // node name, or input value name
  std::string source;  // graph inputs: parameter path
  bool is_input = false, is_parameter = false;
  std::vector<ir::ShardStrategy> strategies;
  std::vector<double> compute_s;  // per strategy
  double bytes = 0;               // graph inputs: tensor bytes
  std::vector<int> vars;          // x per strategy
};

double Bytes(const ir::Graph& g, ir::ValueId v) {
  const auto& t = g.type(v);
  if (!t.is_tensor()) return 0;
  auto b = t.tensor.BytesHint();
  return b ? static_cast<double>(*b) : 0;
}

// The collective turning `from` into `to` for a tensor of `bytes`, and its time.
std::pair<std::string, double> Reshard(const ShardSpec& from, const ShardSpec& to, double bytes,
                                       int world, const cost::DeviceProfile& d) {
  if (from == to) return {"", 0};
  if (from.kind == Kind::kReplicate) return {"", 0};  // a local slice (or zero-padded copy)
  if (to.kind == Kind::kPartial && from.kind != Kind::kPartial) return {"", 0};  // zero-pad
  // Each collective is one more launch: of two ways with equal ring volume (reduce-scatter +
  // all-gather vs one all-reduce) the one with fewer collectives wins.
  const double launch = d.kernel_overhead;
  if (from.kind == Kind::kShard && to.kind == Kind::kReplicate)
    return {"all_gather", launch + cost::AllGatherTime(d, bytes, world)};
  if (from.kind == Kind::kShard && to.kind == Kind::kShard)
    return {"all_to_all", launch + cost::AllToAllTime(d, bytes / world, world)};
  if (from.kind == Kind::kPartial && to.kind == Kind::kReplicate)
    return {"all_reduce", launch + cost::AllReduceTime(d, bytes, world)};
  if (from.kind == Kind::kPartial && to.kind == Kind::kShard)
    return {"reduce_scatter", launch + cost::AllGatherTime(d, bytes, world)};
  return {"", 0};
}

}  // namespace

ShardingPlan PlanSharding(const ir::Graph& g, const ShardingOptions& o) {
  if (o.world < 1) throw ShardingError("sharding needs a mesh of at least one rank", 0);
  const cost::DeviceProfile& device = cost::FindDeviceProfile(o.device);
  const ir::OpRegistry& registry = ir::OpRegistry::Default();
  const double comm_factor = o.training ? 2.0 : 1.0;     // backward mirrors every collective
  const double compute_factor = o.training ? 3.0 : 1.0;  // forward + two backward matmuls

  std::vector<Entity> ents;
  std::map<ir::ValueId, std::pair<int, int>> producer;  // value -> (entity, output index)
  for (const auto& in : g.inputs()) {
    const auto& t = g.type(in.value);
    if (!t.is_tensor()) continue;
    Entity e;
    e.name = g.value(in.value).name;
    e.source = in.source;
    e.is_input = true;
    e.is_parameter = in.kind == ir::InputKind::kParameter;
    e.bytes = Bytes(g, in.value);
    for (const auto& spec : ir::InputSpecs(t.tensor, o.world)) {
      e.strategies.push_back({spec.ToString(), {}, {spec}, 0.0});
      e.compute_s.push_back(0);
    }
    producer[in.value] = {static_cast<int>(ents.size()), 0};
    ents.push_back(std::move(e));
  }
  for (const auto& n : g.nodes()) {
    bool has_tensor = false;
    for (ir::ValueId v : n.outputs) has_tensor = has_tensor || g.type(v).is_tensor();
    if (!has_tensor) continue;
    Entity e;
    e.name = n.name;
    e.strategies = ir::ShardingStrategies(g, n, o.world);
    const ir::OpCost c = registry.Estimate(g, n);
    for (const auto& s : e.strategies) {
      e.compute_s.push_back(compute_factor * cost::ComputeTime(device, c.flops * s.compute_fraction,
                                                               c.bytes * s.compute_fraction, 1));
    }
    for (size_t k = 0; k < n.outputs.size(); ++k)
      producer[n.outputs[k]] = {static_cast<int>(ents.size()), static_cast<int>(k)};
    ents.push_back(std::move(e));
  }

  // Pins: by input source, input name or node name.
  std::map<int, ShardSpec> pins;
  for (const auto& [key, spec] : o.pinned) {
    int found = -1;
    for (size_t i = 0; i < ents.size(); ++i)
      if (ents[i].name == key || (!ents[i].source.empty() && ents[i].source == key))
        found = static_cast<int>(i);
    if (found < 0)
      throw ShardingError("pinned '" + key + "' names no parameter, input or node of the graph", 0);
    bool possible = false;
    std::string valid;
    for (const auto& s : ents[static_cast<size_t>(found)].strategies) {
      if (s.outputs.empty()) continue;
      possible = possible || s.outputs[0] == spec;
      if (valid.find(s.outputs[0].ToString()) == std::string::npos)
        valid += (valid.empty() ? "" : ", ") + s.outputs[0].ToString();
    }
    if (!possible)
      throw ShardingError("pinned '" + key + "' to " + spec.ToString() +
                              ", which no rule allows on " + std::to_string(o.world) +
                              " ranks; possible: " + valid,
                          0);
    pins[found] = spec;
  }

  solver::IlpModel m;
  ShardingPlan plan;
  for (auto& e : ents) {
    std::vector<std::pair<int, double>> one;
    for (size_t s = 0; s < e.strategies.size(); ++s) {
      double obj = e.compute_s[s];
      if (o.training && e.is_parameter && e.strategies[s].outputs[0].kind == Kind::kReplicate)
        obj += cost::AllReduceTime(device, e.bytes, o.world);  // gradient sync
      const int x = m.AddBinary(obj, e.name + "/" + e.strategies[s].name);
      e.vars.push_back(x);
      one.push_back({x, 1.0});
    }
    m.AddConstraint(one, solver::Sense::kEqual, 1.0);
  }
  for (const auto& [i, spec] : pins) {
    const Entity& e = ents[static_cast<size_t>(i)];
    for (size_t s = 0; s < e.strategies.size(); ++s)
      if (e.strategies[s].outputs[0] != spec)
        m.AddConstraint({{e.vars[s], 1.0}}, solver::Sense::kEqual, 0.0);
  }
  // Parameter memory.
  const double factor = o.training ? o.state_bytes_factor : 1.0;
  double min_bytes = 0;
  std::vector<std::pair<int, double>> mem;
  for (const auto& e : ents) {
    if (!e.is_parameter) continue;
    double least = std::numeric_limits<double>::infinity();
    for (size_t s = 0; s < e.strategies.size(); ++s) {
      const double b =
          factor * e.bytes / (e.strategies[s].outputs[0].kind == Kind::kShard ? o.world : 1);
      mem.push_back({e.vars[s], b});
      least = std::min(least, b);
    }
    min_bytes += least;
  }
  if (o.memory_budget_bytes > 0) {
    if (min_bytes > o.memory_budget_bytes) {
      std::ostringstream os;
      os << "no sharding fits " << o.memory_budget_bytes / 1e9 << " GB per rank: parameters"
         << (o.training ? " and optimizer state" : "") << " need at least " << min_bytes / 1e9
         << " GB per rank on " << o.world << " ranks; raise the budget or use more ranks";
      throw ShardingError(os.str(), min_bytes);
    }
    m.AddConstraint(mem, solver::Sense::kLessEqual, o.memory_budget_bytes);
  }

  // Edges: resharding between producer output spec and consumer input spec.
  struct EdgeChoice {
    int y;
    int p, sp, c, sc;
    std::string kind, value, consumer;
    ShardSpec from, to;
    double bytes, seconds;
  };
  std::vector<EdgeChoice> edges;
  std::map<std::string, int> node_entity;
  for (size_t i = 0; i < ents.size(); ++i)
    if (!ents[i].is_input) node_entity[ents[i].name] = static_cast<int>(i);
  for (const auto& n : g.nodes()) {
    auto it = node_entity.find(n.name);
    if (it == node_entity.end()) continue;
    const int c = it->second;
    const Entity& ce = ents[static_cast<size_t>(c)];
    const auto ins = ir::TensorInputs(g, n);
    for (size_t i = 0; i < ins.size(); ++i) {
      auto pit = producer.find(ins[i]);
      if (pit == producer.end()) continue;
      const auto [p, k] = pit->second;
      const Entity& pe = ents[static_cast<size_t>(p)];
      const double bytes = Bytes(g, ins[i]);
      // Transportation form (tighter than y >= x + x' - 1): e[sp][sc] >= 0 with
      // sum_sc e = x[p][sp] and sum_sp e = x[c][sc]; its LP relaxation is near-integral.
      std::vector<std::vector<int>> e(pe.strategies.size(),
                                      std::vector<int>(ce.strategies.size(), -1));
      for (size_t sp = 0; sp < pe.strategies.size(); ++sp) {
        for (size_t sc = 0; sc < ce.strategies.size(); ++sc) {
          const ShardSpec& from = pe.strategies[sp].outputs[static_cast<size_t>(k)];
          const ShardSpec& to = ce.strategies[sc].inputs[i];
          auto [kind, secs] = Reshard(from, to, bytes, o.world, device);
          e[sp][sc] = m.AddVariable(0.0, 1.0, comm_factor * secs, false);
          if (secs > 0) {
            edges.push_back({e[sp][sc], p, static_cast<int>(sp), c, static_cast<int>(sc), kind,
                             g.value(ins[i]).name, n.name, from, to, bytes, secs});
          }
        }
      }
      for (size_t sp = 0; sp < pe.strategies.size(); ++sp) {
        std::vector<std::pair<int, double>> row = {{pe.vars[sp], -1.0}};
        for (size_t sc = 0; sc < ce.strategies.size(); ++sc) row.push_back({e[sp][sc], 1.0});
        m.AddConstraint(row, solver::Sense::kEqual, 0.0);
      }
      for (size_t sc = 0; sc < ce.strategies.size(); ++sc) {
        std::vector<std::pair<int, double>> row = {{ce.vars[sc], -1.0}};
        for (size_t sp = 0; sp < pe.strategies.size(); ++sp) row.push_back({e[sp][sc], 1.0});
        m.AddConstraint(row, solver::Sense::kEqual, 0.0);
      }
    }
  }
  // Graph outputs must be replicated: the producer pays the gather directly.
  for (ir::ValueId v : g.OutputValues()) {
    auto pit = producer.find(v);
    if (pit == producer.end()) continue;
    const auto [p, k] = pit->second;
    Entity& pe = ents[static_cast<size_t>(p)];
    for (size_t sp = 0; sp < pe.strategies.size(); ++sp) {
      const ShardSpec& from = pe.strategies[sp].outputs[static_cast<size_t>(k)];
      auto [kind, secs] = Reshard(from, ShardSpec::R(), Bytes(g, v), o.world, device);
      if (secs <= 0) continue;
      const int y = m.AddVariable(0.0, 1.0, comm_factor * secs, false);
      m.AddConstraint({{y, 1.0}, {pe.vars[sp], -1.0}}, solver::Sense::kEqual, 0.0);
      edges.push_back({y, p, static_cast<int>(sp), -1, -1, kind, g.value(v).name, "output", from,
                       ShardSpec::R(), Bytes(g, v), secs});
    }
  }

  solver::SolveOptions so;
  so.time_limit_s = o.time_limit_s;
  const solver::IlpSolution sol = m.Solve(so);
  plan.variables = m.num_variables();
  plan.constraints = m.num_constraints();
  plan.status = solver::IlpStatusName(sol.status);
  if (!sol.has_solution())
    throw ShardingError("the sharding ILP found no plan (" + plan.status + ")", min_bytes);
  plan.objective = sol.objective;

  std::vector<int> chosen(ents.size(), 0);
  for (size_t i = 0; i < ents.size(); ++i) {
    const Entity& e = ents[i];
    for (size_t s = 0; s < e.strategies.size(); ++s)
      if (sol.IntValue(e.vars[s]) == 1) chosen[i] = static_cast<int>(s);
    const auto& st = e.strategies[static_cast<size_t>(chosen[i])];
    if (e.is_input) {
      plan.spec[e.name] = st.outputs[0];
      if (!e.source.empty()) plan.spec[e.source] = st.outputs[0];
      if (e.is_parameter) {
        plan.param_bytes_per_rank += e.bytes / (st.outputs[0].kind == Kind::kShard ? o.world : 1);
        if (o.training && st.outputs[0].kind == Kind::kReplicate)
          plan.grad_sync_s += cost::AllReduceTime(device, e.bytes, o.world);
      }
    } else {
      plan.strategy[e.name] = st.name;
      plan.chosen[e.name] = st;
      plan.node_compute_s[e.name] = e.compute_s[static_cast<size_t>(chosen[i])];
      plan.compute_s += e.compute_s[static_cast<size_t>(chosen[i])];
    }
  }
  for (const auto& n : g.nodes()) {
    auto it = node_entity.find(n.name);
    if (it == node_entity.end()) continue;
    const auto& st = ents[static_cast<size_t>(it->second)]
                         .strategies[static_cast<size_t>(chosen[static_cast<size_t>(it->second)])];
    for (size_t k = 0; k < n.outputs.size() && k < st.outputs.size(); ++k)
      plan.spec[g.value(n.outputs[k]).name] = st.outputs[k];
  }
  for (const auto& e : edges) {
    const bool on = chosen[static_cast<size_t>(e.p)] == e.sp &&
                    (e.c < 0 || chosen[static_cast<size_t>(e.c)] == e.sc);
    if (!on) continue;
    plan.collectives.push_back({e.kind, e.value, e.consumer, e.from, e.to, e.bytes, e.seconds});
    plan.comm_s += comm_factor * e.seconds;
  }
  return plan;
}

}  // namespace tp::passes
