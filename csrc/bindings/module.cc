// pybind11 module torch_plugin._C: the IR, the pass manager and the solver, seen from Python.
//
// The boundary carries records, never tensors: a graph crosses as (inputs, nodes, output)
// made of Python primitives and tagged tuples (see torch_plugin/fx_bridge.py for the format).
// Every malformed record becomes torch_plugin.GraphError naming the node; C++ exceptions never
// escape as crashes. This file needs pybind11 only, not LibTorch. (The one binding that takes
// tensors, the per-call weight check of frozen graphs, is frozen_weights.cc.)
#include <pybind11/eval.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sstream>

#include "ir/graph.h"
#include "ir/op_registry.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "bindings/typed.h"
#include "passes/pass_manager.h"
#include "passes/pipeline_partition.h"
#include "passes/sharding_ilp.h"
#include "solver/cbc.h"

namespace py = pybind11;

namespace tp::bindings {
namespace {

using ir::Arg;

// ---- Python records -> IR ----

Arg ArgFromPy(const py::handle& obj) {
  if (obj.is_none()) return Arg::None();
  if (py::isinstance<py::bool_>(obj)) return Arg::Bool(obj.cast<bool>());
  if (py::isinstance<py::int_>(obj)) return Arg::Int(obj.cast<int64_t>());
  if (py::isinstance<py::float_>(obj)) return Arg::Double(obj.cast<double>());
  if (py::isinstance<py::str>(obj)) return Arg::String(obj.cast<std::string>());
  if (!py::isinstance<py::tuple>(obj) || py::len(obj) != 2) {
    throw std::invalid_argument(
        "argument record must be a primitive or a (tag, payload) pair, got " +
        std::string(py::str(py::repr(obj))));
  }
  auto rec = obj.cast<py::tuple>();
  const std::string tag = rec[0].cast<std::string>();
  if (tag == "v") return Arg::Value(rec[1].cast<ir::ValueId>());
  if (tag == "list" || tag == "tuple") {
    std::vector<Arg> items;
    for (const auto& item : rec[1]) items.push_back(ArgFromPy(item));
    return Arg::List(std::move(items), tag == "tuple");
  }
  if (tag == "dtype") return Arg::Tagged(Arg::Kind::kDtype, rec[1].cast<std::string>());
  if (tag == "device") return Arg::Tagged(Arg::Kind::kDevice, rec[1].cast<std::string>());
  if (tag == "layout") return Arg::Tagged(Arg::Kind::kLayout, rec[1].cast<std::string>());
  if (tag == "memory_format") {
    return Arg::Tagged(Arg::Kind::kMemoryFormat, rec[1].cast<std::string>());
  }
  if (tag == "opaque") return Arg::Opaque(rec[1].cast<int64_t>());
  throw std::invalid_argument("unknown argument tag '" + tag + "'");
}

ir::SymDim DimFromPy(const py::handle& obj) {
  if (py::isinstance<py::int_>(obj)) return ir::SymDim::Concrete(obj.cast<int64_t>());
  auto rec = obj.cast<py::tuple>();  // (expr, hint or None)
  const int64_t hint = rec[1].is_none() ? -1 : rec[1].cast<int64_t>();
  return ir::SymDim::Symbolic(rec[0].cast<std::string>(), hint);
}

ir::ValueType TypeFromPy(const py::handle& obj) {
  auto rec = obj.cast<py::tuple>();
  const std::string kind = rec[0].cast<std::string>();
  if (kind == "tensor") {
    ir::TensorType t;
    for (const auto& d : rec[1]) t.shape.push_back(DimFromPy(d));
    for (const auto& d : rec[2]) t.stride.push_back(DimFromPy(d));
    const std::string dtype = rec[3].cast<std::string>();
    t.dtype = ir::DTypeFromName(dtype);
    if (t.dtype == ir::DType::kUnknown) {
      throw std::invalid_argument("unknown dtype '" + dtype + "'");
    }
    t.device = rec[4].cast<std::string>();
    t.requires_grad = rec[5].cast<bool>();
    return ir::ValueType::Tensor(std::move(t));
  }
  if (kind == "symint")
    return ir::ValueType::Scalar(ir::ValueKind::kSymInt, rec[1].cast<std::string>());
  if (kind == "symfloat") {
    return ir::ValueType::Scalar(ir::ValueKind::kSymFloat, rec[1].cast<std::string>());
  }
  if (kind == "symbool") {
    return ir::ValueType::Scalar(ir::ValueKind::kSymBool, rec[1].cast<std::string>());
  }
  if (kind == "none") return ir::ValueType::None();
  if (kind == "opaque") return ir::ValueType::Opaque(rec[1].cast<std::string>());
  throw std::invalid_argument("unknown type kind '" + kind + "'");
}

// Runs fn, turning any conversion failure into a GraphError that names `owner`.
template <class Fn>
auto NamingErrors(const std::string& owner, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const ir::GraphError& e) {
    if (!e.node().empty()) throw;
    throw ir::GraphError(owner, e.what());
  } catch (const py::error_already_set& e) {
    throw ir::GraphError(owner, std::string("malformed record: ") + e.what());
  } catch (const std::exception& e) {
    throw ir::GraphError(owner, std::string("malformed record: ") + e.what());
  }
}

ir::Graph GraphFromRecords(const py::list& inputs, const py::list& nodes, const py::handle& output,
                           bool verify) {
  ir::GraphBuilder b;
  size_t index = 0;
  for (const auto& item : inputs) {
    std::string owner = "input #" + std::to_string(index++);
    NamingErrors(owner, [&] {
      auto rec = item.cast<py::tuple>();
      if (rec.size() != 4) throw std::invalid_argument("input record needs 4 fields");
      if (py::isinstance<py::str>(rec[0])) owner = rec[0].cast<std::string>();
      b.AddInput(rec[0].cast<std::string>(), TypeFromPy(rec[1]),
                 ir::InputKindFromName(rec[2].cast<std::string>()), rec[3].cast<std::string>());
      return 0;
    });
  }
  index = 0;
  for (const auto& item : nodes) {
    std::string owner = "#" + std::to_string(index++);
    NamingErrors(owner, [&] {
      auto rec = item.cast<py::tuple>();
      if (rec.size() != 8) throw std::invalid_argument("node record needs 8 fields");
      ir::NodeSpec spec;
      spec.name = rec[0].cast<std::string>();
      owner = spec.name;
      return NamingErrors(owner, [&] {
        spec.op = rec[1].cast<std::string>();
        for (const auto& a : rec[2]) spec.args.push_back(ArgFromPy(a));
        for (const auto& kw : rec[3]) {
          auto pair = kw.cast<py::tuple>();
          spec.kwargs.push_back({pair[0].cast<std::string>(), ArgFromPy(pair[1])});
        }
        for (const auto& t : rec[4]) spec.output_types.push_back(TypeFromPy(t));
        for (const auto& n : rec[5]) spec.output_names.push_back(n.cast<std::string>());
        spec.tuple_output = rec[6].cast<bool>();
        spec.scope = rec[7].cast<std::string>();
        b.AddNode(std::move(spec));
        return 0;
      });
    });
  }
  NamingErrors("output", [&] {
    b.SetOutput(ArgFromPy(output));
    return 0;
  });
  return verify ? b.Build() : b.BuildUnverified();
}

// ---- IR -> Python records ----

py::object ArgToPy(const Arg& a) {
  using K = Arg::Kind;
  switch (a.kind) {
    case K::kNone:
      return py::none();
    case K::kBool:
      return py::bool_(a.b);
    case K::kInt:
      return py::int_(a.i);
    case K::kDouble:
      return py::float_(a.d);
    case K::kString:
      return py::str(a.s);
    case K::kValue:
      return py::make_tuple("v", a.i);
    case K::kList:
    case K::kTuple: {
      py::list items;
      for (const auto& item : a.items) items.append(ArgToPy(item));
      return py::make_tuple(a.kind == K::kList ? "list" : "tuple", items);
    }
    case K::kDtype:
      return py::make_tuple("dtype", a.s);
    case K::kDevice:
      return py::make_tuple("device", a.s);
    case K::kLayout:
      return py::make_tuple("layout", a.s);
    case K::kMemoryFormat:
      return py::make_tuple("memory_format", a.s);
    case K::kOpaque:
      return py::make_tuple("opaque", a.i);
  }
  return py::none();
}

py::object DimToPy(const ir::SymDim& d) {
  if (!d.is_symbolic()) return py::int_(d.value);
  auto hint = d.hint();
  return py::make_tuple(d.expr, hint ? py::object(py::int_(*hint)) : py::object(py::none()));
}

py::tuple TypeToPy(const ir::ValueType& t) {
  switch (t.kind) {
    case ir::ValueKind::kTensor: {
      py::list shape, stride;
      for (const auto& d : t.tensor.shape) shape.append(DimToPy(d));
      for (const auto& d : t.tensor.stride) stride.append(DimToPy(d));
      return py::make_tuple("tensor", shape, stride, ir::DTypeName(t.tensor.dtype), t.tensor.device,
                            t.tensor.requires_grad);
    }
    case ir::ValueKind::kNone:
      return py::make_tuple("none");
    case ir::ValueKind::kOpaque:
      return py::make_tuple("opaque", t.note);
    default:
      return py::make_tuple(ir::ValueKindName(t.kind), t.expr);
  }
}

py::tuple GraphToRecords(const ir::Graph& g) {
  py::list inputs;
  for (const auto& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    inputs.append(py::make_tuple(v.name, TypeToPy(v.type), ir::InputKindName(in.kind), in.source));
  }
  py::list nodes;
  for (const auto& n : g.nodes()) {
    py::list args, kwargs, types, names;
    for (const auto& a : n.args) args.append(ArgToPy(a));
    for (const auto& kw : n.kwargs) kwargs.append(py::make_tuple(kw.name, ArgToPy(kw.value)));
    for (ir::ValueId out : n.outputs) {
      types.append(TypeToPy(g.type(out)));
      names.append(g.value(out).name);
    }
    py::list outs;
    for (ir::ValueId out : n.outputs) outs.append(out);
    nodes.append(
        py::make_tuple(n.name, n.op, args, kwargs, types, names, n.tuple_output, n.scope, outs));
  }
  return py::make_tuple(inputs, nodes, ArgToPy(g.output()));
}

void TranslateExceptions(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const ir::GraphError& e) {
    py::object type = py::module_::import("torch_plugin._C").attr("GraphError");
    py::object exc = type(e.what());
    exc.attr("node") = e.node();
    PyErr_SetObject(type.ptr(), exc.ptr());
  } catch (const passes::PassError& e) {
    py::object type = py::module_::import("torch_plugin._C").attr("PassError");
    py::object exc = type(e.what());
    exc.attr("pass_name") = e.pass_name();
    exc.attr("node") = e.node();
    exc.attr("hint") = e.hint();
    exc.attr("passes_before") = e.passes_before();
    PyErr_SetObject(type.ptr(), exc.ptr());
  } catch (const pipeline::PartitionError& e) {
    py::object type = py::module_::import("torch_plugin._C").attr("PlanError");
    py::object exc = type(e.what());
    exc.attr("min_memory_bytes") = e.min_memory_bytes();
    PyErr_SetObject(type.ptr(), exc.ptr());
  } catch (const passes::ShardingError& e) {
    py::object type = py::module_::import("torch_plugin._C").attr("PlanError");
    py::object exc = type(e.what());
    exc.attr("min_memory_bytes") = e.min_bytes();
    PyErr_SetObject(type.ptr(), exc.ptr());
  }
}

}  // namespace
}  // namespace tp::bindings

