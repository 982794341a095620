// Types carried by IR values: tensors with (possibly symbolic) shapes, symbolic scalars and
// opaque values. Plain data, no torch: the bridge fills them from FakeTensor metadata.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tp::ir {

enum class DType {
  kUnknown,
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,
  kComplex128,
  kFloat8E4M3,
  kFloat8E5M2,
};

// Names follow torch ("float32", "bfloat16", ...) so the bridge maps them without a table.
DType DTypeFromName(const std::string& name);
const char* DTypeName(DType dtype);
// Short form used by the printer: f32, bf16, i64, ...
const char* DTypeShortName(DType dtype);
// Inverse of DTypeShortName; kUnknown for a name it does not know.
DType DTypeFromShortName(const std::string& name);
int64_t ItemSize(DType dtype);
bool IsFloatingPoint(DType dtype);

// One dimension of a shape or stride: a concrete size, or a symbolic expression such as
// "s0" or "2*s0" with an optional hint (the size seen at capture time).
struct SymDim {
  int64_t value = 0;          // the size when concrete, else the hint (or -1 if none)
  std::string expr;           // empty when concrete
  bool is_symbolic() const { return !expr.empty(); }
  std::optional<int64_t> hint() const {
    if (!is_symbolic() || value >= 0) return value;
    return std::nullopt;
  }
  static SymDim Concrete(int64_t v) { return SymDim{v, ""}; }
  static SymDim Symbolic(std::string e, int64_t hint = -1) { return SymDim{hint, std::move(e)}; }
  bool operator==(const SymDim& o) const { return value == o.value && expr == o.expr; }
  std::string ToString() const { return is_symbolic() ? expr : std::to_string(value); }
};

struct TensorType {
  std::vector<SymDim> shape;
  std::vector<SymDim> stride;  // empty when unknown
  DType dtype = DType::kUnknown;
  std::string device = "cpu";
  bool requires_grad = false;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  // Number of elements using hints for symbolic dims; nullopt if some dim has no hint.
  std::optional<int64_t> NumelHint() const;
  std::optional<int64_t> BytesHint() const;
  bool operator==(const TensorType& o) const;
};

// What a value is. Tensors carry a TensorType; symbolic scalars carry their expression.
enum class ValueKind { kTensor, kSymInt, kSymFloat, kSymBool, kNone, kOpaque };
const char* ValueKindName(ValueKind kind);

struct ValueType {
  ValueKind kind = ValueKind::kOpaque;
  TensorType tensor;       // valid when kind == kTensor
  std::string expr;        // symbolic scalars: expression, or the literal when concrete
  std::string note;        // opaque values: a short description for diagnostics

  static ValueType Tensor(TensorType t) {
    ValueType v;
    v.kind = ValueKind::kTensor;
    v.tensor = std::move(t);
    return v;
  }
  static ValueType Scalar(ValueKind kind, std::string expr) {
    ValueType v;
    v.kind = kind;
    v.expr = std::move(expr);
    return v;
  }
  static ValueType None() {
    ValueType v;
    v.kind = ValueKind::kNone;
    return v;
  }
  static ValueType Opaque(std::string note) {
    ValueType v;
    v.kind = ValueKind::kOpaque;
    v.note = std::move(note);
    return v;
  }
  bool is_tensor() const { return kind == ValueKind::kTensor; }
  std::string ToString() const;
};

}  // namespace tp::ir
