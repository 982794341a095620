// Pipeline stage partitioner (GraphPipe, thesis §3.5, Algorithm 2): a binary search on the
// bottleneck time-per-sample (TPS) around a dynamic program over the series-parallel tree.
//
// DP state: a convex piece of the graph (an SP subtree, or a contiguous range of its children),
// a device count, and the entry signature of the plan downstream of it (micro-batch size, k of
// kFkB and in-flight samples of each stage it feeds). The value, for each configuration an
// upstream stage could use, is the smallest number of in-flight samples that upstream stage
// must hold (Table 3.2), over plans whose stages all meet the TPS target and the memory limit.
// Base case: the piece is one stage with data parallelism over its devices. Series case: split
// the range at any child, solve the tail first, then the head against the tail's signature.
// Parallel case: split the branches and the devices; both halves feed the same downstream.
//
// The sequential baseline (PipeDream-style SPP) runs the same DP over the topological order as
// one chain with one micro-batch size for all stages; its stages depend on each other in order.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cost/device_profile.h"
#include "passes/pipeline_graph.h"

namespace tp::pipeline {

// Table 3.2: in-flight samples of stage x (kFkB with micro-batch b_x) feeding stage y
// (k_y, b_y) that holds i_y in-flight samples.
int64_t ComputeInFlight(int kx, int bx, int ky, int by, int64_t iy);

struct StageEdge {
  int from = -1, to = -1;
  double bytes_per_sample = 0;  // activations sent forward (gradients of the same size back)
  bool data = true;             // false: an order-only edge of a sequential pipeline
};

struct Stage {
  int id = -1;
  std::vector<int> blocks;   // CostGraph node indices
  int micro_batch = 1;       // b: samples per micro-batch (over all replicas)
  int k = 1;                 // kFkB's k (1 = 1F1B)
  int replicas = 1;          // data-parallel degree d
  std::vector<int> devices;  // global device ids
  int64_t in_flight = 0;     // peak in-flight samples (over all replicas)
  double fwd_time = 0;       // per micro-batch on one replica (compute only)
  double bwd_time = 0;
  double comm_time = 0;       // per micro-batch: sends and receives, both directions
  double allreduce_time = 0;  // gradient all-reduce per iteration
  double tps = 0;             // time per sample
  double memory_bytes = 0;    // per device: weights + optimizer state + activations
};

struct StageGraph {
  std::string kind;  // "gpp" or "spp"
  int mini_batch = 0;
  int num_devices = 0;
  std::vector<Stage> stages;  // topological order
  std::vector<StageEdge> edges;
  double bottleneck_tps = 0;
  double max_memory_bytes = 0;

  std::vector<std::vector<int>> Successors() const;  // over all edges
  std::vector<std::vector<int>> Predecessors() const;
  int Depth() const;  // stages on the longest path
  std::string ToString(const CostGraph& graph) const;
};

struct PartitionOptions {
  int mini_batch = 0;
  int num_devices = 1;
  cost::DeviceProfile device;
  double memory_limit = 0;                // bytes per device; 0 = device.memory_bytes
  std::vector<int> micro_batch_sizes;     // empty: powers of two dividing mini_batch
  std::vector<int> k_values = {1};        // kFkB choices per stage (1 = 1F1B)
  double state_bytes_per_param_byte = 4;  // weights + gradients + Adam's two moments
  bool sequential = false;                // SPP baseline instead of GPP
  bool absorb_joins = true;               // GPP: a branch's last stage may hold the join
  double epsilon = 1e-3;                  // relative width at which the binary search stops
  int max_iterations = 60;
  double time_limit_s = 0;  // 0 = none; else return the best plan found so far
};

struct PartitionStats {
  int iterations = 0;
  int64_t dp_states = 0;
  double search_seconds = 0;
  int blocks = 0;
  int linearised_regions = 0;
  bool timed_out = false;  // the time limit stopped the binary search early
  std::string sp_tree;
};

// No plan fits: says the smallest per-device memory with which one was found (if any).
class PartitionError : public std::runtime_error {
 public:
  PartitionError(const std::string& what, double min_memory_bytes)
      : std::runtime_error(what), min_memory_bytes_(min_memory_bytes) {}
  double min_memory_bytes() const { return min_memory_bytes_; }

 private:
  double min_memory_bytes_;
};

StageGraph PartitionPipeline(const CostGraph& graph, const PartitionOptions& options,
                             PartitionStats* stats = nullptr);

// A stage graph from stages with blocks and configurations set: orders the stages, assigns
// devices in order, adds the data edges (and, for SPP, the chain order) and evaluates it.
StageGraph BuildStageGraph(const CostGraph& graph, const PartitionOptions& options,
                           std::vector<Stage> stages);

// Fills times, in-flight samples and memory of a stage graph whose stages, configurations and
// edges are set (used by the partitioner and for hand-written plans in tests).
void EvaluateStageGraph(const CostGraph& graph, const PartitionOptions& options, StageGraph& sg);

}  // namespace tp::pipeline
