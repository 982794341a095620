// Pass: sharding_ilp; see sharding_ilp.h.
#include "passes/sharding_ilp.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

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
  std::vector<double> compute_s;    // per strategy
  double bytes = 0;                 // graph inputs: tensor bytes
  std::vector<double> saved_bytes;  // nodes, per strategy: outputs kept for the backward
  std::vector<int> vars;            // x per strategy
  std::vector<int> zero_vars;       // parameters: z1 per strategy (ZeRO-1 on), -1 where none
  std::vector<int> zero2_vars;      // parameters: z2 per strategy (ZeRO-2 on), -1 where none
};

double Bytes(const ir::Graph& g, ir::ValueId v) {
  const auto& t = g.type(v);
  if (!t.is_tensor()) return 0;
  auto b = t.tensor.BytesHint();
  return b ? static_cast<double>(*b) : 0;
}

// The collective turning `from` into `to` for a tensor of `bytes`, and its time: what the
// runtime runs for the reshard node the materialiser names with ir::ReshardOpFor.
std::pair<std::string, double> Reshard(const ShardSpec& from, const ShardSpec& to, double bytes,
                                       int world, const cost::DeviceProfile& d,
                                       bool has_reduce_scatter) {
  // Each collective is one more launch: of two ways with equal ring volume (reduce-scatter +
  // all-gather vs one all-reduce) the one with fewer collectives wins.
  const double launch = d.kernel_overhead;
  switch (ir::ReshardOpFor(from, to)) {
    case ir::ReshardOp::kAllGather:
    case ir::ReshardOp::kGatherSlice:  // the whole gathered, then sliced
      return {"all_gather", launch + cost::AllGatherTime(d, bytes, world)};
    case ir::ReshardOp::kAllToAll:
      return {"all_to_all", launch + cost::AllToAllTime(d, bytes / world, world)};
    case ir::ReshardOp::kAllReduce:
      return {"all_reduce", launch + cost::AllReduceTime(d, bytes, world)};
    case ir::ReshardOp::kReduceScatter:
      if (!has_reduce_scatter) return {"all_reduce", launch + cost::AllReduceTime(d, bytes, world)};
      return {"reduce_scatter", launch + cost::AllGatherTime(d, bytes, world)};
    default:  // local: a slice, a zero-padded copy, or zero summands
      return {"", 0};
  }
}

std::string TypeKey(const ir::ValueType& t) {
  if (!t.is_tensor()) return "x";
  std::string k = ir::DTypeName(t.tensor.dtype);
  for (const auto& d : t.tensor.shape) k += "," + d.ToString();
  return k;
}

// The node's constant arguments (values elided): identical layers have identical constants.
void ArgKey(const ir::Arg& a, std::string* out) {
  switch (a.kind) {
    case ir::Arg::Kind::kValue:
      *out += "v";
      return;
    case ir::Arg::Kind::kList:
    case ir::Arg::Kind::kTuple:
      *out += "[";
      for (const auto& item : a.items) ArgKey(item, out), *out += ",";
      *out += "]";
      return;
    case ir::Arg::Kind::kInt:
      *out += std::to_string(a.i);
      return;
    case ir::Arg::Kind::kDouble:
      *out += std::to_string(a.d);
      return;
    case ir::Arg::Kind::kBool:
      *out += a.b ? "T" : "F";
      return;
    default:
      *out += a.s;
  }
}

