// Graph invariants: SSA, topological order, well-formed types, arity of known ops.
#pragma once

#include "ir/graph.h"

namespace tp::ir {

// Throws GraphError naming the first offending node (or input) and what to do about it.
// Checks:
//  1. every value is defined exactly once, by an input or by one node output (SSA);
//  2. every reference points to a value defined earlier: a reference to a value defined
//     later means a cycle or a node list out of topological order; to no value at all, a
//     dangling reference;
//  3. node and value names are unique and node ids equal their positions;
//  4. tensor types are well formed (known dtype, no negative sizes, stride rank = shape rank);
//  5. ops known to the registry get their declared number of positional arguments.
void Verify(const Graph& graph);

}  // namespace tp::ir
