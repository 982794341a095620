// Small hand-built graphs shared by the core's tests.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace tp::testing {

inline ir::TensorType F32(std::vector<int64_t> shape) {
  ir::TensorType t;
  for (int64_t d : shape) t.shape.push_back(ir::SymDim::Concrete(d));
  t.dtype = ir::DType::kFloat32;
  return t;
}

inline ir::ValueType Tensor(std::vector<int64_t> shape) { return ir::ValueType::Tensor(F32(shape)); }

inline ir::NodeSpec Op(std::string name, std::string op, std::vector<ir::Arg> args,
                       ir::ValueType out) {
  ir::NodeSpec spec;
  spec.name = std::move(name);
  spec.op = std::move(op);
  spec.args = std::move(args);
  spec.output_types.push_back(std::move(out));
  return spec;
}

inline ir::Arg V(ir::ValueId v) { return ir::Arg::Value(v); }

// y = relu(x @ w.T + b): x [8, 16], w [32, 16], b [32].
inline ir::Graph LinearRelu() {
  ir::GraphBuilder b;
  auto x = b.AddInput("x", Tensor({8, 16}), ir::InputKind::kUser);
  auto w = b.AddInput("w", Tensor({32, 16}), ir::InputKind::kParameter, "fc.weight");
  auto bias = b.AddInput("b", Tensor({32}), ir::InputKind::kParameter, "fc.bias");
  auto t = b.AddNode(Op("t", "aten::t.default", {V(w)}, Tensor({16, 32})));
  auto addmm = b.AddNode(Op("addmm", "aten::addmm.default",
                            {V(bias), V(x), V(b.peek().node(t).outputs[0])}, Tensor({8, 32})));
  auto relu = b.AddNode(
      Op("relu", "aten::relu.default", {V(b.peek().node(addmm).outputs[0])}, Tensor({8, 32})));
  b.SetOutput(ir::Arg::List({V(b.peek().node(relu).outputs[0])}, /*tuple=*/true));
  return b.Build();
}

}  // namespace tp::testing
