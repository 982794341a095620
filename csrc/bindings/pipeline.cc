// Bindings of the pipeline passes: one call from a cost graph (plain records) to a typed plan,
// its schedule and its simulation. No LibTorch here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/typed.h"
#include "cost/device_profile.h"
#include "passes/pass_manager.h"
#include "passes/pipeline_plan.h"

namespace py = pybind11;

namespace tp::bindings {
namespace {

template <typename T>
T Get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) && !d[key].is_none() ? d[key].cast<T>() : fallback;
}

pipeline::CostGraph CostGraphFromRecords(const py::list& records) {
  pipeline::CostGraph g;
  for (const auto& item : records) {
    const py::dict r = item.cast<py::dict>();
    pipeline::CostNode n;
    n.name = r["name"].cast<std::string>();
    n.scope = Get<std::string>(r, "scope", "");
    n.inputs = Get<std::vector<int>>(r, "inputs", {});
    n.fwd_flops = Get<double>(r, "fwd_flops", 0);
    n.bwd_flops = Get<double>(r, "bwd_flops", 2 * n.fwd_flops);
    n.io_bytes = Get<double>(r, "io_bytes", 0);
    n.act_bytes = Get<double>(r, "act_bytes", 0);
    n.out_bytes = Get<double>(r, "out_bytes", 0);
    n.param_bytes = Get<double>(r, "param_bytes", 0);
    n.kernels = Get<double>(r, "kernels", 1);
    n.is_output = Get<bool>(r, "is_output", false);
    g.nodes.push_back(std::move(n));
  }
  return g;  // validated by PlanPipeline
}

}  // namespace

