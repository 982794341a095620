// sharding_ilp on a hand-built GPT block (ATen forward as AOTAutograd emits it): the ILP finds
// Megatron's plan, honours pins, and reports the memory an infeasible budget would need.
#include "passes/sharding_ilp.h"

#include <gtest/gtest.h>

#include <iostream>

#include "cost/device_profile.h"
#include "sharding_test_graphs.h"
#include "test_graphs.h"

namespace tp::passes {
namespace {

using ir::ShardSpec;
using testing::GptBlock;
using testing::Op;
using testing::Tensor;
using testing::V;

TEST(ShardingIlp, GptBlockTrainingPicksMegatron) {
  ShardingOptions o;
  o.world = 4;
  o.training = true;
  const ShardingPlan p = PlanSharding(GptBlock(), o);
  EXPECT_EQ(p.status, "optimal");
  // Column-parallel q/k/v and fc1 (weights split by output rows), row-parallel o and fc2.
  for (const char* w : {"attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.fc1.weight"})
    EXPECT_EQ(p.spec.at(w), ShardSpec::S(0)) << w;
  for (const char* w : {"attn.o.weight", "mlp.fc2.weight"})
    EXPECT_EQ(p.spec.at(w), ShardSpec::S(1)) << w;
  EXPECT_EQ(p.strategy.at("attn.q_addmm"), "col");
  EXPECT_EQ(p.strategy.at("mlp.fc1_addmm"), "col");
  EXPECT_EQ(p.strategy.at("attn.o_addmm"), "inner");
  EXPECT_EQ(p.strategy.at("mlp.fc2_addmm"), "inner");
  EXPECT_EQ(p.spec.at("attn"), ShardSpec::S(1));  // attention split by heads
  // Forward traffic per block is Megatron's: one all-reduce's worth after attention and one
  // after the MLP. The ILP prefers the sequence-parallel form of each (reduce-scatter into the
  // residual add, all-gather before the next column-parallel matmul or the output): the same
  // ring volume, and each rank runs 1/N of the residual add.
  double bytes = 0;
  int reduces = 0;
  for (const auto& c : p.collectives) {
    EXPECT_TRUE(c.kind == "all_reduce" || c.kind == "reduce_scatter" || c.kind == "all_gather")
        << c.kind << " of " << c.value;
    if (c.kind != "all_gather") {
      ++reduces;
      EXPECT_TRUE(c.value == "attn.o_addmm" || c.value == "mlp.fc2_addmm") << c.value;
    }
    bytes += c.kind == "all_reduce" ? 2 * c.bytes : c.bytes;
  }
  EXPECT_EQ(reduces, 2);
  const double activation = 8.0 * 128 * 1024 * 4;
  EXPECT_DOUBLE_EQ(bytes, 2 * 2 * activation);
  {  // Pinning Megatron's row-parallel projection costs nothing: it is the optimum itself.
    ShardingOptions o2 = o;
    o2.pinned["attn.o.weight"] = ShardSpec::S(1);
    o2.pinned["attn.o_addmm"] = ShardSpec::P();
    EXPECT_NEAR(PlanSharding(GptBlock(), o2).objective, p.objective, 1e-12);
  }
  std::cout << "GPT block plan: " << p.variables << " variables, " << p.constraints
            << " constraints; collectives:";
  for (const auto& c : p.collectives) std::cout << " " << c.kind << "(" << c.value << ")";
  std::cout << "\n";
  EXPECT_EQ(p.grad_sync_s, 0.0);
}

TEST(ShardingIlp, OneRankReplicatesEverything) {
  ShardingOptions o;
  o.world = 1;
  const ShardingPlan p = PlanSharding(GptBlock(2, 16, 64, 4), o);
  EXPECT_TRUE(p.collectives.empty());
  for (const auto& [name, spec] : p.spec) EXPECT_EQ(spec, ShardSpec::R()) << name;
}

TEST(ShardingIlp, PinsAreHonoured) {
  ShardingOptions o;
  o.world = 4;
  o.pinned["mlp.fc1.weight"] = ShardSpec::R();
  o.pinned["attn.q.weight"] = ShardSpec::S(1);
  const ShardingPlan p = PlanSharding(GptBlock(), o);
  EXPECT_EQ(p.spec.at("mlp.fc1.weight"), ShardSpec::R());
  EXPECT_EQ(p.spec.at("attn.q.weight"), ShardSpec::S(1));
  // The pins cost: the free plan is cheaper.
  ShardingOptions free = o;
  free.pinned.clear();
  EXPECT_LT(PlanSharding(GptBlock(), free).objective, p.objective);
}

TEST(ShardingIlp, BadPinsAreClearErrors) {
  ShardingOptions o;
  o.world = 4;
  o.pinned["mlp.fc9.weight"] = ShardSpec::R();
  try {
    PlanSharding(GptBlock(), o);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find("names no parameter"), std::string::npos);
  }
  o.pinned.clear();
  o.pinned["mlp.fc1.weight"] = ShardSpec::P();
  try {
    PlanSharding(GptBlock(), o);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find("possible: R, S(0), S(1)"), std::string::npos) << e.what();
  }
}

