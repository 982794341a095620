// Bindings of the schedule auto-tuner: the search decides which point to evaluate next; Python
// applies the schedule at that point and runs the user's evaluation.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "passes/schedule_tune.h"

namespace py = pybind11;

namespace tp::bindings {

void BindSchedule(py::module_& m) {
  m.def(
      "tune_schedule",
      [](const std::vector<int>& sizes, const passes::TuneEvalFn& evaluate,
         const std::string& method, int max_evaluations, uint64_t seed, int restarts,
         double time_budget_s, const passes::TuneProgressFn& progress,
         std::function<void(const std::string&)> log) {
        passes::Context ctx;
        if (log) ctx.log = log;
        ctx.SetTimeBudget(time_budget_s);
        passes::TuneOptions opts;
        if (method == "exhaustive") {
          opts.method = passes::TuneOptions::Method::kExhaustive;
        } else if (method == "coordinate_descent") {
          opts.method = passes::TuneOptions::Method::kCoordinateDescent;
        } else {
          throw std::invalid_argument("unknown tuning method '" + method +
                                      "'; methods: exhaustive, coordinate_descent");
        }
        opts.max_evaluations = max_evaluations;
        opts.seed = seed;
        opts.restarts = restarts;
        auto r = passes::TuneSchedule(sizes, evaluate, opts, ctx, progress);
        py::list trials;
        for (const auto& t : r.trials) {
          trials.append(py::make_tuple(
              t.point, t.score ? py::object(py::float_(*t.score)) : py::object(py::none())));
        }
        return py::dict(py::arg("best") = r.best, py::arg("best_score") = r.best_score,
                        py::arg("trials") = trials, py::arg("space_size") = r.space_size,
                        py::arg("stopped_by_budget") = r.stopped_by_budget);
      },
      py::arg("sizes"), py::arg("evaluate"), py::arg("method") = "exhaustive",
      py::arg("max_evaluations") = 0, py::arg("seed") = 0, py::arg("restarts") = 1,
      py::arg("time_budget_s") = 0.0, py::arg("progress") = nullptr, py::arg("log") = nullptr,
      "Search over candidate indices; evaluate(point) -> score (higher is better) or None.");
}

}  // namespace tp::bindings