void BindPipeline(py::module_& m, py::class_<passes::PassManager>& pm) {
  using pipeline::PipelineOptions;
  Struct<PipelineOptions>(m, "PipelineOptions",
                          "Options of pipeline_partition (csrc/passes/pipeline_plan.h).")
      .field("scope_depth", &PipelineOptions::scope_depth)
      .field("max_blocks", &PipelineOptions::max_blocks)
      .field("cheap_fraction", &PipelineOptions::cheap_fraction)
      .field("mini_batch", &PipelineOptions::mini_batch)
      .field("num_devices", &PipelineOptions::num_devices)
      .field("device", &PipelineOptions::device)
      .field("memory_limit", &PipelineOptions::memory_limit, "bytes per device; 0: the profile's")
      .field("micro_batch_sizes", &PipelineOptions::micro_batch_sizes)
      .field("k_values", &PipelineOptions::k_values)
      .field("sequential", &PipelineOptions::sequential, "SPP baseline instead of GPP")
      .field("absorb_joins", &PipelineOptions::absorb_joins)
      .field("epsilon", &PipelineOptions::epsilon)
      .field("time_limit_s", &PipelineOptions::time_limit_s)
      .field("schedule", &PipelineOptions::schedule, "'1f1b', 'kfkb', 'gpipe', 'greedy'")
      .field("simulate", &PipelineOptions::simulate);

  using pipeline::Stage;
  Struct<Stage>(m, "PipelineStage", "One stage: its blocks, configuration and modelled costs.")
      .field("id", &Stage::id)
      .field("blocks", &Stage::blocks)
      .field("micro_batch", &Stage::micro_batch)
      .field("k", &Stage::k)
      .field("replicas", &Stage::replicas)
      .field("devices", &Stage::devices)
      .field("in_flight", &Stage::in_flight)
      .field("fwd_time", &Stage::fwd_time)
      .field("bwd_time", &Stage::bwd_time)
      .field("comm_time", &Stage::comm_time)
      .field("allreduce_time", &Stage::allreduce_time)
      .field("tps", &Stage::tps)
      .field("memory_bytes", &Stage::memory_bytes);

  using pipeline::PartitionStats;
  Struct<PartitionStats>(m, "PartitionStats", "How the partitioner's search went.")
      .field("iterations", &PartitionStats::iterations)
      .field("dp_states", &PartitionStats::dp_states)
      .field("search_seconds", &PartitionStats::search_seconds)
      .field("blocks", &PartitionStats::blocks)
      .field("linearised_regions", &PartitionStats::linearised_regions)
      .field("timed_out", &PartitionStats::timed_out)
      .field("sp_tree", &PartitionStats::sp_tree);

  using sim::PipelineSimResult;
  Struct<PipelineSimResult>(m, "PipelineSimulation", "One simulated iteration.")
      .field("iteration_time", &PipelineSimResult::iteration_time)
      .field("throughput", &PipelineSimResult::throughput)
      .field("bubble_fraction", &PipelineSimResult::bubble_fraction)
      .field("device_busy", &PipelineSimResult::device_busy)
      .field("device_peak_memory", &PipelineSimResult::device_peak_memory)
      .field("stage_peak_in_flight", &PipelineSimResult::stage_peak_in_flight)
      .computed("events", [](const PipelineSimResult& r) {
        py::list ev;
        for (const auto& e : r.events)
          ev.append(py::make_tuple(e.stage, e.micro_batch, e.backward, e.start, e.end));
        return ev;
      }, "(stage, micro_batch, backward, start, end) per pass");

  using pipeline::PipelinePlan;
  Struct<PipelinePlan>(m, "PipelinePlan",
                       "Pipeline stages, their schedule and the simulated iteration.",
                       [](const PipelinePlan& p) { return p.ToString(); })
      .computed("kind", [](const PipelinePlan& p) { return p.stages.kind; }, "'gpp' or 'spp'")
      .computed("schedule_kind",
                [](const PipelinePlan& p) { return pipeline::ScheduleKindName(p.schedule.kind); })
      .computed("mini_batch", [](const PipelinePlan& p) { return p.stages.mini_batch; })
      .computed("num_devices", [](const PipelinePlan& p) { return p.stages.num_devices; })
      .computed("stages", [](const PipelinePlan& p) { return p.stages.stages; })
      .computed("stage_nodes", &PipelinePlan::StageNodes,
                "each stage's original cost-graph nodes, sorted")
      .computed("edges",
                [](const PipelinePlan& p) {
                  py::list edges;
                  for (const auto& e : p.stages.edges)
                    edges.append(py::make_tuple(e.from, e.to, e.bytes_per_sample, e.data));
                  return edges;
                },
                "(from, to, bytes_per_sample, data) per stage edge")
      .computed("schedule",
                [](const PipelinePlan& p) {
                  py::list per_stage;
                  for (const auto& ops : p.schedule.per_stage) {
                    py::list l;
                    for (const auto& op : ops) l.append(py::make_tuple(op.micro_batch, op.backward));
                    per_stage.append(l);
                  }
                  return per_stage;
                },
                "per stage: (micro_batch, backward) in run order")
      .computed("depth", [](const PipelinePlan& p) { return p.stages.Depth(); })
      .computed("bottleneck_tps", [](const PipelinePlan& p) { return p.stages.bottleneck_tps; })
      .computed("max_memory_bytes",
                [](const PipelinePlan& p) { return p.stages.max_memory_bytes; })
      .computed("text", [](const PipelinePlan& p) { return p.stages.ToString(p.blocks); })
      .field("stats", &PipelinePlan::stats)
      .field("sim", &PipelinePlan::sim);

  pm.def(
      "plan_pipeline",
      [](passes::PassManager&, const py::list& records, const PipelineOptions& o) {
        const pipeline::CostGraph graph = CostGraphFromRecords(records);
        py::gil_scoped_release release;
        return pipeline::PlanPipeline(graph, o);
      },
      py::arg("nodes"), py::arg("options"),
      "Coarsens a cost graph (records), partitions it into pipeline stages (GPP, or SPP with "
      "sequential=True), schedules the micro-batches and simulates one iteration.");
  m.def("device_profiles", [] {
    py::dict out;
    for (const auto& name : cost::DeviceProfileNames()) {
      const auto& p = cost::FindDeviceProfile(name);
      py::dict d;
      d["peak_flops"] = p.peak_flops;
      d["mem_bandwidth"] = p.mem_bandwidth;
      d["memory_bytes"] = p.memory_bytes;
      d["link_bandwidth"] = p.link_bandwidth;
      d["link_latency"] = p.link_latency;
      out[py::str(name)] = d;
    }
    return out;
  });
}

}  // namespace tp::bindings
