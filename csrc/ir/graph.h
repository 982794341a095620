// The C++ IR: a graph of ATen-level nodes in topological order, in SSA form.
//
// A Graph is an immutable value: passes read a `const Graph&` and build a new one through a
// GraphBuilder, which is the only way to make a graph. Node arguments mirror FX arguments
// exactly (values, constants, nested lists, tagged dtypes/devices, opaque Python objects by
// index) so the bridge can rebuild the identical FX graph. Must not include torch or Python.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/types.h"

namespace tp::ir {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr NodeId kNoNode = -1;

// A malformed graph. `node` names the offending node (or input) so the user can find it.
class GraphError : public std::runtime_error {
 public:
  GraphError(std::string node, const std::string& what)
      : std::runtime_error(node.empty() ? what : "node '" + node + "': " + what),
        node_(std::move(node)) {}
  const std::string& node() const { return node_; }

 private:
  std::string node_;
};

// One argument of a node, exactly as FX had it.
struct Arg {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kDouble,
    kString,
    kValue,         // reference to an SSA value (i = ValueId)
    kList,
    kTuple,
    kDtype,         // s = torch name, e.g. "float32"
    kDevice,        // s = "cpu", "cuda:0"
    kLayout,        // s = "strided"
    kMemoryFormat,  // s = "contiguous_format"
    kOpaque,        // a Python object the bridge keeps; i = its index there
  };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double d = 0.0;
  std::string s;
  std::vector<Arg> items;

  static Arg None() { return Arg{}; }
  static Arg Bool(bool v) {
    Arg a;
    a.kind = Kind::kBool;
    a.b = v;
    return a;
  }
  static Arg Int(int64_t v) {
    Arg a;
    a.kind = Kind::kInt;
    a.i = v;
    return a;
  }
  static Arg Double(double v) {
    Arg a;
    a.kind = Kind::kDouble;
    a.d = v;
    return a;
  }
  static Arg Value(ValueId v) {
    Arg a;
    a.kind = Kind::kValue;
    a.i = v;
    return a;
  }
  static Arg Opaque(int64_t index) {
    Arg a;
    a.kind = Kind::kOpaque;
    a.i = index;
    return a;
  }
  // kString, kDtype, kDevice, kLayout, kMemoryFormat.
  static Arg Tagged(Kind kind, std::string s) {
    Arg a;
    a.kind = kind;
    a.s = std::move(s);
    return a;
  }
  static Arg String(std::string s) { return Tagged(Kind::kString, std::move(s)); }
  static Arg List(std::vector<Arg> items, bool tuple = false) {
    Arg a;
    a.kind = tuple ? Kind::kTuple : Kind::kList;
    a.items = std::move(items);
    return a;
  }

  bool is_value() const { return kind == Kind::kValue; }
  ValueId value() const { return static_cast<ValueId>(i); }
  // Calls fn on every value referenced, depth first, in argument order.
  void ForEachValue(const std::function<void(ValueId)>& fn) const;
  // A copy with every value id v replaced by map[v].
  Arg Remap(const std::vector<ValueId>& map) const;
  bool operator==(const Arg& o) const;
};

struct NamedArg {
  std::string name;
  Arg value;
  bool operator==(const NamedArg& o) const { return name == o.name && value == o.value; }
};

// Why a graph input exists; passes use it (parameters are sharded, tangents are not, ...).
enum class InputKind { kUser, kParameter, kBuffer, kSymbol, kTangent, kSaved };
const char* InputKindName(InputKind kind);
InputKind InputKindFromName(const std::string& name);

struct Value {
  ValueId id = -1;
  std::string name;  // FX node name that carries this value; may be empty for unused outputs
  ValueType type;
  NodeId producer = kNoNode;  // kNoNode for graph inputs
  int32_t output_index = 0;
};

struct GraphInput {
  ValueId value = -1;
  InputKind kind = InputKind::kUser;
  std::string source;  // e.g. parameter path "layers.0.attn.q_proj.weight"
};

struct Node {
  NodeId id = kNoNode;
  std::string name;  // unique; the FX node name
  std::string op;    // "aten::mm.default", "torch_plugin::bias_gelu.default", "fx::get_attr"
  std::vector<Arg> args;
  std::vector<NamedArg> kwargs;
  std::vector<ValueId> outputs;
  // True when the node returns a tuple/list whose elements are `outputs` (FX getitem users).
  bool tuple_output = false;
  std::string scope;  // nn.Module path, e.g. "transformer.h.0.attn"
  std::map<std::string, std::string> attrs;

  void ForEachInput(const std::function<void(ValueId)>& fn) const;
};

class GraphBuilder;

class Graph {
 public:
  const std::vector<GraphInput>& inputs() const { return inputs_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const Arg& output() const { return output_; }
  const Value& value(ValueId v) const;
  const Node& node(NodeId n) const;
  const ValueType& type(ValueId v) const { return value(v).type; }

  // users[v] lists the nodes that read value v, in order, once per node.
  std::vector<std::vector<NodeId>> ComputeUsers() const;
  // Values referenced by the graph output.
  std::vector<ValueId> OutputValues() const;
  // A builder holding a copy of this graph; Build() yields the edited graph.
  GraphBuilder Edit() const;

 private:
  friend class GraphBuilder;
  std::vector<GraphInput> inputs_;
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  Arg output_ = Arg::List({}, /*tuple=*/true);
};

// Everything AddNode needs; output names may be empty (unused tuple elements).
struct NodeSpec {
  std::string name;
  std::string op;
  std::vector<Arg> args;
  std::vector<NamedArg> kwargs;
  std::vector<ValueType> output_types;
  std::vector<std::string> output_names;
  bool tuple_output = false;
  std::string scope;
  std::map<std::string, std::string> attrs;
};

class GraphBuilder {
 public:
  GraphBuilder() = default;
  ValueId AddInput(const std::string& name, ValueType type, InputKind kind,
                   const std::string& source = "");
  // Appends a node; argument references are checked by Build(), so records that arrive
  // malformed from Python get one clear error instead of a crash here.
  NodeId AddNode(NodeSpec spec);
  void SetOutput(Arg output);
  // Rebuilding passes copy what they keep: every input of `from` (returns the old -> new value
  // map, -1 for values not copied yet), and one node with its arguments remapped (its outputs
  // are added to `remap`).
  std::vector<ValueId> CopyInputs(const Graph& from);
  NodeId CopyNode(const Graph& from, const Node& node, std::vector<ValueId>* remap);
  int64_t num_values() const { return static_cast<int64_t>(graph_.values_.size()); }
  const Graph& peek() const { return graph_; }
  // Verifies (see verify.h) and returns the graph; throws GraphError when malformed.
  Graph Build();
  // For tests of the verifier itself.
  Graph BuildUnverified();

 private:
  friend class Graph;
  Graph graph_;
};

}  // namespace tp::ir
