// Verifier; see verify.h for the list of checks.
#include "ir/verify.h"

#include <string>
#include <unordered_set>

#include "ir/op_registry.h"

namespace tp::ir {
namespace {

void CheckType(const std::string& owner, const ValueType& type) {
  if (!type.is_tensor()) return;
  const TensorType& t = type.tensor;
  if (t.dtype == DType::kUnknown) {
    throw GraphError(owner, "tensor has an unknown dtype; pass a torch dtype name such as "
                            "'float32'");
  }
  for (const auto& d : t.shape) {
    if (!d.is_symbolic() && d.value < 0) {
      throw GraphError(owner, "tensor has a negative size " + std::to_string(d.value));
    }
  }
  if (!t.stride.empty() && t.stride.size() != t.shape.size()) {
    throw GraphError(owner, "tensor stride has rank " + std::to_string(t.stride.size()) +
                                " but its shape has rank " + std::to_string(t.shape.size()));
  }
}

}  // namespace

void Verify(const Graph& graph) {
  const auto& values = graph.values();
  const size_t num_values = values.size();
  // defined_at[v]: -2 undefined, -1 defined by an input, n >= 0 defined by node n.
  std::vector<int64_t> defined_at(num_values, -2);
  std::unordered_set<std::string> names;

  for (size_t v = 0; v < num_values; ++v) {
    if (values[v].id != static_cast<ValueId>(v)) {
      throw GraphError(values[v].name, "value id " + std::to_string(values[v].id) +
                                           " does not match its position " + std::to_string(v));
    }
  }
  auto define = [&](ValueId v, int64_t where, const std::string& owner) {
    if (v < 0 || static_cast<size_t>(v) >= num_values) {
      throw GraphError(owner, "defines value id " + std::to_string(v) + " which does not exist");
    }
    if (defined_at[static_cast<size_t>(v)] != -2) {
      throw GraphError(owner, "redefines value %" + values[static_cast<size_t>(v)].name +
                                  " (each value must be defined once: SSA)");
    }
    defined_at[static_cast<size_t>(v)] = where;
  };

  for (const auto& in : graph.inputs()) {
    const Value& val = graph.value(in.value);
    define(in.value, -1, val.name);
    if (val.producer != kNoNode) {
      throw GraphError(val.name, "is a graph input but names node " +
                                     std::to_string(val.producer) + " as its producer");
    }
    if (val.name.empty()) throw GraphError("", "a graph input has no name");
    if (!names.insert(val.name).second) {
      throw GraphError(val.name, "name is used twice; names must be unique");
    }
    CheckType(val.name, val.type);
  }

  const OpRegistry& registry = OpRegistry::Default();
  const auto& nodes = graph.nodes();
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    if (node.name.empty()) throw GraphError("#" + std::to_string(n), "node has no name");
    if (node.id != static_cast<NodeId>(n)) {
      throw GraphError(node.name, "node id " + std::to_string(node.id) +
                                      " does not match its position " + std::to_string(n));
    }
    if (node.op.empty()) throw GraphError(node.name, "node has no op");
    node.ForEachInput([&](ValueId v) {
      if (v < 0 || static_cast<size_t>(v) >= num_values ||
          defined_at[static_cast<size_t>(v)] == -2) {
        // Not defined so far: either defined by this or a later node (cycle / order) or never.
        bool defined_later = false;
        if (v >= 0 && static_cast<size_t>(v) < num_values) {
          NodeId p = values[static_cast<size_t>(v)].producer;
          defined_later = p != kNoNode && static_cast<size_t>(p) >= n;
        }
        if (defined_later) {
          const Node& producer = graph.node(values[static_cast<size_t>(v)].producer);
          throw GraphError(node.name, "uses %" + values[static_cast<size_t>(v)].name +
                                          " which is defined by node '" + producer.name +
                                          "' at or after it: the graph has a cycle or is not "
                                          "in topological order");
        }
        throw GraphError(node.name, "refers to value id " + std::to_string(v) +
                                        " which no input or node defines (dangling reference)");
      }
    });
    if (!names.insert(node.name).second) {
      throw GraphError(node.name, "name is used twice; names must be unique");
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      ValueId out = node.outputs[i];
      define(out, static_cast<int64_t>(n), node.name);
      const Value& val = graph.value(out);
      if (val.producer != node.id || val.output_index != static_cast<int32_t>(i)) {
        throw GraphError(node.name, "output " + std::to_string(i) +
                                        " does not point back to this node");
      }
      if (node.tuple_output && !val.name.empty() && !names.insert(val.name).second) {
        throw GraphError(node.name, "output name '" + val.name + "' is used twice");
      }
      CheckType(node.name, val.type);
    }
    if (!node.tuple_output && node.outputs.size() != 1) {
      throw GraphError(node.name, "must have exactly one output");
    }
    if (const OpInfo* info = registry.Find(node.op)) {
      const int64_t n_args = static_cast<int64_t>(node.args.size());
      if (info->min_args >= 0 && (n_args < info->min_args || n_args > info->max_args)) {
        throw GraphError(node.name, node.op + " takes " + std::to_string(info->min_args) +
                                        (info->max_args != info->min_args
                                             ? " to " + std::to_string(info->max_args)
                                             : std::string()) +
                                        " positional arguments but got " +
                                        std::to_string(n_args) + " (wrong arity)");
      }
    }
  }

  for (size_t v = 0; v < num_values; ++v) {
    if (defined_at[v] == -2) {
      throw GraphError(values[v].name, "value id " + std::to_string(v) +
                                           " is defined by neither an input nor a node");
    }
  }
  graph.output().ForEachValue([&](ValueId v) {
    if (v < 0 || static_cast<size_t>(v) >= num_values) {
      throw GraphError("output", "refers to value id " + std::to_string(v) +
                                     " which does not exist (dangling reference)");
    }
  });
}

}  // namespace tp::ir
