// The pattern rules of each placement backend: which groups of ATen nodes it can take.
//
// Python backends name their rule set; the rules themselves live here, next to the matcher,
// so what a backend can run is decided (and tested) in C++.
#pragma once

#include <string>
#include <vector>

#include "pattern/candidates.h"

namespace tp::pattern {

// Rule sets: "aten" (every node alone; eager always works), "inductor", "openvino",
// "onnxruntime" (graph compilers: single compute ops and fusions of a compute op with a chain
// of elementwise/view ops), "fused" (our kernels in kernels/cpu: linear + activation epilogue,
// residual add + layer norm, scaled/masked softmax, attention). Throws std::invalid_argument
// naming the known sets for an unknown name.
std::vector<Rule> DefaultRules(const std::string& backend);
std::vector<std::string> KnownRuleSets();

}  // namespace tp::pattern
