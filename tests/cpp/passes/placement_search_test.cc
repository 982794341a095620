#include "passes/placement_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

namespace tp::passes {
namespace {

// A stub machine: fixed run times per backend, fixed compile times, a fake clock.
struct Stub {
  std::map<std::string, double> run_s;
  std::map<std::string, double> compile_s;
  std::map<std::string, bool> compiles;
  // Timings returned before run_s's: a noisy first sample, say.
  std::map<std::string, std::vector<double>> first_runs;
  double clock = 0.0;
  bool timing_takes_time = false;      // a timing advances the clock by the run time
  std::function<double()> free_bytes;  // empty: memory unknown
  std::vector<std::string> calls;

  // How many times `call` ("time openvino", "compile inductor") was made.
  int64_t Count(const std::string& call) const {
    return std::count(calls.begin(), calls.end(), call);
  }

  WholeGraphMeasurer Measurer() {
    return {[this](const std::string& b) {
              calls.push_back("compile " + b);
              clock += compile_s[b];
              return compiles.count(b) ? compiles[b] : true;
            },
            [this](const std::string& b) {
              calls.push_back("time " + b);
              double t = run_s[b];
              if (auto& q = first_runs[b]; !q.empty()) {
                t = q.front();
                q.erase(q.begin());
              }
              if (timing_takes_time) clock += t;
              return t;
            },
            [this] { return clock; },
            nullptr,
            nullptr,
            free_bytes,
            nullptr};
  }
};

TEST(PlacementSearch, ReferenceFirstThenTheOthersEagerNeverCompiled) {
  EXPECT_EQ(WholeGraphOrder({"aten", "onnxruntime", "openvino", "inductor"}, "inductor"),
            (std::vector<std::string>{"inductor", "onnxruntime", "openvino"}));
}

TEST(PlacementSearch, CheapCompilersThenTheReferenceThenTheRestCheapestFirst) {
  EXPECT_EQ(WholeGraphOrder({"onnxruntime", "tvm", "openvino", "inductor", "fused"}, "inductor",
                            {{"onnxruntime", 8.0}, {"openvino", 0.5}, {"inductor", 12.0}}),
            (std::vector<std::string>{"openvino", "inductor", "onnxruntime", "tvm", "fused"}));
  // Without expectations: the reference first, then as given.
  EXPECT_EQ(WholeGraphOrder({"onnxruntime", "openvino", "inductor"}, "inductor"),
            (std::vector<std::string>{"inductor", "onnxruntime", "openvino"}));
}

TEST(PlacementSearch, CheapMeansWithinTheBudgetsSlackOverTheReference) {
  // bert-base in bf16: OpenVINO ~1.2 s against Inductor's ~7.4 s (16%) goes first by default
  // (the 1.25x budget's slack, 0.25); at the old 0.1 it went after Inductor and found the
  // budget spent.
  const std::map<std::string, double> expected{
      {"openvino", 1.2}, {"inductor", 7.4}, {"onnxruntime", 8.1}};
  EXPECT_EQ(WholeGraphOrder({"inductor", "openvino", "onnxruntime"}, "inductor", expected),
            (std::vector<std::string>{"openvino", "inductor", "onnxruntime"}));
  EXPECT_EQ(WholeGraphOrder({"inductor", "openvino", "onnxruntime"}, "inductor", expected, 0.1),
            (std::vector<std::string>{"inductor", "openvino", "onnxruntime"}));
  EXPECT_DOUBLE_EQ(WholeGraphSearchOptions{}.cheap_fraction,
                   WholeGraphSearchOptions{}.budget_factor - 1.0);
}

TEST(PlacementSearch, ACheapCompilerIsTriedBeforeAReferenceServedFromItsCache) {
  // Inductor's graph came from its cache (1 s): a 1.25 s budget, spent once it is timed.
  // OpenVINO, expected at 0.5 s, went first and wins; ONNX Runtime is skipped.
  Stub s;
  s.run_s = {{"eager", 150e-3}, {"inductor", 140e-3}, {"openvino", 50e-3}, {"onnxruntime", 55e-3}};
  s.compile_s = {{"inductor", 1.0}, {"openvino", 0.4}, {"onnxruntime", 8.0}};
  WholeGraphSearchOptions o;
  o.expected_compile_s = {{"inductor", 15.0}, {"openvino", 0.5}, {"onnxruntime", 8.0}};
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_EQ(plan.trials[1].backend, "openvino");
  EXPECT_EQ(plan.trials[2].backend, "inductor");
  EXPECT_EQ(plan.trials[3].backend, "onnxruntime");
  EXPECT_FALSE(plan.trials[3].compiled);
  EXPECT_NE(plan.trials[3].skipped.find("budget"), std::string::npos);
}

TEST(PlacementSearch, AReferenceSaidServedFromItsCacheBudgetsOnItsExpectedCompile) {
  // The same search, but the measurer says Inductor's graph came from its cache: the budget is
  // 1.25 x its expected 15 s, not x the 1 s it took, and ONNX Runtime (8 s) is compiled.
  Stub s;
  s.run_s = {{"eager", 150e-3}, {"inductor", 140e-3}, {"openvino", 50e-3}, {"onnxruntime", 45e-3}};
  s.compile_s = {{"inductor", 1.0}, {"openvino", 0.4}, {"onnxruntime", 8.0}};
  WholeGraphSearchOptions o;
  o.expected_compile_s = {{"inductor", 15.0}, {"openvino", 0.5}, {"onnxruntime", 8.0}};
  auto m = s.Measurer();
  m.served = [](const std::string& b) { return b == "inductor"; };
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, m, o);
  EXPECT_DOUBLE_EQ(plan.budget_s, 1.25 * 15.0);
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_EQ(plan.trials[3].backend, "onnxruntime");
  EXPECT_TRUE(plan.trials[3].compiled);
  EXPECT_EQ(plan.pick, "onnxruntime");
  // A compile slower than expected keeps its own seconds as the basis.
  s.compile_s["inductor"] = 20.0;
  s.clock = 0.0;
  EXPECT_DOUBLE_EQ(SearchWholeGraphFirst({"inductor", "openvino"}, m, o).budget_s, 1.25 * 20.0);
}

TEST(PlacementSearch, WorkTheReferenceRanSideBySideCountsInItsBudget) {
  // Inductor's compile took 8 s here; the user's own would have taken 5 s more (its ISA
  // probes one after another). The budget is 1.25 x 13 s, not x 8 s, and ONNX Runtime's 4 s
  // compile fits in it.
  Stub s;
  s.run_s = {{"eager", 100e-3}, {"inductor", 60e-3}, {"openvino", 50e-3}, {"onnxruntime", 45e-3}};
  s.compile_s = {{"inductor", 8.0}, {"openvino", 0.5}, {"onnxruntime", 4.0}};
  WholeGraphSearchOptions o;
  o.expected_compile_s = {{"inductor", 6.0}, {"openvino", 0.5}, {"onnxruntime", 4.0}};
  auto m = s.Measurer();
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, m, o);
  EXPECT_DOUBLE_EQ(plan.budget_s, 1.25 * 8.0);
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_EQ(plan.trials[3].backend, "onnxruntime");
  EXPECT_EQ(plan.trials[3].skipped,
            "would take ~4.0 s to compile, 1.5 s of the 10.0 s budget left");
  EXPECT_EQ(plan.pick, "openvino");
  std::vector<std::string> asked;
  m.saved_s = [&asked](const std::string& b) {
    asked.push_back(b);
    return b == "inductor" ? 5.0 : 0.0;
  };
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, m, o);
  EXPECT_DOUBLE_EQ(plan.budget_s, 1.25 * 13.0);
  EXPECT_TRUE(plan.trials[3].compiled);
  EXPECT_EQ(plan.pick, "onnxruntime");
  // Asked of the reference only, where its compile fixes the budget.
  EXPECT_EQ(asked, std::vector<std::string>{"inductor"});
}

