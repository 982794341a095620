// See pipeline_plan.h.
#include "passes/pipeline_plan.h"

#include <algorithm>
#include <sstream>

#include "cost/device_profile.h"

namespace tp::pipeline {

PipelinePlan PlanPipeline(const CostGraph& graph, const PipelineOptions& o) {
  CoarsenOptions co;
  co.scope_depth = o.scope_depth;
  co.max_blocks = o.max_blocks;
  co.cheap_fraction = o.cheap_fraction;
  PartitionOptions po;
  po.mini_batch = o.mini_batch;
  po.num_devices = o.num_devices;
  po.device = cost::FindDeviceProfile(o.device);
  po.memory_limit = o.memory_limit;
  po.micro_batch_sizes = o.micro_batch_sizes;
  po.k_values = o.k_values;
  po.sequential = o.sequential;
  po.absorb_joins = o.absorb_joins;
  po.epsilon = o.epsilon;
  po.time_limit_s = o.time_limit_s;
  const ScheduleKind kind = ScheduleKindFromName(o.schedule);

  PipelinePlan plan;
  graph.Validate();
  plan.blocks = Coarsen(graph, co);
  plan.stages = PartitionPipeline(plan.blocks, po, &plan.stats);
  plan.schedule = BuildSchedule(plan.stages, kind);
  if (o.simulate) plan.sim = sim::SimulatePipeline(plan.stages, plan.schedule, plan.blocks, po.device);
  return plan;
}

std::vector<std::vector<int>> PipelinePlan::StageNodes() const {
  std::vector<std::vector<int>> out;
  for (const auto& s : stages.stages) {
    std::vector<int> members;
    for (int b : s.blocks) {
      const auto& m = blocks.nodes[static_cast<size_t>(b)].members;
      if (m.empty()) members.push_back(b);
      members.insert(members.end(), m.begin(), m.end());
    }
    std::sort(members.begin(), members.end());
    out.push_back(std::move(members));
  }
  return out;
}

std::string PipelinePlan::ToString() const {
  std::ostringstream os;
  os << stages.ToString(blocks);
  os << "schedule " << ScheduleKindName(schedule.kind) << ", " << stats.blocks << " blocks";
  if (sim) {
    os << "; simulated iteration " << sim->iteration_time * 1e3 << " ms, bubble "
       << sim->bubble_fraction;
  }
  os << "\n";
  return os.str();
}

}  // namespace tp::pipeline
