// Pattern language over the IR (Collage §2): predicates on nodes and the values between them.
//
// A pattern is an immutable tree (a DAG when sub-patterns are shared) built from the
// constructors below. Matching a pattern at a node yields the op nodes it covers. An op pattern
// with input sub-patterns matches the node's tensor arguments in order; a sub-pattern object
// used twice must bind the same node both times, which is how multi-input DAG patterns (e.g. a
// diamond x -> {a, b} -> c) are written. Must not include torch or Python.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/op_registry.h"

namespace tp::pattern {

struct PatternNode;
using Pattern = std::shared_ptr<const PatternNode>;

struct PatternNode {
  enum class Kind { kWildcard, kOp, kOpClass, kAlt, kAttr, kDType, kRank, kStaticShape };
  Kind kind = Kind::kWildcard;
  // kOp: qualified names; "aten::add" matches every overload, "aten::add.Tensor" only that one.
  std::vector<std::string> ops;
  std::vector<ir::OpClass> classes;  // kOpClass
  // kOp / kOpClass: patterns for the node's value arguments in order; empty = any inputs.
  std::vector<Pattern> inputs;
  std::vector<Pattern> alternatives;  // kAlt
  Pattern inner;                      // kAttr, kDType, kRank, kStaticShape: the constrained pattern
  std::string key, value;             // kAttr
  std::vector<ir::DType> dtypes;      // kDType
  int min_rank = 0, max_rank = 0;     // kRank

  std::string ToString() const;
};

// Any value: a graph input, a constant-producing node, anything. Covers no node.
Pattern Wildcard();
// A node whose op is one of `ops`, optionally with its tensor arguments matching `inputs`.
Pattern IsOp(std::vector<std::string> ops, std::vector<Pattern> inputs = {});
// Any op node (IsOp with no names).
Pattern AnyOp();
// A node of one of the registry's op classes (elementwise, view, ...).
Pattern IsOpClass(std::vector<ir::OpClass> classes, std::vector<Pattern> inputs = {});
// Either pattern; the first that matches wins.
Pattern Alt(std::vector<Pattern> alternatives);
// `inner` whose node has attribute or keyword argument `key` printing as `value`.
Pattern HasAttr(Pattern inner, std::string key, std::string value);
// `inner` whose (first) output has one of these dtypes.
Pattern HasDType(Pattern inner, std::vector<ir::DType> dtypes);
// `inner` whose (first) output has min_rank <= rank <= max_rank.
Pattern HasRank(Pattern inner, int min_rank, int max_rank);
// `inner` whose outputs have concrete shapes (no symbolic dims).
Pattern HasStaticShape(Pattern inner);

// A match: the op nodes covered, in topological order, and the root.
struct Match {
  ir::NodeId root = ir::kNoNode;
  std::vector<ir::NodeId> nodes;
};

class Matcher {
 public:
  explicit Matcher(const ir::Graph& graph,
                   const ir::OpRegistry& registry = ir::OpRegistry::Default());
  // Matches `pattern` rooted at `node`; nullopt when it does not match.
  std::optional<Match> MatchAt(const Pattern& pattern, ir::NodeId node) const;
  // Every node at which `pattern` matches, in graph order.
  std::vector<Match> MatchAll(const Pattern& pattern) const;
  const ir::Graph& graph() const { return graph_; }

 private:
  // Bindings of op sub-patterns to nodes, so shared sub-patterns bind one node.
  using Bindings = std::map<const PatternNode*, ir::NodeId>;
  bool MatchValue(const Pattern& p, ir::ValueId v, Bindings* b) const;
  bool MatchNode(const Pattern& p, ir::NodeId n, Bindings* b) const;
  bool OpMatches(const PatternNode& p, const ir::Node& node) const;

  const ir::Graph& graph_;
  const ir::OpRegistry& registry_;
};

}  // namespace tp::pattern