TEST(PlacementSearch, ACompilerThatCannotBeatTheFastestSoFarIsNotCompiled) {
  // bf16 asked: OpenVINO computes in bf16 (28 ms); ONNX Runtime in f32, whose FLOPs at the
  // machine's f32 peak take at least 40 ms: it cannot win, and its compile is saved.
  Stub s;
  s.run_s = {{"eager", 120e-3}, {"inductor", 30e-3}, {"openvino", 28e-3}, {"onnxruntime", 55e-3}};
  s.compile_s = {{"inductor", 12.0}, {"openvino", 0.5}, {"onnxruntime", 8.0}};
  WholeGraphSearchOptions o;
  o.budget_s = 100.0;
  o.lower_bound_s = {{"onnxruntime", 40e-3}};
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_FALSE(plan.trials[3].compiled);
  EXPECT_EQ(plan.trials[3].skipped, "cannot win: at least 40.0 ms at its peak, 28.0 ms measured");
  EXPECT_EQ(s.Count("compile onnxruntime"), 0);
  // A bound under the fastest so far decides nothing: it is compiled and timed.
  o.lower_bound_s = {{"onnxruntime", 20e-3}};
  s.calls.clear();
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  EXPECT_TRUE(plan.trials[3].compiled);
  EXPECT_NEAR(plan.trials[3].median_s, 55e-3, 1e-12);
}

