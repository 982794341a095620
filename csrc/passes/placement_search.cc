#include "passes/placement_search.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace tp::passes {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<std::string> WholeGraphOrder(const std::vector<std::string>& backends,
                                         const std::string& reference) {
  std::vector<std::string> out;
  for (const auto& b : backends) {
    if (b == reference) out.push_back(b);
  }
  for (const auto& b : backends) {
    if (b != reference && b != "eager" && b != "aten") out.push_back(b);
  }
  return out;
}

WholeGraphSearchPlan SearchWholeGraphFirst(const std::vector<std::string>& backends,
                                           const WholeGraphMeasurer& measurer,
                                           const WholeGraphSearchOptions& options) {
  if (!measurer.compile || !measurer.time || !measurer.elapsed) {
    throw std::invalid_argument("SearchWholeGraphFirst: compile, time and elapsed are required");
  }
  if (options.turns < 1) throw std::invalid_argument("SearchWholeGraphFirst: turns must be >= 1");
  WholeGraphSearchPlan plan;
  plan.trials.push_back({"eager", true, 0.0, 0.0, ""});
  plan.budget_s = options.budget_s;
  bool failed_compiler = false;
  for (const auto& b : WholeGraphOrder(backends, options.reference)) {
    WholeGraphTrial t{b, false, 0.0, 0.0, ""};
    double spent = measurer.elapsed();
    if (plan.budget_s > 0 && spent >= plan.budget_s) {
      std::ostringstream os;
      os.setf(std::ios::fixed);
      os.precision(1);
      os << "compile budget of " << plan.budget_s << " s spent";
      t.skipped = os.str();
      plan.trials.push_back(t);
      continue;
    }
    double t0 = measurer.elapsed();
    t.compiled = measurer.compile(b);
    t.compile_s = measurer.elapsed() - t0;
    failed_compiler = failed_compiler || !t.compiled;
    if (plan.budget_s <= 0 && b == options.reference && t.compiled) {
      plan.budget_s = options.budget_factor * t.compile_s;
    }
    plan.trials.push_back(t);
  }
  if (plan.budget_s <= 0) plan.budget_s = options.fallback_budget_s;

  // Measured in turns, so drift and other runtimes' idle threads fall on all of them alike.
  std::vector<std::vector<double>> times(plan.trials.size());
  std::vector<bool> racing(plan.trials.size());
  for (size_t i = 0; i < plan.trials.size(); ++i) racing[i] = plan.trials[i].compiled;
  for (int r = 0; r < options.turns; ++r) {
    for (size_t i = 0; i < plan.trials.size(); ++i) {
      if (racing[i]) times[i].push_back(measurer.time(plan.trials[i].backend));
    }
    if (r == 0 && options.drop_ratio > 1.0) {
      double best = 0.0;
      for (size_t i = 0; i < times.size(); ++i) {
        if (racing[i] && times[i][0] > 0 && (best == 0.0 || times[i][0] < best)) best = times[i][0];
      }
      for (size_t i = 0; i < times.size(); ++i) {
        if (racing[i] && best > 0 && times[i][0] > options.drop_ratio * best) racing[i] = false;
      }
    }
  }
  for (size_t i = 0; i < plan.trials.size(); ++i) {
    if (plan.trials[i].compiled) plan.trials[i].median_s = Median(times[i]);
  }
  plan.eager_s = plan.trials[0].median_s;
  plan.pick = "eager";
  plan.pick_s = plan.eager_s;
  for (const auto& t : plan.trials) {
    if (t.compiled && t.backend != "eager" && t.median_s > 0 &&
        t.median_s < plan.eager_s * (1.0 - options.keep_eager_margin) && t.median_s < plan.pick_s) {
      plan.pick = t.backend;
      plan.pick_s = t.median_s;
    }
  }

  // The runner-up among everything that ran (eager included).
  double runner_up = 0.0;
  for (const auto& t : plan.trials) {
    if (!t.compiled || t.backend == plan.pick || t.median_s <= 0) continue;
    if (runner_up == 0.0 || t.median_s < runner_up) runner_up = t.median_s;
  }
  if (failed_compiler) {
    plan.predicted_gain = options.mixing_prior;
  } else if (runner_up > 0 && plan.pick_s > 0) {
    plan.predicted_gain = std::max(0.0, options.mixing_prior - (runner_up / plan.pick_s - 1.0));
  }
  double recompile = 0.0;
  for (const auto& t : plan.trials) recompile += t.compile_s;
  plan.predicted_refine_s = options.refine_candidates * options.seconds_per_candidate + recompile;
  double spent = measurer.elapsed();
  plan.refine_budget_s = std::max(0.0, plan.budget_s - spent);
  std::ostringstream why;
  why.setf(std::ios::fixed);
  why.precision(1);
  if (!options.allow_refine) {
    why << "finer search off";
  } else if (plan.predicted_gain < options.min_gain) {
    why << "finer search skipped: predicted gain " << plan.predicted_gain * 100 << "% < "
        << options.min_gain * 100 << "%";
  } else if (plan.predicted_refine_s > plan.refine_budget_s) {
    why << "finer search skipped: it would take ~" << plan.predicted_refine_s << " s, "
        << plan.refine_budget_s << " s of the " << plan.budget_s << " s budget left";
  } else {
    plan.refine = true;
    why << "finer search: predicted gain " << plan.predicted_gain * 100 << "%, ~"
        << plan.predicted_refine_s << " s of " << plan.refine_budget_s << " s left";
  }
  plan.reason = why.str();
  return plan;
}

}  // namespace tp::passes