TEST(ShardingIlp, MemoryBudgetForcesShardingAndInfeasibleSaysTheMinimum) {
  const ir::Graph g = GptBlock();
  ShardingOptions o;
  o.world = 4;
  o.training = false;
  // Inference with room for everything: no reason to shard weights for memory; the plan may
  // still shard for compute. With a budget of a quarter of the weights, every weight is split.
  double weight_bytes = 0;
  for (const auto& in : g.inputs())
    if (in.kind == ir::InputKind::kParameter) weight_bytes += *g.type(in.value).tensor.BytesHint();
  o.memory_budget_bytes = weight_bytes / 4 * 1.001;
  const ShardingPlan p = PlanSharding(g, o);
  EXPECT_LE(p.param_bytes_per_rank, o.memory_budget_bytes);
  for (const auto& in : g.inputs()) {
    if (in.kind == ir::InputKind::kParameter && g.type(in.value).tensor.rank() == 2) {
      EXPECT_EQ(p.spec.at(in.source).kind, ShardSpec::Kind::kShard) << in.source;
    }
  }
  o.memory_budget_bytes = weight_bytes / 8;
  try {
    PlanSharding(g, o);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NEAR(e.min_bytes(), weight_bytes / 4, 1.0);
    EXPECT_NE(std::string(e.what()).find("need at least"), std::string::npos);
  }
}

TEST(ShardingIlp, FastLevelTiesRepeatedLayersAndKeepsTheOptimum) {
  const ir::Graph g = GptBlock(8, 128, 1024, 16, /*layers=*/12);
  ShardingOptions o;
  o.world = 4;
  o.level = "exact";
  const ShardingPlan exact = PlanSharding(g, o);
  o.level = "fast";
  const ShardingPlan fast = PlanSharding(g, o);
  EXPECT_EQ(exact.level, "exact");
  EXPECT_EQ(fast.level, "fast");
  // Twelve repeats collapse to about one layer's worth of decision units (the first and last
  // layers differ near the graph's ends).
  EXPECT_LT(fast.classes * 2, exact.classes);
  EXPECT_LT(fast.variables * 2, exact.variables);
  EXPECT_NEAR(fast.fastest_objective, exact.fastest_objective,
              1e-9 + 1e-6 * exact.fastest_objective);
  // Every layer runs Megatron's plan.
  for (int l = 0; l < 12; ++l) {
    const std::string p = "l" + std::to_string(l) + ".";
    EXPECT_EQ(fast.strategy.at(p + "attn.q_addmm"), "col") << p;
    EXPECT_EQ(fast.strategy.at(p + "mlp.fc2_addmm"), "inner") << p;
  }
  o.level = "coarse";
  EXPECT_THROW(PlanSharding(g, o), ShardingError);
}

