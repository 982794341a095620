// libFuzzer target over the pipeline passes: coarsening, SP decomposition, the partitioner (GPP
// and SPP), every schedule kind and the simulator.
//
// The input bytes describe a cost graph (random sizes, inputs that may dangle or point
// forward, costs that may be negative or huge) and options (devices, mini-batch, micro-batch
// sizes that may not divide it, k values, memory limits that may fit nothing). Whatever the
// bytes, the passes must return a plan whose schedules simulate without deadlock, or throw
// std::invalid_argument (bad input) or PartitionError (nothing fits). Anything else - a crash,
// an ASan/UBSan report, a deadlock error, a logic_error - is a bug.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cost/device_profile.h"
#include "passes/pipeline_graph.h"
#include "passes/pipeline_partition.h"
#include "passes/pipeline_schedule.h"
#include "sim/pipeline_sim.h"

using namespace tp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  pipeline::CostGraph g;
  const int n = in.ConsumeIntegralInRange(0, 20);
  const char* scopes[] = {"", "a", "a.0", "a.1", "b.0.x", "b.1.x"};
  for (int v = 0; v < n; ++v) {
    pipeline::CostNode c;
    c.name = "n" + std::to_string(v);
    c.scope = scopes[in.ConsumeIntegralInRange(0, 5)];
    const int k = in.ConsumeIntegralInRange(0, 3);
    for (int i = 0; i < k && v > 0; ++i) {
      // Mostly earlier nodes; sometimes a forward or dangling reference.
      const int u = in.ConsumeBool() && in.ConsumeBool() ? in.ConsumeIntegralInRange(-1, n)
                                                         : in.ConsumeIntegralInRange(0, v - 1);
      c.inputs.push_back(u);
    }
    std::sort(c.inputs.begin(), c.inputs.end());
    c.inputs.erase(std::unique(c.inputs.begin(), c.inputs.end()), c.inputs.end());
    c.fwd_flops = in.ConsumeFloatingPointInRange<double>(-1.0, 1e13);
    c.bwd_flops = 2 * c.fwd_flops;
    c.io_bytes = in.ConsumeFloatingPointInRange<double>(0, 1e10);
    c.act_bytes = in.ConsumeFloatingPointInRange<double>(0, 1e9);
    c.out_bytes = in.ConsumeFloatingPointInRange<double>(0, 1e8);
    c.param_bytes = in.ConsumeFloatingPointInRange<double>(0, 1e11);
    c.kernels = in.ConsumeIntegralInRange(0, 50);
    c.is_output = v == n - 1 || in.ConsumeBool();
    g.nodes.push_back(std::move(c));
  }
  pipeline::CoarsenOptions co;
  co.scope_depth = in.ConsumeIntegralInRange(-1, 3);
  co.max_blocks = in.ConsumeIntegralInRange(0, 24);
  co.cheap_fraction = in.ConsumeFloatingPointInRange<double>(0, 0.5);
  pipeline::PartitionOptions o;
  o.num_devices = in.ConsumeIntegralInRange(0, 9);
  o.mini_batch = in.ConsumeIntegralInRange(0, 64);
  const auto names = cost::DeviceProfileNames();
  o.device = cost::FindDeviceProfile(names[in.ConsumeIntegralInRange<size_t>(0, names.size() - 1)]);
  o.memory_limit = in.ConsumeBool() ? 0 : in.ConsumeFloatingPointInRange<double>(1, 1e12);
  const int sizes = in.ConsumeIntegralInRange(0, 3);
  for (int i = 0; i < sizes; ++i) o.micro_batch_sizes.push_back(in.ConsumeIntegralInRange(-1, 64));
  o.k_values = in.ConsumeBool() ? std::vector<int>{1} : std::vector<int>{1, 2, 4};
  o.sequential = in.ConsumeBool();
  o.absorb_joins = in.ConsumeBool();
  o.time_limit_s = 0.5;
  try {
    const pipeline::CostGraph blocks = pipeline::Coarsen(g, co);
    const pipeline::StageGraph sg = pipeline::PartitionPipeline(blocks, o);
    for (auto kind : {pipeline::ScheduleKind::k1F1B, pipeline::ScheduleKind::kKFKB,
                      pipeline::ScheduleKind::kGPipe, pipeline::ScheduleKind::kGreedy}) {
      sim::SimulatePipeline(sg, pipeline::BuildSchedule(sg, kind), blocks, o.device);
    }
  } catch (const std::invalid_argument&) {
  } catch (const pipeline::PartitionError&) {
  }
  return 0;
}
