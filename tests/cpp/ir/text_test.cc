#include "ir/text.h"

#include <gtest/gtest.h>

#include "sharding_test_graphs.h"
#include "test_graphs.h"

namespace tp::ir {
namespace {

TEST(TextTest, PrintsLinearRelu) {
  const std::string expected =
      "graph(%x: f32[8, 16] user,\n"
      "      %w: f32[32, 16] parameter \"fc.weight\",\n"
      "      %b: f32[32] parameter \"fc.bias\"):\n"
      "  %t: f32[16, 32] = aten::t.default(%w)\n"
      "  %addmm: f32[8, 32] = aten::addmm.default(%b, %x, %t)\n"
      "  %relu: f32[8, 32] = aten::relu.default(%addmm)\n"
      "  return (%relu,)\n";
  EXPECT_EQ(PrintGraph(testing::LinearRelu()), expected);
}

TEST(TextTest, PrintsConstantsKwargsTuplesAndScopes) {
  GraphBuilder b;
  auto x = b.AddInput("x", testing::Tensor({2, 8}), InputKind::kUser);
  NodeSpec spec;
  spec.name = "native_layer_norm";
  spec.op = "aten::native_layer_norm.default";
  spec.args = {Arg::Value(x), Arg::List({Arg::Int(8)}), Arg::None(), Arg::Bool(true),
               Arg::Double(1e-5)};
  spec.kwargs = {{"dtype", Arg::Tagged(Arg::Kind::kDtype, "float16")},
                 {"device", Arg::Tagged(Arg::Kind::kDevice, "cpu")},
                 {"obj", Arg::Opaque(3)},
                 {"s", Arg::String("tanh")}};
  spec.output_types = {testing::Tensor({2, 8}), testing::Tensor({2, 1}),
                       testing::Tensor({2, 1})};
  spec.output_names = {"getitem", "", "getitem_2"};
  spec.tuple_output = true;
  spec.scope = "encoder.ln";
  b.AddNode(spec);
  b.SetOutput(Arg::List({Arg::Value(1), Arg::None()}, true));
  const std::string text = PrintGraph(b.Build());
  EXPECT_NE(text.find("(%getitem: f32[2, 8], _: f32[2, 1], %getitem_2: f32[2, 1]) "
                      "%native_layer_norm = "
                      "aten::native_layer_norm.default(%x, [8], None, True, 1e-05, "
                      "dtype=torch.float16, device=device(\"cpu\"), obj=<opaque#3>, s=\"tanh\")  "
                      "# encoder.ln"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("return (%getitem, None)"), std::string::npos) << text;
}

// Every kind of argument, symbolic dims with hints, strides, devices, attrs, a renamed node.
Graph EveryFeature() {
  GraphBuilder b;
  TensorType sym = testing::F32({4, 8});
  sym.shape[0] = SymDim::Symbolic("s0", 4);
  sym.requires_grad = true;
  auto x = b.AddInput("x", ValueType::Tensor(sym), InputKind::kUser);
  TensorType strided = testing::F32({8, 4});
  strided.stride = {SymDim::Concrete(1), SymDim::Concrete(8)};
  strided.device = "cuda:1";
  strided.dtype = DType::kBFloat16;
  auto w = b.AddInput("w", ValueType::Tensor(strided), InputKind::kParameter, "blk.w \"q\"");
  auto n = b.AddInput("n", ValueType::Scalar(ValueKind::kSymInt, "s0"), InputKind::kSymbol);
  NodeSpec spec;
  spec.name = "call";
  spec.op = "torch_plugin::thing.default";
  spec.args = {Arg::Value(x),
               Arg::List({Arg::Int(-3), Arg::Double(2.0), Arg::Double(-1e-30),
                          Arg::Double(0.1), Arg::Value(n)}),
               Arg::List({Arg::Value(w)}, true),
               Arg::List({}, true),
               Arg::None(),
               Arg::Bool(false),
               Arg::Tagged(Arg::Kind::kLayout, "strided"),
               Arg::Tagged(Arg::Kind::kMemoryFormat, "channels_last"),
               Arg::Tagged(Arg::Kind::kDtype, "bfloat16"),
               Arg::Tagged(Arg::Kind::kDevice, "cuda:0"),
               Arg::Opaque(7)};
  spec.kwargs = {{"mode", Arg::String("a \"b\" \\ c")}, {"eps", Arg::Double(1e-5)}};
  spec.output_types = {ValueType::Tensor(sym), ValueType::None(), ValueType::Opaque("Generator")};
  spec.output_names = {"o0", "", "o2"};
  spec.tuple_output = true;
  spec.scope = "model.layers.0.self_attn";
  spec.attrs = {{"cache_parallel.replaces", "sdpa"}, {"k", "v"}};
  b.AddNode(spec);
  NodeSpec renamed = testing::Op("relu_node", "aten::relu.default", {Arg::Value(3)},
                                 {ValueType::Tensor(sym)});
  renamed.output_names = {"relu"};
  b.AddNode(renamed);
  b.SetOutput(Arg::List({Arg::Value(6), Arg::List({Arg::Value(5), Arg::None()})}, true));
  return b.Build();
}

TEST(TextTest, ParseReadsBackWhatPrintWrote) {
  for (const Graph& g : {testing::LinearRelu(), testing::GptBlock(), EveryFeature()}) {
    const std::string text = PrintGraph(g);
    const Graph parsed = ParseGraph(text);
    EXPECT_EQ(PrintGraph(parsed), text);
    ASSERT_EQ(parsed.nodes().size(), g.nodes().size());
    ASSERT_EQ(parsed.values().size(), g.values().size());
    // Value ids follow text order in the parsed graph (a builder may interleave inputs and
    // nodes), so values are compared where they are defined and arguments by printed name.
    auto same_value = [&](ValueId pa, ValueId ex) {
      EXPECT_EQ(parsed.value(pa).name, g.value(ex).name);
      EXPECT_EQ(parsed.type(pa).kind, g.type(ex).kind);
      EXPECT_EQ(parsed.type(pa).expr, g.type(ex).expr);
      EXPECT_EQ(parsed.type(pa).note, g.type(ex).note);
      if (g.type(ex).is_tensor()) {
        EXPECT_EQ(parsed.type(pa).tensor, g.type(ex).tensor) << g.value(ex).name;
      }
    };
    for (size_t i = 0; i < g.inputs().size(); ++i) {
      same_value(parsed.inputs()[i].value, g.inputs()[i].value);
      EXPECT_EQ(parsed.inputs()[i].kind, g.inputs()[i].kind);
      EXPECT_EQ(parsed.inputs()[i].source, g.inputs()[i].source);
    }
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& a = parsed.nodes()[i];
      const Node& e = g.nodes()[i];
      EXPECT_EQ(a.name, e.name);
      EXPECT_EQ(a.op, e.op);
      ASSERT_EQ(a.args.size(), e.args.size());
      for (size_t k = 0; k < a.args.size(); ++k) {
        EXPECT_EQ(PrintArg(parsed, a.args[k]), PrintArg(g, e.args[k]));
        if (!e.args[k].is_value() && e.args[k].kind != Arg::Kind::kList &&
            e.args[k].kind != Arg::Kind::kTuple) {
          EXPECT_EQ(a.args[k], e.args[k]) << e.name << " arg " << k;
        }
      }
      ASSERT_EQ(a.kwargs.size(), e.kwargs.size());
      for (size_t k = 0; k < a.kwargs.size(); ++k) {
        EXPECT_EQ(a.kwargs[k].name, e.kwargs[k].name);
        EXPECT_EQ(PrintArg(parsed, a.kwargs[k].value), PrintArg(g, e.kwargs[k].value));
      }
      EXPECT_EQ(a.tuple_output, e.tuple_output);
      EXPECT_EQ(a.scope, e.scope);
      EXPECT_EQ(a.attrs, e.attrs);
      ASSERT_EQ(a.outputs.size(), e.outputs.size());
      for (size_t k = 0; k < a.outputs.size(); ++k) same_value(a.outputs[k], e.outputs[k]);
    }
    EXPECT_EQ(PrintArg(parsed, parsed.output()), PrintArg(g, g.output()));
  }
}
TEST(TextTest, AnUnnamedTupleElementThatIsReadGetsAName) {
  GraphBuilder b;
  auto x = b.AddInput("x", testing::Tensor({4, 8}), InputKind::kUser);
  NodeSpec split = testing::Op("split", "aten::split.Tensor", {Arg::Value(x), Arg::Int(4)},
                               testing::Tensor({4, 4}));
  split.output_types.push_back(testing::Tensor({4, 4}));
  split.output_names = {"", ""};
  split.tuple_output = true;
  b.AddNode(split);
  b.AddNode(testing::Op("relu", "aten::relu.default", {Arg::Value(2)}, testing::Tensor({4, 4})));
  b.SetOutput(Arg::List({Arg::Value(3)}, true));
  const std::string text = PrintGraph(b.Build());
  EXPECT_NE(text.find("(_: f32[4, 4], %v2: f32[4, 4]) %split"), std::string::npos) << text;
  EXPECT_EQ(PrintGraph(ParseGraph(text)), text);
}

TEST(TextTest, ParseSkipsCommentLinesAndNamesTheLineOfAnError) {
  const std::string ok =
      "// a golden file's header\n"
      "graph(%x: f32[2] user):\n"
      "\n"
      "  %relu: f32[2] = aten::relu.default(%x)\n"
      "  return (%relu,)\n";
  EXPECT_EQ(ParseGraph(ok).nodes().size(), 1u);
  const std::string undefined =
      "graph(%x: f32[2] user):\n"
      "  %relu: f32[2] = aten::relu.default(%y)\n"
      "  return (%relu,)\n";
  try {
    ParseGraph(undefined);
    FAIL() << "an undefined value must not parse";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'%y' is not defined"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ParseGraph("graph(%x: q32[2] user):\n  return (%x,)\n"), GraphError);
  EXPECT_THROW(ParseGraph("graph(%x: f32[2] user):\n  return (%x,) junk\n"), GraphError);
  EXPECT_THROW(ParseGraph("graph(%x: f32[2] user, %x: f32[2] user):\n  return (%x,)\n"),
               GraphError);
}

}  // namespace
}  // namespace tp::ir
