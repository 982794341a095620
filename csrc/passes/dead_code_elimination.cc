// Pass: dead_code_elimination.
//
// Removes nodes none of whose outputs is used by a later node or by the graph output, when the
// op is known to be pure. Kept even when unused: mutations (copy_, add_), random ops (dropping
// one would shift the RNG stream of every later random op and break bit-exactness with eager)
// and every op the registry does not know. Graph inputs are never removed: they are the
// calling convention. Post: the same graph minus dead pure nodes, value ids renumbered.
#include <sstream>

#include "ir/op_registry.h"
#include "passes/pass.h"

namespace tp::passes {

PassResult DeadCodeElimination(const ir::Graph& graph, Context& /*ctx*/) {
  const ir::OpRegistry& registry = ir::OpRegistry::Default();
  const auto& nodes = graph.nodes();
  std::vector<bool> live_value(graph.values().size(), false);
  for (ir::ValueId v : graph.OutputValues()) live_value[static_cast<size_t>(v)] = true;

  // S1: liveness, walking backwards so a node kept alive keeps its inputs alive.
  std::vector<bool> keep(nodes.size(), false);
  for (size_t k = nodes.size(); k-- > 0;) {
    const ir::Node& node = nodes[k];
    bool used = !registry.IsPure(node.op);
    for (ir::ValueId out : node.outputs) used = used || live_value[static_cast<size_t>(out)];
    if (!used) continue;
    keep[k] = true;
    node.ForEachInput([&](ir::ValueId v) { live_value[static_cast<size_t>(v)] = true; });
  }

  PassResult result;
  size_t removed = 0;
  for (bool k : keep) removed += k ? 0 : 1;
  if (removed == 0) {
    result.graph = graph;
    return result;
  }

  // S2: rebuild with the kept nodes, renumbering values.
  ir::GraphBuilder builder;
  std::vector<ir::ValueId> remap = builder.CopyInputs(graph);
  for (size_t k = 0; k < nodes.size(); ++k)
    if (keep[k]) builder.CopyNode(graph, nodes[k], &remap);
  builder.SetOutput(graph.output().Remap(remap));
  result.graph = builder.Build();
  result.changed = true;
  std::ostringstream note;
  note << "removed " << removed << " dead node(s)";
  result.notes.push_back(note.str());
  return result;
}

}  // namespace tp::passes
