// Runs a named list of graph passes, verifying the graph before the first and after each one.
#pragma once

#include <string>
#include <vector>

#include "passes/pass.h"

namespace tp::passes {

struct PassRecord {
  std::string name;
  double milliseconds = 0.0;
  int64_t nodes_before = 0;
  int64_t nodes_after = 0;
  bool changed = false;
};

struct PipelineReport {
  std::vector<PassRecord> passes;
  double verify_milliseconds = 0.0;
};

// The frozen list of passes users can name.
const std::vector<PassSpec>& RegisteredPasses();
std::vector<std::string> RegisteredPassNames();

// An empty list is the identity pipeline: verify only. Unknown names throw PassError listing the
// valid ones. A failing pass or verification throws PassError naming it and the passes before.
ir::Graph RunPipeline(const ir::Graph& graph, const std::vector<std::string>& pass_names,
                      Context& ctx, PipelineReport* report = nullptr);

}  // namespace tp::passes
