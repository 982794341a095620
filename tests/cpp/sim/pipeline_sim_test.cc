#include "sim/pipeline_sim.h"

#include <gtest/gtest.h>

#include <random>

#include "passes/pipeline_schedule.h"
#include "pipeline_test_graphs.h"

namespace tp::sim {
namespace {

using pipeline::BuildSchedule;
using pipeline::ScheduleKind;
using pipeline::Stage;
using pipeline::StageGraph;

// Two stages x -> y with the given micro-batch sizes and k's, equal per-sample costs.
StageGraph TwoStages(const pipeline::CostGraph& g, int bx, int kx, int by, int ky, int mini) {
  auto o = testing::Options(2, mini);
  std::vector<Stage> stages(2);
  stages[0].blocks = {0};
  stages[1].blocks = {1};
  stages[0].micro_batch = bx, stages[0].k = kx;
  stages[1].micro_batch = by, stages[1].k = ky;
  return pipeline::BuildStageGraph(g, o, stages);
}

TEST(PipelineSchedule, EveryScheduleOfEveryPlanRunsAndRespectsMemory) {
  const auto dev = cost::FindDeviceProfile("a100");
  std::mt19937 rng(3);
  std::vector<pipeline::CostGraph> graphs = {testing::Branches(4, 4), testing::Branches(7, 4),
                                             testing::Chain(12)};
  for (int i = 0; i < 4; ++i) graphs.push_back(testing::RandomSp(rng, 10 + 3 * i));
  for (const auto& g : graphs) {
    for (bool sequential : {false, true}) {
      for (int devices : {4, 8}) {
        auto o = testing::Options(devices, 64);
        o.sequential = sequential;
        o.k_values = {1, 2};
        const StageGraph sg = pipeline::PartitionPipeline(g, o);
        for (auto kind : {ScheduleKind::k1F1B, ScheduleKind::kKFKB, ScheduleKind::kGPipe,
                          ScheduleKind::kGreedy}) {
          SCOPED_TRACE(std::string(pipeline::ScheduleKindName(kind)) + "\n" + sg.ToString(g));
          const auto sched = BuildSchedule(sg, kind);
          const auto res = SimulatePipeline(sg, sched, g, dev);
          EXPECT_GT(res.throughput, 0);
          EXPECT_GE(res.bubble_fraction, 0);
          EXPECT_LT(res.bubble_fraction, 1);
          if (kind == ScheduleKind::kGPipe || kind == ScheduleKind::k1F1B) continue;
          for (const auto& st : sg.stages) {
            // kFkB and greedy hold at most the plan's count (1F1B at most its own, smaller).
            EXPECT_LE(res.stage_peak_in_flight[st.id], st.in_flight)
                << pipeline::ScheduleKindName(kind) << " S" << st.id << "\n"
                << sg.ToString(g);
          }
          if (kind == ScheduleKind::kKFKB) {
            for (int d = 0; d < sg.num_devices; ++d)
              EXPECT_LE(res.device_peak_memory[d], dev.memory_bytes);
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, OneF1BOnAChainMatchesTheClassicFormula) {
  // p equal stages, m micro-batches: iteration = (m + p - 1) (f + b), bubble (p-1)/(m+p-1).
  const auto g = testing::Chain(4, 1e9);
  auto o = testing::Options(4, 16);
  std::vector<Stage> stages(4);
  for (int i = 0; i < 4; ++i) stages[i].blocks = {i}, stages[i].micro_batch = 1;
  pipeline::CostGraph equal = g;
  for (auto& n : equal.nodes) n = testing::Block(n.name, n.inputs, 1e9), n.out_bytes = 0;
  const StageGraph sg = pipeline::BuildStageGraph(equal, o, stages);
  const auto res = SimulatePipeline(sg, BuildSchedule(sg, ScheduleKind::k1F1B), equal,
                                    cost::FindDeviceProfile("a100"));
  const double fb = sg.stages[0].fwd_time + sg.stages[0].bwd_time;
  EXPECT_NEAR(res.iteration_time, (16 + 3) * fb + sg.stages[0].allreduce_time, 1e-9);
  EXPECT_NEAR(res.bubble_fraction, 3.0 / 19.0, 1e-9);
  EXPECT_EQ(res.stage_peak_in_flight[0], 4);
  EXPECT_EQ(res.stage_peak_in_flight[3], 1);
}

TEST(PipelineSchedule, KFkBInFlightFormulaIsSufficientAndTight) {
  // For x -> y, the in-flight count of Table 3.2 lets x run without slowing the pipeline down
  // compared with unbounded memory (GPipe order for x), in every row of the table.
  pipeline::CostGraph g;
  g.nodes = {testing::Block("x", {}, 1e9), testing::Block("y", {0}, 1e9)};
  g.nodes[0].out_bytes = g.nodes[1].out_bytes = 0;
  const auto dev = cost::FindDeviceProfile("a100");
  const std::vector<std::array<int, 4>> cases = {
      {2, 2, 4, 2}, {1, 2, 2, 2}, {4, 1, 2, 2}, {4, 1, 1, 2}, {4, 2, 3, 1},
      {2, 2, 2, 1}, {1, 2, 1, 2}, {2, 2, 2, 2}, {1, 1, 1, 4}, {1, 4, 1, 1}};
  for (const auto& [kx, bx, ky, by] : cases) {
    const StageGraph sg = TwoStages(g, bx, kx, by, ky, 48);
    EXPECT_EQ(sg.stages[1].in_flight, ky * by);
    EXPECT_EQ(sg.stages[0].in_flight, pipeline::ComputeInFlight(kx, bx, ky, by, ky * by));
    const auto kfkb = SimulatePipeline(sg, BuildSchedule(sg, ScheduleKind::kKFKB), g, dev);
    EXPECT_LE(kfkb.stage_peak_in_flight[0], sg.stages[0].in_flight);
    const auto greedy = SimulatePipeline(sg, BuildSchedule(sg, ScheduleKind::kGreedy), g, dev);
    EXPECT_LE(greedy.stage_peak_in_flight[0], sg.stages[0].in_flight)
        << kx << " " << bx << " " << ky << " " << by;
  }
}

TEST(PipelineSchedule, DeadlockingScheduleIsReported) {
  const auto g = testing::Chain(2);
  auto o = testing::Options(2, 4);
  std::vector<Stage> stages(2);
  stages[0].blocks = {0}, stages[1].blocks = {1};
  stages[0].micro_batch = stages[1].micro_batch = 2;
  const StageGraph sg = pipeline::BuildStageGraph(g, o, stages);
  pipeline::Schedule bad;
  // Stage 0 waits for backward 0 before sending forward 1; stage 1 wants forward 1 first.
  bad.per_stage = {{{0, 0, false}, {0, 0, true}, {0, 1, false}, {0, 1, true}},
                   {{1, 0, false}, {1, 1, false}, {1, 0, true}, {1, 1, true}}};
  EXPECT_THROW(SimulatePipeline(sg, bad, g, cost::FindDeviceProfile("a100")), std::runtime_error);
  pipeline::Schedule unordered = bad;
  std::swap(unordered.per_stage[1][0], unordered.per_stage[1][1]);
  EXPECT_THROW(pipeline::CheckStageOrder(sg, unordered), std::invalid_argument);
}

}  // namespace
}  // namespace tp::sim
