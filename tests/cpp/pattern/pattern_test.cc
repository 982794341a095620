#include "pattern/pattern.h"

#include <gtest/gtest.h>

#include "pattern/backend_rules.h"
#include "pattern/candidates.h"
#include "test_graphs.h"

namespace tp::pattern {
namespace {

using testing::Op;
using testing::Tensor;
using testing::V;

ir::ValueId Out(const ir::GraphBuilder& b, ir::NodeId n) { return b.peek().node(n).outputs[0]; }

// x -> mm(x, w) -> add(., bias) -> relu -> mul(., x2) ; a diamond: relu feeds both a sigmoid
// and the mul, whose other operand is the sigmoid: out = relu * sigmoid(relu).
ir::Graph MatmulChain() {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4, 8}), ir::InputKind::kUser);
  auto w = b.AddInput("w", Tensor({8, 8}), ir::InputKind::kParameter, "w");
  auto bias = b.AddInput("b", Tensor({8}), ir::InputKind::kParameter, "b");
  auto mm = b.AddNode(Op("mm", "aten::mm.default", {V(x), V(w)}, Tensor({4, 8})));
  auto add = b.AddNode(Op("add", "aten::add.Tensor", {V(Out(b, mm)), V(bias)}, Tensor({4, 8})));
  auto relu = b.AddNode(Op("relu", "aten::relu.default", {V(Out(b, add))}, Tensor({4, 8})));
  auto sig = b.AddNode(Op("sig", "aten::sigmoid.default", {V(Out(b, relu))}, Tensor({4, 8})));
  auto mul =
      b.AddNode(Op("mul", "aten::mul.Tensor", {V(Out(b, relu)), V(Out(b, sig))}, Tensor({4, 8})));
  b.SetOutput(ir::Arg::List({V(Out(b, mul))}, true));
  return b.Build();
}

TEST(PatternMatcher, OpNamesMatchAnyOverloadOrExactlyOne) {
  auto g = MatmulChain();
  Matcher m(g);
  EXPECT_TRUE(m.MatchAt(IsOp({"aten::add"}), 1));
  EXPECT_TRUE(m.MatchAt(IsOp({"aten::add.Tensor"}), 1));
  EXPECT_FALSE(m.MatchAt(IsOp({"aten::add.Scalar"}), 1));
  EXPECT_FALSE(m.MatchAt(IsOp({"aten::mm"}), 1));
  EXPECT_EQ(m.MatchAll(IsOpClass({ir::OpClass::kElementwise})).size(), 4u);
}

TEST(PatternMatcher, InputsAndWildcardsCoverOnlyOpNodes) {
  auto g = MatmulChain();
  Matcher m(g);
  auto p = IsOp({"aten::relu"}, {IsOp({"aten::add"}, {IsOp({"aten::mm"}), Wildcard()})});
  auto match = m.MatchAt(p, 2);
  ASSERT_TRUE(match);
  EXPECT_EQ(match->nodes, (std::vector<ir::NodeId>{0, 1, 2}));
  // The add's second operand is a graph input, not an mm.
  EXPECT_FALSE(m.MatchAt(IsOp({"aten::add"}, {Wildcard(), IsOp({"aten::mm"})}), 1));
}

TEST(PatternMatcher, SharedSubPatternBindsOneNode) {
  auto g = MatmulChain();
  Matcher m(g);
  auto relu = IsOp({"aten::relu"});
  // mul(relu, sigmoid(relu)) with the same relu on both sides: a diamond.
  auto diamond = IsOp({"aten::mul"}, {relu, IsOp({"aten::sigmoid"}, {relu})});
  auto match = m.MatchAt(diamond, 4);
  ASSERT_TRUE(match);
  EXPECT_EQ(match->nodes, (std::vector<ir::NodeId>{2, 3, 4}));
  // Two distinct relu patterns cannot both cover the one relu node.
  auto two =
      IsOp({"aten::mul"}, {IsOp({"aten::relu"}), IsOp({"aten::sigmoid"}, {IsOp({"aten::relu"})})});
  EXPECT_FALSE(m.MatchAt(two, 4));
}

