// Candidate groups for backend placement (Collage §2.3): which sets of nodes each backend can
// take, found by pattern rules over the whole graph and filtered by the path check.
//
// A rule is either a pattern rule (every match is a group) or a fusion rule (an anchor such as
// a matmul or convolution followed by a chain of up to `max_chain` ops matching `chain`, every
// prefix a group). A group is kept only if it is convex: no path leaves it and comes back,
// since fusing such a group would create a cycle between it and the nodes on that path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "pattern/pattern.h"

namespace tp::pattern {

struct Rule {
  enum class Kind { kPattern, kFusion };
  Kind kind = Kind::kPattern;
  std::string name;
  Pattern pattern;  // kPattern: the group; kFusion: the anchor
  Pattern chain;    // kFusion: what may follow the anchor, one match after another
  int max_chain = 4;
};

Rule PatternRule(std::string name, Pattern pattern);
Rule FusionRule(std::string name, Pattern anchor, Pattern chain, int max_chain = 4);

struct BackendRules {
  std::string backend;
  std::vector<Rule> rules;
};

struct Candidate {
  int id = 0;
  std::string backend;
  std::string rule;
  std::vector<ir::NodeId> nodes;     // sorted (topological order)
  std::vector<ir::ValueId> inputs;   // values read from outside, in first-use order
  std::vector<ir::ValueId> outputs;  // values used outside the group or by the graph output
  // Canonical text of the group (ops, constants, local wiring, input types): two groups with
  // the same signature compute the same function on same-shaped inputs, so one measurement
  // serves both (and every repeat of a layer).
  std::string signature;
};

struct CandidateSet {
  std::vector<Candidate> candidates;
  int64_t rejected_cyclic = 0;    // groups the path check refused
  int64_t rejected_too_many = 0;  // groups dropped past max_candidates
};

// Node-level successors: succ[n] = nodes reading an output of n, sorted, without repeats.
std::vector<std::vector<ir::NodeId>> NodeSuccessors(const ir::Graph& graph);

// The path check: true when no path from a node of `nodes` to another one leaves the set.
bool IsConvex(const std::vector<std::vector<ir::NodeId>>& succ,
              const std::vector<ir::NodeId>& nodes);

// Inputs, outputs and signature of a group of nodes (sorted).
Candidate DescribeGroup(const ir::Graph& graph, std::vector<ir::NodeId> nodes,
                        const std::vector<std::vector<ir::NodeId>>& users);

// Every group each backend's rules produce over the whole graph, deduplicated per backend,
// path-checked, at most `max_candidates` in all.
CandidateSet GenerateCandidates(const ir::Graph& graph, const std::vector<BackendRules>& backends,
                                int64_t max_candidates = 200000);

}  // namespace tp::pattern
