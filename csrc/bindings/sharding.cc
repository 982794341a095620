// Bindings of the sharding planner (sharding_ilp) and its materialisation
// (sharding_materialize): typed options and plans, methods of the PassManager. No LibTorch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>

#include "bindings/typed.h"
#include "passes/pass_manager.h"
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
      size_t digits = 0;
      const int dim = std::stoi(s.substr(2, close - 2), &digits);
      if (digits != close - 2) throw std::invalid_argument(s);  // "S(1a)": not a dim
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

template <class Map>
std::map<std::string, std::string> SpecStrings(const Map& m) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m) out[k] = v.ToString();
  return out;
}

// A sharded graph: the SPMD graph every rank runs, and what the materialisation inserted.
struct ShardedGraph {
  ir::Graph graph;
  passes::MaterializeStats stats;
};

}  // namespace

void BindSharding(py::module_& m, py::class_<passes::PassManager>& pm) {
  using passes::ShardingOptions;
  using passes::ShardingPlan;
  Struct<ShardingOptions>(m, "ShardingOptions",
                          "Options of the sharding ILP (csrc/passes/sharding_ilp.h).")
      .field("world", &ShardingOptions::world, "ranks on the tensor-parallel axis")
      .field("device", &ShardingOptions::device, "device profile for the cost model")
      .field("training", &ShardingOptions::training)
      .field("state_bytes_factor", &ShardingOptions::state_bytes_factor)
      .field("memory_budget_bytes", &ShardingOptions::memory_budget_bytes, "0: unlimited")
      .field("activation_bytes_factor", &ShardingOptions::activation_bytes_factor)
      .field("dp", &ShardingOptions::dp, "data-parallel replicas of the graph")
      .field("max_zero_stage", &ShardingOptions::max_zero_stage)
      .field("time_limit_s", &ShardingOptions::time_limit_s)
      .field("memory_slack", &ShardingOptions::memory_slack,
             "least memory among plans within this fraction of the fastest; 0: the fastest")
      .field("level", &ShardingOptions::level, "'exact', 'fast' or 'auto'")
      .field("auto_fast_above", &ShardingOptions::auto_fast_above)
      .field("reduce_scatter", &ShardingOptions::reduce_scatter,
             "the runtime's library has reduce-scatter (NCCL, gloo); False prices all-reduce")
      .property(
          "pinned", [](const ShardingOptions& o) { return SpecStrings(o.pinned); },
          +[](ShardingOptions& o, const std::map<std::string, std::string>& pins) {
            o.pinned.clear();
            for (const auto& [k, v] : pins) o.pinned[k] = SpecFromString(v);
          },
          "input source or node name -> spec ('R', 'S(d)', 'S(d)xk', 'P')")
      .field("fixed_strategies", &ShardingOptions::fixed_strategies,
             "node or input name -> strategy name (a plan's `strategy`): the same program at "
             "another size; all fixed: no ILP is solved (status 'fixed')")
      .field("fixed_zero", &ShardingOptions::fixed_zero,
             "parameter -> ZeRO stage (a plan's `zero_stage`) where strategies are fixed");

  // The one parser of spec strings: reshard nodes, checkpoint layouts and pretrained boxes read
  // their specs through it (Python keeps no twin of it).
  m.def(
      "parse_spec",
      [](const std::string& s) {
        const ir::ShardSpec spec = SpecFromString(s);
        const char* kind = spec.kind == ir::ShardSpec::Kind::kShard     ? "S"
                           : spec.kind == ir::ShardSpec::Kind::kPartial ? "P"
                                                                        : "R";
        return py::make_tuple(kind, spec.dim, spec.sections);
      },
      py::arg("spec"),
      "(kind, dim, sections) of 'R', 'P', 'S(d)' or the strided 'S(d)xN' (dim -1 unless "
      "kind is 'S'). Raises ValueError for anything else.");

  m.def(
      "reshard_op",
      [](const std::string& from, const std::string& to) {
        return std::string(
            ir::ReshardOpName(ir::ReshardOpFor(SpecFromString(from), SpecFromString(to))));
      },
      py::arg("src"), py::arg("dst"),
      "The step turning spec `src` into `dst` (ir::ReshardOpFor): none, slice, zero_pad, "
      "keep_on_rank_zero, all_gather, all_gather_slice, all_to_all, all_reduce, reduce_scatter.");
  m.def(
      "gradient_spec",
      [](const std::string& s) { return ir::GradientSpec(SpecFromString(s)).ToString(); },
      py::arg("spec"), "The spec of a value's gradient: R <-> P, a shard stays itself.");

  Struct<passes::Collective>(m, "Collective", "One forward resharding the plan priced.")
      .field("kind", &passes::Collective::kind)
      .field("value", &passes::Collective::value)
      .field("consumer", &passes::Collective::consumer)
      .computed("from_spec", [](const passes::Collective& c) { return c.from.ToString(); })
      .computed("to_spec", [](const passes::Collective& c) { return c.to.ToString(); })
      .field("bytes", &passes::Collective::bytes)
      .field("seconds", &passes::Collective::seconds);

  Struct<ShardingPlan>(m, "ShardingPlan",
                       "A sharding plan: strategy per node, spec per value, collectives, costs.",
                       [](const ShardingPlan& p) { return p.ToString(); })
      .field("strategy", &ShardingPlan::strategy)
      .computed("spec", [](const ShardingPlan& p) { return SpecStrings(p.spec); })
      .computed("input_specs",
                [](const ShardingPlan& p) {
                  std::map<std::string, std::vector<std::string>> out;
                  for (const auto& [node, st] : p.chosen)
                    for (const auto& s : st.inputs) out[node].push_back(s.ToString());
                  return out;
                })
      .field("node_compute_s", &ShardingPlan::node_compute_s)
      .field("collectives", &ShardingPlan::collectives)
      .field("compute_s", &ShardingPlan::compute_s)
      .field("comm_s", &ShardingPlan::comm_s)
      .field("grad_sync_s", &ShardingPlan::grad_sync_s)
      .field("objective", &ShardingPlan::objective)
      .field("fastest_objective", &ShardingPlan::fastest_objective)
      .field("param_bytes_per_rank", &ShardingPlan::param_bytes_per_rank)
      .field("state_bytes_per_rank", &ShardingPlan::state_bytes_per_rank)
      .field("activation_bytes_per_rank", &ShardingPlan::activation_bytes_per_rank)
      .field("zero_copies", &ShardingPlan::zero_copies)
      .field("zero_stage", &ShardingPlan::zero_stage)
      .field("zero_gather_s", &ShardingPlan::zero_gather_s)
      .field("variables", &ShardingPlan::variables)
      .field("constraints", &ShardingPlan::constraints)
      .field("classes", &ShardingPlan::classes)
      .field("level", &ShardingPlan::level)
      .field("status", &ShardingPlan::status);

  Struct<passes::MaterializeOptions>(m, "MaterializeOptions",
                                     "Options of sharding_materialize.")
      .field("world", &passes::MaterializeOptions::world)
      .field("group", &passes::MaterializeOptions::group,
             "runtime handle of the process group the collectives use")
      .field("training", &passes::MaterializeOptions::training);

  Struct<ShardedGraph>(m, "ShardedGraph", "The SPMD graph every rank runs on its local shards.",
                       [](const ShardedGraph& s) {
                         return "ShardedGraph(" + std::to_string(s.graph.nodes().size()) +
                                " nodes, " + std::to_string(s.stats.reshards) + " reshards, " +
                                std::to_string(s.stats.grad_syncs) + " parameters synced, " +
                                std::to_string(s.stats.views_rewritten) + " views rewritten)";
                       })
      .field("graph", &ShardedGraph::graph)
      .computed("reshards", [](const ShardedGraph& s) { return s.stats.reshards; })
      .computed("grad_syncs", [](const ShardedGraph& s) { return s.stats.grad_syncs; })
      .computed("views_rewritten", [](const ShardedGraph& s) { return s.stats.views_rewritten; });

  pm.def(
      "plan_sharding",
      [](passes::PassManager&, const ir::Graph& g, const ShardingOptions& o) {
        py::gil_scoped_release release;  // CBC may run for seconds
        return passes::PlanSharding(g, o);
      },
      py::arg("graph"), py::arg("options"),
      "Sharding plan of an ATen graph on a 1-D mesh (ILP on CBC). Raises PlanError "
      "(with .min_memory_bytes) when no plan fits the budget.");
  pm.def(
      "materialize_sharding",
      [](passes::PassManager&, const ir::Graph& g, const ShardingPlan& plan,
         const passes::MaterializeOptions& o) {
        ShardedGraph out;
        out.graph = passes::MaterializeSharding(g, plan, o, &out.stats);
        return out;
      },
      py::arg("graph"), py::arg("plan"), py::arg("options"),
      "The SPMD graph of a plan, with torch_plugin::reshard / grad_sync / replicated_output "
      "nodes on process group handle options.group.");
}

}  // namespace tp::bindings