TEST(PatternMatcher, AltAttrDtypeAndRank) {
  auto g = MatmulChain();
  Matcher m(g);
  auto act = Alt({IsOp({"aten::gelu"}), IsOp({"aten::relu"})});
  EXPECT_TRUE(m.MatchAt(act, 2));
  EXPECT_FALSE(m.MatchAt(act, 3));
  EXPECT_TRUE(m.MatchAt(HasDType(IsOp({"aten::mm"}), {ir::DType::kFloat32}), 0));
  EXPECT_FALSE(m.MatchAt(HasDType(IsOp({"aten::mm"}), {ir::DType::kBFloat16}), 0));
  EXPECT_TRUE(m.MatchAt(HasRank(IsOp({"aten::mm"}), 2, 2), 0));
  EXPECT_FALSE(m.MatchAt(HasRank(IsOp({"aten::mm"}), 3, 4), 0));
  EXPECT_TRUE(m.MatchAt(HasStaticShape(IsOp({"aten::mm"})), 0));
  // Value predicates apply to graph inputs under a wildcard too.
  EXPECT_TRUE(m.MatchAt(IsOp({"aten::mm"}, {HasRank(Wildcard(), 2, 2), Wildcard()}), 0));
  EXPECT_FALSE(m.MatchAt(IsOp({"aten::add"}, {Wildcard(), HasRank(Wildcard(), 2, 2)}), 1));
  EXPECT_FALSE(m.MatchAt(HasAttr(IsOp({"aten::mm"}), "approximate", "tanh"), 0));
  EXPECT_NE(act->ToString().find("aten::gelu"), std::string::npos);
}

TEST(PatternMatcher, AttrMatchesKeywordArguments) {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), ir::InputKind::kUser);
  auto spec = Op("gelu", "aten::gelu.default", {V(x)}, Tensor({4}));
  spec.kwargs.push_back({"approximate", ir::Arg::String("tanh")});
  auto n = b.AddNode(spec);
  b.SetOutput(ir::Arg::List({V(Out(b, n))}, true));
  auto g = b.Build();
  Matcher m(g);
  EXPECT_TRUE(m.MatchAt(HasAttr(IsOp({"aten::gelu"}), "approximate", "tanh"), 0));
  EXPECT_FALSE(m.MatchAt(HasAttr(IsOp({"aten::gelu"}), "approximate", "none"), 0));
}

// a -> b -> c and a -> c: the group {a, c} leaves through b and comes back, so fusing it
// would make a cycle with b; {a, b, c} and {b, c} are fine.
TEST(PathCheck, RejectsGroupsAPathLeavesAndReenters) {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), ir::InputKind::kUser);
  auto a = b.AddNode(Op("a", "aten::relu.default", {V(x)}, Tensor({4})));
  auto bb = b.AddNode(Op("b", "aten::exp.default", {V(Out(b, a))}, Tensor({4})));
  auto c = b.AddNode(Op("c", "aten::add.Tensor", {V(Out(b, a)), V(Out(b, bb))}, Tensor({4})));
  b.SetOutput(ir::Arg::List({V(Out(b, c))}, true));
  auto g = b.Build();
  auto succ = NodeSuccessors(g);
  EXPECT_FALSE(IsConvex(succ, {0, 2}));
  EXPECT_TRUE(IsConvex(succ, {0, 1, 2}));
  EXPECT_TRUE(IsConvex(succ, {1, 2}));
  EXPECT_TRUE(IsConvex(succ, {0}));

  // A pattern that covers {a, c} through the add's first operand is generated, then refused.
  BackendRules rules{"fake",
                     {PatternRule("add_of_relu", IsOp({"aten::add"}, {IsOp({"aten::relu"})}))}};
  auto set = GenerateCandidates(g, {rules});
  EXPECT_EQ(set.candidates.size(), 0u);
  EXPECT_EQ(set.rejected_cyclic, 1);
}

