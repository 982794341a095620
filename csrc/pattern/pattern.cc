#include "pattern/pattern.h"

#include <algorithm>
#include <sstream>

namespace tp::pattern {
namespace {

Pattern Make(PatternNode node) { return std::make_shared<const PatternNode>(std::move(node)); }

std::string ArgToString(const ir::Arg& a) {
  switch (a.kind) {
    case ir::Arg::Kind::kBool:
      return a.b ? "True" : "False";
    case ir::Arg::Kind::kInt:
      return std::to_string(a.i);
    case ir::Arg::Kind::kDouble: {
      std::ostringstream os;
      os << a.d;
      return os.str();
    }
    case ir::Arg::Kind::kNone:
      return "None";
    default:
      return a.s;
  }
}

bool TypePredicate(const PatternNode& p, const ir::ValueType& type) {
  if (type.kind != ir::ValueKind::kTensor) return false;
  const ir::TensorType& t = type.tensor;
  switch (p.kind) {
    case PatternNode::Kind::kDType:
      return std::find(p.dtypes.begin(), p.dtypes.end(), t.dtype) != p.dtypes.end();
    case PatternNode::Kind::kRank:
      return t.rank() >= p.min_rank && t.rank() <= p.max_rank;
    case PatternNode::Kind::kStaticShape:
      return std::none_of(t.shape.begin(), t.shape.end(),
                          [](const ir::SymDim& d) { return d.is_symbolic(); });
    default:
      return true;
  }
}

bool IsTypePredicate(PatternNode::Kind k) {
  return k == PatternNode::Kind::kDType || k == PatternNode::Kind::kRank ||
         k == PatternNode::Kind::kStaticShape;
}

}  // namespace

Pattern Wildcard() { return Make(PatternNode{}); }

Pattern IsOp(std::vector<std::string> ops, std::vector<Pattern> inputs) {
  PatternNode p;
  p.kind = PatternNode::Kind::kOp;
  p.ops = std::move(ops);
  p.inputs = std::move(inputs);
  return Make(std::move(p));
}

Pattern AnyOp() { return IsOp({}); }

Pattern IsOpClass(std::vector<ir::OpClass> classes, std::vector<Pattern> inputs) {
  PatternNode p;
  p.kind = PatternNode::Kind::kOpClass;
  p.classes = std::move(classes);
  p.inputs = std::move(inputs);
  return Make(std::move(p));
}

Pattern Alt(std::vector<Pattern> alternatives) {
  PatternNode p;
  p.kind = PatternNode::Kind::kAlt;
  p.alternatives = std::move(alternatives);
  return Make(std::move(p));
}

Pattern HasAttr(Pattern inner, std::string key, std::string value) {
  PatternNode p;
  p.kind = PatternNode::Kind::kAttr;
  p.inner = std::move(inner);
  p.key = std::move(key);
  p.value = std::move(value);
  return Make(std::move(p));
}

Pattern HasDType(Pattern inner, std::vector<ir::DType> dtypes) {
  PatternNode p;
  p.kind = PatternNode::Kind::kDType;
  p.inner = std::move(inner);
  p.dtypes = std::move(dtypes);
  return Make(std::move(p));
}

Pattern HasRank(Pattern inner, int min_rank, int max_rank) {
  PatternNode p;
  p.kind = PatternNode::Kind::kRank;
  p.inner = std::move(inner);
  p.min_rank = min_rank;
  p.max_rank = max_rank;
  return Make(std::move(p));
}

Pattern HasStaticShape(Pattern inner) {
  PatternNode p;
  p.kind = PatternNode::Kind::kStaticShape;
  p.inner = std::move(inner);
  return Make(std::move(p));
}

std::string PatternNode::ToString() const {
  std::ostringstream os;
  auto list = [&os](const std::vector<Pattern>& ps) {
    for (size_t i = 0; i < ps.size(); ++i) os << (i ? ", " : "") << ps[i]->ToString();
  };
  switch (kind) {
    case Kind::kWildcard:
      return "*";
    case Kind::kOp:
    case Kind::kOpClass:
      os << "is_op(";
      if (kind == Kind::kOp) {
        for (size_t i = 0; i < ops.size(); ++i) os << (i ? "|" : "") << ops[i];
      } else {
        for (size_t i = 0; i < classes.size(); ++i)
          os << (i ? "|" : "") << "<" << ir::OpClassName(classes[i]) << ">";
      }
      os << ")";
      if (!inputs.empty()) {
        os << "(";
        list(inputs);
        os << ")";
      }
      return os.str();
    case Kind::kAlt:
      os << "alt(";
      list(alternatives);
      os << ")";
      return os.str();
    case Kind::kAttr:
      return inner->ToString() + ".has_attr(" + key + "=" + value + ")";
    case Kind::kDType:
      os << inner->ToString() << ".has_dtype(";
      for (size_t i = 0; i < dtypes.size(); ++i) os << (i ? "|" : "") << ir::DTypeName(dtypes[i]);
      os << ")";
      return os.str();
    case Kind::kRank:
      os << inner->ToString() << ".has_rank(" << min_rank << ".." << max_rank << ")";
      return os.str();
    case Kind::kStaticShape:
      return inner->ToString() + ".static_shape()";
  }
  return "?";
}

Matcher::Matcher(const ir::Graph& graph, const ir::OpRegistry& registry)
    : graph_(graph), registry_(registry) {}

bool Matcher::OpMatches(const PatternNode& p, const ir::Node& node) const {
  if (p.kind == PatternNode::Kind::kOpClass) {
    const ir::OpInfo* info = registry_.Find(node.op);
    return info != nullptr &&
           std::find(p.classes.begin(), p.classes.end(), info->cls) != p.classes.end();
  }
  if (p.ops.empty()) return true;  // any op
  const std::string base = ir::OpRegistry::SplitOverload(node.op).first;
  for (const auto& name : p.ops) {
    if (name == node.op || name == base) return true;
  }
  return false;
}

bool Matcher::MatchNode(const Pattern& p, ir::NodeId n, Bindings* b) const {
  const ir::Node& node = graph_.node(n);
  switch (p->kind) {
    case PatternNode::Kind::kWildcard:
      return true;
    case PatternNode::Kind::kAlt:
      for (const auto& alt : p->alternatives) {
        Bindings trial = *b;
        if (MatchNode(alt, n, &trial)) {
          *b = std::move(trial);
          return true;
        }
      }
      return false;
    case PatternNode::Kind::kAttr: {
      bool found = false;
      auto it = node.attrs.find(p->key);
      if (it != node.attrs.end()) found = it->second == p->value;
      for (const auto& kw : node.kwargs) {
        if (kw.name == p->key) found = ArgToString(kw.value) == p->value;
      }
      return found && MatchNode(p->inner, n, b);
    }
    case PatternNode::Kind::kDType:
    case PatternNode::Kind::kRank:
    case PatternNode::Kind::kStaticShape:
      if (node.outputs.empty() || !TypePredicate(*p, graph_.type(node.outputs[0]))) return false;
      return MatchNode(p->inner, n, b);
    case PatternNode::Kind::kOp:
    case PatternNode::Kind::kOpClass: {
      auto bound = b->find(p.get());
      if (bound != b->end()) return bound->second == n;
      if (!OpMatches(*p, node)) return false;
      // A node may be covered by one op sub-pattern only: the group is a set of distinct ops.
      for (const auto& [pat, id] : *b) {
        if (id == n) return false;
      }
      (*b)[p.get()] = n;
      if (p->inputs.empty()) return true;
      std::vector<ir::ValueId> args;
      for (const auto& a : node.args) a.ForEachValue([&](ir::ValueId v) { args.push_back(v); });
      if (args.size() < p->inputs.size()) return false;
      for (size_t i = 0; i < p->inputs.size(); ++i) {
        if (!MatchValue(p->inputs[i], args[i], b)) return false;
      }
      return true;
    }
  }
  return false;
}

bool Matcher::MatchValue(const Pattern& p, ir::ValueId v, Bindings* b) const {
  if (p->kind == PatternNode::Kind::kWildcard) return true;
  if (IsTypePredicate(p->kind)) {
    return TypePredicate(*p, graph_.type(v)) && MatchValue(p->inner, v, b);
  }
  if (p->kind == PatternNode::Kind::kAlt) {
    for (const auto& alt : p->alternatives) {
      Bindings trial = *b;
      if (MatchValue(alt, v, &trial)) {
        *b = std::move(trial);
        return true;
      }
    }
    return false;
  }
  const ir::NodeId producer = graph_.value(v).producer;
  if (producer == ir::kNoNode) return false;
  return MatchNode(p, producer, b);
}

std::optional<Match> Matcher::MatchAt(const Pattern& pattern, ir::NodeId node) const {
  // A bare wildcard covers no node, so it is no group; require at least the root.
  if (pattern->kind == PatternNode::Kind::kWildcard) return std::nullopt;
  Bindings b;
  if (!MatchNode(pattern, node, &b)) return std::nullopt;
  Match m;
  m.root = node;
  for (const auto& [pat, id] : b) m.nodes.push_back(id);
  if (m.nodes.empty()) m.nodes.push_back(node);
  std::sort(m.nodes.begin(), m.nodes.end());
  m.nodes.erase(std::unique(m.nodes.begin(), m.nodes.end()), m.nodes.end());
  return m;
}

std::vector<Match> Matcher::MatchAll(const Pattern& pattern) const {
  std::vector<Match> out;
  for (const auto& node : graph_.nodes()) {
    if (auto m = MatchAt(pattern, node.id)) out.push_back(std::move(*m));
  }
  return out;
}

}  // namespace tp::pattern
