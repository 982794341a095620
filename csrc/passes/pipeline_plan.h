// Pass: pipeline_partition's driver. One call from a cost graph to a pipeline plan: coarsen it
// to blocks, partition the blocks into stages (GraphPipe's GPP, or the sequential SPP
// baseline), order each stage's micro-batches and simulate one iteration.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "passes/pipeline_graph.h"
#include "passes/pipeline_partition.h"
#include "passes/pipeline_schedule.h"
#include "sim/pipeline_sim.h"

namespace tp::pipeline {

struct PipelineOptions {
  // Coarsening (CoarsenOptions).
  int scope_depth = -1;
  int max_blocks = 256;
  double cheap_fraction = 0.05;
  // Partitioning (PartitionOptions).
  int mini_batch = 0;
  int num_devices = 1;
  std::string device = "cpu";  // a cost::DeviceProfile name
  double memory_limit = 0;
  std::vector<int> micro_batch_sizes;
  std::vector<int> k_values = {1};
  bool sequential = false;
  bool absorb_joins = true;
  double epsilon = 1e-3;
  double time_limit_s = 0;
  // Schedule and simulation.
  std::string schedule = "1f1b";  // "1f1b", "kfkb", "gpipe", "greedy"
  bool simulate = true;
};

struct PipelinePlan {
  CostGraph blocks;  // the coarsened graph the stages index
  StageGraph stages;
  Schedule schedule;
  PartitionStats stats;
  std::optional<sim::PipelineSimResult> sim;

  // Each stage's original cost-graph nodes (sorted), in stage order.
  std::vector<std::vector<int>> StageNodes() const;
  // The stage graph, then the simulated iteration: the readable form (repr, golden files).
  std::string ToString() const;
};

// Throws PartitionError when no plan fits the memory, std::invalid_argument for bad options.
PipelinePlan PlanPipeline(const CostGraph& graph, const PipelineOptions& options);

}  // namespace tp::pipeline