TEST(Candidates, FusionRuleGrowsEveryChainPrefix) {
  auto g = MatmulChain();
  auto elementwise = IsOpClass({ir::OpClass::kElementwise});
  BackendRules fused{"fused", {FusionRule("mm_epilogue", IsOp({"aten::mm"}), elementwise, 3)}};
  BackendRules aten{
      "aten", {PatternRule("op", IsOpClass({ir::OpClass::kMatmul, ir::OpClass::kElementwise}))}};
  auto set = GenerateCandidates(g, {aten, fused});
  std::vector<std::vector<ir::NodeId>> fused_groups;
  for (const auto& c : set.candidates) {
    if (c.backend == "fused") fused_groups.push_back(c.nodes);
    if (c.backend == "aten") {
      EXPECT_EQ(c.nodes.size(), 1u);
    }
  }
  // mm; mm+add; mm+add+relu; then relu's users: sigmoid and mul. {mm, add, relu, mul} leaves
  // through sigmoid and re-enters at mul, so the path check drops it.
  EXPECT_EQ(fused_groups,
            (std::vector<std::vector<ir::NodeId>>{{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}}));
  EXPECT_EQ(set.rejected_cyclic, 1);
  // Inputs and outputs of mm+add+relu: x, w, b in; relu's output (read by sigmoid and mul) out.
  for (const auto& c : set.candidates) {
    if (c.backend == "fused" && c.nodes.size() == 3) {
      EXPECT_EQ(c.inputs.size(), 3u);
      ASSERT_EQ(c.outputs.size(), 1u);
      EXPECT_EQ(c.outputs[0], g.node(2).outputs[0]);
    }
  }
}

TEST(Candidates, RepeatedGroupsShareASignature) {
  // Two identical relu->exp chains on different inputs of the same shape, and one of another.
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), ir::InputKind::kUser);
  auto y = b.AddInput("y", Tensor({4}), ir::InputKind::kUser);
  auto z = b.AddInput("z", Tensor({5}), ir::InputKind::kUser);
  std::vector<ir::ValueId> outs;
  int i = 0;
  for (auto [in, n] : std::vector<std::pair<ir::ValueId, int64_t>>{{x, 4}, {y, 4}, {z, 5}}) {
    auto r = b.AddNode(Op("r" + std::to_string(i), "aten::relu.default", {V(in)}, Tensor({n})));
    auto e =
        b.AddNode(Op("e" + std::to_string(i++), "aten::exp.default", {V(Out(b, r))}, Tensor({n})));
    outs.push_back(Out(b, e));
  }
  b.SetOutput(ir::Arg::List({V(outs[0]), V(outs[1]), V(outs[2])}, true));
  auto g = b.Build();
  auto users = g.ComputeUsers();
  EXPECT_EQ(DescribeGroup(g, {0, 1}, users).signature, DescribeGroup(g, {2, 3}, users).signature);
  EXPECT_NE(DescribeGroup(g, {0, 1}, users).signature, DescribeGroup(g, {4, 5}, users).signature);
  EXPECT_NE(DescribeGroup(g, {0, 1}, users).signature, DescribeGroup(g, {0}, users).signature);
}

}  // namespace
}  // namespace tp::pattern

