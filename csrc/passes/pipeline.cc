// Pass pipeline; see pipeline.h.
#include "passes/pipeline.h"

#include <chrono>
#include <sstream>

#include "ir/verify.h"
#include "passes/cache_parallel.h"

namespace tp::passes {
namespace {

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
  return os.str();
}

}  // namespace

PassError::PassError(std::string pass_name, std::string node, std::string what, std::string hint,
                     std::vector<std::string> passes_before)
    : std::runtime_error(
          "pass '" + pass_name + "'" + (node.empty() ? "" : " at node '" + node + "'") + ": " +
          what + (hint.empty() ? "" : " (" + hint + ")") +
          (passes_before.empty() ? "" : " [passes run before: " + JoinNames(passes_before) + "]")),
      pass_name_(std::move(pass_name)),
      node_(std::move(node)),
      hint_(std::move(hint)),
      passes_before_(std::move(passes_before)) {}

const std::vector<PassSpec>& RegisteredPasses() {
  static const std::vector<PassSpec>* passes = new std::vector<PassSpec>{
      {"dead_code_elimination",
       "drops pure nodes whose outputs nobody uses (random and mutating ops are kept)",
       DeadCodeElimination},
      {"cache_parallel",
       "splits decode attention over KV caches across ranks (options cache_parallel.*)",
       CacheParallelPass},
  };
  return *passes;
}

std::vector<std::string> RegisteredPassNames() {
  std::vector<std::string> names;
  for (const auto& p : RegisteredPasses()) names.push_back(p.name);
  return names;
}

ir::Graph RunPipeline(const ir::Graph& graph, const std::vector<std::string>& pass_names,
                      Context& ctx, PipelineReport* report) {
  std::vector<const PassSpec*> specs;
  for (const auto& name : pass_names) {
    const PassSpec* found = nullptr;
    for (const auto& spec : RegisteredPasses()) {
      if (spec.name == name) found = &spec;
    }
    if (found == nullptr) {
      throw PassError(name, "", "unknown pass",
                      "valid passes: " + JoinNames(RegisteredPassNames()));
    }
    specs.push_back(found);
  }

  auto verify = [&](const ir::Graph& g, const std::string& after,
                    const std::vector<std::string>& before) {
    const auto start = std::chrono::steady_clock::now();
    try {
      ir::Verify(g);
    } catch (const ir::GraphError& e) {
      throw PassError(after.empty() ? "verify" : after, e.node(),
                      after.empty() ? std::string("input graph is malformed: ") + e.what()
                                    : std::string("produced a malformed graph: ") + e.what(),
                      "", before);
    }
    if (report) report->verify_milliseconds += MillisecondsSince(start);
  };

  verify(graph, "", {});
  ir::Graph current = graph;
  std::vector<std::string> ran;
  for (const PassSpec* spec : specs) {
    const auto start = std::chrono::steady_clock::now();
    PassRecord record;
    record.name = spec->name;
    record.nodes_before = static_cast<int64_t>(current.nodes().size());
    PassResult result;
    try {
      result = spec->fn(current, ctx);
    } catch (const PassError&) {
      throw;
    } catch (const ir::GraphError& e) {
      throw PassError(spec->name, e.node(), e.what(), "", ran);
    } catch (const std::exception& e) {
      throw PassError(spec->name, "", e.what(), "", ran);
    }
    record.milliseconds = MillisecondsSince(start);
    record.nodes_after = static_cast<int64_t>(result.graph.nodes().size());
    record.changed = result.changed;
    ran.push_back(spec->name);
    if (result.changed) current = std::move(result.graph);
    if (ctx.verify_each && result.changed) verify(current, spec->name, ran);
    std::ostringstream line;
    line << "pass " << record.name << ": " << record.milliseconds << " ms, nodes "
         << record.nodes_before << " -> " << record.nodes_after
         << (record.changed ? "" : " (unchanged)");
    ctx.Log(line.str());
    for (const auto& note : result.notes) ctx.Log("  " + note);
    if (report) report->passes.push_back(record);
  }
  return current;
}

}  // namespace tp::passes
