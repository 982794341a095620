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

TEST(ShardingRules, EmbeddingSplitsLookupsFeaturesOrVocabulary) {
  ValueType idx = Tensor({4, 16});
  idx.tensor.dtype = DType::kInt64;
  auto s = Strategies(
      OneNode("aten::embedding.default", {Tensor({1000, 64}), idx}, {}, Tensor({4, 16, 64})), 2);
  EXPECT_EQ(s.at("lookups0"), "R S(0) -> S(0)");
  EXPECT_EQ(s.at("lookups1"), "R S(1) -> S(1)");
  EXPECT_EQ(s.at("features"), "S(1) R -> S(2)");
  // Vocabulary-parallel: each rank's rows, zeros elsewhere (materialised as vocab_embedding).
  EXPECT_EQ(s.at("vocab"), "S(0) R -> P");
  EXPECT_EQ(s.size(), 5u);  // + replicate
  // 1000 rows do not split over 3 ranks.
  auto s3 = Strategies(
      OneNode("aten::embedding.default", {Tensor({1000, 63}), idx}, {}, Tensor({4, 16, 63})), 3);
  EXPECT_EQ(s3.count("vocab"), 0u);
}

TEST(ShardingRules, UnsqueezeShiftsTheShardedDim) {
  auto s = Strategies(
      OneNode("aten::unsqueeze.default", {Tensor({4, 6})}, {Arg::Int(1)}, Tensor({4, 1, 6})), 2);
  EXPECT_EQ(s.at("dim0"), "S(0) -> S(0)");
  EXPECT_EQ(s.at("dim1"), "S(1) -> S(2)");
  EXPECT_EQ(s.at("partial"), "P -> P");
}

TEST(ShardingRules, SliceKeepsEveryOtherDim) {
  // rotate_half's x[..., :4] on [B, H, S, D]: heads (and batch, sequence) pass through.
  auto s = Strategies(OneNode("aten::slice.Tensor", {Tensor({2, 4, 6, 8})},
                              {Arg::Int(3), Arg::Int(0), Arg::Int(4)}, Tensor({2, 4, 6, 4})),
                      2);
  EXPECT_EQ(s.at("dim1"), "S(1) -> S(1)");
  EXPECT_EQ(s.at("dim0"), "S(0) -> S(0)");
  EXPECT_EQ(s.count("dim3"), 0u);  // the sliced dim never splits
  EXPECT_EQ(s.at("partial"), "P -> P");
}

TEST(ShardingRules, ExpandKeepsOnlyDimsItDoesNotBroadcast) {
  // repeat_kv: [B, KV, 1, S, D] -> [B, KV, 3, S, D]; the broadcast dim never splits.
  auto s = Strategies(
      OneNode("aten::expand.default", {Tensor({2, 4, 1, 6, 8})},
              {Arg::List({Arg::Int(2), Arg::Int(4), Arg::Int(3), Arg::Int(6), Arg::Int(8)})},
              Tensor({2, 4, 3, 6, 8})),
      2);
  EXPECT_EQ(s.at("dim1"), "S(1) -> S(1)");
  EXPECT_EQ(s.count("dim2"), 0u);
  // A new leading dim shifts the kept ones.
  auto t =
      Strategies(OneNode("aten::expand.default", {Tensor({4, 6})},
                         {Arg::List({Arg::Int(2), Arg::Int(4), Arg::Int(6)})}, Tensor({2, 4, 6})),
                 2);
  EXPECT_EQ(t.at("dim0"), "S(0) -> S(1)");
  EXPECT_EQ(t.at("dim1"), "S(1) -> S(2)");
}

TEST(ShardingRules, NoSplitOutputWithoutASplitInput) {
  // x [1, 8] broadcast against y [8, 8] can split dim 0 only through y.
  auto s = Strategies(
      OneNode("aten::add.Tensor", {Tensor({1, 8}), Tensor({8, 8})}, {}, Tensor({8, 8})), 2);
  EXPECT_EQ(s.at("dim0"), "R S(0) -> S(0)");
  // tril's matrix dims never split (a block of a triangular matrix is not triangular).
  auto t = Strategies(OneNode("aten::tril.default", {Tensor({4, 8, 8})}, {}, Tensor({4, 8, 8})), 2);
  EXPECT_EQ(t.count("dim1"), 0u);
  EXPECT_EQ(t.count("dim2"), 0u);
  EXPECT_EQ(t.at("dim0"), "S(0) -> S(0)");
}