// Training keeps activations for the backward: they count against the budget under each node's
// strategy. A budget that only the parameters would fit (activations ignored) is honoured with
// them counted, and an impossible one names both minima.
TEST(ShardingIlp, TrainingBudgetCountsSavedActivations) {
  const ir::Graph g = GptBlock();
  ShardingOptions o;
  o.world = 4;
  o.training = true;
  const ShardingPlan free = PlanSharding(g, o);
  EXPECT_GT(free.activation_bytes_per_rank, 0);
  ShardingOptions ignore = o;
  ignore.activation_bytes_factor = 0;
  const ShardingPlan blind = PlanSharding(g, ignore);
  EXPECT_EQ(blind.activation_bytes_per_rank, 0);
  EXPECT_NEAR(blind.objective, free.objective, 1e-9);
  const auto total = [&](const ShardingPlan& p) {
    return p.state_bytes_per_rank + p.activation_bytes_per_rank;
  };
  EXPECT_NEAR(free.state_bytes_per_rank, o.state_bytes_factor * free.param_bytes_per_rank, 1.0);
  // 95% of what the unconstrained plan needs: blind to activations, the ILP keeps that plan (its
  // parameters fit) and overflows the budget; counting them, it trades modelled time for
  // activation memory and fits.
  o.memory_budget_bytes = 0.95 * total(free);
  ignore.memory_budget_bytes = o.memory_budget_bytes;
  EXPECT_NEAR(PlanSharding(g, ignore).objective, free.objective, 1e-9);
  const ShardingPlan tight = PlanSharding(g, o);
  EXPECT_LE(total(tight), o.memory_budget_bytes * (1 + 1e-9));
  EXPECT_LT(tight.activation_bytes_per_rank, free.activation_bytes_per_rank);
  EXPECT_GT(tight.objective, free.objective);
  o.memory_budget_bytes = 1.0;
  try {
    PlanSharding(g, o);
    FAIL();
  } catch (const ShardingError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("activations kept for the backward at least"), std::string::npos) << what;
    ignore.memory_budget_bytes = 1.0;
    try {
      PlanSharding(g, ignore);
      FAIL();
    } catch (const ShardingError& params_only) {
      EXPECT_GT(e.min_bytes(), params_only.min_bytes());  // the activations' least share
    }
  }
}

