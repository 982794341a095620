// Graph storage and construction.
#include "ir/graph.h"

#include <array>
#include <utility>

#include "ir/verify.h"

namespace tp::ir {

void Arg::ForEachValue(const std::function<void(ValueId)>& fn) const {
  if (kind == Kind::kValue) {
    fn(value());
  } else if (kind == Kind::kList || kind == Kind::kTuple) {
    for (const auto& item : items) item.ForEachValue(fn);
  }
}

Arg Arg::Remap(const std::vector<ValueId>& map) const {
  Arg out = *this;
  if (kind == Kind::kValue) {
    out.i = map.at(static_cast<size_t>(value()));
  } else {
    for (auto& item : out.items) item = item.Remap(map);
  }
  return out;
}

bool Arg::operator==(const Arg& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b == o.b;
    case Kind::kInt:
    case Kind::kValue:
    case Kind::kOpaque:
      return i == o.i;
    case Kind::kDouble:
      return d == o.d;
    case Kind::kList:
    case Kind::kTuple:
      return items == o.items;
    default:
      return s == o.s;
  }
}

namespace {
constexpr std::array<std::pair<InputKind, const char*>, 6> kInputKinds = {{
    {InputKind::kUser, "user"},
    {InputKind::kParameter, "parameter"},
    {InputKind::kBuffer, "buffer"},
    {InputKind::kSymbol, "symbol"},
    {InputKind::kTangent, "tangent"},
    {InputKind::kSaved, "saved"},
}};
}  // namespace

const char* InputKindName(InputKind kind) {
  for (const auto& [k, name] : kInputKinds) {
    if (k == kind) return name;
  }
  return "user";
}

InputKind InputKindFromName(const std::string& name) {
  for (const auto& [k, n] : kInputKinds) {
    if (name == n) return k;
  }
  throw GraphError("", "unknown input kind '" + name +
                           "' (valid: user, parameter, buffer, symbol, tangent, saved)");
}

void Node::ForEachInput(const std::function<void(ValueId)>& fn) const {
  for (const auto& a : args) a.ForEachValue(fn);
  for (const auto& kw : kwargs) kw.value.ForEachValue(fn);
}

const Value& Graph::value(ValueId v) const {
  if (v < 0 || static_cast<size_t>(v) >= values_.size()) {
    throw GraphError("", "value id " + std::to_string(v) + " is out of range");
  }
  return values_[static_cast<size_t>(v)];
}

const Node& Graph::node(NodeId n) const {
  if (n < 0 || static_cast<size_t>(n) >= nodes_.size()) {
    throw GraphError("", "node id " + std::to_string(n) + " is out of range");
  }
  return nodes_[static_cast<size_t>(n)];
}

std::vector<std::vector<NodeId>> Graph::ComputeUsers() const {
  std::vector<std::vector<NodeId>> users(values_.size());
  for (const auto& node : nodes_) {
    node.ForEachInput([&](ValueId v) {
      if (v < 0 || static_cast<size_t>(v) >= users.size()) return;
      auto& list = users[static_cast<size_t>(v)];
      if (list.empty() || list.back() != node.id) list.push_back(node.id);
    });
  }
  return users;
}

std::vector<ValueId> Graph::OutputValues() const {
  std::vector<ValueId> out;
  output_.ForEachValue([&](ValueId v) { out.push_back(v); });
  return out;
}

std::vector<ValueId> GraphBuilder::CopyInputs(const Graph& from) {
  std::vector<ValueId> remap(from.values().size(), -1);
  for (const auto& in : from.inputs()) {
    const Value& v = from.value(in.value);
    remap[static_cast<size_t>(in.value)] = AddInput(v.name, v.type, in.kind, in.source);
  }
  return remap;
}

NodeId GraphBuilder::CopyNode(const Graph& from, const Node& node, std::vector<ValueId>* remap) {
  NodeSpec spec;
  spec.name = node.name;
  spec.op = node.op;
  for (const auto& a : node.args) spec.args.push_back(a.Remap(*remap));
  for (const auto& kw : node.kwargs) spec.kwargs.push_back({kw.name, kw.value.Remap(*remap)});
  for (ValueId out : node.outputs) {
    spec.output_types.push_back(from.type(out));
    spec.output_names.push_back(from.value(out).name);
  }
  spec.tuple_output = node.tuple_output;
  spec.scope = node.scope;
  spec.attrs = node.attrs;
  const NodeId id = AddNode(std::move(spec));
  const Node& added = graph_.node(id);
  for (size_t i = 0; i < node.outputs.size(); ++i)
    (*remap)[static_cast<size_t>(node.outputs[i])] = added.outputs[i];
  return id;
}

GraphBuilder Graph::Edit() const {
  GraphBuilder b;
  b.graph_ = *this;
  return b;
}

ValueId GraphBuilder::AddInput(const std::string& name, ValueType type, InputKind kind,
                               const std::string& source) {
  Value v;
  v.id = static_cast<ValueId>(graph_.values_.size());
  v.name = name;
  v.type = std::move(type);
  graph_.values_.push_back(v);
  graph_.inputs_.push_back(GraphInput{v.id, kind, source});
  return v.id;
}

NodeId GraphBuilder::AddNode(NodeSpec spec) {
  Node node;
  node.id = static_cast<NodeId>(graph_.nodes_.size());
  node.name = std::move(spec.name);
  node.op = std::move(spec.op);
  node.args = std::move(spec.args);
  node.kwargs = std::move(spec.kwargs);
  node.tuple_output = spec.tuple_output;
  node.scope = std::move(spec.scope);
  node.attrs = std::move(spec.attrs);
  if (!spec.output_names.empty() && spec.output_names.size() != spec.output_types.size()) {
    throw GraphError(node.name, "has " + std::to_string(spec.output_types.size()) +
                                    " output types but " +
                                    std::to_string(spec.output_names.size()) + " output names");
  }
  if (!node.tuple_output && spec.output_types.size() != 1) {
    throw GraphError(node.name, "a node that does not return a tuple must have exactly one "
                                "output, got " + std::to_string(spec.output_types.size()));
  }
  for (size_t i = 0; i < spec.output_types.size(); ++i) {
    Value v;
    v.id = static_cast<ValueId>(graph_.values_.size());
    v.name = spec.output_names.empty() ? (node.tuple_output ? "" : node.name)
                                       : spec.output_names[i];
    v.type = std::move(spec.output_types[i]);
    v.producer = node.id;
    v.output_index = static_cast<int32_t>(i);
    graph_.values_.push_back(std::move(v));
    node.outputs.push_back(graph_.values_.back().id);
  }
  graph_.nodes_.push_back(std::move(node));
  return graph_.nodes_.back().id;
}

void GraphBuilder::SetOutput(Arg output) { graph_.output_ = std::move(output); }

Graph GraphBuilder::Build() {
  Verify(graph_);
  return std::move(graph_);
}

Graph GraphBuilder::BuildUnverified() { return std::move(graph_); }

}  // namespace tp::ir
