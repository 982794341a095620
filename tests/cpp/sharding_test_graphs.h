// A hand-built GPT block as AOTAutograd emits its forward, shared by the sharding tests.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "test_graphs.h"

namespace tp::testing {

// x [T, E] -> q/k/v = addmm(b, x, t(w)) -> view [B, S, H, D] -> transpose -> sdpa -> transpose
// -> view [T, E] -> addmm(bo, ., t(wo)) -> + x -> addmm(b1, ., t(w1)) -> gelu ->
// addmm(b2, ., t(w2)) -> + residual.
inline ir::Graph GptBlock(int64_t B = 8, int64_t S = 128, int64_t E = 1024, int64_t H = 16,
                          int layers = 1) {
  const int64_t T = B * S, D = E / H, F = 4 * E;
  ir::GraphBuilder b;
  auto out0 = [&](ir::NodeId n) { return b.peek().node(n).outputs[0]; };
  auto I = [](int64_t v) { return ir::Arg::Int(v); };
  auto L = [&](std::vector<int64_t> v) {
    std::vector<ir::Arg> items;
    for (int64_t x : v) items.push_back(ir::Arg::Int(x));
    return ir::Arg::List(items);
  };
  auto x = b.AddInput("x", Tensor({T, E}), ir::InputKind::kUser);
  auto param = [&](const std::string& name, std::vector<int64_t> shape) {
    return b.AddInput(name, Tensor(shape), ir::InputKind::kParameter, name);
  };
  auto linear = [&](const std::string& p, ir::ValueId in, int64_t fin, int64_t fout) {
    auto w = param(p + ".weight", {fout, fin});
    auto bias = param(p + ".bias", {fout});
    auto t = out0(b.AddNode(Op(p + "_t", "aten::t.default", {V(w)}, Tensor({fin, fout}))));
    return out0(b.AddNode(
        Op(p + "_addmm", "aten::addmm.default", {V(bias), V(in), V(t)}, Tensor({T, fout}))));
  };
  auto heads = [&](const std::string& p, ir::ValueId v) {
    auto view = out0(b.AddNode(
        Op(p + "_view", "aten::view.default", {V(v), L({B, S, H, D})}, Tensor({B, S, H, D}))));
    return out0(b.AddNode(
        Op(p + "_tr", "aten::transpose.int", {V(view), I(1), I(2)}, Tensor({B, H, S, D}))));
  };
  ir::ValueId in = x, r2 = x;
  for (int layer = 0; layer < layers; ++layer) {
    const std::string P = layers == 1 ? "" : "l" + std::to_string(layer) + ".";
    auto q = heads(P + "q", linear(P + "attn.q", in, E, E));
    auto k = heads(P + "k", linear(P + "attn.k", in, E, E));
    auto v = heads(P + "v", linear(P + "attn.v", in, E, E));
    ir::NodeSpec sdpa =
        Op(P + "sdpa", "aten::_scaled_dot_product_flash_attention_for_cpu.default",
           {V(q), V(k), V(v), ir::Arg::Double(0.0), ir::Arg::Bool(true)}, Tensor({B, H, S, D}));
    sdpa.output_types.push_back(Tensor({B, H, S}));
    sdpa.output_names = {P + "attn", P + "lse"};
    sdpa.tuple_output = true;
    auto attn = out0(b.AddNode(sdpa));
    auto back = out0(
        b.AddNode(Op(P + "attn_tr", "aten::transpose.int", {V(attn), I(1), I(2)}, Tensor({B, S, H, D}))));
    auto flat =
        out0(b.AddNode(Op(P + "attn_view", "aten::view.default", {V(back), L({T, E})}, Tensor({T, E}))));
    auto proj = linear(P + "attn.o", flat, E, E);
    auto r1 = out0(b.AddNode(Op(P + "res1", "aten::add.Tensor", {V(in), V(proj)}, Tensor({T, E}))));
    auto h = linear(P + "mlp.fc1", r1, E, F);
    auto gelu = out0(b.AddNode(Op(P + "gelu", "aten::gelu.default", {V(h)}, Tensor({T, F}))));
    auto m = linear(P + "mlp.fc2", gelu, F, E);
    r2 = out0(b.AddNode(Op(P + "res2", "aten::add.Tensor", {V(r1), V(m)}, Tensor({T, E}))));
    in = r2;
  }
  b.SetOutput(ir::Arg::List({V(r2)}, /*tuple=*/true));
  return b.Build();
}

}  // namespace tp::testing
