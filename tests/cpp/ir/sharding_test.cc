// Per-op sharding rules (ir/sharding.h) on one-node graphs: which strategies each op offers.
#include "ir/sharding.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "test_graphs.h"

namespace tp::ir {
namespace {

using testing::Op;
using testing::Tensor;
using testing::V;

// name -> "in specs -> out specs" for every strategy of the graph's only node.
std::map<std::string, std::string> Strategies(const Graph& g, int world) {
  std::map<std::string, std::string> out;
  for (const auto& s : ShardingStrategies(g, g.nodes()[0], world)) {
    std::string text;
    for (const auto& i : s.inputs) text += i.ToString() + " ";
    text += "->";
    for (const auto& o : s.outputs) text += " " + o.ToString();
    out[s.name] = text;
  }
  return out;
}

Graph OneNode(const std::string& op, std::vector<ValueType> ins, std::vector<Arg> extra,
              ValueType out) {
  GraphBuilder b;
  std::vector<Arg> args;
  for (size_t i = 0; i < ins.size(); ++i)
    args.push_back(V(b.AddInput("in" + std::to_string(i), ins[i], InputKind::kUser)));
  for (auto& a : extra) args.push_back(a);
  b.AddNode(Op("n", op, args, out));
  b.SetOutput(Arg::List({V(b.peek().node(0).outputs[0])}, /*tuple=*/true));
  return b.Build();
}

TEST(ShardingRules, BmmSplitsBatchRowsColumnsOrContraction) {
  auto s = Strategies(
      OneNode("aten::bmm.default", {Tensor({8, 4, 6}), Tensor({8, 6, 10})}, {}, Tensor({8, 4, 10})),
      2);
  EXPECT_EQ(s.at("batch"), "S(0) S(0) -> S(0)");
  EXPECT_EQ(s.at("row"), "S(1) R -> S(1)");
  EXPECT_EQ(s.at("col"), "R S(2) -> S(2)");
  EXPECT_EQ(s.at("inner"), "S(2) S(1) -> P");
  // 4 rows do not split over 3 ranks, nor 10 columns.
  auto s3 = Strategies(
      OneNode("aten::bmm.default", {Tensor({6, 4, 6}), Tensor({6, 6, 10})}, {}, Tensor({6, 4, 10})),
      3);
  EXPECT_EQ(s3.count("row"), 0u);
  EXPECT_EQ(s3.count("col"), 0u);
  EXPECT_EQ(s3.count("batch"), 1u);
}

TEST(ShardingRules, EmbeddingSplitsLookupsOrFeatures) {
  ValueType idx = Tensor({4, 16});
  idx.tensor.dtype = DType::kInt64;
  auto s = Strategies(
      OneNode("aten::embedding.default", {Tensor({1000, 64}), idx}, {}, Tensor({4, 16, 64})), 2);
  EXPECT_EQ(s.at("lookups0"), "R S(0) -> S(0)");
  EXPECT_EQ(s.at("lookups1"), "R S(1) -> S(1)");
  EXPECT_EQ(s.at("features"), "S(1) R -> S(2)");
  EXPECT_EQ(s.size(), 4u);  // + replicate; no vocabulary split (a local lookup would be wrong)
}

TEST(ShardingRules, UnsqueezeShiftsTheShardedDim) {
  auto s = Strategies(OneNode("aten::unsqueeze.default", {Tensor({4, 6})}, {Arg::Int(1)},
                              Tensor({4, 1, 6})),
                      2);
  EXPECT_EQ(s.at("dim0"), "S(0) -> S(0)");
  EXPECT_EQ(s.at("dim1"), "S(1) -> S(2)");
  EXPECT_EQ(s.at("partial"), "P -> P");
}

TEST(ShardingRules, NoSplitOutputWithoutASplitInput) {
  // x [1, 8] broadcast against y [8, 8] can split dim 0 only through y.
  auto s = Strategies(
      OneNode("aten::add.Tensor", {Tensor({1, 8}), Tensor({8, 8})}, {}, Tensor({8, 8})), 2);
  EXPECT_EQ(s.at("dim0"), "R S(0) -> S(0)");
  // tril's matrix dims never split (a block of a triangular matrix is not triangular).
  auto t = Strategies(
      OneNode("aten::tril.default", {Tensor({4, 8, 8})}, {}, Tensor({4, 8, 8})), 2);
  EXPECT_EQ(t.count("dim1"), 0u);
  EXPECT_EQ(t.count("dim2"), 0u);
  EXPECT_EQ(t.at("dim0"), "S(0) -> S(0)");
}

}  // namespace
}  // namespace tp::ir
