// Bindings of the training-layout model and planner (passes/layout_plan) and the cluster
// profiles it prices with: typed structs and two functions. No LibTorch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/typed.h"
#include "cost/cluster_profile.h"
#include "passes/layout_plan.h"

namespace py = pybind11;

namespace tp::bindings {

void BindLayout(py::module_& m) {
  using cost::ClusterProfile;
  using namespace passes;
  Struct<ClusterProfile>(
      m, "ClusterProfile",
      "A training cluster: device peak and efficiencies, memory, the fabric "
      "inside a node and the network between nodes (csrc/cost/cluster_profile.h).")
      .field("name", &ClusterProfile::name)
      .field("source", &ClusterProfile::source)
      .field("peak_flops", &ClusterProfile::peak_flops)
      .field("gemm_efficiency", &ClusterProfile::gemm_efficiency)
      .field("attention_efficiency", &ClusterProfile::attention_efficiency)
      .field("attention_bwd_efficiency", &ClusterProfile::attention_bwd_efficiency)
      .field("sustained", &ClusterProfile::sustained,
             "share of the kernel efficiencies a training step sustains (calibrated)")
      .field("calibrated_on", &ClusterProfile::calibrated_on)
      .field("sms", &ClusterProfile::sms)
      .field("mem_bandwidth", &ClusterProfile::mem_bandwidth)
      .field("memory_bytes", &ClusterProfile::memory_bytes)
      .field("usable_memory", &ClusterProfile::usable_memory)
      .field("devices_per_node", &ClusterProfile::devices_per_node)
      .field("intra_bandwidth", &ClusterProfile::intra_bandwidth)
      .field("intra_latency", &ClusterProfile::intra_latency)
      .field("inter_bandwidth", &ClusterProfile::inter_bandwidth)
      .field("inter_latency", &ClusterProfile::inter_latency);
  m.def("cluster_profile", &cost::FindClusterProfile, py::arg("name"),
        "A preset cluster profile by name (see cluster_profile_names()).");
  m.def("cluster_profile_names", &cost::ClusterProfileNames);

  Struct<TransformerSpec>(m, "TransformerSpec", "A decoder-only transformer by its sizes.")
      .field("name", &TransformerSpec::name)
      .field("layers", &TransformerSpec::layers)
      .field("hidden", &TransformerSpec::hidden)
      .field("ffn", &TransformerSpec::ffn)
      .field("heads", &TransformerSpec::heads)
      .field("kv_heads", &TransformerSpec::kv_heads)
      .field("vocab", &TransformerSpec::vocab)
      .field("head_dim", &TransformerSpec::head_dim, "0: hidden / heads")
      .field("gated_mlp", &TransformerSpec::gated_mlp, "SwiGLU (True) or a two-matrix MLP")
      .field("tied_embeddings", &TransformerSpec::tied_embeddings)
      .field("biases", &TransformerSpec::biases, "GPT-style biases and LayerNorm")
      .field("positions", &TransformerSpec::positions, "learned position embeddings")
      .computed("params", &TransformerSpec::Params, "parameter count")
      .cls()
      .def("forward_flops", &TransformerSpec::ForwardFlops, py::arg("seq_len"),
           "forward FLOPs of one sequence (causal attention)");
  Struct<TrainingJob>(m, "TrainingJob", "Devices, sequence length and global batch (sequences).")
      .field("world", &TrainingJob::world)
      .field("seq_len", &TrainingJob::seq_len)
      .field("global_batch", &TrainingJob::global_batch);
  Struct<TrainingLayout>(
      m, "TrainingLayout", "A 3-D (+ context parallel) training layout.",
      [](const TrainingLayout& l) { return "TrainingLayout(" + l.ToString() + ")"; })
      .field("tp", &TrainingLayout::tp)
      .field("cp", &TrainingLayout::cp)
      .field("pp", &TrainingLayout::pp)
      .field("dp", &TrainingLayout::dp)
      .field("chunks", &TrainingLayout::chunks, "model chunks per device (interleaved 1F1B > 1)")
      .field("micro_batch", &TrainingLayout::micro_batch)
      .field("zero", &TrainingLayout::zero, "0-3; 3 is FSDP")
      .field("recompute", &TrainingLayout::recompute, "'none', 'selective' or 'full'")
      .field("sequence_parallel", &TrainingLayout::sequence_parallel)
      .field("tp_overlap", &TrainingLayout::tp_overlap, "async TP")
      .field("order", &TrainingLayout::order, "mesh dimensions in rank order, innermost first");
  Struct<StepEstimate>(m, "StepEstimate", "The modelled step of one layout.")
      .field("feasible", &StepEstimate::feasible)
      .field("reason", &StepEstimate::reason)
      .field("step_time", &StepEstimate::step_time)
      .field("pipeline_time", &StepEstimate::pipeline_time)
      .field("bubble_fraction", &StepEstimate::bubble_fraction)
      .field("compute_time", &StepEstimate::compute_time)
      .field("tp_comm_time", &StepEstimate::tp_comm_time)
      .field("cp_comm_time", &StepEstimate::cp_comm_time)
      .field("pp_send_time", &StepEstimate::pp_send_time)
      .field("dp_exposed_time", &StepEstimate::dp_exposed_time)
      .field("optimizer_time", &StepEstimate::optimizer_time)
      .field("memory_bytes", &StepEstimate::memory_bytes)
      .field("state_bytes", &StepEstimate::state_bytes)
      .field("activation_bytes", &StepEstimate::activation_bytes)
      .field("micro_batches", &StepEstimate::micro_batches)
      .field("model_flops", &StepEstimate::model_flops)
      .field("tflops_per_device", &StepEstimate::tflops_per_device)
      .field("mfu", &StepEstimate::mfu);
  Struct<LayoutSearch>(m, "LayoutSearch", "Candidate values per decision; empty: all that tile.")
      .field("tp", &LayoutSearch::tp)
      .field("cp", &LayoutSearch::cp)
      .field("pp", &LayoutSearch::pp)
      .field("chunks", &LayoutSearch::chunks)
      .field("micro_batch", &LayoutSearch::micro_batch)
      .field("zero", &LayoutSearch::zero)
      .field("recompute", &LayoutSearch::recompute)
      .field("order", &LayoutSearch::order)
      .field("sequence_parallel", &LayoutSearch::sequence_parallel)
      .field("tp_overlap", &LayoutSearch::tp_overlap)
      .field("keep", &LayoutSearch::keep);
  Struct<LayoutCandidate>(m, "LayoutCandidate", "A layout and its estimate.")
      .field("layout", &LayoutCandidate::layout)
      .field("estimate", &LayoutCandidate::estimate);
  Struct<LayoutPlan>(m, "LayoutPlan", "The fastest layout that fits, and the runners-up.",
                     [](const LayoutPlan& p) { return p.ToString(); })
      .field("layout", &LayoutPlan::layout)
      .field("estimate", &LayoutPlan::estimate)
      .field("best", &LayoutPlan::best)
      .field("evaluated", &LayoutPlan::evaluated)
      .field("feasible", &LayoutPlan::feasible);
  m.def(
      "estimate_training_step",
      [](const TransformerSpec& spec, const TrainingJob& job, const TrainingLayout& layout,
         const ClusterProfile& cluster) {
        py::gil_scoped_release release;
        return EstimateTrainingStep(spec, job, layout, cluster);
      },
      py::arg("spec"), py::arg("job"), py::arg("layout"), py::arg("cluster"),
      "Models one training step of `layout` (csrc/passes/layout_plan.h).");
  m.def(
      "plan_training_layout",
      [](const TransformerSpec& spec, const TrainingJob& job, const ClusterProfile& cluster,
         const LayoutSearch& search) {
        py::gil_scoped_release release;
        return PlanTrainingLayout(spec, job, cluster, search);
      },
      py::arg("spec"), py::arg("job"), py::arg("cluster"), py::arg("search"),
      "The fastest layout that fits in memory, over the search's candidates.");
}

}  // namespace tp::bindings
