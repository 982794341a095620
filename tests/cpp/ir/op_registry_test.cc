#include "ir/op_registry.h"

#include <gtest/gtest.h>

#include "test_graphs.h"

namespace tp::ir {
namespace {

using testing::Op;
using testing::Tensor;
using testing::V;

// Builds a one-op graph over the given inputs and returns its estimate.
OpCost EstimateOne(const std::string& op, const std::vector<ValueType>& inputs,
                   std::vector<Arg> extra_args, ValueType out) {
  GraphBuilder b;
  std::vector<Arg> args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    args.push_back(V(b.AddInput("in" + std::to_string(i), inputs[i], InputKind::kUser)));
  }
  for (auto& a : extra_args) args.push_back(a);
  NodeId n = b.AddNode(Op("op", op, args, out));
  Graph g = b.BuildUnverified();
  return OpRegistry::Default().Estimate(g, g.node(n));
}

TEST(OpRegistryTest, FindsByOverloadAndWildcard) {
  const auto& reg = OpRegistry::Default();
  EXPECT_GT(reg.size(), 150u);
  ASSERT_NE(reg.Find("aten::mm.default"), nullptr);
  EXPECT_EQ(reg.Find("aten::mm.default")->cls, OpClass::kMatmul);
  ASSERT_NE(reg.Find("aten::add.Scalar"), nullptr);  // via "aten::add.*"
  EXPECT_EQ(reg.Find("aten::add.Scalar")->cls, OpClass::kElementwise);
  EXPECT_EQ(reg.Find("mylib::thing.default"), nullptr);
  EXPECT_FALSE(reg.IsPure("mylib::thing.default"));
  EXPECT_FALSE(reg.IsPure("aten::native_dropout.default"));
  // A checkpointed dropout's forward draws (and saves the state it drew from): random, kept.
  ASSERT_NE(reg.Find("higher_order::run_and_save_rng_state"), nullptr);
  EXPECT_EQ(reg.Find("higher_order::run_and_save_rng_state")->cls, OpClass::kRandom);
  EXPECT_FALSE(reg.IsPure("higher_order::run_and_save_rng_state"));
  // Its recomputation runs from a given state and sets the generator back: it draws nothing.
  EXPECT_EQ(reg.Find("higher_order::run_with_rng_state"), nullptr);
  EXPECT_TRUE(reg.IsPure("aten::view.default"));
  EXPECT_EQ(OpRegistry::SplitOverload("aten::add.Tensor"),
            (std::pair<std::string, std::string>{"aten::add", "Tensor"}));
  EXPECT_EQ(OpRegistry::SplitOverload("aten::relu"),
            (std::pair<std::string, std::string>{"aten::relu", "default"}));
}

TEST(OpRegistryTest, MatmulFamily) {
  OpCost mm = EstimateOne("aten::mm.default", {Tensor({64, 128}), Tensor({128, 32})}, {},
                          Tensor({64, 32}));
  ASSERT_TRUE(mm.known);
  EXPECT_DOUBLE_EQ(mm.flops, 2.0 * 64 * 128 * 32);
  EXPECT_DOUBLE_EQ(mm.bytes, 4.0 * (64 * 128 + 128 * 32 + 64 * 32));
  OpCost addmm = EstimateOne("aten::addmm.default",
                             {Tensor({32}), Tensor({64, 128}), Tensor({128, 32})}, {},
                             Tensor({64, 32}));
  EXPECT_DOUBLE_EQ(addmm.flops, 2.0 * 64 * 128 * 32 + 64 * 32);
  OpCost bmm = EstimateOne("aten::bmm.default", {Tensor({4, 8, 16}), Tensor({4, 16, 5})}, {},
                           Tensor({4, 8, 5}));
  EXPECT_DOUBLE_EQ(bmm.flops, 2.0 * 4 * 8 * 16 * 5);
  OpCost baddbmm = EstimateOne("aten::baddbmm.default",
                               {Tensor({4, 8, 5}), Tensor({4, 8, 16}), Tensor({4, 16, 5})}, {},
                               Tensor({4, 8, 5}));
  EXPECT_DOUBLE_EQ(baddbmm.flops, 2.0 * 4 * 8 * 16 * 5 + 4 * 8 * 5);
}

TEST(OpRegistryTest, Convolution) {
  // [1, 3, 32, 32] * [16, 3, 3, 3] -> [1, 16, 30, 30]
  std::vector<Arg> rest = {Arg::List({Arg::Int(1), Arg::Int(1)}),
                           Arg::List({Arg::Int(0), Arg::Int(0)}),
                           Arg::List({Arg::Int(1), Arg::Int(1)}), Arg::Bool(false),
                           Arg::List({Arg::Int(0), Arg::Int(0)}), Arg::Int(1)};
  OpCost c = EstimateOne("aten::convolution.default",
                         {Tensor({1, 3, 32, 32}), Tensor({16, 3, 3, 3}), Tensor({16})}, rest,
                         Tensor({1, 16, 30, 30}));
  ASSERT_TRUE(c.known);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 16 * 30 * 30 * 3 * 3 * 3);
}