TEST(PlacementSearch, AGraphTimedUnderItsBoundDisprovesTheBounds) {
  // f32: every compiler's bound is 167 ms (its FLOPs at a peak measured low). OpenVINO runs in
  // 154 ms, under its own bound: the bounds are wrong and rule nothing out, so ONNX Runtime
  // (153 ms) is compiled and picked instead of being skipped as "cannot win".
  Stub s;
  s.run_s = {
      {"eager", 310e-3}, {"inductor", 200e-3}, {"openvino", 154e-3}, {"onnxruntime", 153e-3}};
  s.compile_s = {{"inductor", 12.0}, {"openvino", 0.5}, {"onnxruntime", 3.0}};
  WholeGraphSearchOptions o;
  o.stop_decided = false;  // constant timings: rounds 3 on would be settled (below)
  o.budget_s = 100.0;
  o.lower_bound_s = {{"inductor", 167e-3}, {"openvino", 167e-3}, {"onnxruntime", 167e-3}};
  auto plan = SearchWholeGraphFirst({"openvino", "onnxruntime", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "onnxruntime");
  for (const auto& t : plan.trials) EXPECT_TRUE(t.compiled) << t.backend << ": " << t.skipped;
  EXPECT_EQ(plan.notes,
            "openvino ran in 154.0 ms, under its 167.0 ms bound at the measured peak: no bound "
            "used");
  // Bounds that hold still save a compile.
  o.lower_bound_s = {{"inductor", 100e-3}, {"openvino", 100e-3}, {"onnxruntime", 160e-3}};
  s.calls.clear();
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"openvino", "onnxruntime", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  EXPECT_TRUE(plan.notes.empty());
  EXPECT_EQ(s.Count("compile onnxruntime"), 0);
}

TEST(PlacementSearch, AMeasuredFloorOverTheFastestRulesTheReferenceOutAndBudgetsOnItsExpectation) {
  // bert-base, batch 1, f32: OpenVINO's graph runs in 108 ms; Inductor's matmuls alone (the
  // BLAS calls its graph makes) measure 140 ms, so its 25 s compile cannot pay. It is skipped,
  // and ONNX Runtime after it gets the budget Inductor's compile was expected to set.
  Stub s;
  s.run_s = {
      {"eager", 200e-3}, {"openvino", 108e-3}, {"inductor", 220e-3}, {"onnxruntime", 140e-3}};
  s.compile_s = {{"openvino", 2.0}, {"inductor", 25.0}, {"onnxruntime", 8.0}};
  WholeGraphSearchOptions o;
  o.expected_compile_s = {{"openvino", 0.5}, {"inductor", 13.5}, {"onnxruntime", 8.1}};
  std::vector<std::pair<std::string, double>> asked;
  auto m = s.Measurer();
  m.floor = [&](const std::string& b, double target_s) {
    asked.emplace_back(b, target_s);
    return b == "inductor" ? 140e-3 : 0.0;
  };
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, m, o);
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_EQ(plan.trials[2].backend, "inductor");
  EXPECT_FALSE(plan.trials[2].compiled);
  EXPECT_EQ(plan.trials[2].skipped,
            "cannot win: its matmuls alone take 140.0 ms, 108.0 ms measured");
  EXPECT_EQ(s.Count("compile inductor"), 0);
  EXPECT_DOUBLE_EQ(plan.budget_s, 1.25 * 13.5);
  EXPECT_TRUE(plan.trials[3].compiled);  // 2 s spent of 16.9
  EXPECT_EQ(plan.pick, "openvino");
  // Asked once per compiler about to be compiled after a timing, against the fastest over
  // the slack: OpenVINO (timed after eager), Inductor, ONNX Runtime.
  ASSERT_EQ(asked.size(), 3u);
  EXPECT_EQ(asked[1].first, "inductor");
  EXPECT_NEAR(asked[1].second, 108e-3 / 0.85, 1e-12);
  // A floor whose slack's share is under the fastest decides nothing: compiled and timed.
  m.floor = [](const std::string& b, double) { return b == "inductor" ? 120e-3 : 0.0; };
  s.calls.clear();
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, m, o);
  EXPECT_TRUE(plan.trials[2].compiled) << plan.trials[2].skipped;
  EXPECT_DOUBLE_EQ(plan.budget_s, 1.25 * 25.0);
}

TEST(PlacementSearch, TheFloorIsNotMeasuredForACompilerSkippedOtherwise) {
  Stub s;
  s.run_s = {{"eager", 100e-3}, {"inductor", 90e-3}, {"openvino", 50e-3}, {"onnxruntime", 48e-3}};
  s.compile_s = {{"inductor", 12.0}, {"openvino", 0.5}, {"onnxruntime", 8.0}};
  WholeGraphSearchOptions o;  // budget 15 s, 12.5 s spent: ONNX Runtime's 7 s do not fit
  o.expected_compile_s = {{"openvino", 0.6}, {"onnxruntime", 7.0}};
  std::vector<std::string> asked;
  auto m = s.Measurer();
  m.floor = [&](const std::string& b, double) {
    asked.push_back(b);
    return 0.0;
  };
  auto plan = SearchWholeGraphFirst({"onnxruntime", "openvino", "inductor"}, m, o);
  EXPECT_FALSE(plan.trials[3].compiled);
  EXPECT_EQ(asked, (std::vector<std::string>{"inductor", "openvino"}));  // not ONNX Runtime
}

