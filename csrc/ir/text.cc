// Printer for the IR text form.
#include "ir/text.h"

#include <iomanip>
#include <sstream>

namespace tp::ir {
namespace {

std::string ValueName(const Graph& graph, ValueId v) {
  if (v < 0 || static_cast<size_t>(v) >= graph.values().size()) {
    return "%<dangling:" + std::to_string(v) + ">";
  }
  const Value& val = graph.values()[static_cast<size_t>(v)];
  return "%" + (val.name.empty() ? "v" + std::to_string(v) : val.name);
}

void Print(std::ostringstream& os, const Graph& graph, const Arg& arg) {
  using K = Arg::Kind;
  switch (arg.kind) {
    case K::kNone:
      os << "None";
      break;
    case K::kBool:
      os << (arg.b ? "True" : "False");
      break;
    case K::kInt:
      os << arg.i;
      break;
    case K::kDouble: {
      std::ostringstream d;
      d << std::setprecision(17) << arg.d;
      os << d.str();
      break;
    }
    case K::kString:
      os << std::quoted(arg.s);
      break;
    case K::kValue:
      os << ValueName(graph, arg.value());
      break;
    case K::kList:
    case K::kTuple: {
      os << (arg.kind == K::kList ? "[" : "(");
      for (size_t i = 0; i < arg.items.size(); ++i) {
        if (i) os << ", ";
        Print(os, graph, arg.items[i]);
      }
      if (arg.kind == K::kTuple && arg.items.size() == 1) os << ",";
      os << (arg.kind == K::kList ? "]" : ")");
      break;
    }
    case K::kDtype:
      os << "torch." << arg.s;
      break;
    case K::kDevice:
      os << "device(" << std::quoted(arg.s) << ")";
      break;
    case K::kLayout:
    case K::kMemoryFormat:
      os << "torch." << arg.s;
      break;
    case K::kOpaque:
      os << "<opaque#" << arg.i << ">";
      break;
  }
}

}  // namespace

std::string PrintArg(const Graph& graph, const Arg& arg) {
  std::ostringstream os;
  Print(os, graph, arg);
  return os.str();
}

std::string PrintGraph(const Graph& graph) {
  std::ostringstream os;
  os << "graph(";
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    const GraphInput& in = graph.inputs()[i];
    if (i) os << ",\n      ";
    os << ValueName(graph, in.value) << ": " << graph.type(in.value).ToString() << " "
       << InputKindName(in.kind);
    if (!in.source.empty()) os << " " << std::quoted(in.source);
  }
  os << "):\n";
  for (const Node& node : graph.nodes()) {
    os << "  ";
    if (node.tuple_output) {
      os << "(";
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        if (i) os << ", ";
        const Value& v = graph.value(node.outputs[i]);
        os << (v.name.empty() ? "_" : "%" + v.name);
      }
      os << ")";
      os << " %" << node.name;
    } else {
      os << ValueName(graph, node.outputs.front()) << ": "
         << graph.type(node.outputs.front()).ToString();
    }
    os << " = " << node.op << "(";
    bool first = true;
    for (const Arg& a : node.args) {
      if (!first) os << ", ";
      first = false;
      Print(os, graph, a);
    }
    for (const NamedArg& kw : node.kwargs) {
      if (!first) os << ", ";
      first = false;
      os << kw.name << "=";
      Print(os, graph, kw.value);
    }
    os << ")";
    if (!node.scope.empty()) os << "  # " << node.scope;
    os << "\n";
  }
  os << "  return ";
  Print(os, graph, graph.output());
  os << "\n";
  return os.str();
}

}  // namespace tp::ir