namespace tp::bindings {
// Each binds its pass's typed options and plans and adds its methods to the PassManager.
using PassManagerClass = py::class_<passes::PassManager>;
void BindPipeline(py::module_& m, PassManagerClass& pm);       // pipeline.cc
void BindCacheParallel(py::module_& m, PassManagerClass& pm);  // cache_parallel.cc
void BindSharding(py::module_& m, PassManagerClass& pm);       // sharding.cc
void BindPlacement(py::module_& m, PassManagerClass& pm);      // placement.cc
void BindSchedule(py::module_& m, PassManagerClass& pm);       // schedule.cc
void BindLayout(py::module_& m);                               // layout.cc
void BindFrozenWeights(py::module_& m);                        // frozen_weights.cc
void BindMkldnnBlob(py::module_& m);                           // mkldnn_blob.cc
}  // namespace tp::bindings

PYBIND11_MODULE(_C, m) {
  using namespace tp;
  using namespace tp::bindings;
  m.doc() = "torch_plugin C++ core: IR, passes, solver.";

  // Exception types; attributes (node, pass_name, ...) are filled by the translator.
  py::exec(R"(
class GraphError(ValueError):
    """A malformed graph; `.node` names the offending node."""
    node = ""

class PlanError(RuntimeError):
    """No parallel plan fits; `.min_memory_bytes` is what the leanest plan found needs."""
    min_memory_bytes = -1.0

class PassError(RuntimeError):
    """A pass failed; `.pass_name` and `.node` say where, `.hint` what to do."""
    pass_name = ""
    node = ""
    hint = ""
    passes_before = []
)",
           m.attr("__dict__"));
  py::register_exception_translator(&TranslateExceptions);

  // Registered first, so signatures of the passes' methods name it.
  py::class_<ir::Graph> graph_cls(m, "Graph", "An ATen-level graph (csrc/ir/graph.h).");
  py::class_<passes::PassManager> pm(
      m, "PassManager",
      "Runs graph rewrites by name and every planning pass through typed options and plans "
      "(csrc/passes/pass_manager.h). log(line) receives what the passes say; time_budget_s "
      "bounds the searches (0: none).");
  pm.def(py::init([](std::function<void(const std::string&)> log, bool verify_each,
                     double time_budget_s) {
           passes::Context ctx;
           if (log) ctx.log = std::move(log);
           ctx.verify_each = verify_each;
           ctx.SetTimeBudget(time_budget_s);
           return passes::PassManager(std::move(ctx));
         }),
         py::kw_only(), py::arg("log") = nullptr, py::arg("verify_each") = true,
         py::arg("time_budget_s") = 0.0);

  Struct<passes::PassInfo>(m, "PassInfo", "A registered pass: what it takes and returns.",
                           [](const passes::PassInfo& p) {
                             return "PassInfo(" + p.name + ": " +
                                    (p.options.empty() ? "-" : p.options) + " -> " + p.result +
                                    (p.rewrite ? ", rewrite" : "") + ")";
                           })
      .field("name", &passes::PassInfo::name)
      .field("summary", &passes::PassInfo::summary)
      .field("options", &passes::PassInfo::options)
      .field("result", &passes::PassInfo::result)
      .field("rewrite", &passes::PassInfo::rewrite);
  m.def("registered_passes", [] { return passes::RegisteredPasses(); },
        "Every pass: name, summary, options type, result type, whether PassManager.run takes it.");

  Struct<passes::PassRecord>(m, "PassRecord", "One rewrite's run.")
      .field("name", &passes::PassRecord::name)
      .field("ms", &passes::PassRecord::milliseconds)
      .field("nodes_before", &passes::PassRecord::nodes_before)
      .field("nodes_after", &passes::PassRecord::nodes_after)
      .field("changed", &passes::PassRecord::changed)
      .field("notes", &passes::PassRecord::notes);
  Struct<passes::PassReport>(m, "PassReport", "What PassManager.run did.",
                             [](const passes::PassReport& r) { return r.ToString(); })
      .field("passes", &passes::PassReport::passes)
      .field("verify_ms", &passes::PassReport::verify_milliseconds);

  BindPipeline(m, pm);
  BindCacheParallel(m, pm);
  BindSharding(m, pm);
  BindPlacement(m, pm);
  BindSchedule(m, pm);
  BindLayout(m);
  BindFrozenWeights(m);
  BindMkldnnBlob(m);

  Struct<passes::RewriteOptions>(m, "RewriteOptions",
                                 "Typed options of the graph rewrites, one field per rewrite.")
      .field("cache_parallel", &passes::RewriteOptions::cache_parallel);
  pm.def(
      "run",
      [](passes::PassManager& self, const ir::Graph& g, const std::vector<std::string>& names,
         const passes::RewriteOptions& options) {
        passes::PassReport report;
        ir::Graph out = self.Run(g, names, options, &report);
        return py::make_tuple(std::move(out), report);
      },
      py::arg("graph"), py::arg("passes"), py::arg("options") = passes::RewriteOptions{},
      "Runs the named rewrites (empty list: verify only); returns (graph, PassReport).");

  graph_cls
      .def_static("from_records", &GraphFromRecords, py::arg("inputs"), py::arg("nodes"),
                  py::arg("output"), py::arg("verify") = true,
                  "Builds a graph from records; raises GraphError naming the bad node.")
      .def_static("parse", &ir::ParseGraph, py::arg("text"),
                  "Reads the text form str(graph) writes (csrc/ir/text.h); raises GraphError "
                  "naming the line.")
      .def("records", &GraphToRecords,
           "(inputs, nodes, output) records; node records carry their output value ids last.")
      .def("verify", [](const ir::Graph& g) { ir::Verify(g); })
      .def_property_readonly("num_nodes", [](const ir::Graph& g) { return g.nodes().size(); })
      .def_property_readonly("num_inputs", [](const ir::Graph& g) { return g.inputs().size(); })
      .def("estimate",
           [](const ir::Graph& g) {
             // Per node: (name, op, op class or "", flops, bytes, known).
             const auto& reg = ir::OpRegistry::Default();
             py::list out;
             for (const auto& n : g.nodes()) {
               const ir::OpInfo* info = reg.Find(n.op);
               ir::OpCost c = reg.Estimate(g, n);
               out.append(py::make_tuple(n.name, n.op, info ? ir::OpClassName(info->cls) : "",
                                         c.flops, c.bytes, c.known));
             }
             return out;
           })
      .def("__str__", [](const ir::Graph& g) { return ir::PrintGraph(g); });


  m.def(
      "solve_ilp",
      [](const std::vector<std::tuple<double, double, double, bool>>& variables,
         const std::vector<std::tuple<std::vector<std::pair<int, double>>, std::string, double>>&
             constraints,
         bool maximize, double time_limit_s) {
        // A thin door to the CBC wrapper, for tests and for Python-side experiments.
        solver::IlpModel model;
        model.SetMaximize(maximize);
        for (const auto& [lb, ub, obj, integer] : variables)
          model.AddVariable(lb, ub, obj, integer);
        for (const auto& [terms, sense, rhs] : constraints) {
          solver::Sense s =
              sense == "<="   ? solver::Sense::kLessEqual
              : sense == ">=" ? solver::Sense::kGreaterEqual
              : sense == "=="
                  ? solver::Sense::kEqual
                  : throw std::invalid_argument(
                        "constraint sense must be '<=', '>=' or '==', got '" + sense + "'");
          model.AddConstraint(terms, s, rhs);
        }
        solver::SolveOptions opts;
        opts.time_limit_s = time_limit_s;
        solver::IlpSolution sol;
        {
          py::gil_scoped_release release;  // CBC may run for seconds
          sol = model.Solve(opts);
        }
        return py::make_tuple(solver::IlpStatusName(sol.status), sol.objective, sol.values);
      },
      py::arg("variables"), py::arg("constraints"), py::arg("maximize") = false,
      py::arg("time_limit_s") = 60.0);
}
