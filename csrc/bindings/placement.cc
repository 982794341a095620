// Bindings of backend placement: the pattern language, candidate generation, the op-level DP
// and the evolutionary search. Measuring and compiling stay in Python (they need the backends);
// everything that decides is here. No LibTorch.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings/typed.h"
#include "cost/cpu_peak.h"
#include "passes/pass_manager.h"
#include "passes/placement_dp.h"
#include "passes/placement_evolve.h"
#include "passes/placement_rounds.h"
#include "passes/placement_search.h"
#include "pattern/backend_rules.h"
#include "pattern/candidates.h"

namespace py = pybind11;

namespace tp::bindings {
namespace {

std::string ValueName(const ir::Graph& g, ir::ValueId v) {
  const auto& val = g.value(v);
  return val.name.empty() ? "v" + std::to_string(v) : val.name;
}

ir::OpClass OpClassFromName(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(ir::OpClass::kOther); ++i) {
    auto cls = static_cast<ir::OpClass>(i);
    if (name == ir::OpClassName(cls)) return cls;
  }
  throw py::value_error("unknown op class '" + name +
                        "'; known: matmul, conv, attention, embedding, elementwise, reduction, "
                        "softmax, norm, pool, view, copy, factory, random, mutation, symbolic, "
                        "other");
}

using PlacementChoice = passes::PlacementOption;

// The DP's result in the caller's candidate ids.
struct Placement {
  std::vector<int> chosen;
  double cost = 0.0;
  int64_t states = 0;
  bool exact = true;
};

}  // namespace