TEST(PlacementSearch, ACompilerExpectedToOverrunTheBudgetIsNotCompiled) {
  Stub s;
  s.run_s = {{"eager", 100e-3}, {"inductor", 90e-3}, {"openvino", 50e-3}, {"onnxruntime", 48e-3}};
  s.compile_s = {{"inductor", 12.0}, {"openvino", 0.5}, {"onnxruntime", 8.0}};
  WholeGraphSearchOptions o;  // budget 1.25 x 12 s = 15 s; 12.5 s spent after OpenVINO
  o.expected_compile_s = {{"openvino", 0.6}, {"onnxruntime", 7.0}};
  auto plan = SearchWholeGraphFirst({"onnxruntime", "openvino", "inductor"}, s.Measurer(), o);
  ASSERT_EQ(plan.trials.size(), 4u);
  // No expectation for Inductor: nothing counts as cheap, the reference goes first.
  EXPECT_EQ(plan.trials[1].backend, "inductor");
  EXPECT_EQ(plan.trials[2].backend, "openvino");
  EXPECT_TRUE(plan.trials[2].compiled);
  EXPECT_EQ(plan.trials[3].backend, "onnxruntime");
  EXPECT_EQ(plan.trials[3].skipped,
            "would take ~7.0 s to compile, 2.5 s of the 15.0 s budget left");
  EXPECT_EQ(plan.pick, "openvino");
  // With room for it, it is compiled (and wins).
  o.budget_factor = 2.0;
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"onnxruntime", "openvino", "inductor"}, s.Measurer(), o);
  EXPECT_TRUE(plan.trials[3].compiled);
  EXPECT_EQ(plan.pick, "onnxruntime");
}

TEST(PlacementSearch, AReplayOfACompileFollowsItAndIsNeverSkippedForTheBudget) {
  const std::map<std::string, std::string> with = {{"inductor_cudagraphs", "inductor"}};
  // A replay's recorded seconds (its capture, or the compile it paid when it went first) made
  // it cheap: it went before the compile it replays.
  const std::map<std::string, double> expected = {
      {"inductor_cudagraphs", 0.5}, {"inductor", 10.0}, {"onnxruntime", 20.0}};
  const std::vector<std::string> all = {"inductor_cudagraphs", "onnxruntime", "inductor"};
  EXPECT_EQ(WholeGraphOrder(all, "inductor", expected),
            (std::vector<std::string>{"inductor_cudagraphs", "inductor", "onnxruntime"}));
  EXPECT_EQ(WholeGraphOrder(all, "inductor", expected, 0.25, with),
            (std::vector<std::string>{"inductor", "inductor_cudagraphs", "onnxruntime"}));
  // Without the compile it replays, it stands where its own expectation puts it.
  EXPECT_EQ(WholeGraphOrder({"inductor_cudagraphs", "openvino"}, "inductor", expected, 0.25, with),
            (std::vector<std::string>{"inductor_cudagraphs", "openvino"}));

  // Eager's slow timing spends Inductor's budget (1.25 x 2 s) before the replay's turn.
  Stub s;
  s.timing_takes_time = true;
  s.run_s = {{"eager", 3.0}, {"inductor", 0.2}, {"inductor_cudagraphs", 0.05}};
  s.compile_s = {{"inductor", 2.0}, {"inductor_cudagraphs", 0.1}};
  WholeGraphSearchOptions o;
  o.expected_compile_s = expected;
  auto plan = SearchWholeGraphFirst({"inductor", "inductor_cudagraphs"}, s.Measurer(), o);
  ASSERT_EQ(plan.trials.size(), 3u);
  EXPECT_EQ(plan.trials[1].backend, "inductor_cudagraphs");  // as cheap, first
  EXPECT_EQ(plan.pick, "inductor_cudagraphs");
  s.clock = 0.0;
  o.expected_compile_s = {{"inductor_cudagraphs", 20.0}, {"inductor", 10.0}};
  plan = SearchWholeGraphFirst({"inductor", "inductor_cudagraphs"}, s.Measurer(), o);
  EXPECT_EQ(plan.trials[2].skipped, "compile budget of 3.5 s spent");  // rescue: 1.75 x 2 s
  EXPECT_EQ(plan.pick, "inductor");
  s.clock = 0.0;
  o.compiles_with = with;
  plan = SearchWholeGraphFirst({"inductor_cudagraphs", "inductor"}, s.Measurer(), o);
  ASSERT_EQ(plan.trials.size(), 3u);
  EXPECT_EQ(plan.trials[1].backend, "inductor");
  EXPECT_EQ(plan.trials[2].backend, "inductor_cudagraphs");
  EXPECT_TRUE(plan.trials[2].compiled);
  EXPECT_EQ(plan.pick, "inductor_cudagraphs");
}

