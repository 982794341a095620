// DType tables and type printing.
#include "ir/types.h"

#include <algorithm>
#include <array>
#include <sstream>

namespace tp::ir {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  const char* short_name;
  int64_t item_size;
  bool floating;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {DType::kUnknown, "unknown", "?", 0, false},
    {DType::kBool, "bool", "b8", 1, false},
    {DType::kUInt8, "uint8", "u8", 1, false},
    {DType::kInt8, "int8", "i8", 1, false},
    {DType::kInt16, "int16", "i16", 2, false},
    {DType::kInt32, "int32", "i32", 4, false},
    {DType::kInt64, "int64", "i64", 8, false},
    {DType::kFloat16, "float16", "f16", 2, true},
    {DType::kBFloat16, "bfloat16", "bf16", 2, true},
    {DType::kFloat32, "float32", "f32", 4, true},
    {DType::kFloat64, "float64", "f64", 8, true},
    {DType::kComplex64, "complex64", "c64", 8, false},
    {DType::kComplex128, "complex128", "c128", 16, false},
    {DType::kFloat8E4M3, "float8_e4m3fn", "f8e4m3", 1, true},
    {DType::kFloat8E5M2, "float8_e5m2", "f8e5m2", 1, true},
}};

const DTypeInfo& Info(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];
}

}  // namespace

DType DTypeFromName(const std::string& name) {
  for (const auto& info : kDTypes) {
    if (name == info.name) return info.dtype;
  }
  return DType::kUnknown;
}

const char* DTypeName(DType dtype) { return Info(dtype).name; }
const char* DTypeShortName(DType dtype) { return Info(dtype).short_name; }
DType DTypeFromShortName(const std::string& name) {
  for (const auto& info : kDTypes) {
    if (name == info.short_name) return info.dtype;
  }
  return DType::kUnknown;
}
int64_t ItemSize(DType dtype) { return Info(dtype).item_size; }
bool IsFloatingPoint(DType dtype) { return Info(dtype).floating; }

std::optional<int64_t> TensorType::NumelHint() const {
  // Sizes come from outside (Python records, fuzzers): an overflowing product is "unknown",
  // not undefined behaviour.
  int64_t n = 1;
  for (const auto& d : shape) {
    auto h = d.hint();
    if (!h || __builtin_mul_overflow(n, *h, &n)) return std::nullopt;
  }
  return n;
}

std::optional<int64_t> TensorType::BytesHint() const {
  auto n = NumelHint();
  int64_t bytes = 0;
  if (!n || __builtin_mul_overflow(*n, ItemSize(dtype), &bytes)) return std::nullopt;
  return bytes;
}

bool TensorType::operator==(const TensorType& o) const {
  return shape == o.shape && stride == o.stride && dtype == o.dtype && device == o.device &&
         requires_grad == o.requires_grad;
}

const char* ValueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kTensor:
      return "tensor";
    case ValueKind::kSymInt:
      return "symint";
    case ValueKind::kSymFloat:
      return "symfloat";
    case ValueKind::kSymBool:
      return "symbool";
    case ValueKind::kNone:
      return "none";
    case ValueKind::kOpaque:
      return "opaque";
  }
  return "?";
}

namespace {

// A dimension as the text form writes it: "768", "s0", or "s0=4" when a symbol has a hint.
void PrintDim(std::ostringstream& os, const SymDim& d) {
  os << d.ToString();
  if (d.is_symbolic() && d.value >= 0) os << "=" << d.value;
}

void PrintDims(std::ostringstream& os, const std::vector<SymDim>& dims) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) os << ", ";
    PrintDim(os, dims[i]);
  }
}

// True when `stride` is exactly what a contiguous tensor of `shape` has, so the text form can
// leave it out. Strict on size-1 dims too: passes read those strides (cache_parallel's layout
// check), so the text must keep them.
bool ContiguousStride(const TensorType& t) {
  int64_t expected = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    const SymDim& s = t.stride[i];
    if (s.is_symbolic() || t.shape[i].is_symbolic()) return false;
    if (s.value != expected) return false;
    // Sizes come from outside (fuzzers, records): a product past int64 is not a layout.
    if (__builtin_mul_overflow(expected, std::max<int64_t>(t.shape[i].value, 1), &expected)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string ValueType::ToString() const {
  std::ostringstream os;
  switch (kind) {
    case ValueKind::kTensor: {
      os << DTypeShortName(tensor.dtype) << "[";
      PrintDims(os, tensor.shape);
      os << "]";
      // Strides appear only when they say something: unknown (empty) and contiguous layouts
      // print nothing.
      if (!tensor.stride.empty() && !ContiguousStride(tensor)) {
        os << "{";
        PrintDims(os, tensor.stride);
        os << "}";
      }
      if (tensor.device != "cpu") os << "@" << tensor.device;
      if (tensor.requires_grad) os << " grad";
      break;
    }
    case ValueKind::kSymInt:
    case ValueKind::kSymFloat:
    case ValueKind::kSymBool:
      os << ValueKindName(kind) << "(" << expr << ")";
      break;
    case ValueKind::kNone:
      os << "none";
      break;
    case ValueKind::kOpaque:
      os << "opaque";
      if (!note.empty()) os << "<" << note << ">";
      break;
  }
  return os.str();
}

}  // namespace tp::ir
