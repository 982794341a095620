#include "passes/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tp::pipeline {
namespace {

int NumMicroBatches(const StageGraph& sg, int s) {
  return sg.mini_batch / sg.stages[s].micro_batch;
}

std::vector<PipeOp> WarmupAlternate(int stage, int m, int warmup, int k) {
  std::vector<PipeOp> ops;
  int f = 0, b = 0;
  warmup = std::clamp(warmup, 1, m);
  for (; f < warmup; ++f) ops.push_back({stage, f, false});
  while (f < m) {
    for (int i = 0; i < k && b < f; ++i) ops.push_back({stage, b++, true});
    for (int i = 0; i < k && f < m; ++i) ops.push_back({stage, f++, false});
  }
  while (b < m) ops.push_back({stage, b++, true});
  return ops;
}

Schedule Greedy(const StageGraph& sg) {
  const int n = static_cast<int>(sg.stages.size());
  const auto preds = sg.Predecessors();
  const auto succs = sg.Successors();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> fw_end(n), bw_end(n);
  std::vector<int> next_fw(n, 0), next_bw(n, 0), cap(n);
  std::vector<double> free_at(n, 0);
  for (int s = 0; s < n; ++s) {
    const int m = NumMicroBatches(sg, s);
    fw_end[s].assign(m, nan);
    bw_end[s].assign(m, nan);
    const Stage& st = sg.stages[s];
    cap[s] =
        std::clamp(static_cast<int>((st.in_flight + st.micro_batch - 1) / st.micro_batch), 1, m);
  }
  Schedule out;
  out.kind = ScheduleKind::kGreedy;
  out.per_stage.resize(n);
  auto ready_fw = [&](int s, int j, double* t) {
    *t = 0;
    for (int p : preds[s]) {
      const auto [a, b] =
          OverlappingMicroBatches(j, sg.stages[s].micro_batch, sg.stages[p].micro_batch);
      for (int i = a; i <= b; ++i) {
        if (std::isnan(fw_end[p][i])) return false;
        *t = std::max(*t, fw_end[p][i]);
      }
    }
    return true;
  };
  auto ready_bw = [&](int s, int j, double* t) {
    if (std::isnan(fw_end[s][j])) return false;
    *t = fw_end[s][j];
    for (int q : succs[s]) {
      const auto [a, b] =
          OverlappingMicroBatches(j, sg.stages[s].micro_batch, sg.stages[q].micro_batch);
      for (int i = a; i <= b; ++i) {
        if (std::isnan(bw_end[q][i])) return false;
        *t = std::max(*t, bw_end[q][i]);
      }
    }
    return true;
  };
  int remaining = 0;
  for (int s = 0; s < n; ++s) remaining += 2 * NumMicroBatches(sg, s);
  while (remaining > 0) {
    int best_stage = -1;
    bool best_bw = false;
    double best_start = std::numeric_limits<double>::infinity();
    for (int s = 0; s < n; ++s) {
      const int m = NumMicroBatches(sg, s);
      double t;
      if (next_bw[s] < next_fw[s] && ready_bw(s, next_bw[s], &t)) {
        const double start = std::max(t, free_at[s]);
        if (start < best_start || (start == best_start && !best_bw))
          best_stage = s, best_bw = true, best_start = start;
      }
      if (next_fw[s] < m && next_fw[s] - next_bw[s] < cap[s] && ready_fw(s, next_fw[s], &t)) {
        const double start = std::max(t, free_at[s]);
        if (start < best_start) best_stage = s, best_bw = false, best_start = start;
      }
    }
    if (best_stage < 0) {
      // The in-flight caps are too tight for this plan's timing: loosen them and go on.
      for (int s = 0; s < n; ++s)
        if (next_fw[s] < NumMicroBatches(sg, s)) ++cap[s];
      continue;
    }
    const Stage& st = sg.stages[best_stage];
    const int j = best_bw ? next_bw[best_stage]++ : next_fw[best_stage]++;
    const double end = best_start + (best_bw ? st.bwd_time : st.fwd_time);
    (best_bw ? bw_end : fw_end)[best_stage][j] = end;
    free_at[best_stage] = end;
    out.per_stage[best_stage].push_back({best_stage, j, best_bw});
    --remaining;
  }
  return out;
}

}  // namespace

