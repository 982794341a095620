// libFuzzer target over the C++ graph builder, verifier, printer, estimates and pass pipeline.
//
// The input bytes are a little program for GraphBuilder: add inputs with random types, add
// nodes with random ops (known and unknown), arities, references (valid, dangling, forward),
// constants, kwargs and tuple outputs, then set an output. Whatever the bytes, the core must
// either build a graph that verifies, prints, estimates and survives the pipeline, or throw
// GraphError / PassError. Anything else (a crash, an ASan/UBSan report, another exception type)
// is a bug. Build: make fuzz (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/op_registry.h"
#include "ir/text.h"
#include "ir/verify.h"
#include "passes/pass_manager.h"

namespace {

using namespace tp;

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  int64_t Small(int64_t lo, int64_t hi) { return lo + U8() % (hi - lo + 1); }
  int64_t I64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | U8();
    return static_cast<int64_t>(v);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

const std::vector<std::string> kOps = {
    "aten::mm.default",
    "aten::addmm.default",
    "aten::bmm.default",
    "aten::baddbmm.default",
    "aten::convolution.default",
    "aten::convolution_backward.default",
    "aten::scaled_dot_product_attention.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten::embedding.default",
    "aten::embedding_dense_backward.default",
    "aten::native_layer_norm.default",
    "aten::_softmax.default",
    "aten::sum.dim_IntList",
    "aten::gelu.default",
    "aten::add.Tensor",
    "aten::view.default",
    "aten::native_dropout.default",
    "aten::copy_.default",
    "aten::sym_size.int",
    "aten::linear.default",
    "aten::max_pool2d_with_indices.default",
    "torch_plugin::bias_gelu.default",
    "mylib::unknown.default",
    "fx::get_attr",
    "python::_operator.getitem",
    "",
    "aten::",
    "::",
    "aten::mm",
};

ir::ValueType RandomType(Bytes& in) {
  switch (in.U8() % 6) {
    case 0:
      return ir::ValueType::None();
    case 1:
      return ir::ValueType::Scalar(ir::ValueKind::kSymInt, "s" + std::to_string(in.U8()));
    case 2:
      return ir::ValueType::Opaque("fuzz");
    default:
      break;
  }
  ir::TensorType t;
  const int64_t rank = in.Small(0, 5);
  for (int64_t d = 0; d < rank; ++d) {
    const uint8_t kind = in.U8() % 8;
    if (kind == 0) {
      t.shape.push_back(ir::SymDim::Symbolic("s" + std::to_string(in.U8() % 4), in.Small(-2, 9)));
    } else if (kind == 1) {
      t.shape.push_back(ir::SymDim::Concrete(in.I64()));  // huge, negative: the verifier's job
    } else {
      t.shape.push_back(ir::SymDim::Concrete(in.Small(0, 64)));
    }
  }
  if (in.U8() % 4 == 0) {
    for (int64_t d = 0; d < in.Small(0, 5); ++d)
      t.stride.push_back(ir::SymDim::Concrete(in.Small(0, 9)));
  }
  t.dtype = static_cast<ir::DType>(in.U8() % 15);
  t.requires_grad = in.U8() & 1;
  return ir::ValueType::Tensor(t);
}

ir::Arg RandomArg(Bytes& in, int64_t num_values, int depth) {
  switch (in.U8() % (depth > 2 ? 8 : 10)) {
    case 0:
      return ir::Arg::None();
    case 1:
      return ir::Arg::Bool(in.U8() & 1);
    case 2:
      return ir::Arg::Int(in.I64());
    case 3:
      return ir::Arg::Double(static_cast<double>(in.I64()) / 7.0);
    case 4:
      return ir::Arg::String(std::string(in.Small(0, 4), 'a'));
    case 5:
      return ir::Arg::Tagged(ir::Arg::Kind::kDtype, "float32");
    case 6:
      return ir::Arg::Opaque(in.U8());
    case 7: {
      // Mostly valid references; sometimes dangling, negative or forward.
      const uint8_t mode = in.U8() % 8;
      if (mode == 0) return ir::Arg::Value(static_cast<ir::ValueId>(in.I64()));
      if (mode == 1) return ir::Arg::Value(static_cast<ir::ValueId>(num_values + in.Small(0, 3)));
      return ir::Arg::Value(num_values > 0 ? static_cast<ir::ValueId>(in.U8() % num_values) : 0);
    }
    default: {
      std::vector<ir::Arg> items;
      for (int64_t i = 0, n = in.Small(0, 4); i < n; ++i) {
        items.push_back(RandomArg(in, num_values, depth + 1));
      }
      return ir::Arg::List(std::move(items), in.U8() & 1);
    }
  }
}

void Exercise(const ir::Graph& g) {
  ir::Verify(g);
  (void)ir::PrintGraph(g);
  const auto& reg = ir::OpRegistry::Default();
  for (const auto& n : g.nodes()) (void)reg.Estimate(g, n);
  (void)g.ComputeUsers();
  passes::RewriteOptions options;
  options.cache_parallel.world = 2;
  (void)passes::PassManager().Run(g, {"dead_code_elimination", "cache_parallel"}, options);
  // The text form reads back as the same text.
  const std::string text = ir::PrintGraph(g);
  if (ir::PrintGraph(ir::ParseGraph(text)) != text) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  ir::GraphBuilder b;
  int node_count = 0;
  try {
    for (int64_t i = 0, n = in.Small(0, 4); i < n; ++i) {
      b.AddInput("in" + std::to_string(i), RandomType(in), static_cast<ir::InputKind>(in.U8() % 6),
                 "");
    }
    while (!in.empty() && node_count < 64) {
      ir::NodeSpec spec;
      spec.name = (in.U8() % 32 == 0) ? "in0" : "n" + std::to_string(node_count++);
      spec.op = kOps[in.U8() % kOps.size()];
      for (int64_t a = 0, n = in.Small(0, 10); a < n; ++a) {
        spec.args.push_back(RandomArg(in, b.num_values(), 0));
      }
      if (in.U8() % 4 == 0) spec.kwargs.push_back({"k", RandomArg(in, b.num_values(), 0)});
      spec.tuple_output = in.U8() % 4 == 0;
      const int64_t outs = spec.tuple_output ? in.Small(0, 4) : (in.U8() % 16 == 0 ? 2 : 1);
      for (int64_t o = 0; o < outs; ++o) {
        spec.output_types.push_back(RandomType(in));
        spec.output_names.push_back(o == 0 ? spec.name
                                           : (in.U8() & 1 ? "" : "o" + std::to_string(o)));
      }
      b.AddNode(std::move(spec));
    }
    b.SetOutput(ir::Arg::List({RandomArg(in, b.num_values(), 0)}, true));
    ir::Graph g = b.BuildUnverified();
    Exercise(g);
  } catch (const ir::GraphError&) {
  } catch (const passes::PassError&) {
  }
  return 0;
}