TEST(PlacementSearch, PicksTheFastestWholeGraphMeasuredInTurns) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 8e-3}, {"openvino", 5e-3}};
  s.compile_s = {{"inductor", 4.0}, {"openvino", 1.0}};
  WholeGraphSearchOptions o;
  o.turns = 2;
  auto plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  EXPECT_DOUBLE_EQ(plan.pick_s, 5e-3);
  EXPECT_DOUBLE_EQ(plan.eager_s, 10e-3);
  EXPECT_DOUBLE_EQ(plan.budget_s, 5.0);  // 1.25 x Inductor's 4 s
  // The first turn as graphs become available (eager, then each right after its compile,
  // reference first); eager (2x) and Inductor (1.6x the fastest) cannot win and are not timed
  // again, and OpenVINO, left alone in the race, is the pick without a second turn.
  std::vector<std::string> want = {"time eager", "compile inductor", "time inductor",
                                   "compile openvino", "time openvino"};
  EXPECT_EQ(s.calls, want);
  ASSERT_EQ(plan.trials.size(), 3u);
  EXPECT_DOUBLE_EQ(plan.trials[1].compile_s, 4.0);
  // 8 vs 5 ms: the winner dominates, mixing is not predicted to gain.
  EXPECT_FALSE(plan.refine);
  EXPECT_NE(plan.reason.find("predicted gain"), std::string::npos);
}

TEST(PlacementSearch, GraphsWithinTheDropRatioAreTimedEveryRound) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 6e-3}, {"openvino", 5e-3}};
  WholeGraphSearchOptions o;
  o.stop_decided = false;  // constant timings: rounds 3 on would be settled (below)
  o.turns = 3;
  auto plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  EXPECT_EQ(s.Count("time eager"), 1);     // 2x the fastest: dropped after the first round
  EXPECT_EQ(s.Count("time inductor"), 3);  // 1.2x: still racing
  EXPECT_EQ(s.Count("time openvino"), 3);
  EXPECT_DOUBLE_EQ(plan.eager_s, 10e-3);  // its one timing stands
  o.drop_ratio = 0.0;                     // off: every round times every graph
  Stub all = s;
  all.calls.clear();
  SearchWholeGraphFirst({"openvino", "inductor"}, all.Measurer(), o);
  EXPECT_EQ(all.calls.size(), 2u + 9u);
}

TEST(PlacementSearch, OneGraphLeftRacingIsNotTimedAgain) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 9e-3}, {"openvino", 5e-3}};
  WholeGraphSearchOptions o;
  o.stop_decided = false;  // constant timings: rounds 3 on would be settled (below)
  o.turns = 3;
  auto plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  EXPECT_DOUBLE_EQ(plan.pick_s, 5e-3);
  // 2x and 1.8x the fastest: both dropped after the first round, which leaves one racer.
  EXPECT_EQ(s.Count("time openvino"), 1);
  EXPECT_EQ(s.calls.size(), 5u);
  // Two racers (Inductor at 1.2x): the turns go on for both.
  Stub two = s;
  two.calls.clear();
  two.run_s["inductor"] = 6e-3;
  SearchWholeGraphFirst({"openvino", "inductor"}, two.Measurer(), o);
  EXPECT_EQ(two.Count("time openvino"), 3);
  EXPECT_EQ(two.Count("time inductor"), 3);
}

TEST(PlacementSearch, RoundsThatOverrunTheBudgetTimeOnlyCloseGraphs) {
  // A 1.2B Llama's prefill on two cores: every timing is one run of 5-7 s, on the clock.
  WholeGraphSearchOptions o;  // 3 turns, budget 1.25 x 40 s = 50 s: spent by the first turn
  o.stop_decided = false;     // constant timings: rounds 3 on would be settled (below)
  std::map<std::string, int64_t> timed;
  auto search = [&](double eager_s, double inductor_s, double openvino_s) {
    Stub s;
    s.run_s = {{"eager", eager_s}, {"inductor", inductor_s}, {"openvino", openvino_s}};
    s.compile_s = {{"inductor", 40.0}, {"openvino", 17.0}};
    s.timing_takes_time = true;
    auto plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
    for (const char* b : {"eager", "inductor", "openvino"}) {
      timed[b] = s.Count(std::string("time ") + b);
    }
    return plan;
  };
  auto plan = search(6.5, 6.4, 5.1);
  EXPECT_EQ(plan.pick, "openvino");
  // A second round (18 s) fits neither the budget nor a tenth of the 75 s spent; eager and
  // Inductor, 1.25-1.27x OpenVINO, cannot be swapped with it by noise: no more rounds.
  std::map<std::string, int64_t> once = {{"eager", 1}, {"inductor", 1}, {"openvino", 1}};
  EXPECT_EQ(timed, once);
  EXPECT_NE(plan.notes.find("rounds 2-3 time only openvino"), std::string::npos) << plan.notes;
  // Inductor within 1.1x of OpenVINO: a close race, timed every round whatever it costs.
  plan = search(6.5, 5.5, 5.1);
  std::map<std::string, int64_t> close = {{"eager", 1}, {"inductor", 3}, {"openvino", 3}};
  EXPECT_EQ(timed, close);
  EXPECT_NE(plan.notes.find("time only inductor, openvino"), std::string::npos) << plan.notes;
  // Within the budget (or its slack), every racer is timed every round, as before.
  plan = search(0.65, 0.64, 0.51);
  std::map<std::string, int64_t> all = {{"eager", 3}, {"inductor", 3}, {"openvino", 3}};
  EXPECT_EQ(timed, all);
  EXPECT_TRUE(plan.notes.empty()) << plan.notes;
}