TEST(ShardingRules, ReductionsKeepSplitsOrMakePartialSums) {
  auto sum = Strategies(OneNode("aten::sum.dim_IntList", {Tensor({4, 6, 8})},
                                {Arg::List({Arg::Int(1)}), Arg::Bool(false)}, Tensor({4, 8})),
                        2);
  EXPECT_EQ(sum.at("dim0"), "S(0) -> S(0)");
  EXPECT_EQ(sum.at("dim2"), "S(2) -> S(1)");  // dim 1 is gone
  EXPECT_EQ(sum.at("reduce_dim1"), "S(1) -> P");
  EXPECT_EQ(sum.at("partial"), "P -> P");
  auto mean = Strategies(OneNode("aten::mean.dim", {Tensor({4, 6, 8})},
                                 {Arg::List({Arg::Int(-1)}), Arg::Bool(true)}, Tensor({4, 6, 1})),
                         2);
  EXPECT_EQ(mean.at("dim1"), "S(1) -> S(1)");  // keepdim
  EXPECT_EQ(mean.count("reduce_dim2"), 0u);    // a block's mean is not a summand
  EXPECT_EQ(mean.at("partial"), "P -> P");
  auto amax = Strategies(OneNode("aten::amax.default", {Tensor({4, 6})},
                                 {Arg::List({Arg::Int(1)}), Arg::Bool(true)}, Tensor({4, 1})),
                         2);
  EXPECT_EQ(amax.at("dim0"), "S(0) -> S(0)");
  EXPECT_EQ(amax.count("partial"), 0u);
}

TEST(ShardingRules, CatSplitsAlongAnotherDim) {
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4, 6}), InputKind::kUser);
  auto y = b.AddInput("y", Tensor({4, 2}), InputKind::kUser);
  b.AddNode(Op("cat", "aten::cat.default", {Arg::List({V(x), V(y)}), Arg::Int(1)}, Tensor({4, 8})));
  b.SetOutput(Arg::List({V(b.peek().node(0).outputs[0])}, /*tuple=*/true));
  auto s = Strategies(b.Build(), 2);
  EXPECT_EQ(s.at("dim0"), "S(0) S(0) -> S(0)");
  EXPECT_EQ(s.count("dim1"), 0u);
  EXPECT_EQ(s.at("partial"), "P P -> P");
}

TEST(ShardingRules, ConvolutionSplitsBatchOrChannels) {
  auto L = [](std::vector<int64_t> v) {
    std::vector<Arg> items;
    for (int64_t x : v) items.push_back(Arg::Int(x));
    return Arg::List(items);
  };
  std::vector<Arg> extra = {L({1, 1}),        L({1, 1}), L({1, 1}),
                            Arg::Bool(false), L({0, 0}), Arg::Int(1)};
  auto s = Strategies(OneNode("aten::convolution.default",
                              {Tensor({2, 4, 8, 8}), Tensor({8, 4, 3, 3}), Tensor({8})}, extra,
                              Tensor({2, 8, 8, 8})),
                      2);
  EXPECT_EQ(s.at("batch"), "S(0) R R -> S(0)");
  EXPECT_EQ(s.at("out_channels"), "R S(0) S(0) -> S(1)");
  EXPECT_EQ(s.at("in_channels"), "S(1) S(1) P -> P");
  extra[5] = Arg::Int(2);  // grouped: no rule (each group's channels would need splitting alike)
  auto grouped = Strategies(OneNode("aten::convolution.default",
                                    {Tensor({2, 4, 8, 8}), Tensor({8, 2, 3, 3}), Tensor({8})},
                                    extra, Tensor({2, 8, 8, 8})),
                            2);
  EXPECT_EQ(grouped.size(), 1u);
}

TEST(ShardingRules, PermuteMovesTheShardedDim) {
  auto s =
      Strategies(OneNode("aten::permute.default", {Tensor({2, 4, 6})},
                         {Arg::List({Arg::Int(2), Arg::Int(0), Arg::Int(1)})}, Tensor({6, 2, 4})),
                 2);
  EXPECT_EQ(s.at("dim2"), "S(2) -> S(0)");
  EXPECT_EQ(s.at("dim0"), "S(0) -> S(1)");
  EXPECT_EQ(s.at("dim1"), "S(1) -> S(2)");
}