// Data parallelism and ZeRO-1 in the same ILP: dp replicas of a one-rank (pure DP) GPT block.
// Unconstrained, every block's gradient is all-reduced over dp and no optimizer state is
// sharded (it would only add an all-gather). Under a budget the whole state no longer fits,
// the ILP shards just enough of it; below ZeRO-1's minimum it says so; without ZeRO it fails.
TEST(ShardingIlp, ZeroShardsOptimizerStateOnlyWhereMemoryNeedsIt) {
  const ir::Graph g = GptBlock(2, 128, 1024, 16);
  ShardingOptions o;
  o.world = 1;
  o.dp = 4;
  o.activation_bytes_factor = 0;
  o.memory_slack = 0;  // the time objective under a budget
  double weight_bytes = 0, sync = 0;
  const cost::DeviceProfile& d = cost::FindDeviceProfile(o.device);
  for (const auto& in : g.inputs()) {
    if (in.kind != ir::InputKind::kParameter) continue;
    const double b = static_cast<double>(*g.type(in.value).tensor.BytesHint());
    weight_bytes += b;
    sync += cost::AllReduceTime(d, b, 4);
  }
  const ShardingPlan free = PlanSharding(g, o);
  EXPECT_TRUE(free.zero_copies.empty());
  EXPECT_EQ(free.zero_gather_s, 0.0);
  EXPECT_NEAR(free.state_bytes_per_rank, 4 * weight_bytes, 1.0);
  EXPECT_NEAR(free.grad_sync_s, sync, 1e-12);  // every block, over the 4 replicas
  // A budget 3.2 bytes of state per weight byte: 4 without ZeRO, 2.5 with all of it sharded.
  o.memory_budget_bytes = 3.2 * weight_bytes;
  const ShardingPlan tight = PlanSharding(g, o);
  EXPECT_LE(tight.state_bytes_per_rank, o.memory_budget_bytes * (1 + 1e-9));
  EXPECT_FALSE(tight.zero_copies.empty());
  double zeroed = 0;
  for (const auto& in : g.inputs()) {
    auto it = tight.zero_copies.find(in.source);
    if (it == tight.zero_copies.end()) continue;
    EXPECT_EQ(it->second, 4) << in.source;
    zeroed += static_cast<double>(*g.type(in.value).tensor.BytesHint());
  }
  EXPECT_GE(zeroed, (4 - 3.2) / 1.5 * weight_bytes * (1 - 1e-9));  // enough, ...
  EXPECT_LT(zeroed, weight_bytes);                                 // ... and not everything
  EXPECT_NEAR(tight.state_bytes_per_rank, 4 * weight_bytes - 1.5 * zeroed, 1.0);
  EXPECT_GT(tight.zero_gather_s, 0);
  EXPECT_NEAR(tight.objective, free.objective + tight.zero_gather_s, 1e-9);
  o.memory_budget_bytes = 2.4 * weight_bytes;
  try {
    PlanSharding(g, o);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NEAR(e.min_bytes(), 2.5 * weight_bytes, 1.0);
    EXPECT_NE(std::string(e.what()).find("ZeRO-1"), std::string::npos) << e.what();
  }
  o.memory_budget_bytes = 3.2 * weight_bytes;
  o.max_zero_stage = 0;
  EXPECT_THROW(PlanSharding(g, o), ShardingError);
  o.max_zero_stage = 3;
  EXPECT_THROW(PlanSharding(g, o), ShardingError);
  // ZeRO-2 also shards the gradient over dp: 1 + 3/4 bytes per weight byte at the least, so a
  // budget under ZeRO-1's least (2.5) fits, with stage 2 where it is needed.
  o.max_zero_stage = 2;
  o.memory_budget_bytes = 2.4 * weight_bytes;
  const ShardingPlan z2 = PlanSharding(g, o);
  EXPECT_LE(z2.state_bytes_per_rank, o.memory_budget_bytes * (1 + 1e-9));
  int stage2 = 0;
  for (const auto& [name, stage] : z2.zero_stage) {
    stage2 += stage == 2;
    EXPECT_EQ(z2.zero_copies.at(name), 4) << name;
  }
  EXPECT_GT(stage2, 0);
  EXPECT_NEAR(z2.objective, free.objective + z2.zero_gather_s, 1e-9);
  o.memory_budget_bytes = 1.7 * weight_bytes;
  try {
    PlanSharding(g, o);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NEAR(e.min_bytes(), 1.75 * weight_bytes, 1.0);
    EXPECT_NE(std::string(e.what()).find("ZeRO-1/2"), std::string::npos) << e.what();
  }
}