TEST(PlacementSearch, RoundsThatCannotChangeThePickAreNotTimed) {
  // Three turns; after two, a graph whose better timing is over the leader's worse one cannot
  // overtake it in the third (median of three), so it is not timed again.
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 5.5e-3}, {"openvino", 5e-3}};
  WholeGraphSearchOptions o;
  auto plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  EXPECT_EQ(s.Count("time eager"), 1);  // 2x: dropped after the first round (drop_ratio)
  EXPECT_EQ(s.Count("time inductor"), 2);
  EXPECT_EQ(s.Count("time openvino"), 2);  // left alone: no third round
  EXPECT_NE(plan.notes.find("from round 3 inductor not timed"), std::string::npos) << plan.notes;
  // Overlapping timings (a noisy 6 ms OpenVINO sample): the third round could swap them.
  s.calls.clear();
  s.first_runs = {{"openvino", {5e-3, 6e-3}}};
  plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(s.Count("time inductor"), 3);
  EXPECT_EQ(s.Count("time openvino"), 3);
  EXPECT_EQ(plan.pick, "openvino");  // 5, 6, 5 ms: median 5 against 5.5
  // Off: every round times every racer.
  s.calls.clear();
  o.stop_decided = false;
  SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(s.Count("time inductor"), 3);
}

TEST(PlacementSearch, SettlingKeepsTheMarginOverEager) {
  // Eager within the drop ratio (1.3x the leader): it stops racing once no timing left could
  // keep the leader from beating it by the margin, and not before.
  Stub s;
  s.run_s = {{"eager", 6.5e-3}, {"inductor", 5e-3}};
  WholeGraphSearchOptions o;
  auto plan = SearchWholeGraphFirst({"inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "inductor");
  EXPECT_EQ(s.Count("time eager"), 2);
  EXPECT_EQ(s.Count("time inductor"), 2);
  // Inductor 1% under eager, inside the 2% margin: eager leads, Inductor cannot be picked and
  // stops racing; the pick is eager, as the full rounds would make it.
  s.calls.clear();
  s.run_s = {{"eager", 5e-3}, {"inductor", 4.95e-3}};
  plan = SearchWholeGraphFirst({"inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "eager");
  EXPECT_EQ(s.Count("time inductor"), 2);
  // Overlapping (eager's second timing 5.1 ms): raced to the end.
  s.calls.clear();
  s.first_runs = {{"eager", {5e-3, 5.1e-3}}};
  plan = SearchWholeGraphFirst({"inductor"}, s.Measurer(), o);
  EXPECT_EQ(s.Count("time inductor"), 3);
}

TEST(PlacementSearch, ACompileThatWouldExhaustMemoryIsNotMade) {
  // 10 GB free; OpenVINO's graph holds 6 GB, Inductor's 6 GB: after OpenVINO's compile 4 GB
  // are left, under 1.25 x 6 GB, so Inductor is not compiled, and says why.
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 4e-3}, {"openvino", 5e-3}};
  s.compile_s = {{"inductor", 8.0}, {"openvino", 1.0}};
  double free = 10e9;
  s.free_bytes = [&] { return free - 6e9 * static_cast<double>(s.Count("compile openvino")); };
  WholeGraphSearchOptions o;
  o.expected_compile_s = {{"openvino", 1.0}, {"inductor", 8.0}};
  o.compile_bytes = {{"openvino", 6e9}, {"inductor", 6e9}};
  auto plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(s.Count("compile openvino"), 1);
  EXPECT_EQ(s.Count("compile inductor"), 0);
  EXPECT_EQ(plan.pick, "openvino");
  ASSERT_EQ(plan.trials.size(), 3u);
  EXPECT_EQ(plan.trials[2].skipped, "would need ~7.5 GB of memory, 4.0 GB free");
  EXPECT_TRUE(plan.memory_limited);
  // The reference skipped: the budget is what its compile was expected to take.
  EXPECT_DOUBLE_EQ(plan.budget_s, 1.25 * 8.0);
  // With 20 GB free both compile; unknown free memory (<= 0) or no need checks nothing.
  for (double f : {20e9, 0.0}) {
    s.calls.clear();
    free = f;
    plan = SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
    EXPECT_EQ(s.Count("compile inductor"), 1) << f;
    EXPECT_EQ(plan.pick, "inductor");
    EXPECT_FALSE(plan.memory_limited);
  }
  s.calls.clear();
  free = 1e9;
  o.compile_bytes.clear();
  SearchWholeGraphFirst({"openvino", "inductor"}, s.Measurer(), o);
  EXPECT_EQ(s.Count("compile inductor"), 1);
}

TEST(PlacementSearch, KeepsEagerUnlessACompilerBeatsItByTheMargin) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 9.9e-3}};
  WholeGraphSearchOptions o;
  auto plan = SearchWholeGraphFirst({"inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "eager");
  s.run_s["inductor"] = 9.7e-3;
  s.calls.clear();
  plan = SearchWholeGraphFirst({"inductor"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "inductor");
}

TEST(PlacementSearch, AFailedCompilerIsNeverPickedAndItsFailurePredictsAGain) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 6e-3}, {"openvino", 1e-3}};
  s.compile_s = {{"inductor", 4.0}, {"openvino", 1.0}};
  s.compiles = {{"openvino", false}};
  WholeGraphSearchOptions o;
  o.refine_candidates = 10;
  auto plan = SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "inductor");
  EXPECT_FALSE(plan.trials[2].compiled);
  EXPECT_DOUBLE_EQ(plan.predicted_gain, o.mixing_prior);
  // 10 candidates x 0.03 s + 5 s of recompiles fit in 5 - 5 s? No: 5.3 > 0.
  EXPECT_FALSE(plan.refine);
  EXPECT_NE(plan.reason.find("budget"), std::string::npos);
  o.budget_s = 20.0;
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o);
  EXPECT_TRUE(plan.refine);
  EXPECT_DOUBLE_EQ(plan.refine_budget_s, 15.0);
}