namespace tp::pattern {
namespace {

TEST(BackendRules, FusedRulesFindLinearActAndLayerNormGroups) {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", testing::Tensor({8, 16}), ir::InputKind::kUser);
  auto w = b.AddInput("w", testing::Tensor({32, 16}), ir::InputKind::kParameter, "w");
  auto bias = b.AddInput("b", testing::Tensor({32}), ir::InputKind::kParameter, "b");
  auto t =
      b.AddNode(testing::Op("t", "aten::t.default", {testing::V(w)}, testing::Tensor({16, 32})));
  auto addmm = b.AddNode(
      testing::Op("addmm", "aten::addmm.default",
                  {testing::V(bias), testing::V(x), testing::V(b.peek().node(t).outputs[0])},
                  testing::Tensor({8, 32})));
  auto gelu = b.AddNode(testing::Op("gelu", "aten::gelu.default",
                                    {testing::V(b.peek().node(addmm).outputs[0])},
                                    testing::Tensor({8, 32})));
  b.SetOutput(ir::Arg::List({testing::V(b.peek().node(gelu).outputs[0])}, true));
  auto g = b.Build();
  auto set =
      GenerateCandidates(g, {{"fused", DefaultRules("fused")}, {"aten", DefaultRules("aten")}});
  int linear_act = 0, aten = 0;
  for (const auto& c : set.candidates) {
    if (c.rule == "linear_act") {
      ++linear_act;
      EXPECT_EQ(c.nodes, (std::vector<ir::NodeId>{addmm, gelu}));
    }
    aten += c.backend == "aten";
  }
  EXPECT_EQ(linear_act, 1);
  EXPECT_EQ(aten, 3);  // every node alone
  // Graph compilers fuse the addmm with its gelu epilogue (and the transpose feeding it).
  auto inductor = GenerateCandidates(g, {{"inductor", DefaultRules("inductor")}});
  bool fused_epilogue = false;
  for (const auto& c : inductor.candidates) {
    fused_epilogue |= c.nodes == std::vector<ir::NodeId>{addmm, gelu};
  }
  EXPECT_TRUE(fused_epilogue);
  EXPECT_THROW(DefaultRules("tvm"), std::invalid_argument);
}

// q, k, v -> SDPA (two outputs: out, logsumexp) -> a transpose of out. The fused "attention"
// rule takes the SDPA node alone, in float32 only; graph compilers take it too.
TEST(BackendRules, FusedAttentionRuleTakesTheSdpaNodeInFloat32) {
  auto build = [](ir::DType dtype, ir::NodeId* sdpa_id) {
    auto typed = [dtype](std::vector<int64_t> shape) {
      ir::TensorType t = testing::F32(std::move(shape));
      t.dtype = dtype;
      return ir::ValueType::Tensor(t);
    };
    ir::GraphBuilder b;
    auto q = b.AddInput("q", typed({1, 4, 16, 8}), ir::InputKind::kUser);
    auto k = b.AddInput("k", typed({1, 4, 16, 8}), ir::InputKind::kUser);
    auto v = b.AddInput("v", typed({1, 4, 16, 8}), ir::InputKind::kUser);
    ir::NodeSpec spec = Op("sdpa", "aten::_scaled_dot_product_flash_attention_for_cpu.default",
                           {V(q), V(k), V(v)}, typed({1, 4, 16, 8}));
    spec.output_types.push_back(typed({1, 4, 16}));
    spec.tuple_output = true;
    *sdpa_id = b.AddNode(spec);
    auto tr = b.AddNode(Op("tr", "aten::transpose.int",
                           {V(Out(b, *sdpa_id)), ir::Arg::Int(1), ir::Arg::Int(2)},
                           typed({1, 16, 4, 8})));
    b.SetOutput(ir::Arg::List({V(Out(b, tr))}, true));
    return b.Build();
  };
  ir::NodeId sdpa = 0;
  auto g = build(ir::DType::kFloat32, &sdpa);
  auto set = GenerateCandidates(g, {{"fused", DefaultRules("fused")}});
  std::vector<std::vector<ir::NodeId>> attention;
  for (const auto& c : set.candidates) {
    if (c.rule == "attention") attention.push_back(c.nodes);
  }
  EXPECT_EQ(attention, (std::vector<std::vector<ir::NodeId>>{{sdpa}}));
  auto half = build(ir::DType::kFloat16, &sdpa);
  for (const auto& c : GenerateCandidates(half, {{"fused", DefaultRules("fused")}}).candidates) {
    EXPECT_NE(c.rule, "attention");  // our kernel is float32 only
  }
}

}  // namespace
}  // namespace tp::pattern
