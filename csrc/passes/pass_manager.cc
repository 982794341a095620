// The pass manager; see pass_manager.h.
#include "passes/pass_manager.h"

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

namespace {

using RewriteFn = PassResult (*)(const ir::Graph&, const RewriteOptions&, Context&);

struct Rewrite {
  const char* name;
  RewriteFn fn;
};

PassResult RunDce(const ir::Graph& g, const RewriteOptions&, Context& ctx) {
  return DeadCodeElimination(g, ctx);
}
PassResult RunCacheParallel(const ir::Graph& g, const RewriteOptions& o, Context& ctx) {
  return CacheParallel(g, o.cache_parallel, ctx);
}

constexpr Rewrite kRewrites[] = {
    {"dead_code_elimination", RunDce},
    {"cache_parallel", RunCacheParallel},
};

}  // namespace

const std::vector<PassInfo>& RegisteredPasses() {
  static const std::vector<PassInfo>* passes = new std::vector<PassInfo>{
      {"dead_code_elimination",
       "drops pure nodes whose outputs nobody uses (random and mutating ops are kept)", "", "Graph",
       true},
      {"placement_search",
       "the default placement: whole-graph compilers measured in turns against eager",
       "WholeGraphSearchOptions", "WholeGraphPlan", false},
      {"placement_dp", "op-level placement: the cheapest cover of the graph by candidate groups",
       "PlacementOptions", "Placement", false},
      {"placement_evolve", "evolutionary search over offload bits", "EvolveOptions", "EvolveResult",
       false},
      {"placement_rounds",
       "the finer search's rounds: compiler order, budget shares, the finalist kept, eager kept",
       "PlacementRoundOptions", "FinalistPick", false},
      {"sharding_ilp", "one sharding strategy per node and ZeRO stage per parameter (ILP, CBC)",
       "ShardingOptions", "ShardingPlan", false},
      {"sharding_materialize",
       "the SPMD graph every rank runs on its shards, with reshards and gradient syncs",
       "MaterializeOptions", "ShardedGraph", false},
      {"pipeline_partition",
       "pipeline stages (GraphPipe's GPP or sequential), their schedule and simulation",
       "PipelineOptions", "PipelinePlan", false},
      {"cache_parallel",
       "splits decode attention over KV caches across ranks (rewrite; its plan alone: "
       "plan_cache_parallel)",
       "CacheParallelOptions", "Graph", true},
      {"schedule_tune", "search over schedule candidates, scored by the user's evaluation",
       "TuneOptions", "TuneResult", false},
  };
  return *passes;
}

std::vector<std::string> RewritePassNames() {
  std::vector<std::string> names;
  for (const auto& r : kRewrites) names.push_back(r.name);
  return names;
}

std::string PassReport::ToString() const {
  std::ostringstream os;
  for (const auto& r : passes) {
    os << r.name << ": " << r.milliseconds << " ms, nodes " << r.nodes_before << " -> "
       << r.nodes_after << (r.changed ? "" : " (unchanged)") << "\n";
  }
  os << "verify: " << verify_milliseconds << " ms\n";
  return os.str();
}

ir::Graph PassManager::Run(const ir::Graph& graph, const std::vector<std::string>& pass_names,
                           const RewriteOptions& options, PassReport* report) {
  Context& ctx = ctx_;
  std::vector<const Rewrite*> specs;
  for (const auto& name : pass_names) {
    const Rewrite* found = nullptr;
    for (const auto& r : kRewrites) {
      if (name == r.name) found = &r;
    }
    if (found == nullptr) {
      bool plan = false;
      for (const auto& p : RegisteredPasses()) plan |= p.name == name;
      throw PassError(name, "", plan ? "is a planning pass, not a graph rewrite" : "unknown pass",
                      (plan ? "call its typed function (see registered_passes()); " : "") +
                          std::string("rewrites: ") + JoinNames(RewritePassNames()));
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
  for (const Rewrite* spec : specs) {
    const auto start = std::chrono::steady_clock::now();
    PassRecord record;
    record.name = spec->name;
    record.nodes_before = static_cast<int64_t>(current.nodes().size());
    PassResult result;
    try {
      result = spec->fn(current, options, ctx);
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
    record.notes = result.notes;
    if (report) report->passes.push_back(record);
  }
  return current;
}

}  // namespace tp::passes
