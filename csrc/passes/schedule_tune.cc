#include "passes/schedule_tune.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace tp::passes {
namespace {

class Search {
 public:
  Search(const std::vector<int>& sizes, const TuneEvalFn& evaluate, const TuneOptions& options,
         Context& ctx, const TuneProgressFn& progress)
      : sizes_(sizes), evaluate_(evaluate), options_(options), ctx_(ctx), progress_(progress) {}

  bool OutOfBudget() const {
    if (options_.max_evaluations > 0 &&
        static_cast<int>(result_.trials.size()) >= options_.max_evaluations) {
      return true;
    }
    return std::chrono::steady_clock::now() >= ctx_.deadline;
  }

  // The score of a point, evaluating it once; empty when invalid, failed, or out of budget.
  std::optional<double> Score(const std::vector<int>& point) {
    auto it = seen_.find(point);
    if (it != seen_.end()) return it->second;
    if (OutOfBudget()) {
      result_.stopped_by_budget = true;
      return std::nullopt;
    }
    std::optional<double> score = evaluate_(point);
    seen_.emplace(point, score);
    result_.trials.push_back({point, score});
    if (score && (result_.best.empty() || *score > result_.best_score)) {
      result_.best = point;
      result_.best_score = *score;
    }
    if (progress_) {
      std::optional<double> best;
      if (!result_.best.empty()) best = result_.best_score;
      progress_(static_cast<int>(result_.trials.size()), point, score, best);
    }
    return score;
  }

  void Exhaustive() {
    std::vector<int> point(sizes_.size(), 0);
    while (true) {
      Score(point);
      if (result_.stopped_by_budget) return;
      // Odometer increment, last variable fastest.
      int k = static_cast<int>(point.size()) - 1;
      while (k >= 0 && ++point[k] == sizes_[k]) point[k--] = 0;
      if (k < 0) return;
    }
  }

  void CoordinateDescent() {
    std::mt19937_64 rng(options_.seed);
    const int space = result_.space_size;
    for (int restart = 0; restart < std::max(1, options_.restarts); ++restart) {
      // A random valid start: random points, then the rest in order, until one is valid.
      std::vector<int> current;
      std::optional<double> current_score;
      const int random_tries = std::min(space, 8);
      for (int t = 0; t < random_tries + space && !current_score; ++t) {
        std::vector<int> p(sizes_.size());
        if (t < random_tries) {
          for (size_t k = 0; k < p.size(); ++k) {
            p[k] = std::uniform_int_distribution<int>(0, sizes_[k] - 1)(rng);
          }
        } else {
          int rest = t - random_tries;
          for (int k = static_cast<int>(p.size()) - 1; k >= 0; --k) {
            p[k] = rest % sizes_[k];
            rest /= sizes_[k];
          }
        }
        current_score = Score(p);
        if (current_score) current = p;
        if (result_.stopped_by_budget) return;
      }
      if (!current_score) return;  // nothing valid anywhere
      std::vector<int> order(sizes_.size());
      std::iota(order.begin(), order.end(), 0);
      bool improved = true;
      while (improved) {
        improved = false;
        std::shuffle(order.begin(), order.end(), rng);
        for (int k : order) {
          std::vector<int> best_point = current;
          double best = *current_score;
          for (int v = 0; v < sizes_[k]; ++v) {
            if (v == current[k]) continue;
            std::vector<int> p = current;
            p[k] = v;
            std::optional<double> s = Score(p);
            if (result_.stopped_by_budget) return;
            if (s && *s > best) {
              best = *s;
              best_point = p;
            }
          }
          if (best_point != current) {
            current = best_point;
            current_score = best;
            improved = true;
          }
        }
      }
      ctx_.Log("schedule_tune: coordinate descent restart " + std::to_string(restart) +
               " converged after " + std::to_string(result_.trials.size()) + " evaluations");
    }
  }

  TuneResult Run() {
    long long space = 1;
    for (int s : sizes_) {
      if (s < 1) throw std::invalid_argument("schedule_tune: every variable needs a candidate");
      space = std::min<long long>(space * s, 1LL << 30);
    }
    result_.space_size = static_cast<int>(space);
    if (sizes_.empty()) throw std::invalid_argument("schedule_tune: no variables to tune");
    if (options_.method == TuneOptions::Method::kExhaustive) {
      Exhaustive();
    } else {
      CoordinateDescent();
    }
    return std::move(result_);
  }

 private:
  const std::vector<int>& sizes_;
  const TuneEvalFn& evaluate_;
  const TuneOptions& options_;
  Context& ctx_;
  const TuneProgressFn& progress_;
  std::map<std::vector<int>, std::optional<double>> seen_;
  TuneResult result_;
};

}  // namespace

TuneResult TuneSchedule(const std::vector<int>& sizes, const TuneEvalFn& evaluate,
                        const TuneOptions& options, Context& ctx, const TuneProgressFn& progress) {
  return Search(sizes, evaluate, options, ctx, progress).Run();
}

}  // namespace tp::passes
