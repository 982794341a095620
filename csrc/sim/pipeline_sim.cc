#include "sim/pipeline_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

namespace tp::sim {

using pipeline::PipeOp;

PipelineSimResult SimulatePipeline(const pipeline::StageGraph& sg,
                                   const pipeline::Schedule& schedule,
                                   const pipeline::CostGraph& graph,
                                   const cost::DeviceProfile& device,
                                   double state_bytes_per_param_byte) {
  pipeline::CheckStageOrder(sg, schedule);
  const int n = static_cast<int>(sg.stages.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> fw_end(n), bw_end(n);
  for (int s = 0; s < n; ++s) {
    const int m = sg.mini_batch / sg.stages[s].micro_batch;
    fw_end[s].assign(m, nan);
    bw_end[s].assign(m, nan);
  }
  // Edge delays: a replica sends its share of a micro-batch.
  std::vector<std::vector<std::pair<int, double>>> preds(n), succs(n);
  for (const auto& e : sg.edges) {
    const auto& p = sg.stages[e.from];
    const double samples = std::ceil(static_cast<double>(p.micro_batch) / p.replicas);
    const double delay = cost::P2PTime(device, e.bytes_per_sample * samples);
    preds[e.to].push_back({e.from, delay});
    succs[e.from].push_back({e.to, delay});
  }
  PipelineSimResult res;
  std::vector<size_t> next(n, 0);
  std::vector<double> free_at(n, 0), busy(n, 0);
  std::vector<int64_t> live(n, 0), peak(n, 0);
  auto ready = [&](const PipeOp& op, double* t) {
    const auto& st = sg.stages[op.stage];
    *t = 0;
    if (op.backward) {
      *t = fw_end[op.stage][op.micro_batch];
      for (auto [q, delay] : succs[op.stage]) {
        const auto [first, last] = pipeline::OverlappingMicroBatches(op.micro_batch, st.micro_batch,
                                                                     sg.stages[q].micro_batch);
        for (int i = first; i <= last; ++i) {
          if (std::isnan(bw_end[q][i])) return false;
          *t = std::max(*t, bw_end[q][i] + delay);
        }
      }
    } else {
      for (auto [p, delay] : preds[op.stage]) {
        const auto [first, last] = pipeline::OverlappingMicroBatches(op.micro_batch, st.micro_batch,
                                                                     sg.stages[p].micro_batch);
        for (int i = first; i <= last; ++i) {
          if (std::isnan(fw_end[p][i])) return false;
          *t = std::max(*t, fw_end[p][i] + delay);
        }
      }
    }
    return true;
  };
  bool progress = true;
  size_t done = 0, total = 0;
  for (const auto& ops : schedule.per_stage) total += ops.size();
  while (progress && done < total) {
    progress = false;
    for (int s = 0; s < n; ++s) {
      const auto& st = sg.stages[s];
      while (next[s] < schedule.per_stage[s].size()) {
        const PipeOp& op = schedule.per_stage[s][next[s]];
        double t;
        if (!ready(op, &t)) break;
        const double start = std::max(t, free_at[s]);
        const double dur = op.backward ? st.bwd_time : st.fwd_time;
        const double end = start + dur;
        (op.backward ? bw_end : fw_end)[s][op.micro_batch] = end;
        free_at[s] = end;
        busy[s] += dur;
        live[s] += op.backward ? -st.micro_batch : st.micro_batch;
        peak[s] = std::max(peak[s], live[s]);
        res.events.push_back({s, op.micro_batch, op.backward, start, end});
        ++next[s];
        ++done;
        progress = true;
      }
    }
  }
  if (done < total) {
    std::string blocked;
    for (int s = 0; s < n; ++s) {
      if (next[s] >= schedule.per_stage[s].size()) continue;
      const PipeOp& op = schedule.per_stage[s][next[s]];
      blocked += (blocked.empty() ? "" : ", ") + std::string(op.backward ? "bw" : "fw") + "(S" +
                 std::to_string(s) + ", mb " + std::to_string(op.micro_batch) + ")";
    }
    throw std::runtime_error("pipeline schedule deadlocks: blocked at " + blocked);
  }
  res.device_busy.assign(sg.num_devices, 0);
  res.device_peak_memory.assign(sg.num_devices, 0);
  res.stage_peak_in_flight = peak;
  double busy_total = 0;
  for (int s = 0; s < n; ++s) {
    const auto& st = sg.stages[s];
    res.iteration_time = std::max(res.iteration_time, free_at[s] + st.allreduce_time);
    double act = 0, params = 0;
    for (int v : st.blocks) act += graph.nodes[v].act_bytes, params += graph.nodes[v].param_bytes;
    const double share =
        std::ceil(static_cast<double>(st.micro_batch) / st.replicas) / st.micro_batch;
    for (int d : st.devices) {
      if (d < 0 || d >= sg.num_devices)
        throw std::invalid_argument("stage S" + std::to_string(s) + " uses device " +
                                    std::to_string(d) + " outside 0.." +
                                    std::to_string(sg.num_devices - 1));
      res.device_busy[d] = busy[s];
      res.device_peak_memory[d] =
          state_bytes_per_param_byte * params + act * static_cast<double>(peak[s]) * share;
      busy_total += busy[s];
    }
  }
  res.throughput = res.iteration_time > 0 ? sg.mini_batch / res.iteration_time : 0;
  res.bubble_fraction =
      res.iteration_time > 0 ? 1.0 - busy_total / (sg.num_devices * res.iteration_time) : 0;
  std::stable_sort(res.events.begin(), res.events.end(),
                   [](const PipeEvent& a, const PipeEvent& b) {
                     return a.stage != b.stage ? a.stage < b.stage : a.start < b.start;
                   });
  return res;
}

}  // namespace tp::sim
