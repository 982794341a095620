// sharding_materialize on the hand-built GPT block: the Megatron plan becomes a graph with local
// parameter blocks, per-rank head counts in the views, one reshard per planned collective, and
// the gradient plumbing of training.
#include "passes/sharding_materialize.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "sharding_test_graphs.h"
#include "test_graphs.h"

namespace tp::passes {
namespace {

using ir::ShardSpec;
using testing::GptBlock;
using testing::Op;
using testing::Tensor;
using testing::V;

const ir::Node* FindNode(const ir::Graph& g, const std::string& name) {
  for (const auto& n : g.nodes())
    if (n.name == name) return &n;
  return nullptr;
}

std::vector<int64_t> Shape(const ir::Graph& g, ir::ValueId v) {
  std::vector<int64_t> out;
  for (const auto& d : g.type(v).tensor.shape) out.push_back(d.value);
  return out;
}

TEST(ShardingMaterialize, MegatronBlockBecomesLocalProgram) {
  const int64_t B = 2, S = 16, E = 64, H = 4, world = 4;
  const ir::Graph g = GptBlock(B, S, E, H);
  ShardingOptions o;
  o.world = world;
  const ShardingPlan plan = PlanSharding(g, o);
  ASSERT_EQ(plan.strategy.at("attn.q_addmm"), "col");
  MaterializeOptions mo;
  mo.world = world;
  mo.group = 7;
  MaterializeStats stats;
  const ir::Graph local = MaterializeSharding(g, plan, mo, &stats);

  // Parameters arrive as local blocks; replicated ones go through grad_sync.
  int grad_syncs = 0;
  for (const auto& in : local.inputs()) {
    if (in.kind != ir::InputKind::kParameter) continue;
    const ShardSpec spec = plan.spec.at(in.source);
    std::vector<int64_t> whole;
    for (const auto& gi : g.inputs())
      if (gi.source == in.source) whole = Shape(g, gi.value);
    std::vector<int64_t> expect = whole;
    if (spec.kind == ShardSpec::Kind::kShard) expect[static_cast<size_t>(spec.dim)] /= world;
    EXPECT_EQ(Shape(local, in.value), expect) << in.source;
    grad_syncs += spec.kind == ShardSpec::Kind::kReplicate;
  }
  EXPECT_EQ(stats.grad_syncs, grad_syncs);
  // One bucket: a single grad_sync node carries every replicated parameter.
  int sync_nodes = 0;
  for (const auto& n : local.nodes()) {
    if (n.op != "torch_plugin::grad_sync.default") continue;
    ++sync_nodes;
    EXPECT_EQ(static_cast<int>(n.outputs.size()), grad_syncs);
    EXPECT_TRUE(n.tuple_output);
  }
  EXPECT_EQ(sync_nodes, grad_syncs > 0 ? 1 : 0);

  // Every planned forward collective is one reshard node with the planned specs.
  std::multiset<std::string> planned, built;
  for (const auto& c : plan.collectives) planned.insert(c.from.ToString() + "->" + c.to.ToString());
  int group_ok = 0;
  for (const auto& n : local.nodes()) {
    if (n.op != "torch_plugin::reshard.default") continue;
    const std::string from = n.args[1].s, to = n.args[2].s;
    group_ok += n.args[3].i == 7;
    // Local slices and zero-pads are free, so the plan lists no collective for them.
    if (from == "R" || (to == "P" && from != "P")) continue;
    built.insert(from + "->" + to);
  }
  EXPECT_EQ(built, planned);
  EXPECT_EQ(group_ok, stats.reshards);

  // Heads are split: the q view is [B, S, H/world, D] on each rank.
  const ir::Node* qview = FindNode(local, "q_view");
  ASSERT_NE(qview, nullptr);
  EXPECT_EQ(qview->args[1].items[2].i, H / world);
  EXPECT_EQ(Shape(local, qview->outputs[0]), (std::vector<int64_t>{B, S, H / world, E / H}));
  EXPECT_GE(stats.views_rewritten, 4);

  // The output is replicated and its gradient seed scaled.
  const auto outs = local.OutputValues();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(local.node(local.value(outs[0]).producer).op,
            "torch_plugin::replicated_output.default");
  EXPECT_EQ(Shape(local, outs[0]), (std::vector<int64_t>{B * S, E}));
}

TEST(ShardingMaterialize, InferenceAndOneRankAddNoGradientPlumbing) {
  const ir::Graph g = GptBlock(2, 16, 64, 4);
  ShardingOptions o;
  o.world = 1;
  MaterializeOptions mo;
  mo.world = 1;
  const ir::Graph one = MaterializeSharding(g, PlanSharding(g, o), mo);
  EXPECT_EQ(one.nodes().size(), g.nodes().size());

  o.world = 2;
  o.training = false;
  mo.world = 2;
  mo.training = false;
  MaterializeStats stats;
  const ir::Graph inf = MaterializeSharding(g, PlanSharding(g, o), mo, &stats);
  EXPECT_EQ(stats.grad_syncs, 0);
  for (const auto& n : inf.nodes()) {
    EXPECT_NE(n.op, "torch_plugin::grad_sync.default");
    EXPECT_NE(n.op, "torch_plugin::replicated_output.default");
  }
}

TEST(ShardingMaterialize, ReshardsAreSharedByConsumers) {
  // x feeds two column-parallel matmuls pinned so x must be gathered once for both.
  ir::GraphBuilder b;
  auto out0 = [&](ir::NodeId n) { return b.peek().node(n).outputs[0]; };
  auto x = b.AddInput("x", Tensor({8, 16}), ir::InputKind::kUser);
  auto relu = out0(b.AddNode(Op("relu", "aten::relu.default", {V(x)}, Tensor({8, 16}))));
  auto w1 = b.AddInput("w1", Tensor({16, 32}), ir::InputKind::kParameter, "w1");
  auto w2 = b.AddInput("w2", Tensor({16, 32}), ir::InputKind::kParameter, "w2");
  auto m1 = out0(b.AddNode(Op("m1", "aten::mm.default", {V(relu), V(w1)}, Tensor({8, 32}))));
  auto m2 = out0(b.AddNode(Op("m2", "aten::mm.default", {V(relu), V(w2)}, Tensor({8, 32}))));
  auto sum = out0(b.AddNode(Op("sum", "aten::add.Tensor", {V(m1), V(m2)}, Tensor({8, 32}))));
  b.SetOutput(ir::Arg::List({V(sum)}, /*tuple=*/true));
  const ir::Graph g = b.Build();
  ShardingPlan plan;
  plan.spec["w1"] = plan.spec["w2"] = ShardSpec::S(1);
  plan.chosen["relu"] = {"dim0", {ShardSpec::S(0)}, {ShardSpec::S(0)}, 0.5};
  plan.chosen["m1"] = {"col", {ShardSpec::R(), ShardSpec::S(1)}, {ShardSpec::S(1)}, 0.5};
  plan.chosen["m2"] = {"col", {ShardSpec::R(), ShardSpec::S(1)}, {ShardSpec::S(1)}, 0.5};
  plan.chosen["sum"] = {"dim1", {ShardSpec::S(1), ShardSpec::S(1)}, {ShardSpec::S(1)}, 0.5};
  MaterializeOptions mo;
  mo.world = 2;
  MaterializeStats stats;
  const ir::Graph local = MaterializeSharding(g, plan, mo, &stats);
  // x: R -> S(0) slice for relu; relu: S(0) -> R once for both matmuls; sum: S(1) -> R output.
  EXPECT_EQ(stats.reshards, 3);
  EXPECT_EQ(Shape(local, FindNode(local, "relu")->outputs[0]), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(Shape(local, FindNode(local, "m1")->outputs[0]), (std::vector<int64_t>{8, 16}));
}

// A vocabulary-parallel embedding becomes vocab_embedding(weight block, indices, padding_idx,
// group), its partial output summed once where a replicated consumer needs it.
TEST(ShardingMaterialize, VocabularyParallelEmbedding) {
  ir::GraphBuilder b;
  auto out0 = [&](ir::NodeId n) { return b.peek().node(n).outputs[0]; };
  auto w = b.AddInput("wte", Tensor({1000, 64}), ir::InputKind::kParameter, "wte.weight");
  ir::ValueType idx_t = Tensor({4, 16});
  idx_t.tensor.dtype = ir::DType::kInt64;
  auto idx = b.AddInput("idx", idx_t, ir::InputKind::kUser);
  auto emb = out0(b.AddNode(
      Op("emb", "aten::embedding.default", {V(w), V(idx), ir::Arg::Int(3)}, Tensor({4, 16, 64}))));
  auto relu = out0(b.AddNode(Op("relu", "aten::relu.default", {V(emb)}, Tensor({4, 16, 64}))));
  b.SetOutput(ir::Arg::List({V(relu)}, /*tuple=*/true));
  const ir::Graph g = b.Build();
  ShardingOptions o;
  o.world = 2;
  o.pinned["wte.weight"] = ShardSpec::S(0);
  o.pinned["emb"] = ShardSpec::P();  // (gathering the rows and looking up whole is cheaper here)
  const ShardingPlan plan = PlanSharding(g, o);
  EXPECT_EQ(plan.strategy.at("emb"), "vocab");
  EXPECT_EQ(plan.spec.at("emb"), ShardSpec::P());
  MaterializeOptions mo;
  mo.world = 2, mo.group = 7;
  MaterializeStats stats;
  const ir::Graph local = MaterializeSharding(g, plan, mo, &stats);
  const ir::Node* e = FindNode(local, "emb");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->op, "torch_plugin::vocab_embedding.default");
  ASSERT_EQ(e->args.size(), 4u);
  EXPECT_EQ(Shape(local, e->args[0].value()), (std::vector<int64_t>{500, 64}));
  EXPECT_EQ(e->args[2].i, 3);  // padding_idx kept: the kernel shifts it per rank
  EXPECT_EQ(e->args[3].i, 7);
  EXPECT_EQ(Shape(local, e->outputs[0]), (std::vector<int64_t>{4, 16, 64}));
  // The partial sum meets one all-reduce (or reduce-scatter) before the elementwise consumer
  // or the output.
  int reduces = 0;
  for (const auto& c : plan.collectives) reduces += c.from.kind == ShardSpec::Kind::kPartial;
  EXPECT_EQ(reduces, 1);
  // sparse or frequency-scaled lookups have no vocabulary-parallel form: a clear error.
  ir::GraphBuilder b2;
  auto w2 = b2.AddInput("wte", Tensor({1000, 64}), ir::InputKind::kParameter, "wte.weight");
  auto idx2 = b2.AddInput("idx", idx_t, ir::InputKind::kUser);
  b2.AddNode(Op("emb", "aten::embedding.default",
                {V(w2), V(idx2), ir::Arg::Int(-1), ir::Arg::Bool(true)}, Tensor({4, 16, 64})));
  b2.SetOutput(ir::Arg::List({V(b2.peek().node(0).outputs[0])}, /*tuple=*/true));
  const ir::Graph g2 = b2.Build();
  const ShardingPlan plan2 = PlanSharding(g2, o);
  try {
    MaterializeSharding(g2, plan2, mo);
    FAIL();
  } catch (const ShardingError& err) {
    EXPECT_NE(std::string(err.what()).find("node 'emb'"), std::string::npos) << err.what();
  }
}

TEST(ShardingMaterialize, PlanThatDoesNotFitIsAClearError) {
  const ir::Graph g = testing::LinearRelu();
  ShardingPlan plan;
  plan.chosen["addmm"] = {"col", {ShardSpec::R()}, {ShardSpec::S(1)}, 0.5};  // 1 spec, 3 inputs
  MaterializeOptions mo;
  mo.world = 2;
  try {
    MaterializeSharding(g, plan, mo);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'addmm'"), std::string::npos) << e.what();
  }
  // A view whose sharded size is symbolic cannot be localised.
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({8, 16}), ir::InputKind::kUser);
  ir::Arg sym = ir::Arg::Value(b.AddInput("s0", ir::ValueType{}, ir::InputKind::kSymbol));
  b.AddNode(Op("v", "aten::view.default", {V(x), ir::Arg::List({sym, ir::Arg::Int(16)})},
               Tensor({8, 16})));
  b.SetOutput(ir::Arg::List({V(b.peek().node(0).outputs[0])}, /*tuple=*/true));
  const ir::Graph gv = b.Build();
  ShardingPlan pv;
  pv.chosen["v"] = {"dim0", {ShardSpec::S(0)}, {ShardSpec::S(0)}, 1.0};
  try {
    MaterializeSharding(gv, pv, mo);
    FAIL();
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tp::passes
