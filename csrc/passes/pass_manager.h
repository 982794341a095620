// The pass manager: one list of every pass (its name, what it does, its typed options and the
// typed plan or graph it returns), and the runner of graph rewrites by name, verifying the graph
// before the first and after each one.
//
// Plan passes (placement, sharding, pipeline partition, schedule tuning) are called through
// their typed functions; the manager lists them so users and the bindings see one registry.
#pragma once

#include <string>
#include <vector>

#include "passes/cache_parallel.h"
#include "passes/pass.h"

namespace tp::passes {

// Typed options of the graph rewrites that take any.
struct RewriteOptions {
  CacheParallelOptions cache_parallel;
};

struct PassInfo {
  std::string name;     // the file under csrc/passes/
  std::string summary;  // one line
  std::string options;  // its options type ("" when it takes none)
  std::string result;   // "Graph" for rewrites, else its plan type
  bool rewrite = false;  // runnable by name in PassManager::Run
};

struct PassRecord {
  std::string name;
  double milliseconds = 0.0;
  int64_t nodes_before = 0;
  int64_t nodes_after = 0;
  bool changed = false;
  std::vector<std::string> notes;
};

struct PassReport {
  std::vector<PassRecord> passes;
  double verify_milliseconds = 0.0;
  std::string ToString() const;
};

// Every pass, in pipeline order (frozen; no global mutable state).
const std::vector<PassInfo>& RegisteredPasses();
// The names of the rewrites PassManager::Run accepts.
std::vector<std::string> RewritePassNames();

class PassManager {
 public:
  explicit PassManager(Context ctx = {}) : ctx_(std::move(ctx)) {}
  Context& context() { return ctx_; }

  // An empty list is the identity: verify only. Unknown names and plan passes throw PassError
  // listing the rewrites. A failing pass or verification throws PassError naming it and the
  // passes before.
  ir::Graph Run(const ir::Graph& graph, const std::vector<std::string>& pass_names,
                const RewriteOptions& options, PassReport* report = nullptr);

 private:
  Context ctx_;
};

}  // namespace tp::passes