TEST(ShardingRules, AttentionSplitsHeadsUnderABroadcastMask) {
  // q, k, v [2, 4, 16, 8] and a mask [2, 1, 16, 16] broadcast over heads.
  auto s = Strategies(OneNode("aten::_scaled_dot_product_flash_attention_for_cpu.default",
                              {Tensor({2, 4, 16, 8}), Tensor({2, 4, 16, 8}), Tensor({2, 4, 16, 8})},
                              {Arg::Double(0.0), Arg::Bool(false)}, Tensor({2, 4, 16, 8})),
                      2);
  EXPECT_EQ(s.at("attn_dim1"), "S(1) S(1) S(1) -> S(1)");
  GraphBuilder b;
  std::vector<Arg> args;
  for (int i = 0; i < 3; ++i)
    args.push_back(
        V(b.AddInput("qkv" + std::to_string(i), Tensor({2, 4, 16, 8}), InputKind::kUser)));
  args.push_back(Arg::Double(0.0));
  args.push_back(Arg::Bool(false));
  NodeSpec sdpa = Op("sdpa", "aten::_scaled_dot_product_flash_attention_for_cpu.default", args,
                     Tensor({2, 4, 16, 8}));
  sdpa.kwargs.push_back(
      {"attn_mask", V(b.AddInput("mask", Tensor({2, 1, 16, 16}), InputKind::kUser))});
  b.AddNode(sdpa);
  b.SetOutput(Arg::List({V(b.peek().node(0).outputs[0])}, /*tuple=*/true));
  auto m = Strategies(b.Build(), 2);
  EXPECT_EQ(m.at("attn_dim1"), "S(1) S(1) S(1) R -> S(1)");
  EXPECT_EQ(m.at("attn_dim0"), "S(0) S(0) S(0) S(0) -> S(0)");
}

TEST(ShardingRules, PackedDimSplitsIntoPlainShards) {
  // qkv [8, 16, 192] split into three [8, 16, 64]: strided S(2)x3 in, plain S(2) out.
  GraphBuilder b;
  auto x = b.AddInput("qkv", Tensor({8, 16, 192}), InputKind::kUser);
  NodeSpec split =
      Op("split", "aten::split.Tensor", {V(x), Arg::Int(64), Arg::Int(2)}, Tensor({8, 16, 64}));
  split.output_types = {Tensor({8, 16, 64}), Tensor({8, 16, 64}), Tensor({8, 16, 64})};
  split.output_names = {"q", "k", "v"};
  split.tuple_output = true;
  b.AddNode(split);
  b.SetOutput(Arg::List({V(b.peek().node(0).outputs[0])}, /*tuple=*/true));
  auto s = Strategies(b.Build(), 2);
  EXPECT_EQ(s.at("packed"), "S(2)x3 -> S(2) S(2) S(2)");
  EXPECT_EQ(s.at("dim0"), "S(0) -> S(0) S(0) S(0)");
  EXPECT_EQ(s.count("dim2"), 0u);  // a plain split of the packed dim would mix q, k and v

  // The packed weight's column-parallel matmul keeps the parts: S(1)x3 out.
  auto mm = Strategies(
      OneNode("aten::addmm.default", {Tensor({192}), Tensor({128, 64}), Tensor({64, 192})}, {},
              Tensor({128, 192})),
      2);
  EXPECT_EQ(mm.at("col_packed3"), "S(0)x3 R S(1)x3 -> S(1)x3");
  EXPECT_EQ(ShardSpec::S(1, 3).ToString(), "S(1)x3");
  EXPECT_NE(ShardSpec::S(1, 3), ShardSpec::S(1));
}

TEST(ReshardOps, OneStepPerPairOfSpecsAndTheGradientsDual) {
  auto name = [](const ShardSpec& a, const ShardSpec& b) {
    return std::string(ReshardOpName(ReshardOpFor(a, b)));
  };
  EXPECT_EQ(name(ShardSpec::S(1), ShardSpec::S(1)), "none");
  EXPECT_EQ(name(ShardSpec::R(), ShardSpec::S(0)), "slice");
  EXPECT_EQ(name(ShardSpec::R(), ShardSpec::P()), "keep_on_rank_zero");
  EXPECT_EQ(name(ShardSpec::S(0), ShardSpec::P()), "zero_pad");
  EXPECT_EQ(name(ShardSpec::S(2), ShardSpec::R()), "all_gather");
  EXPECT_EQ(name(ShardSpec::S(1), ShardSpec::S(1, 2)), "all_gather_slice");
  EXPECT_EQ(name(ShardSpec::S(0), ShardSpec::S(1, 3)), "all_to_all");
  EXPECT_EQ(name(ShardSpec::P(), ShardSpec::R()), "all_reduce");
  EXPECT_EQ(name(ShardSpec::P(), ShardSpec::S(1, 2)), "reduce_scatter");
  // The backward of a reshard is the dual one: all_gather <-> reduce_scatter, slice <->
  // zero_pad, all_reduce <-> all_reduce (gradient specs: R <-> P).
  auto dual = [&](const ShardSpec& a, const ShardSpec& b) {
    return name(GradientSpec(b), GradientSpec(a));
  };
  EXPECT_EQ(dual(ShardSpec::S(2), ShardSpec::R()), "reduce_scatter");
  EXPECT_EQ(dual(ShardSpec::P(), ShardSpec::S(0)), "all_gather");
  EXPECT_EQ(dual(ShardSpec::R(), ShardSpec::S(0)), "zero_pad");
  EXPECT_EQ(dual(ShardSpec::P(), ShardSpec::R()), "all_reduce");
}

}  // namespace
}  // namespace tp::ir