// On a (dp, tp) mesh the gradient of every block is summed over dp too, and ZeRO spreads a
// tp-replicated block's state over all dp x tp copies, a tp-sharded one's over dp.
TEST(ShardingIlp, DpAxisSyncsEveryBlockAndZeroCountsCopies) {
  const ir::Graph g = GptBlock(2, 128, 1024, 16);
  ShardingOptions o;
  o.world = 2;
  o.dp = 2;
  o.activation_bytes_factor = 0;
  const ShardingPlan p = PlanSharding(g, o);
  const cost::DeviceProfile& d = cost::FindDeviceProfile(o.device);
  double sync = 0, state = 0;
  for (const auto& in : g.inputs()) {
    if (in.kind != ir::InputKind::kParameter) continue;
    const double b = static_cast<double>(*g.type(in.value).tensor.BytesHint());
    const bool sharded = p.spec.at(in.source).kind == ShardSpec::Kind::kShard;
    sync += cost::AllReduceTime(d, sharded ? b / 2 : b, 2) +
            (sharded ? 0 : cost::AllReduceTime(d, b, 2));
    state += 4 * (sharded ? b / 2 : b);
  }
  EXPECT_NEAR(p.grad_sync_s, sync, 1e-12);
  EXPECT_NEAR(p.state_bytes_per_rank, state, 1.0);
  o.memory_budget_bytes = 0.8 * state;
  const ShardingPlan z = PlanSharding(g, o);
  EXPECT_LE(z.state_bytes_per_rank, o.memory_budget_bytes * (1 + 1e-9));
  ASSERT_FALSE(z.zero_copies.empty());
  for (const auto& [name, copies] : z.zero_copies)
    EXPECT_EQ(copies, z.spec.at(name).kind == ShardSpec::Kind::kShard ? 2 : 4) << name;
}

TEST(ShardingIlp, InfeasibleMinimumRespectsPins) {
  // Pinning every parameter replicated (pure data parallelism): the minimum is all of them.
  const ir::Graph g = GptBlock(2, 16, 64, 4);
  ShardingOptions o;
  o.world = 4;
  o.training = false;
  double weight_bytes = 0;
  for (const auto& in : g.inputs()) {
    if (in.kind != ir::InputKind::kParameter) continue;
    weight_bytes += *g.type(in.value).tensor.BytesHint();
    o.pinned[in.source] = ShardSpec::R();
  }
  o.memory_budget_bytes = weight_bytes / 2;
  try {
    PlanSharding(g, o);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NEAR(e.min_bytes(), weight_bytes, 1.0);
    EXPECT_NE(std::string(e.what()).find("pin less"), std::string::npos) << e.what();
  }
}

// Brute force over every assignment of a tiny graph (each entity's strategies have distinct
// output specs, so pinning every output fixes the whole assignment): the ILP's optimum is the
// least of them.
TEST(ShardingIlp, EqualsBruteForceOnATinyGraph) {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({8, 16}), ir::InputKind::kUser);
  auto w = b.AddInput("w", Tensor({32, 16}), ir::InputKind::kParameter, "w");
  auto out0 = [&](ir::NodeId n) { return b.peek().node(n).outputs[0]; };
  auto t = out0(b.AddNode(Op("t", "aten::t.default", {V(w)}, Tensor({16, 32}))));
  auto mm = out0(b.AddNode(Op("mm", "aten::mm.default", {V(x), V(t)}, Tensor({8, 32}))));
  auto relu = out0(b.AddNode(Op("relu", "aten::relu.default", {V(mm)}, Tensor({8, 32}))));
  b.SetOutput(ir::Arg::List({V(relu)}, /*tuple=*/true));
  const ir::Graph g = b.Build();
  for (bool training : {false, true}) {
    ShardingOptions o;
    o.world = 2;
    o.training = training;
    o.device = "cpu";
    const ShardingPlan plan = PlanSharding(g, o);
    const double best = plan.fastest_objective;
    const std::vector<ShardSpec> xs = {ShardSpec::R(), ShardSpec::S(0), ShardSpec::S(1)};
    const std::vector<ShardSpec> four = {ShardSpec::R(), ShardSpec::S(0), ShardSpec::S(1),
                                         ShardSpec::P()};
    double brute = 1e30;
    int tried = 0;
    std::vector<std::pair<double, double>> time_state;  // every assignment's
    for (const auto& sx : xs)
      for (const auto& sw : xs)
        for (const auto& st : four)
          for (const auto& smm : four)
            for (const auto& sr : xs) {
              o.pinned = {{"x", sx}, {"w", sw}, {"t", st}, {"mm", smm}, {"relu", sr}};
              try {
                const ShardingPlan p = PlanSharding(g, o);
                brute = std::min(brute, p.objective);
                time_state.push_back({p.objective, p.state_bytes_per_rank});
                ++tried;
              } catch (const ShardingError&) {
                // a spec no rule offers for that node (e.g. relu cannot take P)
              }
            }
    EXPECT_GT(tried, 100);
    EXPECT_NEAR(best, brute, 1e-12 + 1e-9 * brute) << "training=" << training;
    // The second stage: the least time + state, each relative to the fastest plan's, among
    // assignments within the slack of the fastest.
    ShardingOptions fastest_only = o;
    fastest_only.pinned.clear();
    fastest_only.memory_slack = 0;
    const double s0 = PlanSharding(g, fastest_only).state_bytes_per_rank;
    auto score = [&](double t, double st) { return t / brute + st / s0; };
    double least = 1e30;
    for (const auto& [t, st] : time_state)
      if (t <= brute * (1 + o.memory_slack) * (1 + 1e-9)) least = std::min(least, score(t, st));
    EXPECT_NEAR(score(plan.objective, plan.state_bytes_per_rank), least, 1e-9)
        << "training=" << training;
    EXPECT_LE(plan.objective, brute * (1 + o.memory_slack) * (1 + 1e-9));
    // Training (state = 4 x the weight), halving the weight is worth its 10% slower step.
    if (training) {
      EXPECT_NEAR(plan.state_bytes_per_rank, s0 / 2, 1e-9);
    }
  }
}