void BindPlacement(py::module_& m, py::class_<passes::PassManager>& pm) {
  auto pat = m.def_submodule("pattern", "The placement pattern language (csrc/pattern).");
  py::class_<pattern::PatternNode, std::shared_ptr<pattern::PatternNode>>(pat, "Pattern")
      .def("__repr__", &pattern::PatternNode::ToString)
      .def("has_attr", [](const pattern::Pattern& p, const std::string& k,
                          const std::string& v) { return pattern::HasAttr(p, k, v); })
      .def("has_dtype",
           [](const pattern::Pattern& p, const std::vector<std::string>& dtypes) {
             std::vector<ir::DType> d;
             for (const auto& s : dtypes) d.push_back(ir::DTypeFromName(s));
             return pattern::HasDType(p, d);
           })
      .def("has_rank",
           [](const pattern::Pattern& p, int lo, int hi) { return pattern::HasRank(p, lo, hi); })
      .def("static_shape", [](const pattern::Pattern& p) { return pattern::HasStaticShape(p); });
  // shared_ptr<const T> is held as shared_ptr<T> on the Python side.
  auto unconst = [](pattern::Pattern p) {
    return std::const_pointer_cast<pattern::PatternNode>(std::move(p));
  };
  pat.def("wildcard", [unconst] { return unconst(pattern::Wildcard()); });
  pat.def(
      "is_op",
      [unconst](const std::vector<std::string>& ops,
                const std::vector<std::shared_ptr<pattern::PatternNode>>& inputs) {
        return unconst(pattern::IsOp(ops, {inputs.begin(), inputs.end()}));
      },
      py::arg("ops"), py::arg("inputs") = std::vector<std::shared_ptr<pattern::PatternNode>>{});
  pat.def(
      "is_op_class",
      [unconst](const std::vector<std::string>& classes,
                const std::vector<std::shared_ptr<pattern::PatternNode>>& inputs) {
        std::vector<ir::OpClass> cls;
        for (const auto& c : classes) cls.push_back(OpClassFromName(c));
        return unconst(pattern::IsOpClass(cls, {inputs.begin(), inputs.end()}));
      },
      py::arg("classes"), py::arg("inputs") = std::vector<std::shared_ptr<pattern::PatternNode>>{});
  pat.def("alt", [unconst](const std::vector<std::shared_ptr<pattern::PatternNode>>& alts) {
    return unconst(pattern::Alt({alts.begin(), alts.end()}));
  });
  pat.def("known_rule_sets", &pattern::KnownRuleSets);
  pat.def(
      "match_all",
      [](const ir::Graph& g, const std::shared_ptr<pattern::PatternNode>& p) {
        pattern::Matcher matcher(g);
        std::vector<std::vector<std::string>> out;
        for (const auto& match : matcher.MatchAll(p)) {
          std::vector<std::string> names;
          for (ir::NodeId n : match.nodes) names.push_back(g.node(n).name);
          out.push_back(std::move(names));
        }
        return out;
      },
      "Every match of the pattern: the names of the nodes each covers.");

  m.def(
      "placement_candidates",
      [](const ir::Graph& g, const std::vector<std::string>& backends,
         const std::map<std::string,
                        std::vector<std::pair<std::string, std::shared_ptr<pattern::PatternNode>>>>&
             extra_rules,
         int64_t max_candidates) {
        std::vector<pattern::BackendRules> rules;
        for (const auto& b : backends) {
          pattern::BackendRules r{b, {}};
          auto extra = extra_rules.find(b);
          if (extra != extra_rules.end()) {
            for (const auto& [name, p] : extra->second)
              r.rules.push_back(pattern::PatternRule(name, p));
          } else {
            try {
              r.rules = pattern::DefaultRules(b);
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          }
          rules.push_back(std::move(r));
        }
        auto set = pattern::GenerateCandidates(g, rules, max_candidates);
        py::list cands;
        for (const auto& c : set.candidates) {
          std::vector<std::string> nodes, inputs, outputs;
          for (ir::NodeId n : c.nodes) nodes.push_back(g.node(n).name);
          for (ir::ValueId v : c.inputs) inputs.push_back(ValueName(g, v));
          for (ir::ValueId v : c.outputs) outputs.push_back(ValueName(g, v));
          cands.append(py::dict(py::arg("id") = c.id, py::arg("backend") = c.backend,
                                py::arg("rule") = c.rule, py::arg("node_ids") = c.nodes,
                                py::arg("nodes") = nodes, py::arg("inputs") = inputs,
                                py::arg("outputs") = outputs, py::arg("signature") = c.signature));
        }
        return py::dict(py::arg("candidates") = cands,
                        py::arg("rejected_cyclic") = set.rejected_cyclic,
                        py::arg("rejected_too_many") = set.rejected_too_many);
      },
      py::arg("graph"), py::arg("backends"), py::arg("extra_rules") = py::dict(),
      py::arg("max_candidates") = 200000,
      "Candidate groups per backend: dicts with id, backend, rule, node names/ids, input and "
      "output value names, and the canonical signature.");

  m.def(
      "graph_signature",
      [](const ir::Graph& g) {
        std::vector<ir::NodeId> all;
        for (const auto& n : g.nodes()) all.push_back(n.id);
        return pattern::DescribeGroup(g, all, g.ComputeUsers()).signature;
      },
      "Canonical text of the whole graph (ops, constants, wiring, input types): the key under "
      "which placement decisions are cached.");

  using passes::PlacementDpOptions;
  Struct<PlacementDpOptions>(m, "PlacementOptions", "Options of the op-level placement DP.")
      .field("max_states", &PlacementDpOptions::max_states,
             "past this many states the search is Collage's bounded form (exact=False)");
  Struct<PlacementChoice>(m, "PlacementChoice",
                          "One candidate group the DP may pick: its nodes, measured seconds, "
                          "backend.")
      .field("candidate", &PlacementChoice::candidate)
      .field("nodes", &PlacementChoice::nodes, "node ids")
      .field("cost", &PlacementChoice::cost, "seconds")
      .field("backend", &PlacementChoice::backend);
  Struct<Placement>(m, "Placement", "The op-level DP's cover of the graph.",
                    [](const Placement& p) {
                      std::string s = "Placement(" + std::to_string(p.chosen.size()) +
                                      " groups, cost " + std::to_string(p.cost * 1e6) + " us, " +
                                      std::to_string(p.states) + " states" +
                                      (p.exact ? ", exact)" : ", bounded)");
                      return s;
                    })
      .field("chosen", &Placement::chosen, "candidate ids in execution order")
      .field("cost", &Placement::cost, "modelled seconds")
      .field("states", &Placement::states)
      .field("exact", &Placement::exact);

  pm.def(
      "place_op_level",
      [](passes::PassManager& self, const ir::Graph& g, const std::vector<PlacementChoice>& choices,
         const PlacementDpOptions& options, double switch_penalty) {
        passes::PlacementProblem p = passes::PlacementProblemFor(g);
        for (const auto& c : choices) p.options.push_back(c);
        p.switch_penalty = switch_penalty;
        passes::OpLevelPlacement r;
        {
          py::gil_scoped_release release;
          r = passes::PlaceOpLevel(p, options, self.context());
        }
        Placement out;
        for (int o : r.chosen) out.chosen.push_back(p.options[static_cast<size_t>(o)].candidate);
        out.cost = r.cost, out.states = r.states, out.exact = r.exact;
        return out;
      },
      py::arg("graph"), py::arg("choices"), py::arg("options"), py::kw_only(),
      py::arg("switch_penalty") = 0.0,
      "Op-level DP over candidate groups (PlacementChoice); seconds per switch into a backend.");

  using passes::WholeGraphSearchOptions;
  Struct<WholeGraphSearchOptions>(m, "WholeGraphSearchOptions",
                                  "Options of the default placement's driver "
                                  "(csrc/passes/placement_search.h).")
      .field("turns", &WholeGraphSearchOptions::turns)
      .field("drop_ratio", &WholeGraphSearchOptions::drop_ratio)
      .field("turn_slack", &WholeGraphSearchOptions::turn_slack)
      .field("close_ratio", &WholeGraphSearchOptions::close_ratio)
      .field("stop_decided", &WholeGraphSearchOptions::stop_decided)
      .field("budget_s", &WholeGraphSearchOptions::budget_s)
      .field("budget_factor", &WholeGraphSearchOptions::budget_factor)
      .field("reference", &WholeGraphSearchOptions::reference)
      .field("fallback_budget_s", &WholeGraphSearchOptions::fallback_budget_s)
      .field("keep_eager_margin", &WholeGraphSearchOptions::keep_eager_margin)
      .field("mixing_prior", &WholeGraphSearchOptions::mixing_prior)
      .field("min_gain", &WholeGraphSearchOptions::min_gain)
      .field("refine_candidates", &WholeGraphSearchOptions::refine_candidates)
      .field("seconds_per_candidate", &WholeGraphSearchOptions::seconds_per_candidate)
      .field("allow_refine", &WholeGraphSearchOptions::allow_refine)
      .field("always_refine", &WholeGraphSearchOptions::always_refine)
      .field("lower_bound_s", &WholeGraphSearchOptions::lower_bound_s)
      .field("floor_slack", &WholeGraphSearchOptions::floor_slack)
      .field("expected_compile_s", &WholeGraphSearchOptions::expected_compile_s)
      .field("cheap_fraction", &WholeGraphSearchOptions::cheap_fraction)
      .field("compiles_with", &WholeGraphSearchOptions::compiles_with)
      .field("compile_bytes", &WholeGraphSearchOptions::compile_bytes)
      .field("memory_slack", &WholeGraphSearchOptions::memory_slack);
  m.def("measure_f32_peak", &cost::MeasureF32Peak, py::arg("threads"), py::arg("seconds") = 0.02,
        py::arg("tries") = 3,
        "The machine's f32 multiply-add peak in FLOP/s on `threads` threads, measured "
        "(csrc/cost/cpu_peak.h).",
        py::call_guard<py::gil_scoped_release>());
  using passes::WholeGraphTrial;
  Struct<WholeGraphTrial>(m, "WholeGraphTrial", "One compiler's whole-graph trial.")
      .field("backend", &WholeGraphTrial::backend)
      .field("compiled", &WholeGraphTrial::compiled)
      .field("compile_s", &WholeGraphTrial::compile_s)
      .field("median_s", &WholeGraphTrial::median_s)
      .field("skipped", &WholeGraphTrial::skipped);
  using passes::WholeGraphSearchPlan;
  Struct<WholeGraphSearchPlan>(
      m, "WholeGraphPlan", "The default placement's pick.",
      [](const WholeGraphSearchPlan& p) {
        return "WholeGraphPlan(pick=" + p.pick + ", " + std::to_string(p.pick_s * 1e3) +
               " ms vs eager " + std::to_string(p.eager_s * 1e3) +
               " ms, refine=" + (p.refine ? "True" : "False") + ": " + p.reason + ")";
      })
      .field("trials", &WholeGraphSearchPlan::trials)
      .field("pick", &WholeGraphSearchPlan::pick)
      .field("pick_s", &WholeGraphSearchPlan::pick_s)
      .field("eager_s", &WholeGraphSearchPlan::eager_s)
      .field("budget_s", &WholeGraphSearchPlan::budget_s)
      .field("refine", &WholeGraphSearchPlan::refine)
      .field("refine_budget_s", &WholeGraphSearchPlan::refine_budget_s)
      .field("predicted_gain", &WholeGraphSearchPlan::predicted_gain)
      .field("predicted_refine_s", &WholeGraphSearchPlan::predicted_refine_s)
      .field("reason", &WholeGraphSearchPlan::reason)
      .field("notes", &WholeGraphSearchPlan::notes)
      .field("memory_limited", &WholeGraphSearchPlan::memory_limited);

  pm.def(
      "search_whole_graph_first",
      [](passes::PassManager&, const std::vector<std::string>& backends, const py::object& measurer,
         const WholeGraphSearchOptions& options) {
        // The measurer is a Python object with compile(backend) -> bool, time(backend) ->
        // seconds and elapsed() -> seconds.
        passes::WholeGraphMeasurer m;
        m.compile = [measurer](const std::string& b) {
          return measurer.attr("compile")(b).cast<bool>();
        };
        m.time = [measurer](const std::string& b) {
          return measurer.attr("time")(b).cast<double>();
        };
        m.elapsed = [measurer]() { return measurer.attr("elapsed")().cast<double>(); };
        if (py::hasattr(measurer, "served")) {
          m.served = [measurer](const std::string& b) {
            return measurer.attr("served")(b).cast<bool>();
          };
        }
        if (py::hasattr(measurer, "floor")) {
          m.floor = [measurer](const std::string& b, double target_s) {
            return measurer.attr("floor")(b, target_s).cast<double>();
          };
        }
        if (py::hasattr(measurer, "free_bytes")) {
          m.free_bytes = [measurer]() { return measurer.attr("free_bytes")().cast<double>(); };
        }
        if (py::hasattr(measurer, "saved_s")) {
          m.saved_s = [measurer](const std::string& b) {
            return measurer.attr("saved_s")(b).cast<double>();
          };
        }
        return passes::SearchWholeGraphFirst(backends, m, options);
      },
      py::arg("backends"), py::arg("measurer"), py::arg("options"),
      "The default placement's driver: each compiler's whole graph compiled (reference first, "
      "within the budget) and measured in turns against eager; returns the pick and whether the "
      "finer search may run. measurer: compile(backend) -> bool, time(backend) -> s, "
      "elapsed() -> s, optionally served(backend) -> bool (its last compile came from a cache), "
      "floor(backend, target_s) -> s (a lower bound on its run time, measured on demand), "
      "free_bytes() -> bytes (the memory the process can still take) and saved_s(backend) -> s "
      "(what the user's own compile of it would have taken beyond its last one).");

  using passes::EvolveOptions;
  Struct<EvolveOptions>(m, "EvolveOptions", "Options of the evolutionary offload search.")
      .field("population", &EvolveOptions::population)
      .field("generations", &EvolveOptions::generations)
      .field("mutation_rate", &EvolveOptions::mutation_rate, "< 0: 1 / bits")
      .field("min_improvement", &EvolveOptions::min_improvement)
      .field("seed", &EvolveOptions::seed)
      .field("max_evaluations", &EvolveOptions::max_evaluations, "<= 0: no limit");
  using passes::EvolveResult;
  Struct<EvolveResult>(m, "EvolveResult", "The best offload bits found.",
                       [](const EvolveResult& r) {
                         return "EvolveResult(best_fitness=" + std::to_string(r.best_fitness) +
                                ", seed_fitness=" + std::to_string(r.seed_fitness) + ", " +
                                std::to_string(r.evaluations) + " evaluations, " +
                                std::to_string(r.generations) + " generations" +
                                (r.stopped_by_deadline ? ", stopped by the deadline)" : ")");
                       })
      .field("best", &EvolveResult::best)
      .field("best_fitness", &EvolveResult::best_fitness)
      .field("seed_fitness", &EvolveResult::seed_fitness)
      .field("evaluations", &EvolveResult::evaluations)
      .field("generations", &EvolveResult::generations)
      .field("stopped_by_deadline", &EvolveResult::stopped_by_deadline);

  pm.def(
      "evolve_placement",
      [](passes::PassManager& self, const std::vector<bool>& seed, const passes::FitnessFn& fitness,
         const EvolveOptions& options, const passes::ProgressFn& progress) {
        return passes::EvolvePlacement(seed, fitness, options, self.context(), progress);
      },
      py::arg("seed"), py::arg("fitness"), py::arg("options"), py::kw_only(),
      py::arg("progress") = nullptr,
      "Evolutionary search over offload bits; fitness(bits) -> seconds (lower is better); stops "
      "at the manager's time budget.");

  using passes::PlacementRoundOptions;
  Struct<PlacementRoundOptions>(m, "PlacementRoundOptions",
                                "Options of the finer search's rounds "
                                "(csrc/passes/placement_rounds.h).")
      .field("only", &PlacementRoundOptions::only, "one compiler's round only; empty: all")
      .field("keep_eager_margin", &PlacementRoundOptions::keep_eager_margin)
      .field("hopeless_ratio", &PlacementRoundOptions::hopeless_ratio);
  using passes::FinalistPick;
  Struct<FinalistPick>(
      m, "FinalistPick", "The finalist kept and each finalist's median.",
      [](const FinalistPick& p) { return "FinalistPick(index=" + std::to_string(p.index) + ")"; })
      .field("index", &FinalistPick::index)
      .field("medians_s", &FinalistPick::medians_s, "-1 where not measured");
  m.def(
      "placement_round_order",
      [](const std::vector<std::pair<std::string, double>>& compilers,
         const PlacementRoundOptions& options) {
        std::vector<passes::RoundCompiler> in;
        for (const auto& [name, s] : compilers) in.push_back({name, s});
        return passes::PlacementRoundOrder(in, options);
      },
      py::arg("compilers"), py::arg("options"),
      "The graph compilers that get an evolutionary round, in order, from (name, expected "
      "compile seconds) pairs: cheapest first.");
  m.def("round_budget", &passes::RoundBudget, py::arg("remaining_s"), py::arg("rounds_left"),
        "A round's budget: an equal share of what is left.");
  m.def("offloaded_runs", &passes::OffloadedRuns, py::arg("bits"),
        "Runs [begin, end) of set bits: each becomes one region of the round's compiler.");
  m.def("pick_finalist", &passes::PickFinalist, py::arg("turns_s"),
        "The fastest finalist by median over its turns; empty turns are not measured.");
  m.def("keeps_eager", &passes::KeepsEager, py::arg("placed_s"), py::arg("eager_s"),
        py::arg("options"), "Whether eager is kept over the placed graph (measured side by side).");
  m.def("builds_dp_placement", &passes::BuildsDpPlacement, py::arg("dp_cost_s"), py::arg("beat_s"),
        py::arg("options"),
        "Whether the finer search builds the DP's placement for a graph that already runs in "
        "beat_s (<= 0: nothing to beat): not when the DP predicts over hopeless_ratio times it.");
}

}  // namespace tp::bindings