TEST(OpRegistryTest, AttentionEmbeddingSoftmaxNorm) {
  OpCost sdpa = EstimateOne("aten::scaled_dot_product_attention.default",
                            {Tensor({2, 4, 16, 8}), Tensor({2, 4, 32, 8}), Tensor({2, 4, 32, 8})},
                            {}, Tensor({2, 4, 16, 8}));
  const double rows = 2 * 4 * 16;
  EXPECT_DOUBLE_EQ(sdpa.flops, 2 * rows * 32 * 8 + 2 * rows * 32 * 8 + 5 * rows * 32);

  ValueType idx = Tensor({4, 10});
  idx.tensor.dtype = DType::kInt64;
  OpCost emb = EstimateOne("aten::embedding.default", {Tensor({50000, 64}), idx}, {},
                           Tensor({4, 10, 64}));
  ASSERT_TRUE(emb.known);
  EXPECT_DOUBLE_EQ(emb.flops, 0.0);
  // Gathered rows read + output written + indices; not the 50000-row table.
  EXPECT_DOUBLE_EQ(emb.bytes, 2.0 * 4 * 10 * 64 * 4 + 4 * 10 * 8);

  OpCost sm = EstimateOne("aten::_softmax.default", {Tensor({8, 100})},
                          {Arg::Int(-1), Arg::Bool(false)}, Tensor({8, 100}));
  EXPECT_DOUBLE_EQ(sm.flops, 5.0 * 800);
  OpCost ln = EstimateOne("aten::native_layer_norm.default", {Tensor({8, 100})},
                          {Arg::List({Arg::Int(100)}), Arg::None(), Arg::None(), Arg::Double(1e-5)},
                          Tensor({8, 100}));
  EXPECT_DOUBLE_EQ(ln.flops, 8.0 * 800);
}

TEST(OpRegistryTest, ElementwiseViewsAndReductions) {
  OpCost gelu = EstimateOne("aten::gelu.default", {Tensor({10, 10})}, {}, Tensor({10, 10}));
  EXPECT_DOUBLE_EQ(gelu.flops, 800.0);
  EXPECT_DOUBLE_EQ(gelu.bytes, 800.0);
  OpCost view = EstimateOne("aten::view.default", {Tensor({10, 10})},
                            {Arg::List({Arg::Int(100)})}, Tensor({100}));
  EXPECT_TRUE(view.known);
  EXPECT_DOUBLE_EQ(view.flops + view.bytes, 0.0);
  OpCost sum = EstimateOne("aten::sum.dim_IntList", {Tensor({10, 10})},
                           {Arg::List({Arg::Int(1)})}, Tensor({10}));
  EXPECT_DOUBLE_EQ(sum.flops, 100.0);
}

TEST(OpRegistryTest, SymbolicSizesUseHintsOrAreUnknown) {
  TensorType a = testing::F32({0, 128});
  a.shape[0] = SymDim::Symbolic("s0", 64);
  TensorType out = testing::F32({0, 32});
  out.shape[0] = SymDim::Symbolic("s0", 64);
  OpCost hinted = EstimateOne("aten::mm.default",
                              {ValueType::Tensor(a), Tensor({128, 32})}, {},
                              ValueType::Tensor(out));
  ASSERT_TRUE(hinted.known);
  EXPECT_DOUBLE_EQ(hinted.flops, 2.0 * 64 * 128 * 32);
  a.shape[0] = SymDim::Symbolic("s0");
  out.shape[0] = SymDim::Symbolic("s0");
  OpCost unknown = EstimateOne("aten::mm.default", {ValueType::Tensor(a), Tensor({128, 32})},
                               {}, ValueType::Tensor(out));
  EXPECT_FALSE(unknown.known);
  OpCost opaque = EstimateOne("mylib::thing.default", {Tensor({4})}, {}, Tensor({4}));
  EXPECT_FALSE(opaque.known);
}

}  // namespace
}  // namespace tp::ir