// The fast level against brute force: two identical branches (x @ w_a, x @ w_b, each a graph
// output) tie their weights and matmuls into shared variables; the tied optimum equals the
// best of every untied assignment (the branches' costs are separable, so a symmetric optimum
// exists).
TEST(ShardingIlp, FastLevelEqualsBruteForceOnTiedBranches) {
  ir::GraphBuilder b;
  auto out0 = [&](ir::NodeId n) { return b.peek().node(n).outputs[0]; };
  auto x = b.AddInput("x", Tensor({8, 16}), ir::InputKind::kUser);
  auto wa = b.AddInput("w_a", Tensor({16, 32}), ir::InputKind::kParameter, "w_a");
  auto wb = b.AddInput("w_b", Tensor({16, 32}), ir::InputKind::kParameter, "w_b");
  auto ma = out0(b.AddNode(Op("mm_a", "aten::mm.default", {V(x), V(wa)}, Tensor({8, 32}))));
  auto mb = out0(b.AddNode(Op("mm_b", "aten::mm.default", {V(x), V(wb)}, Tensor({8, 32}))));
  b.SetOutput(ir::Arg::List({V(ma), V(mb)}, /*tuple=*/true));
  const ir::Graph g = b.Build();
  ShardingOptions o;
  o.world = 2;
  o.device = "cpu";
  o.level = "exact";
  const ShardingPlan exact = PlanSharding(g, o);
  o.level = "fast";
  const ShardingPlan fast = PlanSharding(g, o);
  EXPECT_LT(fast.classes, exact.classes);  // w_a ~ w_b and mm_a ~ mm_b share variables
  EXPECT_EQ(fast.spec.at("w_a"), fast.spec.at("w_b"));
  o.level = "exact";
  const std::vector<ShardSpec> three = {ShardSpec::R(), ShardSpec::S(0), ShardSpec::S(1)};
  const std::vector<ShardSpec> four = {ShardSpec::R(), ShardSpec::S(0), ShardSpec::S(1),
                                       ShardSpec::P()};
  double brute = 1e30;
  int tried = 0;
  for (const auto& sx : three)
    for (const auto& sa : three)
      for (const auto& sb : three)
        for (const auto& ma_spec : four)
          for (const auto& mb_spec : four) {
            o.pinned = {{"x", sx}, {"w_a", sa}, {"w_b", sb}, {"mm_a", ma_spec}, {"mm_b", mb_spec}};
            try {
              brute = std::min(brute, PlanSharding(g, o).objective);
              ++tried;
            } catch (const ShardingError&) {
            }
          }
  EXPECT_GT(tried, 100);
  EXPECT_NEAR(fast.fastest_objective, brute, 1e-12 + 1e-9 * brute);
  EXPECT_NEAR(exact.fastest_objective, brute, 1e-12 + 1e-9 * brute);
}