// Classes of entities with isomorphic neighbourhoods (Weisfeiler-Lehman refinement over the
// value edges, `rounds` hops): the same op of every repeat of a layer lands in one class. The
// class id is its first member's index.
std::vector<int> RepeatClasses(const ir::Graph& g, const std::vector<Entity>& ents,
                               const std::map<ir::ValueId, std::pair<int, int>>& producer,
                               const std::map<int, ShardSpec>& pins,
                               const std::vector<int>& fixed, int rounds = 4) {
  const size_t n = ents.size();
  std::map<std::string, const ir::Node*> node_of;
  for (const auto& node : g.nodes()) node_of[node.name] = &node;
  std::set<int> outputs;
  for (ir::ValueId v : g.OutputValues()) {
    auto it = producer.find(v);
    if (it != producer.end()) outputs.insert(it->second.first);
  }
  std::vector<std::vector<std::pair<int, int>>> in(n), out(n);  // (entity, position)
  std::vector<std::string> label(n);
  for (size_t i = 0; i < n; ++i) {
    const Entity& e = ents[i];
    std::string key = std::to_string(e.strategies.size()) + (outputs.count(int(i)) ? "o" : "");
    auto pin = pins.find(static_cast<int>(i));
    if (pin != pins.end()) key += "pin" + pin->second.ToString();
    if (fixed[i] >= 0) key += "fix" + std::to_string(fixed[i]);
    if (e.is_input) {
      label[i] = key + "in" + (e.is_parameter ? "p" : "u");
      continue;
    }
    const ir::Node& node = *node_of.at(e.name);
    key += node.op + "|";
    for (ir::ValueId v : node.outputs) key += TypeKey(g.type(v)) + ";";
    for (const auto& a : node.args) ArgKey(a, &key);
    for (const auto& kw : node.kwargs) key += kw.name + "=", ArgKey(kw.value, &key);
    label[i] = key;
    const auto ins = ir::TensorInputs(g, node);
    for (size_t k = 0; k < ins.size(); ++k) {
      auto it = producer.find(ins[k]);
      if (it == producer.end()) continue;
      const int p = it->second.first;
      in[i].push_back({p, it->second.second * 1000 + static_cast<int>(k)});
      out[static_cast<size_t>(p)].push_back({static_cast<int>(i), static_cast<int>(k)});
    }
  }
  for (size_t i = 0; i < n; ++i)  // inputs: their type, known from any consumer's view
    if (ents[i].is_input) label[i] += std::to_string(static_cast<long long>(ents[i].bytes));
  std::hash<std::string> hash;
  std::vector<std::string> next(n);
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < n; ++i) {
      std::string k = label[i] + "<";
      for (const auto& [p, pos] : in[i])
        k += label[static_cast<size_t>(p)] + "@" + std::to_string(pos) + ",";
      std::vector<std::string> users;
      for (const auto& [c, pos] : out[i])
        users.push_back(label[static_cast<size_t>(c)] + "@" + std::to_string(pos));
      std::sort(users.begin(), users.end());
      k += ">";
      for (const auto& u : users) k += u + ",";
      next[i] = std::to_string(hash(k)) + ":" + std::to_string(k.size());
    }
    label.swap(next);
  }
  std::map<std::string, int> first;
  std::vector<int> cls(n);
  for (size_t i = 0; i < n; ++i)
    cls[i] = first.emplace(label[i], static_cast<int>(i)).first->second;
  return cls;
}

}  // namespace

// The ILP's objective is in microseconds: CBC prunes nodes that cannot improve the incumbent by
// its cutoff increment (1e-5 absolute), which in seconds would blur every difference under 10 us.
constexpr double kMicro = 1e6;

