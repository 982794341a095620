// Training layouts for clusters we cannot run: the step time of a decoder-only transformer under
// a 3-D (+ context-parallel) layout on a modelled cluster, and the layout the planner picks.
//
// The model composes what the other passes price, at cluster scale: GEMMs and flash attention
// on a roofline at the cluster's measured efficiencies, Megatron's tensor- and sequence-parallel
// collectives inside a node, context parallelism's K/V all-gather, the pipeline schedule
// (1F1B or interleaved) on the event simulator (sim/interleaved_pipeline.h), and the data-parallel
// gradient reduce-scatter overlapped with the backward of the chunks still running. Memory per
// device (weights, gradients, optimizer states by ZeRO stage, activations at the schedule's peak)
// must fit, or the layout is rejected with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cost/cluster_profile.h"

namespace tp::passes {

// A decoder-only transformer (Llama/GPT family) by its sizes; Params() must equal the
// parameter count of the model it describes (the Python side checks it on the meta device).
struct TransformerSpec {
  std::string name;
  int64_t layers = 0, hidden = 0, ffn = 0, heads = 0, kv_heads = 0, vocab = 0;
  int64_t head_dim = 0;   // 0: hidden / heads
  bool gated_mlp = true;  // SwiGLU (gate, up, down); false: two matrices (GPT)
  bool tied_embeddings = false;
  bool biases = false;    // GPT-style biases and LayerNorm (two vectors per norm)
  int64_t positions = 0;  // learned position embeddings (GPT-2); 0 with rotary
  int64_t HeadDim() const { return head_dim ? head_dim : hidden / heads; }
  double LayerParams() const;
  double Params() const;
  // Forward FLOPs of one sequence of `seq` tokens through the whole model, causal attention
  // counted once (the MFU numerator is three times this).
  double ForwardFlops(int64_t seq) const;
};

struct TrainingJob {
  int world = 1;             // devices
  int64_t seq_len = 0;       // tokens per sequence
  int64_t global_batch = 0;  // sequences per optimizer step
};

struct TrainingLayout {
  int tp = 1, cp = 1, pp = 1, dp = 1;
  int chunks = 1;       // model chunks per pipeline device (interleaved 1F1B when > 1)
  int micro_batch = 1;  // sequences per micro-batch and data-parallel replica
  int zero = 1;         // 0 replicated; 1 optimizer states sharded over dp; 2 + gradients;
                        // 3 + weights (FSDP)
  // Activation recomputation: "none"; "selective" (GEMM and attention outputs kept, norms and
  // the MLP activation recomputed: torchtitan's per-op policy); "full" (layer inputs only).
  std::string recompute = "none";
  bool sequence_parallel = true;      // Megatron SP: norms and residuals sharded over tp
  bool tp_overlap = false;            // TP collectives overlapped with the GEMMs (async TP)
  std::string order = "tp-cp-pp-dp";  // mesh dimensions in rank order, innermost first
  std::string ToString() const;
};

struct StepEstimate {
  bool feasible = false;
  std::string reason;        // why not, when infeasible
  double step_time = 0;      // seconds per optimizer step
  double pipeline_time = 0;  // first forward to last backward
  double bubble_fraction = 0;
  double compute_time = 0;  // per device (the busiest): GEMMs, attention, elementwise
  double tp_comm_time = 0;  // exposed TP collectives per device per step
  double cp_comm_time = 0;
  double pp_send_time = 0;     // one activation send between stages
  double dp_exposed_time = 0;  // gradient sync and parameter gathers not hidden
  double optimizer_time = 0;
  double memory_bytes = 0;      // peak per device
  double state_bytes = 0;       // weights + gradients + optimizer states per device
  double activation_bytes = 0;  // at the schedule's peak
  int micro_batches = 0;
  double model_flops = 0;        // per step, whole job: 3 x forward (no recomputation)
  double tflops_per_device = 0;  // model_flops / step_time / world / 1e12
  double mfu = 0;                // of the cluster's datasheet peak
};

// Throws std::invalid_argument naming the field for a layout that does not tile the job (degrees
// whose product is not the world, a batch the replicas and micro-batches do not divide, heads
// not divisible by tp, ...). A layout that tiles but does not fit in memory returns
// feasible=false with the reason.
StepEstimate EstimateTrainingStep(const TransformerSpec& model, const TrainingJob& job,
                                  const TrainingLayout& layout, const cost::ClusterProfile& c);

// Candidate values per decision; empty: every value that tiles the job.
struct LayoutSearch {
  std::vector<int> tp, cp, pp, chunks, micro_batch, zero;
  std::vector<std::string> recompute;
  std::string order = "tp-cp-pp-dp";
  bool sequence_parallel = true;
  bool tp_overlap = false;
  int keep = 5;  // best layouts reported
};

struct LayoutCandidate {
  TrainingLayout layout;
  StepEstimate estimate;
};

struct LayoutPlan {
  TrainingLayout layout;  // the fastest layout that fits
  StepEstimate estimate;
  std::vector<LayoutCandidate> best;  // the `keep` fastest, fastest first
  int64_t evaluated = 0;              // layouts that tile the job
  int64_t feasible = 0;               // of which fit in memory
  std::string ToString() const;
};

// Throws std::runtime_error when no layout tiles the job or none fits (naming the closest).
LayoutPlan PlanTrainingLayout(const TransformerSpec& model, const TrainingJob& job,
                              const cost::ClusterProfile& c, const LayoutSearch& search);

}  // namespace tp::passes
