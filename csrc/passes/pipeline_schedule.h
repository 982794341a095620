// Static micro-batch scheduler (GraphPipe §3.6): per stage, the order of its forward and
// backward passes. Every replica of a stage runs the same order on its share of each micro-batch.
//
//   1F1B / kFkB: warm-up forwards up to the stage's in-flight count, then k backwards and k
//                forwards alternately, then the remaining backwards (Table 3.2 gives the count).
//   GPipe:       all forwards, then all backwards (the memory-hungry baseline).
//   Greedy:      list scheduling on the cost model that runs a ready backward before any forward
//                and never exceeds the stage's in-flight count (Algorithm 4's rule).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "passes/pipeline_partition.h"

namespace tp::pipeline {

enum class ScheduleKind { k1F1B, kKFKB, kGPipe, kGreedy };
ScheduleKind ScheduleKindFromName(const std::string& name);  // "1f1b", "kfkb", "gpipe", "greedy"
const char* ScheduleKindName(ScheduleKind kind);

struct PipeOp {
  int stage = -1;
  int micro_batch = -1;  // index within the stage's own micro-batches
  bool backward = false;
  bool operator==(const PipeOp& o) const {
    return stage == o.stage && micro_batch == o.micro_batch && backward == o.backward;
  }
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  std::vector<std::vector<PipeOp>> per_stage;
  // The op list a device runs (its stage's list); empty for an unused device.
  std::vector<PipeOp> ForDevice(const StageGraph& sg, int device) const;
};

// Micro-batches [first, last] of a stage with micro-batch size `b_other` that share samples
// with micro-batch `j` of a stage with size `b` (C5 at sample granularity).
inline std::pair<int, int> OverlappingMicroBatches(int j, int b, int b_other) {
  return {j * b / b_other, ((j + 1) * b - 1) / b_other};
}

Schedule BuildSchedule(const StageGraph& sg, ScheduleKind kind);

// Checks C4 (per-stage order: each pass once, forwards and backwards in micro-batch order, a
// forward before its backward). Throws std::invalid_argument naming the stage otherwise.
void CheckStageOrder(const StageGraph& sg, const Schedule& schedule);

}  // namespace tp::pipeline