TEST(PlacementSearch, CloseCompilersPredictAGainFromMixing) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 5.2e-3}, {"openvino", 5e-3}};
  s.compile_s = {{"inductor", 4.0}, {"openvino", 1.0}};
  WholeGraphSearchOptions o;
  o.refine_candidates = 20;
  o.budget_s = 12.0;  // 5 s spent compiling; 20 x 0.03 s + 5 s of recompiles fit in the 7 left
  auto plan = SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  EXPECT_NEAR(plan.predicted_gain, 0.15 - 0.04, 1e-9);
  EXPECT_TRUE(plan.refine);
  o.allow_refine = false;
  s.clock = 0.0;
  EXPECT_FALSE(SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o).refine);
}

TEST(PlacementSearch, ThePlacementPassAlwaysRefinesUnlessRefiningIsOff) {
  // One compiler far ahead (no predicted gain) and no budget left: the default compile stops
  // at the whole graph; the explicit pass runs the finer search from it all the same.
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 9e-3}, {"openvino", 2e-3}};
  s.compile_s = {{"inductor", 4.0}, {"openvino", 3.0}};
  WholeGraphSearchOptions o;
  o.refine_candidates = 1000;
  EXPECT_FALSE(SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o).refine);
  o.always_refine = true;
  s.clock = 0.0;
  auto plan = SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o);
  EXPECT_EQ(plan.pick, "openvino");
  EXPECT_TRUE(plan.refine);
  EXPECT_EQ(plan.reason, "finer search: asked for (predicted gain 0.0%)");
  o.allow_refine = false;
  s.clock = 0.0;
  EXPECT_FALSE(SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o).refine);
}

TEST(PlacementSearch, WhileNothingBeatsTheReferenceTheBudgetStretches) {
  // T5 at the suite's size: OpenVINO fails, Inductor compiles in 12 s (budget 15 s), 14 s are
  // spent when ONNX Runtime (expected 6 s) comes up: over the budget, within 1.75 x 12 = 21 s.
  Stub s;
  s.run_s = {{"eager", 4e-3}, {"inductor", 2.6e-3}, {"onnxruntime", 1.4e-3}};
  s.compile_s = {{"inductor", 12.0}, {"openvino", 2.0}, {"onnxruntime", 4.0}};
  s.compiles = {{"openvino", false}};
  WholeGraphSearchOptions o;
  o.expected_compile_s = {{"inductor", 12.0}, {"openvino", 0.5}, {"onnxruntime", 6.0}};
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_EQ(plan.trials[1].backend, "openvino");
  EXPECT_FALSE(plan.trials[1].compiled);
  EXPECT_EQ(plan.trials[3].backend, "onnxruntime");
  EXPECT_TRUE(plan.trials[3].compiled) << plan.trials[3].skipped;
  EXPECT_EQ(plan.pick, "onnxruntime");
  EXPECT_DOUBLE_EQ(plan.budget_s, 15.0);  // the plan's budget is still the plain one
  // Beyond the stretched budget it is skipped, and the message names that budget.
  o.expected_compile_s["onnxruntime"] = 8.0;
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  EXPECT_EQ(plan.trials[3].skipped,
            "would take ~8.0 s to compile, 7.0 s of the 21.0 s budget left");
  EXPECT_EQ(plan.pick, "inductor");
  // Once another compiler has beaten the reference, the plain budget holds.
  s.compiles.clear();
  s.run_s["openvino"] = 1.5e-3;
  o.expected_compile_s["onnxruntime"] = 6.0;
  s.clock = 0.0;
  plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  EXPECT_EQ(plan.trials[3].skipped,
            "would take ~6.0 s to compile, 1.0 s of the 15.0 s budget left");
  EXPECT_EQ(plan.pick, "openvino");
}