ShardingPlan PlanSharding(const ir::Graph& g, const ShardingOptions& o) {
  if (o.world < 1) throw ShardingError("sharding needs a mesh of at least one rank", 0);
  if (o.dp < 1) throw ShardingError("sharding needs at least one data-parallel replica (dp)", 0);
  if (o.max_zero_stage < 0 || o.max_zero_stage > 2)
    throw ShardingError("max_zero_stage " + std::to_string(o.max_zero_stage) +
                            ": 0 (whole optimizer state on every rank), 1 (ZeRO-1: the ILP may "
                            "shard a parameter's optimizer state over its copies) or 2 (ZeRO-2: "
                            "its gradient too, over the dp axis)",
                        0);
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
    for (const auto& spec : ir::InputSpecs(t.tensor, o.world, e.is_parameter)) {
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
      // Tie-break between plans of equal modelled time: the one whose ops read (and so save for
      // backward) fewer bytes per rank, e.g. a row-parallel projection of the heads' block over
      // gathering them for a column-parallel one. 1e-15 s per byte: 4 ns for a 4 MB tensor,
      // above the solver's resolution (the objective is in us) and below real cost differences.
      double kept = 0;
      const auto ins = ir::TensorInputs(g, n);
      for (size_t k = 0; k < ins.size() && k < s.inputs.size(); ++k)
        kept += Bytes(g, ins[k]) / (s.inputs[k].kind == Kind::kShard ? o.world : 1);
      e.compute_s.push_back(compute_factor * cost::ComputeTime(device, c.flops * s.compute_fraction,
                                                               c.bytes * s.compute_fraction, 1) +
                            1e-15 * kept);
    }
    // Saved activations: a view aliases its input, which is counted where it is produced.
    const ir::OpInfo* info = registry.Find(n.op);
    const bool aliases = info != nullptr && info->cls == ir::OpClass::kView;
    for (const auto& s : e.strategies) {
      double saved = 0;
      for (size_t k = 0; k < n.outputs.size() && k < s.outputs.size() && !aliases; ++k)
        saved += Bytes(g, n.outputs[k]) / (s.outputs[k].kind == Kind::kShard ? o.world : 1);
      e.saved_bytes.push_back(saved);
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

  // Fixed strategies (the same program at another size): the strategy each entity must take,
  // -1 where free. A fixed name that this graph's sizes do not allow, or that contradicts a pin,
  // leaves the entity free; an input pinned to a spec is fixed (one strategy per spec).
  std::vector<int> fixed(ents.size(), -1);
  for (size_t i = 0; i < ents.size(); ++i) {
    const Entity& e = ents[i];
    int f = -1;
    auto fs = o.fixed_strategies.find(e.name);
    for (size_t s = 0; fs != o.fixed_strategies.end() && s < e.strategies.size(); ++s)
      if (e.strategies[s].name == fs->second) {
        f = static_cast<int>(s);
        break;
      }
    auto pin = pins.find(static_cast<int>(i));
    if (pin != pins.end() && f >= 0 &&
        e.strategies[static_cast<size_t>(f)].outputs[0] != pin->second)
      f = -1;
    for (size_t s = 0; f < 0 && e.is_input && pin != pins.end() && s < e.strategies.size(); ++s)
      if (e.strategies[s].outputs[0] == pin->second) f = static_cast<int>(s);
    fixed[i] = f;
  }
  const bool all_fixed =
      !ents.empty() && std::all_of(fixed.begin(), fixed.end(), [](int f) { return f >= 0; });

  // Fast level: entities whose neighbourhoods are identical (the same op in every repeat of a
  // layer) share their variables, so the ILP has one copy of each repeated layer.
  if (o.level != "exact" && o.level != "fast" && o.level != "auto")
    throw ShardingError("unknown sharding level '" + o.level + "'; valid: exact, fast, auto", 0);
  const bool tie = o.level == "fast" || (o.level == "auto" && ents.size() > o.auto_fast_above);
  std::vector<int> cls(ents.size());
  for (size_t i = 0; i < ents.size(); ++i) cls[i] = static_cast<int>(i);
  if (tie && !all_fixed) cls = RepeatClasses(g, ents, producer, pins, fixed);

  // Per parameter block: how many ranks hold a copy (its replicas over tp, and the dp axis),
  // the gradient sync it needs, and what sharding its optimizer state over the copies saves.
  const double factor = o.training ? o.state_bytes_factor : 1.0;
  auto block_bytes = [&](const Entity& e, size_t s) {
    return e.bytes / (e.strategies[s].outputs[0].kind == Kind::kShard ? o.world : 1);
  };
  auto copies = [&](const Entity& e, size_t s) {
    return o.dp * (e.strategies[s].outputs[0].kind == Kind::kReplicate ? o.world : 1);
  };
  auto grad_sync = [&](const Entity& e, size_t s) {
    if (!o.training) return 0.0;
    double t = 0;
    if (e.strategies[s].outputs[0].kind == Kind::kReplicate)
      t += cost::AllReduceTime(device, e.bytes, o.world);
    if (o.dp > 1) t += cost::AllReduceTime(device, block_bytes(e, s), o.dp);
    return t;
  };
  const bool zero_allowed = o.training && o.max_zero_stage >= 1 && factor > 2;
  // ZeRO-1 of a block: each copy keeps 1/copies of the state and, after its step, the copies
  // all-gather the updated block (one more collective).
  auto zero_saving = [&](const Entity& e, size_t s) {
    return (factor - 2) * (1.0 - 1.0 / copies(e, s)) * block_bytes(e, s);
  };
  auto zero_gather = [&](const Entity& e, size_t s) {
    return device.kernel_overhead + cost::AllGatherTime(device, block_bytes(e, s), copies(e, s));
  };
  // ZeRO-2 over dp: the block's gradient is reduce-scattered when backward produces it and its
  // updated block all-gathered (two collectives of its own), in place of its share of the dp
  // bucket's all-reduce; gradient and optimizer state keep 1/dp.
  const bool zero2_allowed = o.training && o.max_zero_stage >= 2 && o.dp > 1 && factor > 1;
  auto zero2_saving = [&](const Entity& e, size_t s) {
    return (factor - 1) * (1.0 - 1.0 / o.dp) * block_bytes(e, s);
  };
  auto zero2_extra = [&](const Entity& e, size_t s) {
    const double b = block_bytes(e, s);
    // Without a reduce-scatter the runtime reduces the gradient with an all-reduce.
    const double reduce = o.reduce_scatter ? cost::AllGatherTime(device, b, o.dp)
                                           : cost::AllReduceTime(device, b, o.dp);
    return 2 * device.kernel_overhead + reduce + cost::AllGatherTime(device, b, o.dp) -
           cost::AllReduceTime(device, b, o.dp);
  };

  solver::IlpModel m;
  ShardingPlan plan;
  // Objective per (class, strategy): the members' sum.
  std::map<int, std::vector<double>> obj;
  for (size_t i = 0; i < ents.size(); ++i) {
    const Entity& e = ents[i];
    auto& o_cls = obj[cls[i]];
    o_cls.resize(e.strategies.size(), 0.0);
    for (size_t s = 0; s < e.strategies.size(); ++s) {
      o_cls[s] += e.compute_s[s] + (e.is_parameter ? grad_sync(e, s) : 0.0);
    }
  }
  for (size_t i = 0; i < ents.size(); ++i) {
    Entity& e = ents[i];
    if (cls[i] != static_cast<int>(i)) {
      e.vars = ents[static_cast<size_t>(cls[i])].vars;  // a member: the representative's x
      continue;
    }
    std::vector<std::pair<int, double>> one;
    for (size_t s = 0; s < e.strategies.size(); ++s) {
      const int x = m.AddBinary(kMicro * obj[cls[i]][s], e.name + "/" + e.strategies[s].name);
      e.vars.push_back(x);
      one.push_back({x, 1.0});
    }
    m.AddConstraint(one, solver::Sense::kEqual, 1.0);
  }
  // z[p][s] <= x[p][s]: the block under spec s also shards its optimizer state.
  std::map<int, std::vector<double>> zero_obj, zero2_obj;
  for (size_t i = 0; i < ents.size(); ++i) {
    const Entity& e = ents[i];
    if (!e.is_parameter) continue;
    auto& z_cls = zero_obj[cls[i]];
    auto& z2_cls = zero2_obj[cls[i]];
    z_cls.resize(e.strategies.size(), 0.0);
    z2_cls.resize(e.strategies.size(), 0.0);
    for (size_t s = 0; s < e.strategies.size(); ++s) {
      if (zero_allowed) z_cls[s] += zero_gather(e, s);
      if (zero2_allowed) z2_cls[s] += zero2_extra(e, s);
    }
  }
  for (size_t i = 0; i < ents.size(); ++i) {
    Entity& e = ents[i];
    if (!e.is_parameter) continue;
    if (cls[i] != static_cast<int>(i)) {
      e.zero_vars = ents[static_cast<size_t>(cls[i])].zero_vars;
      e.zero2_vars = ents[static_cast<size_t>(cls[i])].zero2_vars;
      continue;
    }
    e.zero_vars.assign(e.strategies.size(), -1);
    e.zero2_vars.assign(e.strategies.size(), -1);
    for (size_t s = 0; s < e.strategies.size(); ++s) {
      std::vector<std::pair<int, double>> row = {{e.vars[s], -1.0}};
      if (zero_allowed && copies(e, s) >= 2) {
        e.zero_vars[s] = m.AddBinary(kMicro * zero_obj[cls[i]][s],
                                     e.name + "/" + e.strategies[s].name + "/zero1");
        row.push_back({e.zero_vars[s], 1.0});
      }
      if (zero2_allowed) {
        e.zero2_vars[s] = m.AddBinary(kMicro * zero2_obj[cls[i]][s],
                                      e.name + "/" + e.strategies[s].name + "/zero2");
        row.push_back({e.zero2_vars[s], 1.0});
      }
      if (row.size() > 1) m.AddConstraint(row, solver::Sense::kLessEqual, 0.0);
    }
  }
  plan.classes = static_cast<int>(obj.size());
  for (const auto& [i, spec] : pins) {
    const Entity& e = ents[static_cast<size_t>(i)];
    for (size_t s = 0; s < e.strategies.size(); ++s)
      if (e.strategies[s].outputs[0] != spec)
        m.AddConstraint({{e.vars[s], 1.0}}, solver::Sense::kEqual, 0.0);
  }
  for (size_t i = 0; i < ents.size() && !all_fixed; ++i) {
    const Entity& e = ents[i];
    if (fixed[i] < 0 || cls[i] != static_cast<int>(i)) continue;  // a class shares its fix
    for (size_t s = 0; s < e.strategies.size(); ++s)
      if (static_cast<int>(s) != fixed[i])
        m.AddConstraint({{e.vars[s], 1.0}}, solver::Sense::kEqual, 0.0);
  }
  // Memory per rank: parameters (with gradients and optimizer state when training) and, when
  // training, the activations kept for the backward.
  const double act_factor = o.training ? o.activation_bytes_factor : 0.0;
  double min_param_bytes = 0, min_act_bytes = 0;
  std::map<int, double> mem_by_var;
  std::map<int, double> state_by_var;  // parameters' layouts alone (memory_slack's objective)
  for (size_t i = 0; i < ents.size(); ++i) {
    const Entity& e = ents[i];
    if (!e.is_parameter && (e.is_input || act_factor <= 0)) continue;
    double least = std::numeric_limits<double>::infinity();
    auto pin = pins.find(static_cast<int>(i));
    for (size_t s = 0; s < e.strategies.size(); ++s) {
      double b = e.is_parameter ? factor * block_bytes(e, s) : act_factor * e.saved_bytes[s];
      mem_by_var[e.vars[s]] += b;
      if (e.is_parameter) {  // the least: the stage that saves the most
        state_by_var[e.vars[s]] += b;
        double saves = 0;
        if (e.zero_vars[s] >= 0) {
          mem_by_var[e.zero_vars[s]] -= zero_saving(e, s);
          saves = zero_saving(e, s);
        }
        if (e.zero2_vars[s] >= 0) {
          mem_by_var[e.zero2_vars[s]] -= zero2_saving(e, s);
          saves = std::max(saves, zero2_saving(e, s));
        }
        b -= saves;
      }
      // The least a pinned entity can take is its pinned spec's.
      if (pin == pins.end() || e.strategies[s].outputs[0] == pin->second)
        least = std::min(least, b);
    }
    (e.is_parameter ? min_param_bytes : min_act_bytes) += least;
  }
  const double min_bytes = min_param_bytes + min_act_bytes;
  if (o.memory_budget_bytes > 0) {
    if (min_bytes > o.memory_budget_bytes) {
      std::ostringstream os;
      os << "no sharding fits " << o.memory_budget_bytes / 1e9 << " GB per rank: parameters"
         << (o.training ? " and optimizer state" : "") << " need at least " << min_param_bytes / 1e9
         << " GB per rank on " << o.world << " ranks" << (o.dp > 1 ? " x " : "")
         << (o.dp > 1 ? std::to_string(o.dp) + " dp replicas" : "")
         << (zero2_allowed  ? " (gradients and optimizer state sharded, ZeRO-1/2)"
             : zero_allowed ? " (optimizer state sharded over every copy, ZeRO-1)"
                            : "");
      if (act_factor > 0)
        os << ", the activations kept for the backward at least " << min_act_bytes / 1e9
           << " GB (the example batch; a smaller micro-batch or checkpointing needs less)";
      os << (pins.empty() ? "" : " with the pinned specs") << "; raise the budget, use more ranks"
         << (pins.empty() ? "" : " or pin less");
      throw ShardingError(os.str(), min_bytes);
    }
    std::vector<std::pair<int, double>> mem(mem_by_var.begin(), mem_by_var.end());
    m.AddConstraint(mem, solver::Sense::kLessEqual, o.memory_budget_bytes);
  }

  // Edges: resharding between producer output spec and consumer input spec. Edges between the
  // same classes at the same positions share one set of variables, weighted by their count.
  struct MemberEdge {
    int p, c;  // c = -1: graph output
    std::string value, consumer;
    double bytes;
  };
  struct EdgeGroup {
    int p, k, c, i;  // representative producer (output k) and consumer (input i)
    std::vector<MemberEdge> members;
  };
  std::map<std::tuple<int, int, int, int>, EdgeGroup> groups;
  std::map<std::string, int> node_entity;
  for (size_t i = 0; i < ents.size(); ++i)
    if (!ents[i].is_input) node_entity[ents[i].name] = static_cast<int>(i);
  for (const auto& n : g.nodes()) {
    auto it = node_entity.find(n.name);
    if (it == node_entity.end()) continue;
    const int c = it->second;
    const auto ins = ir::TensorInputs(g, n);
    for (size_t i = 0; i < ins.size(); ++i) {
      auto pit = producer.find(ins[i]);
      if (pit == producer.end()) continue;
      const auto [p, k] = pit->second;
      auto key = std::make_tuple(cls[static_cast<size_t>(p)], k, cls[static_cast<size_t>(c)],
                                 static_cast<int>(i));
      auto& grp = groups[key];
      if (grp.members.empty()) grp = {p, k, c, static_cast<int>(i), {}};
      grp.members.push_back({p, c, g.value(ins[i]).name, n.name, Bytes(g, ins[i])});
    }
  }
  // Graph outputs must be replicated: the producer pays the gather directly.
  for (ir::ValueId v : g.OutputValues()) {
    auto pit = producer.find(v);
    if (pit == producer.end()) continue;
    const auto [p, k] = pit->second;
    auto key = std::make_tuple(cls[static_cast<size_t>(p)], k, -1, -1);
    auto& grp = groups[key];
    if (grp.members.empty()) grp = {p, k, -1, -1, {}};
    grp.members.push_back({p, -1, g.value(v).name, "output", Bytes(g, v)});
  }
  struct EdgeChoice {
    const EdgeGroup* group;
    int sp, sc;
    std::string kind;
    ShardSpec from, to;
    double seconds;
  };
  std::vector<EdgeChoice> edges;
  for (const auto& [key, grp] : groups) {
    const Entity& pe = ents[static_cast<size_t>(grp.p)];
    const double bytes = grp.members[0].bytes;
    const double count = static_cast<double>(grp.members.size());
    if (grp.c < 0) {
      for (size_t sp = 0; sp < pe.strategies.size(); ++sp) {
        const ShardSpec& from = pe.strategies[sp].outputs[static_cast<size_t>(grp.k)];
        auto [kind, secs] =
            Reshard(from, ShardSpec::R(), bytes, o.world, device, o.reduce_scatter);
        if (secs <= 0) continue;
        const int y = m.AddVariable(0.0, 1.0, kMicro * count * comm_factor * secs, false);
        m.AddConstraint({{y, 1.0}, {pe.vars[sp], -1.0}}, solver::Sense::kEqual, 0.0);
        edges.push_back({&grp, static_cast<int>(sp), -1, kind, from, ShardSpec::R(), secs});
      }
      continue;
    }
    const Entity& ce = ents[static_cast<size_t>(grp.c)];
    // Transportation form (tighter than y >= x + x' - 1): e[sp][sc] >= 0 with
    // sum_sc e = x[p][sp] and sum_sp e = x[c][sc]; its LP relaxation is near-integral.
    std::vector<std::vector<int>> e(pe.strategies.size(), std::vector<int>(ce.strategies.size()));
    for (size_t sp = 0; sp < pe.strategies.size(); ++sp) {
      for (size_t sc = 0; sc < ce.strategies.size(); ++sc) {
        const ShardSpec& from = pe.strategies[sp].outputs[static_cast<size_t>(grp.k)];
        const ShardSpec& to = ce.strategies[sc].inputs[static_cast<size_t>(grp.i)];
        auto [kind, secs] = Reshard(from, to, bytes, o.world, device, o.reduce_scatter);
        e[sp][sc] = m.AddVariable(0.0, 1.0, kMicro * count * comm_factor * secs, false);
        if (secs > 0)
          edges.push_back({&grp, static_cast<int>(sp), static_cast<int>(sc), kind, from, to, secs});
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

  solver::SolveOptions so;
  so.time_limit_s = o.time_limit_s;
  // Two stages: the fastest modelled step first, then, within memory_slack of it, the layout
  // trading time for the parameters' memory per rank (with gradients and optimizer state), one
  // percent for one percent. Activations are left out (the example batch is a tracing input,
  // rarely the run's) and so is ZeRO (a collective per step: the budget's tool). Solved on a
  // copy taken before CBC consumes `m`.
  const bool lean = o.memory_slack > 0 && !state_by_var.empty() && !all_fixed;
  std::optional<solver::IlpModel> second;
  if (lean) second.emplace(m.Clone());
  plan.level = tie && !all_fixed ? "fast" : "exact";
  // Every choice fixed: read the plan off, nothing to solve.
  solver::IlpSolution sol;
  if (all_fixed) {
    sol.status = solver::IlpStatus::kOptimal;
    sol.values.assign(static_cast<size_t>(m.num_variables()), 0.0);
    for (size_t i = 0; i < ents.size(); ++i) {
      const Entity& e = ents[i];
      const size_t f = static_cast<size_t>(fixed[i]);
      sol.values[static_cast<size_t>(e.vars[f])] = 1.0;
      if (!e.is_parameter) continue;
      auto z = o.fixed_zero.find(e.source.empty() ? e.name : e.source);
      const int stage = z == o.fixed_zero.end() ? 0 : z->second;
      if (stage == 1 && e.zero_vars[f] >= 0) sol.values[static_cast<size_t>(e.zero_vars[f])] = 1;
      if (stage == 2 && e.zero2_vars[f] >= 0) sol.values[static_cast<size_t>(e.zero2_vars[f])] = 1;
    }
  } else {
    sol = m.Solve(so);
    plan.variables = m.num_variables();
    plan.constraints = m.num_constraints();
  }
  plan.status = all_fixed ? "fixed" : solver::IlpStatusName(sol.status);
  if (!sol.has_solution())
    throw ShardingError("the sharding ILP found no plan (" + plan.status + ")", min_bytes);
  plan.objective = plan.fastest_objective = sol.objective / kMicro;
  if (lean && sol.objective > 0) {
    const std::vector<double> time = second->ObjectiveCoefficients();
    std::vector<std::pair<int, double>> row;
    for (size_t v = 0; v < time.size(); ++v)
      if (time[v] != 0) row.push_back({static_cast<int>(v), time[v]});
    second->AddConstraint(row, solver::Sense::kLessEqual,
                          sol.objective * (1 + o.memory_slack) * (1 + 1e-9), "memory_slack");
    // Exchange rate: 1% of the fastest plan's state per rank is worth 1% of its step, so a
    // layout saving a few bytes for a collective (a norm's weight) stays replicated while a
    // table saving a tenth of the model is split.
    double fastest_state = 0;
    for (const auto& [v, b] : state_by_var) fastest_state += b * sol.values[static_cast<size_t>(v)];
    fastest_state = std::max(fastest_state, 1.0);
    for (size_t v = 0; v < time.size(); ++v) {
      auto it = state_by_var.find(static_cast<int>(v));
      const double bytes = it == state_by_var.end() ? 0.0 : it->second;
      second->SetObjective(static_cast<int>(v), bytes / fastest_state + time[v] / sol.objective);
    }
    second->SetInitialSolution(sol.values);
    solver::IlpSolution leaner = second->Solve(so);
    if (leaner.has_solution()) {
      double t = 0;
      for (size_t v = 0; v < time.size(); ++v) t += time[v] * leaner.values[v];
      plan.objective = t / kMicro;
      plan.status = solver::IlpStatusName(leaner.status);
      plan.constraints = second->num_constraints();
      sol = std::move(leaner);
    }
  }

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
        const size_t s = static_cast<size_t>(chosen[i]);
        plan.param_bytes_per_rank += block_bytes(e, s);
        plan.grad_sync_s += grad_sync(e, s);
        double state = factor * block_bytes(e, s);
        const std::string key = e.source.empty() ? e.name : e.source;
        if (e.zero_vars[s] >= 0 && sol.IntValue(e.zero_vars[s]) == 1) {
          state -= zero_saving(e, s);
          plan.zero_copies[key] = copies(e, s);
          plan.zero_stage[key] = 1;
          plan.zero_gather_s += zero_gather(e, s);
        } else if (e.zero2_vars[s] >= 0 && sol.IntValue(e.zero2_vars[s]) == 1) {
          state -= zero2_saving(e, s);
          plan.zero_copies[key] = o.dp;
          plan.zero_stage[key] = 2;
          plan.zero_gather_s += zero2_extra(e, s);
        }
        plan.state_bytes_per_rank += state;
      }
    } else {
      plan.strategy[e.name] = st.name;
      plan.chosen[e.name] = st;
      plan.activation_bytes_per_rank += act_factor * e.saved_bytes[static_cast<size_t>(chosen[i])];
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
  if (all_fixed) {  // priced as the ILP's objective would price it
    plan.objective = plan.fastest_objective = 0;
    for (size_t i = 0; i < ents.size(); ++i) {
      const Entity& e = ents[i];
      const size_t f = static_cast<size_t>(chosen[i]);
      plan.objective += e.compute_s[f] + (e.is_parameter ? grad_sync(e, f) : 0.0);
    }
  }
  for (const auto& e : edges) {
    const EdgeGroup& grp = *e.group;
    const bool on = chosen[static_cast<size_t>(grp.p)] == e.sp &&
                    (grp.c < 0 || chosen[static_cast<size_t>(grp.c)] == e.sc);
    if (!on) continue;
    for (const auto& me : grp.members) {
      plan.collectives.push_back(
          {e.kind, me.value, me.consumer, e.from, e.to, me.bytes, e.seconds});
      plan.comm_s += comm_factor * e.seconds;
      if (all_fixed) plan.objective += comm_factor * e.seconds;
    }
  }
  if (all_fixed) {
    plan.objective += plan.zero_gather_s;
    plan.fastest_objective = plan.objective;
    const double used = plan.state_bytes_per_rank + plan.activation_bytes_per_rank;
    if (o.memory_budget_bytes > 0 && used > o.memory_budget_bytes)
      throw ShardingError("the fixed strategies need " + std::to_string(used / 1e9) +
                              " GB per rank, over the budget of " +
                              std::to_string(o.memory_budget_bytes / 1e9) + " GB",
                          used);
  }
  return plan;
}

std::string ShardingPlan::ToString() const {
  std::ostringstream os;
  os << "sharding plan (" << status << ", level " << level << "): objective "
     << objective * 1e6 << " us = compute " << compute_s * 1e6 << " + comm " << comm_s * 1e6
     << " + grad sync " << grad_sync_s * 1e6 << " us; per rank: params " << param_bytes_per_rank
     << " B, state " << state_bytes_per_rank << " B, activations " << activation_bytes_per_rank
     << " B\n";
  for (const auto& [name, s] : spec) {
    if (name.empty()) continue;  // an unused tuple element
    os << "  " << name << ": " << s.ToString();
    auto st = strategy.find(name);
    if (st != strategy.end()) os << " by " << st->second;
    auto z = zero_stage.find(name);
    if (z != zero_stage.end())
      os << ", ZeRO-" << z->second << " over " << zero_copies.at(name);
    os << "\n";
  }
  for (const auto& c : collectives) {
    os << "  " << c.kind << " " << c.value << " " << c.from.ToString() << " -> "
       << c.to.ToString() << " for " << c.consumer << " (" << c.bytes << " B)\n";
  }
  return os.str();
}

}  // namespace tp::passes
