// Bindings of the pipeline passes: one call from a cost graph (plain records) to a plan, its
// schedule and its simulation, as Python dicts. No LibTorch here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cost/device_profile.h"
#include "passes/pipeline_graph.h"
#include "passes/pipeline_partition.h"
#include "passes/pipeline_schedule.h"
#include "sim/pipeline_sim.h"

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
  g.Validate();
  return g;
}

py::dict PipelinePlan(const py::list& records, const py::dict& opts) {
  const pipeline::CostGraph original = CostGraphFromRecords(records);
  pipeline::CoarsenOptions co;
  co.scope_depth = Get<int>(opts, "scope_depth", -1);
  co.max_blocks = Get<int>(opts, "max_blocks", 256);
  co.cheap_fraction = Get<double>(opts, "cheap_fraction", 0.05);
  pipeline::PartitionOptions o;
  o.mini_batch = Get<int>(opts, "mini_batch", 0);
  o.num_devices = Get<int>(opts, "num_devices", 1);
  o.device = cost::FindDeviceProfile(Get<std::string>(opts, "device", "cpu"));
  o.memory_limit = Get<double>(opts, "memory_limit", 0);
  o.micro_batch_sizes = Get<std::vector<int>>(opts, "micro_batch_sizes", {});
  o.k_values = Get<std::vector<int>>(opts, "k_values", {1});
  o.sequential = Get<bool>(opts, "sequential", false);
  o.absorb_joins = Get<bool>(opts, "absorb_joins", true);
  o.epsilon = Get<double>(opts, "epsilon", 1e-3);
  o.time_limit_s = Get<double>(opts, "time_limit_s", 0);
  const auto kind = pipeline::ScheduleKindFromName(Get<std::string>(opts, "schedule", "1f1b"));
  const bool simulate = Get<bool>(opts, "simulate", true);

  pipeline::CostGraph graph;
  pipeline::PartitionStats stats;
  pipeline::StageGraph sg;
  pipeline::Schedule schedule;
  sim::PipelineSimResult sim;
  {
    py::gil_scoped_release release;
    graph = pipeline::Coarsen(original, co);
    sg = pipeline::PartitionPipeline(graph, o, &stats);
    schedule = pipeline::BuildSchedule(sg, kind);
    if (simulate) sim = sim::SimulatePipeline(sg, schedule, graph, o.device);
  }
  py::list stages;
  for (const auto& s : sg.stages) {
    std::vector<int> members;
    for (int b : s.blocks) {
      const auto& m = graph.nodes[b].members;
      if (m.empty()) members.push_back(b);
      members.insert(members.end(), m.begin(), m.end());
    }
    std::sort(members.begin(), members.end());
    py::dict d;
    d["id"] = s.id;
    d["nodes"] = members;
    d["micro_batch"] = s.micro_batch;
    d["k"] = s.k;
    d["replicas"] = s.replicas;
    d["devices"] = s.devices;
    d["in_flight"] = s.in_flight;
    d["fwd_time"] = s.fwd_time;
    d["bwd_time"] = s.bwd_time;
    d["tps"] = s.tps;
    d["memory_bytes"] = s.memory_bytes;
    stages.append(d);
  }
  py::list edges;
  for (const auto& e : sg.edges)
    edges.append(py::make_tuple(e.from, e.to, e.bytes_per_sample, e.data));
  py::list per_stage;
  for (const auto& ops : schedule.per_stage) {
    py::list l;
    for (const auto& op : ops) l.append(py::make_tuple(op.micro_batch, op.backward));
    per_stage.append(l);
  }
  py::dict out;
  out["kind"] = sg.kind;
  out["schedule_kind"] = pipeline::ScheduleKindName(kind);
  out["mini_batch"] = sg.mini_batch;
  out["num_devices"] = sg.num_devices;
  out["stages"] = stages;
  out["edges"] = edges;
  out["schedule"] = per_stage;
  out["depth"] = sg.Depth();
  out["bottleneck_tps"] = sg.bottleneck_tps;
  out["max_memory_bytes"] = sg.max_memory_bytes;
  out["text"] = sg.ToString(graph);
  py::dict st;
  st["iterations"] = stats.iterations;
  st["dp_states"] = stats.dp_states;
  st["search_seconds"] = stats.search_seconds;
  st["blocks"] = stats.blocks;
  st["linearised_regions"] = stats.linearised_regions;
  st["sp_tree"] = stats.sp_tree;
  st["timed_out"] = stats.timed_out;
  out["stats"] = st;
  if (simulate) {
    py::dict s;
    s["iteration_time"] = sim.iteration_time;
    s["throughput"] = sim.throughput;
    s["bubble_fraction"] = sim.bubble_fraction;
    s["device_busy"] = sim.device_busy;
    s["device_peak_memory"] = sim.device_peak_memory;
    s["stage_peak_in_flight"] = sim.stage_peak_in_flight;
    py::list ev;
    for (const auto& e : sim.events)
      ev.append(py::make_tuple(e.stage, e.micro_batch, e.backward, e.start, e.end));
    s["events"] = ev;
    out["sim"] = s;
  }
  return out;
}

}  // namespace

void BindPipeline(py::module_& m) {
  m.def("pipeline_plan", &PipelinePlan, py::arg("nodes"), py::arg("options"),
        "Coarsens a cost graph, partitions it into pipeline stages (GPP, or SPP with "
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