TEST(PlacementSearch, ASlowFirstSampleDoesNotStretchTheBudget) {
  // T5 at real size: OpenVINO (1.5x faster than Inductor) timed slow once after its compile;
  // the stretch then let ONNX Runtime's compile in. A second timing of each graph settles it.
  Stub s;
  s.run_s = {{"eager", 0.23}, {"inductor", 0.168}, {"openvino", 0.110}, {"onnxruntime", 0.13}};
  s.first_runs = {{"openvino", {0.25}}};
  s.compile_s = {{"inductor", 20.0}, {"openvino", 1.7}, {"onnxruntime", 16.5}};
  WholeGraphSearchOptions o;  // budget 25 s, stretched 35 s; 21.7 s spent at ONNX Runtime's turn
  o.expected_compile_s = {{"inductor", 17.0}, {"openvino", 0.7}, {"onnxruntime", 10.2}};
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_EQ(plan.trials[3].skipped,
            "would take ~10.2 s to compile, 3.3 s of the 25.0 s budget left");
  EXPECT_EQ(plan.pick, "openvino");
  // Timed again, OpenVINO's graph is still the slower: the budget stretches.
  s.clock = 0.0;
  s.calls.clear();
  s.run_s["openvino"] = 0.2;
  s.first_runs = {{"openvino", {0.25}}};
  plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  EXPECT_TRUE(plan.trials[3].compiled) << plan.trials[3].skipped;
  // Its first timing and the second; later turns drop it (1.9x ONNX Runtime's first).
  EXPECT_EQ(s.Count("time openvino"), 2);
}

TEST(PlacementSearch, ANearTieWithTheReferenceDoesNotStretchTheBudget) {
  // T5's encoder at batch 1 on the 2-core Xeon: OpenVINO's graph 1.03x Inductor's. Stretched,
  // the budget let ONNX Runtime's 16.9 s export in (expected 10.2 s), and it lost.
  Stub s;
  s.run_s = {{"eager", 0.15}, {"inductor", 0.0975}, {"openvino", 0.1003}, {"onnxruntime", 0.0994}};
  s.compile_s = {{"inductor", 25.0}, {"openvino", 1.5}, {"onnxruntime", 16.9}};
  WholeGraphSearchOptions o;  // budget 1.25 x 25 s; 26.5 s spent at ONNX Runtime's turn
  o.expected_compile_s = {{"inductor", 17.0}, {"openvino", 0.7}, {"onnxruntime", 10.2}};
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_EQ(plan.trials[3].skipped,
            "would take ~10.2 s to compile, 4.8 s of the 31.2 s budget left");
  EXPECT_EQ(plan.pick, "inductor");
  // Past close_ratio (1.1) it is no tie: the budget stretches to 1.75 x 25 s.
  s.clock = 0.0;
  s.run_s["openvino"] = 0.0975 * 1.15;
  plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  EXPECT_TRUE(plan.trials[3].compiled) << plan.trials[3].skipped;
}

TEST(PlacementSearch, StopsCompilingOnceTheBudgetIsSpent) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 8e-3}, {"openvino", 5e-3}, {"onnxruntime", 4e-3}};
  s.compile_s = {{"inductor", 2.0}, {"openvino", 4.0}, {"onnxruntime", 1.0}};
  WholeGraphSearchOptions o;  // budget 1.25 x 2 s = 2.5 s: spent after openvino
  auto plan = SearchWholeGraphFirst({"inductor", "openvino", "onnxruntime"}, s.Measurer(), o);
  ASSERT_EQ(plan.trials.size(), 4u);
  EXPECT_FALSE(plan.trials[3].compiled);
  EXPECT_NE(plan.trials[3].skipped.find("budget"), std::string::npos);
  EXPECT_EQ(plan.pick, "openvino");
}

TEST(PlacementSearch, WithoutTheReferenceTheFallbackBudgetHolds) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"openvino", 5e-3}};
  s.compile_s = {{"openvino", 1.0}};
  s.compiles = {{"inductor", false}};
  WholeGraphSearchOptions o;
  o.fallback_budget_s = 12.0;
  auto plan = SearchWholeGraphFirst({"inductor", "openvino"}, s.Measurer(), o);
  EXPECT_DOUBLE_EQ(plan.budget_s, 12.0);
  EXPECT_EQ(plan.pick, "openvino");
}

TEST(PlacementSearch, RejectsMissingCallbacks) {
  WholeGraphSearchOptions o;
  EXPECT_THROW(SearchWholeGraphFirst({"inductor"}, WholeGraphMeasurer{}, o), std::invalid_argument);
}

TEST(PlacementSearch, RejectsOptionsThatWouldEndEveryRace) {
  Stub s;
  s.run_s = {{"eager", 10e-3}, {"inductor", 5e-3}};
  WholeGraphSearchOptions turns, close, slack;
  turns.turns = 0;
  close.close_ratio = 0.9;  // no graph within 0.9x of the fastest, the fastest included
  slack.turn_slack = -0.1;
  for (const auto& o : {turns, close, slack}) {
    EXPECT_THROW(SearchWholeGraphFirst({"inductor"}, s.Measurer(), o), std::invalid_argument);
  }
  EXPECT_NO_THROW(SearchWholeGraphFirst({"inductor"}, s.Measurer(), WholeGraphSearchOptions{}));
}

}  // namespace
}  // namespace tp::passes
