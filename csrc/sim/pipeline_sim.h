// Event simulator of a pipeline plan: runs every device's static op list against the data
// dependencies between stages (C5, at sample granularity so stages may use different
// micro-batch sizes) and the cost model, without running the model. This is how plans for 32
// devices are evaluated on a 2-core machine.
#pragma once

#include <vector>

#include "cost/device_profile.h"
#include "passes/pipeline_schedule.h"

namespace tp::sim {

struct PipeEvent {
  int stage = -1, micro_batch = -1;
  bool backward = false;
  double start = 0, end = 0;
};

struct PipelineSimResult {
  double iteration_time = 0;                  // one mini-batch, including gradient all-reduce
  double throughput = 0;                      // samples per second
  double bubble_fraction = 0;                 // idle share of device time
  std::vector<double> device_busy;            // seconds of compute per device
  std::vector<double> device_peak_memory;     // bytes per device
  std::vector<int64_t> stage_peak_in_flight;  // samples over all replicas
  std::vector<PipeEvent> events;              // in start order per stage
};

// Throws std::runtime_error naming the blocked passes when the schedule deadlocks (violates a
// cross-stage dependency) and std::invalid_argument for a malformed schedule.
PipelineSimResult SimulatePipeline(const pipeline::StageGraph& sg,
                                   const pipeline::Schedule& schedule,
                                   const pipeline::CostGraph& graph,
                                   const cost::DeviceProfile& device,
                                   double state_bytes_per_param_byte = 4);

}  // namespace tp::sim
