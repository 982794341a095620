#include <gtest/gtest.h>

#include "ir/text.h"
#include "passes/pass_manager.h"
#include "test_graphs.h"

namespace tp::passes {
namespace {

using ir::Arg;
using testing::Op;
using testing::Tensor;
using testing::V;

// x -> neg (dead), x -> native_dropout (dead but random), x -> relu (output),
// x -> mylib::log_it (unknown, dead) : only neg may go.
ir::Graph GraphWithDeadNodes() {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), ir::InputKind::kUser);
  b.AddNode(Op("neg", "aten::neg.default", {V(x)}, Tensor({4})));
  ir::NodeSpec drop;
  drop.name = "native_dropout";
  drop.op = "aten::native_dropout.default";
  drop.args = {V(x), Arg::Double(0.1), Arg::Bool(true)};
  drop.output_types = {Tensor({4}), Tensor({4})};
  drop.tuple_output = true;
  b.AddNode(drop);
  auto relu = b.AddNode(Op("relu", "aten::relu.default", {V(x)}, Tensor({4})));
  b.AddNode(Op("log_it", "mylib::log_it.default", {V(x)}, ir::ValueType::None()));
  b.SetOutput(Arg::List({V(b.peek().node(relu).outputs[0])}, true));
  return b.Build();
}

TEST(DeadCodeEliminationTest, DropsOnlyPureDeadNodes) {
  Context ctx;
  PassResult r = DeadCodeElimination(GraphWithDeadNodes(), ctx);
  ASSERT_TRUE(r.changed);
  std::vector<std::string> names;
  for (const auto& n : r.graph.nodes()) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{"native_dropout", "relu", "log_it"}));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0], "removed 1 dead node(s)");
  // Output still points at relu after renumbering.
  EXPECT_EQ(r.graph.value(r.graph.OutputValues()[0]).name, "relu");
}

TEST(DeadCodeEliminationTest, DeadChainRemovedTransitively) {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), ir::InputKind::kUser);
  auto a = b.AddNode(Op("a", "aten::neg.default", {V(x)}, Tensor({4})));
  b.AddNode(Op("b", "aten::exp.default", {V(b.peek().node(a).outputs[0])}, Tensor({4})));
  b.SetOutput(Arg::List({V(x)}, true));
  Context ctx;
  PassResult r = DeadCodeElimination(b.Build(), ctx);
  EXPECT_TRUE(r.changed);
  EXPECT_TRUE(r.graph.nodes().empty());
}

TEST(DeadCodeEliminationTest, UnchangedGraphReportsNoChange) {
  Context ctx;
  PassResult r = DeadCodeElimination(testing::LinearRelu(), ctx);
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(ir::PrintGraph(r.graph), ir::PrintGraph(testing::LinearRelu()));
}

TEST(PassManagerTest, IdentityPipelineVerifiesAndKeepsGraph) {
  Context ctx;
  PassReport report;
  ir::Graph g = PassManager(ctx).Run(testing::LinearRelu(), {}, {}, &report);
  EXPECT_EQ(ir::PrintGraph(g), ir::PrintGraph(testing::LinearRelu()));
  EXPECT_TRUE(report.passes.empty());
}

TEST(PassManagerTest, RunsNamedPassesAndLogs) {
  std::vector<std::string> lines;
  Context ctx;
  ctx.log = [&](const std::string& l) { lines.push_back(l); };
  PassReport report;
  ir::Graph g = PassManager(ctx).Run(GraphWithDeadNodes(), {"dead_code_elimination"}, {}, &report);
  EXPECT_EQ(g.nodes().size(), 3u);
  ASSERT_EQ(report.passes.size(), 1u);
  EXPECT_EQ(report.passes[0].nodes_before, 4);
  EXPECT_EQ(report.passes[0].nodes_after, 3);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("pass dead_code_elimination"), std::string::npos);
}

TEST(PassManagerTest, UnknownPassListsValidOnes) {
  Context ctx;
  try {
    PassManager(ctx).Run(testing::LinearRelu(), {"fuse_everything"}, {});
    FAIL();
  } catch (const PassError& e) {
    EXPECT_EQ(e.pass_name(), "fuse_everything");
    EXPECT_NE(std::string(e.what()).find("rewrites: dead_code_elimination"),
              std::string::npos)
        << e.what();
  }
}

TEST(PassManagerTest, PlanPassesAreListedButNotRunAsRewrites) {
  bool sharding_listed = false;
  for (const auto& p : RegisteredPasses()) sharding_listed |= p.name == "sharding_ilp";
  EXPECT_TRUE(sharding_listed);
  try {
    PassManager().Run(testing::LinearRelu(), {"sharding_ilp"}, {});
    FAIL();
  } catch (const PassError& e) {
    EXPECT_NE(std::string(e.what()).find("planning pass"), std::string::npos) << e.what();
  }
}

TEST(PassManagerTest, MalformedInputNamesNode) {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), ir::InputKind::kUser);
  b.AddNode(Op("bad", "aten::add.Tensor", {V(x), V(9)}, Tensor({4})));
  Context ctx;
  try {
    PassManager(ctx).Run(b.BuildUnverified(), {}, {});
    FAIL();
  } catch (const PassError& e) {
    EXPECT_EQ(e.node(), "bad");
    EXPECT_NE(std::string(e.what()).find("dangling"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tp::passes
