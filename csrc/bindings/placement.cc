// Bindings of backend placement: the pattern language, candidate generation, the op-level DP
// and the evolutionary search. Measuring and compiling stay in Python (they need the backends);
// everything that decides is here. No LibTorch.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "passes/placement_dp.h"
#include "passes/placement_evolve.h"
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

}  // namespace

void BindPlacement(py::module_& m) {
  auto pm = m.def_submodule("pattern", "The placement pattern language (csrc/pattern).");
  py::class_<pattern::PatternNode, std::shared_ptr<pattern::PatternNode>>(pm, "Pattern")
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
  pm.def("wildcard", [unconst] { return unconst(pattern::Wildcard()); });
  pm.def(
      "is_op",
      [unconst](const std::vector<std::string>& ops,
                const std::vector<std::shared_ptr<pattern::PatternNode>>& inputs) {
        return unconst(pattern::IsOp(ops, {inputs.begin(), inputs.end()}));
      },
      py::arg("ops"), py::arg("inputs") = std::vector<std::shared_ptr<pattern::PatternNode>>{});
  pm.def(
      "is_op_class",
      [unconst](const std::vector<std::string>& classes,
                const std::vector<std::shared_ptr<pattern::PatternNode>>& inputs) {
        std::vector<ir::OpClass> cls;
        for (const auto& c : classes) cls.push_back(OpClassFromName(c));
        return unconst(pattern::IsOpClass(cls, {inputs.begin(), inputs.end()}));
      },
      py::arg("classes"), py::arg("inputs") = std::vector<std::shared_ptr<pattern::PatternNode>>{});
  pm.def("alt", [unconst](const std::vector<std::shared_ptr<pattern::PatternNode>>& alts) {
    return unconst(pattern::Alt({alts.begin(), alts.end()}));
  });
  pm.def("known_rule_sets", &pattern::KnownRuleSets);
  pm.def(
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

  m.def(
      "place_op_level",
      [](const ir::Graph& g,
         const std::vector<std::tuple<int, std::vector<int>, double, std::string>>& options,
         double switch_penalty, int64_t max_states, std::function<void(const std::string&)> log) {
        passes::PlacementProblem p;
        p.num_nodes = static_cast<int>(g.nodes().size());
        p.preds = passes::NodePredecessors(g);
        for (const auto& n : g.nodes()) p.node_names.push_back(n.name);
        for (const auto& [id, nodes, cost, backend] : options) {
          p.options.push_back({id, nodes, cost, backend});
        }
        p.switch_penalty = switch_penalty;
        passes::Context ctx;
        if (log) ctx.log = log;
        passes::OpLevelPlacement r;
        {
          py::gil_scoped_release release;
          r = passes::PlaceOpLevel(p, {max_states}, ctx);
        }
        std::vector<int> chosen;
        for (int o : r.chosen) chosen.push_back(p.options[static_cast<size_t>(o)].candidate);
        return py::dict(py::arg("chosen") = chosen, py::arg("cost") = r.cost,
                        py::arg("states") = r.states, py::arg("exact") = r.exact);
      },
      py::arg("graph"), py::arg("options"), py::arg("switch_penalty") = 0.0,
      py::arg("max_states") = 20000, py::arg("log") = nullptr,
      "Op-level DP. options: (candidate id, node ids, seconds, backend). Returns the chosen "
      "candidate ids in execution order, the modelled cost, states expanded, exactness.");

  m.def(
      "search_whole_graph_first",
      [](const std::vector<std::string>& backends, std::function<bool(const std::string&)> compile,
         std::function<double(const std::string&)> time, std::function<double()> elapsed,
         const py::dict& options) {
        passes::WholeGraphSearchOptions o;
        for (auto item : options) {
          auto key = item.first.cast<std::string>();
          auto v = item.second;
          if (key == "turns")
            o.turns = v.cast<int>();
          else if (key == "budget_s")
            o.budget_s = v.cast<double>();
          else if (key == "budget_factor")
            o.budget_factor = v.cast<double>();
          else if (key == "reference")
            o.reference = v.cast<std::string>();
          else if (key == "fallback_budget_s")
            o.fallback_budget_s = v.cast<double>();
          else if (key == "keep_eager_margin")
            o.keep_eager_margin = v.cast<double>();
          else if (key == "mixing_prior")
            o.mixing_prior = v.cast<double>();
          else if (key == "min_gain")
            o.min_gain = v.cast<double>();
          else if (key == "refine_candidates")
            o.refine_candidates = v.cast<int>();
          else if (key == "seconds_per_candidate")
            o.seconds_per_candidate = v.cast<double>();
          else if (key == "allow_refine")
            o.allow_refine = v.cast<bool>();
          else
            throw py::value_error("search_whole_graph_first: unknown option '" + key + "'");
        }
        auto plan = passes::SearchWholeGraphFirst(backends, {compile, time, elapsed}, o);
        py::list trials;
        for (const auto& t : plan.trials) {
          trials.append(py::dict(py::arg("backend") = t.backend, py::arg("compiled") = t.compiled,
                                 py::arg("compile_s") = t.compile_s,
                                 py::arg("median_s") = t.median_s, py::arg("skipped") = t.skipped));
        }
        return py::dict(py::arg("trials") = trials, py::arg("pick") = plan.pick,
                        py::arg("pick_s") = plan.pick_s, py::arg("eager_s") = plan.eager_s,
                        py::arg("budget_s") = plan.budget_s, py::arg("refine") = plan.refine,
                        py::arg("refine_budget_s") = plan.refine_budget_s,
                        py::arg("predicted_gain") = plan.predicted_gain,
                        py::arg("predicted_refine_s") = plan.predicted_refine_s,
                        py::arg("reason") = plan.reason);
      },
      py::arg("backends"), py::arg("compile"), py::arg("time"), py::arg("elapsed"),
      py::arg("options") = py::dict(),
      "The default placement's driver: each compiler's whole graph compiled (reference first, "
      "within the budget) and measured in turns against eager; returns the pick and whether the "
      "finer search may run (csrc/passes/placement_search.h).");

  m.def(
      "evolve_placement",
      [](const std::vector<bool>& seed, const passes::FitnessFn& fitness, int population,
         int generations, double min_improvement, uint64_t rng_seed, int max_evaluations,
         double time_budget_s, const passes::ProgressFn& progress,
         std::function<void(const std::string&)> log) {
        passes::Context ctx;
        if (log) ctx.log = log;
        ctx.SetTimeBudget(time_budget_s);
        passes::EvolveOptions opts;
        opts.population = population;
        opts.generations = generations;
        opts.min_improvement = min_improvement;
        opts.seed = rng_seed;
        opts.max_evaluations = max_evaluations;
        auto r = passes::EvolvePlacement(seed, fitness, opts, ctx, progress);
        return py::dict(py::arg("best") = r.best, py::arg("best_fitness") = r.best_fitness,
                        py::arg("seed_fitness") = r.seed_fitness,
                        py::arg("evaluations") = r.evaluations,
                        py::arg("generations") = r.generations,
                        py::arg("stopped_by_deadline") = r.stopped_by_deadline);
      },
      py::arg("seed"), py::arg("fitness"), py::arg("population") = 12, py::arg("generations") = 10,
      py::arg("min_improvement") = 0.02, py::arg("rng_seed") = 0, py::arg("max_evaluations") = 0,
      py::arg("time_budget_s") = 0.0, py::arg("progress") = nullptr, py::arg("log") = nullptr,
      "Evolutionary search over offload bits; fitness(bits) -> seconds (lower is better).");
}

}  // namespace tp::bindings
