// Readable text form of a graph, for logs, dumps (TP_DUMP_IR) and golden tests; ParseGraph reads
// it back, so a golden file is both what a pass is given and what it must print.
#pragma once

#include <string>

#include "ir/graph.h"

namespace tp::ir {

// Example:
//   graph(%x: f32[s0=8, 768] user, %fc_weight: f32[3072, 768] grad parameter "fc.weight"):
//     %addmm: f32[s0=8, 3072] = aten::addmm.default(%fc_bias, %x, %t)  # fc
//     (%getitem: f32[8, 768], _: f32[8, 1], _: f32[8, 1]) %ln = aten::native_layer_norm.default(
//         %x, [768], %w, %b, 1e-05)
//     %y: f32[2, 3]{1, 2} %node = aten::t.default(%x) {key="value"}
//     return (%addmm,)
// Types: dtype[dims] with symbolic dims as expr=hint, strides in braces only when they are not
// contiguous, @device when not cpu, "grad" when requires_grad. A node's name is written after
// its outputs when it differs from its single output's name (always for tuple outputs); attrs in
// braces after the call; the scope as a trailing comment.
std::string PrintGraph(const Graph& graph);
std::string PrintArg(const Graph& graph, const Arg& arg);

// Parses PrintGraph's text (one graph; blank lines and lines starting with "//" are skipped).
// PrintGraph(ParseGraph(t)) == t for any t PrintGraph wrote. Throws GraphError naming the line
// and column of the first thing it cannot read, and verifies the graph it builds.
Graph ParseGraph(const std::string& text);

}  // namespace tp::ir
