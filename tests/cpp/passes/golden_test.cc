// Golden tests: every graph pass run on real models' ATen graphs (tests/cpp/testdata/<pass>/
// <case>.before.ir, written by scripts/golden_inputs.py), its output compared with
// <case>.after.txt. TP_UPDATE_GOLDEN=1 rewrites the .after.txt files instead (review the diff).
//
// A .before.ir may set options in its header: "// option world=4".
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cost/device_profile.h"
#include "ir/op_registry.h"
#include "ir/text.h"
#include "passes/pass_manager.h"
#include "passes/pipeline_plan.h"
#include "passes/placement_dp.h"
#include "passes/sharding_ilp.h"
#include "passes/sharding_materialize.h"
#include "pattern/backend_rules.h"
#include "pattern/candidates.h"

namespace tp::passes {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string name;
  ir::Graph graph;
  std::map<std::string, std::string> options;
  fs::path after;
};

std::vector<Case> Cases(const std::string& pass) {
  std::vector<Case> cases;
  const fs::path dir = fs::path(TP_TESTDATA) / pass;
  if (!fs::is_directory(dir)) return cases;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.size() > 10 && f.compare(f.size() - 10, 10, ".before.ir") == 0) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    Case c;
    const std::string file = f.filename().string();
    c.name = file.substr(0, file.size() - 10);
    const std::string text = Read(f);
    c.graph = ir::ParseGraph(text);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("// option ", 0) != 0) continue;
      const std::string kv = line.substr(10);
      const auto eq = kv.find('=');
      c.options[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    }
    c.after = dir / (c.name + ".after.txt");
    cases.push_back(std::move(c));
  }
  return cases;
}

int IntOption(const Case& c, const std::string& key, int fallback) {
  auto it = c.options.find(key);
  return it == c.options.end() ? fallback : std::stoi(it->second);
}

// Compares with the golden file, or rewrites it under TP_UPDATE_GOLDEN=1.
void ExpectGolden(const Case& c, const std::string& got) {
  const char* update = std::getenv("TP_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(c.after) << got;
    return;
  }
  ASSERT_TRUE(fs::exists(c.after)) << c.after << " is missing; run with TP_UPDATE_GOLDEN=1";
  EXPECT_EQ(got, Read(c.after)) << "golden " << c.after
                                << " differs (TP_UPDATE_GOLDEN=1 rewrites it; review the diff)";
}

template <class Fn>
void RunCases(const std::string& pass, Fn fn) {
  const auto cases = Cases(pass);
  ASSERT_FALSE(cases.empty()) << "no golden case for pass " << pass << " under " << TP_TESTDATA;
  for (const auto& c : cases) {
    SCOPED_TRACE(pass + "/" + c.name);
    ExpectGolden(c, fn(c));
  }
}

TEST(Golden, EveryGraphPassHasCases) {
  for (const auto& p : RegisteredPasses()) {
    // The searches over callbacks (whole-graph measurement, evolution, schedule tuning) and
    // the placement rounds' decisions over measured figures take no graph; the rest each have
    // a directory.
    if (p.name == "placement_search" || p.name == "placement_evolve" ||
        p.name == "placement_rounds" || p.name == "schedule_tune")
      continue;
    EXPECT_FALSE(Cases(p.name).empty()) << "no golden case for pass " << p.name;
  }
}

TEST(Golden, DeadCodeElimination) {
  RunCases("dead_code_elimination", [](const Case& c) {
    PassManager pm;
    return ir::PrintGraph(pm.Run(c.graph, {"dead_code_elimination"}, {}));
  });
}

TEST(Golden, CacheParallel) {
  RunCases("cache_parallel", [](const Case& c) {
    CacheParallelOptions o;
    o.world = IntOption(c, "world", 2);
    o.handle = 1;
    RewriteOptions options;
    options.cache_parallel = o;
    PassManager pm;
    return PlanCacheParallel(c.graph, o).ToString() + "\n" +
           ir::PrintGraph(pm.Run(c.graph, {"cache_parallel"}, options));
  });
}

ShardingOptions GoldenSharding(const Case& c) {
  ShardingOptions o;
  o.world = IntOption(c, "world", 2);
  o.device = "cpu";
  o.training = IntOption(c, "training", 0) != 0;
  return o;
}

TEST(Golden, ShardingIlp) {
  RunCases("sharding_ilp",
           [](const Case& c) { return PlanSharding(c.graph, GoldenSharding(c)).ToString(); });
}

TEST(Golden, ShardingMaterialize) {
  RunCases("sharding_materialize", [](const Case& c) {
    const ShardingOptions so = GoldenSharding(c);
    const ShardingPlan plan = PlanSharding(c.graph, so);
    MaterializeOptions mo;
    mo.world = so.world, mo.group = 1, mo.training = so.training;
    return ir::PrintGraph(MaterializeSharding(c.graph, plan, mo));
  });
}

TEST(Golden, PipelinePartition) {
  RunCases("pipeline_partition", [](const Case& c) {
    const int batch = IntOption(c, "batch", 2);
    pipeline::PipelineOptions o;
    o.num_devices = IntOption(c, "devices", 2);
    o.mini_batch = batch;
    o.scope_depth = IntOption(c, "scope_depth", 4);
    const auto plan = pipeline::PlanPipeline(pipeline::CostGraphFromIr(c.graph, batch), o);
    std::ostringstream os;
    os << plan.ToString();
    const auto nodes = plan.StageNodes();
    for (size_t s = 0; s < nodes.size(); ++s) {
      os << "stage " << s << ":";
      for (int n : nodes[s]) os << " " << c.graph.nodes()[static_cast<size_t>(n)].name;
      os << "\n";
    }
    return os.str();
  });
}

// The op-level DP over every rule set's candidates, costed by a fixed profile (the roofline
// of the cpu preset, compiled groups at 0.7x, 5 us per group) instead of measurements.
TEST(Golden, PlacementDp) {
  RunCases("placement_dp", [](const Case& c) {
    std::vector<pattern::BackendRules> rules;
    for (const auto& b : pattern::KnownRuleSets()) rules.push_back({b, pattern::DefaultRules(b)});
    const auto set = pattern::GenerateCandidates(c.graph, rules);
    const auto& device = cost::FindDeviceProfile("cpu");
    const auto& reg = ir::OpRegistry::Default();
    PlacementProblem p = PlacementProblemFor(c.graph);
    for (const auto& cand : set.candidates) {
      double s = 5e-6;
      for (ir::NodeId n : cand.nodes) {
        const ir::OpCost cost = reg.Estimate(c.graph, c.graph.node(n));
        s += (cost.flops / device.peak_flops + cost.bytes / device.mem_bandwidth) *
             (cand.backend == "aten" ? 1.0 : 0.7);
      }
      p.options.push_back({cand.id, {cand.nodes.begin(), cand.nodes.end()}, s, cand.backend});
    }
    Context ctx;
    const OpLevelPlacement r = PlaceOpLevel(p, {}, ctx);
    std::ostringstream os;
    os << set.candidates.size() << " candidates; cover of " << r.chosen.size() << " groups"
       << (r.exact ? " (exact)" : " (bounded)") << "\n";
    for (int o : r.chosen) {
      const auto& cand = set.candidates[static_cast<size_t>(p.options[o].candidate)];
      os << cand.backend << " " << cand.rule << ":";
      for (ir::NodeId n : cand.nodes) os << " " << c.graph.node(n).name;
      os << "\n";
    }
    return os.str();
  });
}

}  // namespace
}  // namespace tp::passes
