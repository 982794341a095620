// Readable text form of a graph, for logs, dumps (TP_DUMP_IR) and golden tests.
#pragma once

#include <string>

#include "ir/graph.h"

namespace tp::ir {

// Example:
//   graph(%x: f32[s0, 768] user, %fc_weight: f32[3072, 768] grad parameter "fc.weight"):
//     %addmm: f32[s0, 3072] = aten::addmm.default(%fc_bias, %x, %t)  # fc
//     (%getitem, _, _) = aten::native_layer_norm.default(%x, [768], %w, %b, 1e-05)
//     return (%addmm,)
std::string PrintGraph(const Graph& graph);
std::string PrintArg(const Graph& graph, const Arg& arg);

}  // namespace tp::ir