TEST(ShardingIlp, FixedStrategiesReadThePlanOffAtAnotherSize) {
  // A plan's strategies, input specs and ZeRO stages fixed: on the same graph no ILP is solved
  // (status "fixed") and the plan is priced as the ILP priced it; on the block at another batch
  // and sequence, the same choices.
  const ir::Graph g = GptBlock(2, 32, 256, 4);
  ShardingOptions o;
  o.world = 2;
  o.dp = 2;
  o.activation_bytes_factor = 0;
  const ShardingPlan whole = PlanSharding(g, o);
  o.memory_budget_bytes = 0.8 * whole.state_bytes_per_rank;
  const ShardingPlan p = PlanSharding(g, o);
  ASSERT_FALSE(p.zero_stage.empty());  // the budget needs ZeRO: its stages are fixed too
  ShardingOptions f = o;
  f.fixed_strategies = p.strategy;
  for (const auto& in : g.inputs()) {
    const std::string& name = g.value(in.value).name;
    f.fixed_strategies[name] = p.spec.at(in.source.empty() ? name : in.source).ToString();
  }
  f.fixed_zero = p.zero_stage;
  const ShardingPlan same = PlanSharding(g, f);
  EXPECT_EQ(same.status, "fixed");
  EXPECT_EQ(same.variables, 0);
  EXPECT_NEAR(same.objective, p.objective, 1e-12 + 1e-9 * p.objective);
  EXPECT_NEAR(same.state_bytes_per_rank, p.state_bytes_per_rank, 1.0);
  EXPECT_EQ(same.collectives.size(), p.collectives.size());
  f.memory_budget_bytes = 0;
  const ShardingPlan q = PlanSharding(GptBlock(3, 48, 256, 4), f);
  EXPECT_EQ(q.status, "fixed");
  EXPECT_EQ(q.strategy, p.strategy);
  EXPECT_EQ(q.zero_stage, p.zero_stage);
  for (const auto& [name, spec] : p.spec) EXPECT_EQ(q.spec.at(name), spec) << name;
  EXPECT_GT(q.objective, p.objective);  // more tokens
  // A budget the fixed choices exceed is an error, not a silent plan.
  f.memory_budget_bytes = 0.99 * p.state_bytes_per_rank;
  EXPECT_THROW(PlanSharding(g, f), ShardingError);
}

TEST(ShardingIlp, FixedStrategiesLeaveWhatTheySayNothingOfToTheIlp) {
  const ir::Graph g = GptBlock(2, 32, 256, 4);
  ShardingOptions o;
  o.world = 2;
  const ShardingPlan p = PlanSharding(g, o);
  ShardingOptions f = o;
  f.fixed_strategies = p.strategy;
  // One node moved off the optimum, a name this graph lacks, and a strategy name no rule has:
  // the first binds, the others are ignored, and the ILP solves the rest (inputs are free).
  const std::string moved = "mlp.fc1_addmm";
  ASSERT_EQ(p.strategy.at(moved), "col");
  f.fixed_strategies[moved] = "replicate";
  f.fixed_strategies["no_such_node"] = "col";
  f.fixed_strategies["mlp.fc2_addmm"] = "no_such_strategy";
  const ShardingPlan q = PlanSharding(g, f);
  EXPECT_NE(q.status, "fixed");
  EXPECT_GT(q.variables, 0);
  EXPECT_EQ(q.strategy.at(moved), "replicate");
  EXPECT_GE(q.objective, p.objective);
}

}  // namespace
}  // namespace tp::passes
