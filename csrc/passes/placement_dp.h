// Op-level backend placement (Collage §2.4): a dynamic program over frontiers that covers every
// node with exactly one candidate group, minimising the sum of the groups' measured costs plus
// a per-switch penalty, with the groups forming an acyclic program.
//
// A state is the set of nodes already placed; it is always closed under predecessors, so the
// groups chosen so far run in the order chosen. A group may extend a state when none of its
// nodes is placed and every node it reads from outside is. States are expanded in order of
// depth (how many nodes they cover), so each is final when expanded: the program is exact over
// every acyclic cover by the given groups. Wide graphs can have many states; past `max_states`
// the search restarts in Collage's bounded form, where a group must contain the first unplaced
// node in topological order (exact = false in the result).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"

namespace tp::passes {

struct PlacementOption {
  int candidate = -1;      // caller's id (the Candidate id)
  std::vector<int> nodes;  // sorted node indices
  double cost = 0.0;       // seconds, measured
  std::string backend;
};

struct PlacementProblem {
  int num_nodes = 0;
  std::vector<std::string> node_names;  // for errors; may be empty
  std::vector<std::vector<int>> preds;  // node-level predecessors
  std::vector<PlacementOption> options;
  // Seconds added per group that runs outside the host graph (a switch into a backend's
  // compiled callable and back); groups of `inline_backend` run inline and pay nothing.
  double switch_penalty = 0.0;
  std::string inline_backend = "aten";
};

struct PlacementDpOptions {
  int64_t max_states = 20000;
};

struct OpLevelPlacement {
  std::vector<int> chosen;  // option indices, in an execution order
  double cost = 0.0;
  int64_t states = 0;
  bool exact = true;
};

// Node-level predecessors of an IR graph (PlacementProblem::preds).
std::vector<std::vector<int>> NodePredecessors(const ir::Graph& graph);

// The problem over `graph`'s nodes (count, predecessors, names), with no options yet.
PlacementProblem PlacementProblemFor(const ir::Graph& graph);

// Cost of a set of options under the problem's model (sum of costs and penalties).
double PlacementCost(const PlacementProblem& problem, const std::vector<int>& chosen);

// Throws PassError naming the first node no group can cover when there is no full cover.
OpLevelPlacement PlaceOpLevel(const PlacementProblem& problem, const PlacementDpOptions& options,
                              Context& ctx);

}  // namespace tp::passes
