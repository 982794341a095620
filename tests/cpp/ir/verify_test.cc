#include "ir/verify.h"

#include <gtest/gtest.h>

#include "test_graphs.h"

namespace tp::ir {
namespace {

using testing::Op;
using testing::Tensor;
using testing::V;

// Expects Verify to throw a GraphError naming `node` with `fragment` in its message.
void ExpectGraphError(const Graph& g, const std::string& node, const std::string& fragment) {
  try {
    Verify(g);
    FAIL() << "expected GraphError mentioning '" << fragment << "'";
  } catch (const GraphError& e) {
    EXPECT_EQ(e.node(), node) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(VerifyTest, AcceptsWellFormedGraph) { EXPECT_NO_THROW(Verify(testing::LinearRelu())); }

TEST(VerifyTest, AcceptsUnknownOpsAsOpaque) {
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), InputKind::kUser);
  b.AddNode(Op("custom", "mylib::frobnicate.default", {V(x), Arg::Opaque(0)},
               ValueType::Opaque("object")));
  b.SetOutput(Arg::List({V(1)}, true));
  EXPECT_NO_THROW(b.Build());
}

TEST(VerifyTest, RejectsCycle) {
  // a uses b's output, b uses a's output.
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), InputKind::kUser);
  b.AddNode(Op("a", "aten::add.Tensor", {V(x), V(2)}, Tensor({4})));  // value 2 is b's output
  b.AddNode(Op("b", "aten::neg.default", {V(1)}, Tensor({4})));
  b.SetOutput(Arg::List({V(2)}, true));
  ExpectGraphError(b.BuildUnverified(), "a", "cycle");
}

TEST(VerifyTest, RejectsSelfReference) {
  GraphBuilder b;
  b.AddInput("x", Tensor({4}), InputKind::kUser);
  b.AddNode(Op("loop", "aten::neg.default", {V(1)}, Tensor({4})));
  ExpectGraphError(b.BuildUnverified(), "loop", "cycle");
}

TEST(VerifyTest, RejectsDanglingReference) {
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), InputKind::kUser);
  b.AddNode(Op("bad", "aten::add.Tensor", {V(x), V(42)}, Tensor({4})));
  ExpectGraphError(b.BuildUnverified(), "bad", "dangling");
}

TEST(VerifyTest, RejectsDanglingOutput) {
  GraphBuilder b;
  b.AddInput("x", Tensor({4}), InputKind::kUser);
  b.SetOutput(Arg::List({V(7)}, true));
  ExpectGraphError(b.BuildUnverified(), "output", "dangling");
}

TEST(VerifyTest, RejectsWrongArityOfKnownOp) {
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4, 4}), InputKind::kUser);
  b.AddNode(Op("mm", "aten::mm.default", {V(x)}, Tensor({4, 4})));
  ExpectGraphError(b.BuildUnverified(), "mm", "wrong arity");
}

TEST(VerifyTest, RejectsDuplicateNames) {
  GraphBuilder b;
  auto x = b.AddInput("x", Tensor({4}), InputKind::kUser);
  b.AddNode(Op("x", "aten::neg.default", {V(x)}, Tensor({4})));
  ExpectGraphError(b.BuildUnverified(), "x", "used twice");
}

TEST(VerifyTest, RejectsBadTensorTypes) {
  {
    GraphBuilder b;
    TensorType t = testing::F32({4});
    t.dtype = DType::kUnknown;
    b.AddInput("x", ValueType::Tensor(t), InputKind::kUser);
    ExpectGraphError(b.BuildUnverified(), "x", "unknown dtype");
  }
  {
    GraphBuilder b;
    TensorType t = testing::F32({4, 2});
    t.stride = {SymDim::Concrete(1)};
    b.AddInput("x", ValueType::Tensor(t), InputKind::kUser);
    ExpectGraphError(b.BuildUnverified(), "x", "stride has rank 1");
  }
  {
    GraphBuilder b;
    b.AddInput("x", Tensor({-3}), InputKind::kUser);
    ExpectGraphError(b.BuildUnverified(), "x", "negative size");
  }
}

TEST(VerifyTest, BuilderRejectsWrongOutputCount) {
  GraphBuilder b;
  NodeSpec spec = Op("two", "aten::neg.default", {}, Tensor({4}));
  spec.output_types.push_back(Tensor({4}));
  EXPECT_THROW(b.AddNode(spec), GraphError);
}

}  // namespace
}  // namespace tp::ir
