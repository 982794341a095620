#include "ir/text.h"

#include <gtest/gtest.h>

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
  EXPECT_NE(text.find("(%getitem, _, %getitem_2) %native_layer_norm = "
                      "aten::native_layer_norm.default(%x, [8], None, True, 1.0000000000000001e-05, "
                      "dtype=torch.float16, device=device(\"cpu\"), obj=<opaque#3>, s=\"tanh\")  "
                      "# encoder.ln"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("return (%getitem, None)"), std::string::npos) << text;
}

}  // namespace
}  // namespace tp::ir
