// Bindings of the schedule auto-tuner: the search decides which point to evaluate next; Python
// applies the schedule at that point and runs the user's evaluation.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/typed.h"
#include "passes/pass_manager.h"
#include "passes/schedule_tune.h"

namespace py = pybind11;

namespace tp::bindings {
namespace {

std::string MethodName(const passes::TuneOptions& o) {
  return o.method == passes::TuneOptions::Method::kExhaustive ? "exhaustive"
                                                              : "coordinate_descent";
}

void SetMethod(passes::TuneOptions& o, const std::string& method) {
  if (method == "exhaustive") {
    o.method = passes::TuneOptions::Method::kExhaustive;
  } else if (method == "coordinate_descent") {
    o.method = passes::TuneOptions::Method::kCoordinateDescent;
  } else {
    throw std::invalid_argument("unknown tuning method '" + method +
                                "'; methods: exhaustive, coordinate_descent");
  }
}

}  // namespace

void BindSchedule(py::module_& m, py::class_<passes::PassManager>& pm) {
  using passes::TuneOptions;
  Struct<TuneOptions>(m, "TuneOptions", "Options of schedule_tune.")
      .property("method", &MethodName, &SetMethod, "'exhaustive' or 'coordinate_descent'")
      .field("max_evaluations", &TuneOptions::max_evaluations, "<= 0: no limit")
      .field("seed", &TuneOptions::seed)
      .field("restarts", &TuneOptions::restarts);

  Struct<passes::TuneTrial>(m, "TuneTrial", "One evaluated point; score None when invalid.")
      .field("point", &passes::TuneTrial::point)
      .field("score", &passes::TuneTrial::score);

  using passes::TuneResult;
  Struct<TuneResult>(m, "TuneResult", "The best point, its score and every trial.",
                     [](const TuneResult& r) {
                       std::string best;
                       for (int i : r.best) best += (best.empty() ? "" : ", ") + std::to_string(i);
                       return "TuneResult(best=[" + best +
                              "], best_score=" + std::to_string(r.best_score) + ", " +
                              std::to_string(r.trials.size()) + " of " +
                              std::to_string(r.space_size) + " points tried" +
                              (r.stopped_by_budget ? ", stopped by the budget)" : ")");
                     })
      .field("best", &TuneResult::best)
      .field("best_score", &TuneResult::best_score)
      .field("trials", &TuneResult::trials)
      .field("space_size", &TuneResult::space_size)
      .field("stopped_by_budget", &TuneResult::stopped_by_budget);

  pm.def(
      "tune_schedule",
      [](passes::PassManager& self, const std::vector<int>& sizes,
         const passes::TuneEvalFn& evaluate, const TuneOptions& options,
         const passes::TuneProgressFn& progress) {
        return passes::TuneSchedule(sizes, evaluate, options, self.context(), progress);
      },
      py::arg("sizes"), py::arg("evaluate"), py::arg("options"), py::kw_only(),
      py::arg("progress") = nullptr,
      "Search over candidate indices; evaluate(point) -> score (higher is better) or None.");
}

}  // namespace tp::bindings