ScheduleKind ScheduleKindFromName(const std::string& name) {
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "kfkb") return ScheduleKind::kKFKB;
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "greedy") return ScheduleKind::kGreedy;
  throw std::invalid_argument("unknown pipeline schedule '" + name +
                              "'; valid: 1f1b, kfkb, gpipe, greedy");
}

const char* ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kKFKB:
      return "kfkb";
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kGreedy:
      return "greedy";
  }
  return "?";
}

std::vector<PipeOp> Schedule::ForDevice(const StageGraph& sg, int device) const {
  for (const auto& st : sg.stages)
    if (std::find(st.devices.begin(), st.devices.end(), device) != st.devices.end())
      return per_stage.at(st.id);
  return {};
}

Schedule BuildSchedule(const StageGraph& sg, ScheduleKind kind) {
  for (const auto& st : sg.stages)
    if (st.micro_batch <= 0 || sg.mini_batch % st.micro_batch != 0)
      throw std::invalid_argument(
          "stage S" + std::to_string(st.id) + ": micro-batch " + std::to_string(st.micro_batch) +
          " does not divide the mini-batch " + std::to_string(sg.mini_batch));
  if (kind == ScheduleKind::kGreedy) return Greedy(sg);
  Schedule out;
  out.kind = kind;
  // 1F1B counts: Table 3.2 with k = 1 everywhere, from the sinks up.
  std::vector<int64_t> one_f1b(sg.stages.size(), 0);
  const auto succs = sg.Successors();
  for (int s = static_cast<int>(sg.stages.size()) - 1; s >= 0; --s) {
    const int b = sg.stages[s].micro_batch;
    one_f1b[s] = succs[s].empty() ? b : 0;
    for (int t : succs[s])
      one_f1b[s] =
          std::max(one_f1b[s], ComputeInFlight(1, b, 1, sg.stages[t].micro_batch, one_f1b[t]));
  }
  for (const auto& st : sg.stages) {
    const int m = NumMicroBatches(sg, st.id);
    if (kind == ScheduleKind::kGPipe) {
      out.per_stage.push_back(WarmupAlternate(st.id, m, m, 1));
      continue;
    }
    const int k = kind == ScheduleKind::kKFKB ? st.k : 1;
    const int64_t in_flight = kind == ScheduleKind::kKFKB ? st.in_flight : one_f1b[st.id];
    const int warmup = static_cast<int>((in_flight + st.micro_batch - 1) / st.micro_batch);
    out.per_stage.push_back(WarmupAlternate(st.id, m, std::max(warmup, k), k));
  }
  return out;
}

void CheckStageOrder(const StageGraph& sg, const Schedule& schedule) {
  if (schedule.per_stage.size() != sg.stages.size())
    throw std::invalid_argument("schedule has " + std::to_string(schedule.per_stage.size()) +
                                " stage lists for " + std::to_string(sg.stages.size()) + " stages");
  for (const auto& st : sg.stages) {
    const int m = NumMicroBatches(sg, st.id);
    int f = 0, b = 0;
    for (const auto& op : schedule.per_stage[st.id]) {
      const std::string where =
          "stage S" + std::to_string(st.id) + ", micro-batch " + std::to_string(op.micro_batch);
      if (op.stage != st.id) throw std::invalid_argument(where + ": op of another stage");
      if (!op.backward) {
        if (op.micro_batch != f) throw std::invalid_argument(where + ": forwards out of order");
        ++f;
      } else {
        if (op.micro_batch != b) throw std::invalid_argument(where + ": backwards out of order");
        if (b >= f) throw std::invalid_argument(where + ": backward before its forward");
        ++b;
      }
    }
    if (f != m || b != m)
      throw std::invalid_argument("stage S" + std::to_string(st.id) + " runs " + std::to_string(f) +
                                  " forwards and " + std::to_string(b) + " backwards; expected " +
                                  std::to_string(m) + " of each");
  }
}

}  // namespace tp::pipeline
