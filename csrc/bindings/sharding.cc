// Bindings of the sharding planner (sharding_ilp) and its materialisation
// (sharding_materialize), as Python dicts. No LibTorch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>

#include "passes/sharding_ilp.h"
#include "passes/sharding_materialize.h"

namespace py = pybind11;

namespace tp::bindings {
namespace {

ir::ShardSpec SpecFromString(const std::string& s) {
  if (s == "R") return ir::ShardSpec::R();
  if (s == "P") return ir::ShardSpec::P();
  const auto close = s.find(')');
  if (s.size() > 3 && s.rfind("S(", 0) == 0 && close != std::string::npos) {
    try {
      const int dim = std::stoi(s.substr(2, close - 2));
      if (close + 1 == s.size()) return ir::ShardSpec::S(dim);
      if (s[close + 1] == 'x' && close + 2 < s.size()) {
        size_t used = 0;
        const int sections = std::stoi(s.substr(close + 2), &used);
        if (close + 2 + used == s.size() && sections > 1) return ir::ShardSpec::S(dim, sections);
      }
    } catch (const std::exception&) {
    }
  }
  throw std::invalid_argument("bad shard spec '" + s +
                              "'; use 'R', 'P', 'S(<dim>)' or 'S(<dim>)x<sections>'");
}

passes::ShardingOptions Options(int world, const std::string& device, bool training,
                                double memory_budget_bytes, double time_limit_s,
                                const std::map<std::string, std::string>& pinned,
                                const std::string& level, double activation_bytes_factor, int dp,
                                int max_zero_stage) {
  passes::ShardingOptions o;
  o.dp = dp, o.max_zero_stage = max_zero_stage;
  o.level = level;
  o.activation_bytes_factor = activation_bytes_factor;
  o.world = world, o.device = device, o.training = training;
  o.memory_budget_bytes = memory_budget_bytes, o.time_limit_s = time_limit_s;
  for (const auto& [k, v] : pinned) o.pinned[k] = SpecFromString(v);
  return o;
}

py::dict PlanDict(const passes::ShardingPlan& p) {
  py::dict spec;
  for (const auto& [k, v] : p.spec) spec[py::str(k)] = v.ToString();
  py::list colls;
  for (const auto& c : p.collectives) {
    colls.append(py::dict(py::arg("kind") = c.kind, py::arg("value") = c.value,
                          py::arg("consumer") = c.consumer, py::arg("from") = c.from.ToString(),
                          py::arg("to") = c.to.ToString(), py::arg("bytes") = c.bytes,
                          py::arg("seconds") = c.seconds));
  }
  py::dict inputs;
  for (const auto& [node, st] : p.chosen) {
    py::list specs;
    for (const auto& s : st.inputs) specs.append(s.ToString());
    inputs[py::str(node)] = specs;
  }
  return py::dict(
      py::arg("strategy") = p.strategy, py::arg("spec") = spec, py::arg("input_specs") = inputs,
      py::arg("node_compute_s") = p.node_compute_s, py::arg("collectives") = colls,
      py::arg("compute_s") = p.compute_s, py::arg("comm_s") = p.comm_s,
      py::arg("grad_sync_s") = p.grad_sync_s, py::arg("objective") = p.objective,
      py::arg("param_bytes_per_rank") = p.param_bytes_per_rank,
      py::arg("activation_bytes_per_rank") = p.activation_bytes_per_rank,
      py::arg("state_bytes_per_rank") = p.state_bytes_per_rank,
      py::arg("zero_copies") = p.zero_copies, py::arg("zero_stage") = p.zero_stage,
      py::arg("zero_gather_s") = p.zero_gather_s,
      py::arg("variables") = p.variables, py::arg("constraints") = p.constraints,
      py::arg("classes") = p.classes, py::arg("level") = p.level, py::arg("status") = p.status);
}

}  // namespace

void BindSharding(py::module_& m) {
  m.def(
      "plan_sharding",
      [](const ir::Graph& g, int world, const std::string& device, bool training,
         double memory_budget_bytes, double time_limit_s,
         const std::map<std::string, std::string>& pinned, const std::string& level,
         double activation_bytes_factor, int dp, int max_zero_stage) {
        return PlanDict(passes::PlanSharding(
            g, Options(world, device, training, memory_budget_bytes, time_limit_s, pinned, level,
                       activation_bytes_factor, dp, max_zero_stage)));
      },
      py::arg("graph"), py::arg("world"), py::arg("device") = "a100", py::arg("training") = true,
      py::arg("memory_budget_bytes") = 0.0, py::arg("time_limit_s") = 30.0,
      py::arg("pinned") = std::map<std::string, std::string>{}, py::arg("level") = "auto",
      py::arg("activation_bytes_factor") = 1.0, py::arg("dp") = 1, py::arg("max_zero_stage") = 1,
      "Sharding plan of an ATen graph on a 1-D mesh of `world` ranks (ILP on CBC): strategy per "
      "node, spec per value ('R', 'S(d)', 'P'), forward collectives, modelled times. level: "
      "'exact' (whole graph), 'fast' (repeated layers share variables), 'auto'. The budget "
      "covers parameters (x optimizer state when training) and, when training, the activations "
      "kept for the backward (x activation_bytes_factor; 0 leaves them out). dp: data-parallel "
      "replicas of the graph (each a batch slice; every block's gradient is summed over them). "
      "max_zero_stage=1 lets the ILP shard a parameter's optimizer state over its copies where "
      "memory needs it, 2 also its gradient over dp ('zero_copies': name -> copies; "
      "'zero_stage': name -> 1 or 2; 'state_bytes_per_rank'). Raises PlanError "
      "(with .min_memory_bytes) when no plan fits the budget.");

  m.def(
      "shard_graph",
      [](const ir::Graph& g, int world, int64_t group, const std::string& device, bool training,
         double memory_budget_bytes, double time_limit_s,
         const std::map<std::string, std::string>& pinned, const std::string& level,
         double activation_bytes_factor, int dp, int max_zero_stage) {
        const passes::ShardingPlan plan = passes::PlanSharding(
            g, Options(world, device, training, memory_budget_bytes, time_limit_s, pinned, level,
                       activation_bytes_factor, dp, max_zero_stage));
        passes::MaterializeOptions mo;
        mo.world = world, mo.group = group, mo.training = training;
        passes::MaterializeStats stats;
        ir::Graph local = passes::MaterializeSharding(g, plan, mo, &stats);
        py::dict out = PlanDict(plan);
        out["graph"] = std::move(local);
        out["reshards"] = stats.reshards;
        out["grad_syncs"] = stats.grad_syncs;
        out["views_rewritten"] = stats.views_rewritten;
        return out;
      },
      py::arg("graph"), py::arg("world"), py::arg("group"), py::arg("device") = "a100",
      py::arg("training") = true, py::arg("memory_budget_bytes") = 0.0,
      py::arg("time_limit_s") = 30.0, py::arg("pinned") = std::map<std::string, std::string>{},
      py::arg("level") = "auto", py::arg("activation_bytes_factor") = 1.0, py::arg("dp") = 1,
      py::arg("max_zero_stage") = 1,
      "Plans the sharding (as plan_sharding) and materialises it: the dict gains 'graph', the "
      "SPMD graph every rank runs on its local shards, with torch_plugin::reshard / grad_sync / "
      "replicated_output nodes on process group handle `group`.");
}

}  // namespace tp::bindings
