// The pass interface: passes are free functions from a const Graph (+ typed options + context)
// to a new graph or a typed plan.
//
// No pass base class and no global state: a pass reads its input graph, builds a new one (or a
// plan) and reports whether it changed anything. The pass manager (pass_manager.h) lists every
// pass, runs graph rewrites by name and verifies the graph after each one.
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace tp::passes {

// A pass failed. Names the pass, the node it choked on, what to do, and the passes that had
// already run (the FX PassManager's habit), so a report points at the cause.
class PassError : public std::runtime_error {
 public:
  PassError(std::string pass_name, std::string node, std::string what, std::string hint = "",
            std::vector<std::string> passes_before = {});
  const std::string& pass_name() const { return pass_name_; }
  const std::string& node() const { return node_; }
  const std::string& hint() const { return hint_; }
  const std::vector<std::string>& passes_before() const { return passes_before_; }

 private:
  std::string pass_name_, node_, hint_;
  std::vector<std::string> passes_before_;
};

struct Context {
  // Receives one line per event (pass timings, decisions); may be empty.
  std::function<void(const std::string&)> log;
  bool verify_each = true;
  // Searches stop at the deadline and return their best result so far.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  // Sets the deadline `seconds` from now; <= 0 leaves it unlimited.
  void SetTimeBudget(double seconds) {
    if (seconds <= 0) return;
    deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(seconds));
  }

  void Log(const std::string& line) const {
    if (log) log(line);
  }
  bool PastDeadline() const { return std::chrono::steady_clock::now() >= deadline; }
};

struct PassResult {
  ir::Graph graph;
  bool changed = false;
  std::vector<std::string> notes;
};

// Graph-to-graph passes, one per file.
PassResult DeadCodeElimination(const ir::Graph& graph, Context& ctx);

}  // namespace tp::passes
