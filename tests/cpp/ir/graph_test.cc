#include "ir/graph.h"

#include <gtest/gtest.h>

#include "test_graphs.h"

namespace tp::ir {
namespace {

using testing::LinearRelu;
using testing::Op;
using testing::Tensor;
using testing::V;

TEST(GraphTest, BuildsInputsNodesAndValues) {
  Graph g = LinearRelu();
  ASSERT_EQ(g.inputs().size(), 3u);
  ASSERT_EQ(g.nodes().size(), 3u);
  EXPECT_EQ(g.values().size(), 6u);
  EXPECT_EQ(g.inputs()[1].kind, InputKind::kParameter);
  EXPECT_EQ(g.inputs()[1].source, "fc.weight");
  const Node& addmm = g.nodes()[1];
  EXPECT_EQ(addmm.op, "aten::addmm.default");
  EXPECT_EQ(g.value(addmm.outputs[0]).producer, addmm.id);
  EXPECT_EQ(g.type(addmm.outputs[0]).tensor.shape[1].value, 32);
}

TEST(GraphTest, UsersAndOutputs) {
  Graph g = LinearRelu();
  auto users = g.ComputeUsers();
  const ValueId x = g.inputs()[0].value;
  ASSERT_EQ(users[static_cast<size_t>(x)].size(), 1u);
  EXPECT_EQ(g.node(users[static_cast<size_t>(x)][0]).name, "addmm");
  auto outs = g.OutputValues();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(g.value(outs[0]).name, "relu");
}

TEST(GraphTest, UserListedOncePerNodeEvenWhenUsedTwice) {
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), InputKind::kUser);
  b.AddNode(Op("mul", "aten::mul.Tensor", {V(x), V(x)}, Tensor({4})));
  b.SetOutput(Arg::List({V(1)}, true));
  Graph g = b.Build();
  EXPECT_EQ(g.ComputeUsers()[0].size(), 1u);
}

TEST(GraphTest, TupleOutputsCarryNamesAndIndices) {
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({2, 8}), InputKind::kUser);
  NodeSpec ln;
  ln.name = "native_layer_norm";
  ln.op = "aten::native_layer_norm.default";
  ln.args = {V(x), Arg::List({Arg::Int(8)}), Arg::None(), Arg::None(), Arg::Double(1e-5)};
  ln.output_types = {Tensor({2, 8}), Tensor({2, 1}), Tensor({2, 1})};
  ln.output_names = {"getitem", "", ""};
  ln.tuple_output = true;
  NodeId n = b.AddNode(ln);
  b.SetOutput(Arg::List({V(b.peek().node(n).outputs[0])}, true));
  Graph g = b.Build();
  const Node& node = g.node(n);
  ASSERT_EQ(node.outputs.size(), 3u);
  EXPECT_EQ(g.value(node.outputs[0]).name, "getitem");
  EXPECT_EQ(g.value(node.outputs[2]).output_index, 2);
}

TEST(GraphTest, EditCopiesAndAppends) {
  Graph g = LinearRelu();
  GraphBuilder b = g.Edit();
  b.AddNode(Op("neg", "aten::neg.default", {V(5)}, Tensor({8, 32})));
  Graph g2 = b.Build();
  EXPECT_EQ(g.nodes().size(), 3u);  // the original is untouched
  EXPECT_EQ(g2.nodes().size(), 4u);
}

TEST(GraphTest, ArgRemapAndEquality) {
  Arg a = Arg::List({V(0), Arg::List({V(2), Arg::Int(3)}, true)});
  Arg r = a.Remap({10, 11, 12});
  std::vector<ValueId> seen;
  r.ForEachValue([&](ValueId v) { seen.push_back(v); });
  EXPECT_EQ(seen, (std::vector<ValueId>{10, 12}));
  EXPECT_FALSE(a == r);
  EXPECT_TRUE(a == a.Remap({0, 1, 2}));
}

TEST(GraphTest, InputKindNamesRoundTrip) {
  for (auto k : {InputKind::kUser, InputKind::kParameter, InputKind::kBuffer, InputKind::kSymbol,
                 InputKind::kTangent, InputKind::kSaved}) {
    EXPECT_EQ(InputKindFromName(InputKindName(k)), k);
  }
  EXPECT_THROW(InputKindFromName("weights"), GraphError);
}

TEST(TypesTest, DTypesAndHints) {
  EXPECT_EQ(DTypeFromName("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(ItemSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeFromName("float128"), DType::kUnknown);
  TensorType t;
  t.dtype = DType::kFloat32;
  t.shape = {SymDim::Symbolic("s0", 4), SymDim::Concrete(8)};
  EXPECT_EQ(t.NumelHint().value(), 32);
  EXPECT_EQ(t.BytesHint().value(), 128);
  t.shape[0] = SymDim::Symbolic("s0");
  EXPECT_FALSE(t.NumelHint().has_value());
  EXPECT_EQ(ValueType::Tensor(t).ToString(), "f32[s0, 8]");
}

// Found by graph_builder_fuzzer (tests/fuzz/corpus-graph_builder/regression-numel-overflow): a huge size
// overflowed the element count (signed overflow, UB). Now the size is just unknown.
TEST(TypesTest, OverflowingSizesAreUnknownNotUndefined) {
  TensorType t;
  t.dtype = DType::kFloat32;
  t.shape = {SymDim::Concrete(int64_t{1} << 40), SymDim::Concrete(int64_t{1} << 40)};
  EXPECT_FALSE(t.NumelHint().has_value());
  t.shape = {SymDim::Concrete(int64_t{1} << 62)};
  EXPECT_TRUE(t.NumelHint().has_value());
  EXPECT_FALSE(t.BytesHint().has_value());
}

}  // namespace
}  // namespace tp::ir
