// The default placement's search driver (issue 27): whole graphs first, the finer search only
// when it can pay for itself.
//
// The op-level DP and the evolution (placement_dp.h, placement_evolve.h) measure every
// candidate group: tens of seconds on a transformer, against Inductor's few. Most of what they
// find is already in the best whole-graph compile (a whole graph is what each compiler is built
// for), so the driver orders the search by value: each available compiler's whole graph
// compiled once and measured in turns against eager, the fastest picked (eager unless a
// compiler beats it by a margin), and the finer search run only while the compile budget
// allows and the cost model below predicts a gain over that pick.
//
// Cost model of the finer search. Its gain comes from giving each part of the graph to the
// compiler that is best there. When one compiler's whole graph beats the runner-up by a wide
// margin it is usually best on every part, and mixing gains nothing; when the two are close,
// each tends to win on some parts. So the predicted relative gain is
//   max(0, mixing_prior - (runner_up / best - 1)),
// and `mixing_prior` when a graph compiler could not take the whole graph (it may still take
// parts of it). Its predicted time is one measurement per candidate group plus a recompile of
// every compiler's regions.
//
// Measuring, compiling and the clock are callbacks, so the logic is tested with stubs.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tp::passes {

struct WholeGraphMeasurer {
  // Compiles the whole graph on `backend` and checks its outputs against eager's; false if it
  // cannot (the reason is the caller's to log). Not called for `eager`.
  std::function<bool(const std::string& backend)> compile;
  // One end-to-end timing, in seconds, of `backend`'s compiled graph ("eager": as given).
  std::function<double(const std::string& backend)> time;
  // Seconds since the compile of this graph began (record, candidates and compiles included).
  std::function<double()> elapsed;
  // Whether `backend`'s last compile was served from a cache (Inductor's FX graph cache, a kept
  // export): its seconds are no compile's. May be empty (never).
  std::function<bool(const std::string& backend)> served;
  // A lower bound in seconds on `backend`'s run time, measured on demand before its compile:
  // the kernels it is known to call, timed alone (Inductor's matmuls go to the same BLAS
  // whatever it fuses around them). Measured only as far as it must to reach `target_s` (the
  // fastest graph so far over floor_slack): any partial sum is a bound too. Called only for a
  // compiler about to be compiled once a graph is timed. May be empty; 0: no bound.
  std::function<double(const std::string& backend, double target_s)> floor;
  // The bytes of memory this process can still take, read now (before each compile: the
  // graphs compiled so far hold theirs). May be empty; <= 0: unknown.
  std::function<double()> free_bytes;
  // Seconds that the user's own compile of `backend`'s graph would have taken beyond the one
  // just made: work this compile ran side by side that the compiler runs one step after
  // another (Inductor's probes of the CPU's vector ISAs in a process's first compile: 9.6 s
  // in turn, 4.9 s two at a time on the 2-core Xeon). Added to the reference's compile where
  // it fixes the budget, a multiple of what the user's compiler takes: else the time saved
  // would shrink the budget by as much. May be empty (none saved).
  std::function<double(const std::string& backend)> saved_s;
};

struct WholeGraphSearchOptions {
  int turns = 3;  // rounds of measurement; each round times every compiled graph once
  // After the first round a graph slower than this multiple of the round's fastest is not
  // timed again: it cannot win, and timing it dominated the compile at real sizes (eager
  // bert-base: 3 rounds of 7 samples at 0.1-0.4 s each). <= 1: every round times every graph.
  // With one graph left racing, no further round is timed: it is the pick.
  double drop_ratio = 1.5;
  // Later rounds are timed while they fit: a round expected to take longer than what is left
  // of the budget (and longer than turn_slack of the time spent so far) times only the graphs
  // within close_ratio of the fastest, the ones a noisy timing could swap. A 1.2B Llama's
  // 512-token prefill runs 5-7 s on two cores: two more rounds of three graphs were ~36 s of a
  // 160 s compile (3.7x Inductor's), for a pick 25% ahead of the next.
  double turn_slack = 0.1;
  double close_ratio = 1.1;
  // Before each later round, a graph whose median cannot become the pick whatever the rounds
  // left measure (its best case against the leader's worst) is not timed again: those rounds
  // cannot change the pick. At batch 8 they were seconds a graph (GPT-2: ~1 s a timing).
  bool stop_decided = true;
  // Total compile time allowed. <= 0: budget_factor times the compile time of `reference`
  // (the compiler a user would otherwise pick), or fallback_budget_s when it did not compile.
  // 1.25: the compiles at most a quarter more than the user's own compiler; with the trace
  // before and the timing turns after, the whole compile stays within about 1.5x.
  double budget_s = 0.0;
  double budget_factor = 1.25;
  std::string reference = "inductor";
  double fallback_budget_s = 30.0;
  // While no other compiler's graph has run faster than the reference's, or within close_ratio
  // of it (they failed, or ran clearly slower), the budget stretches to this multiple of the
  // reference's compile: the search would otherwise end on the user's own compiler with the
  // best chance still untried (T5 and BART at the suite's sizes: OpenVINO fails on them, and
  // ONNX Runtime, 1.6-1.9x Inductor there, was skipped with 2 s of a 15 s budget left). 1.75
  // keeps the whole compile within about 2x.
  double rescue_budget_factor = 1.75;
  // A compiler is picked over eager only when it is faster by this fraction.
  double keep_eager_margin = 0.02;
  double mixing_prior = 0.15;
  double min_gain = 0.03;  // predicted gain below which the finer search is not run
  // What the finer search would cost: candidate groups, seconds per candidate.
  int refine_candidates = 0;
  double seconds_per_candidate = 0.03;
  bool allow_refine = true;
  // The explicit placement pass: the finer search runs whatever the predicted gain and the
  // budget (its own is the user's), from the whole-graph pick, which stands unless the finer
  // placement measures faster. So the pass is never slower than the default compile's pick.
  bool always_refine = false;
  // Per compiler, a lower bound on its run time in seconds (its FLOPs at the machine's peak for
  // the precision it computes in): one that cannot beat the fastest graph timed so far is not
  // compiled. Absent or 0: no bound.
  std::map<std::string, double> lower_bound_s;
  // A measured floor (WholeGraphMeasurer::floor) rules a compiler out only where this fraction
  // of it still exceeds the fastest graph so far: its kernels ran warm and alone, and either
  // timing may be a noisy sample.
  double floor_slack = 0.85;
  // Per compiler, its expected compile time in seconds: once the budget is known (the
  // reference compiled), a compiler expected to overrun what is left of it is not compiled.
  // Absent or 0: unknown, compiled while any budget is left.
  std::map<std::string, double> expected_compile_s;
  // Compilers expected to compile in at most this fraction of the reference's expected time go
  // before it (WholeGraphOrder). The budget's slack over the reference (budget_factor - 1): one
  // tried first never costs more than that slack. At 0.1, OpenVINO's bf16 compile (~1.2 s, 16%
  // of Inductor's ~7.4 s on bert-base) went after Inductor and found the budget spent, so the
  // bf16 pick was Inductor's graph at 0.91x OpenVINO's.
  double cheap_fraction = 0.25;
  // Compiler -> the compiler whose compile it replays another way (Inductor's graph replayed
  // as one CUDA graph): tried right after that one, and once that one compiled, never skipped
  // for the budget, since trying it costs a capture and a timing, not a compile. Counted as a
  // compile, its expectation had put it before Inductor (it then paid Inductor's compile) and
  // skipped it on the next graphs (GPT-2, ViT, DistilBERT on the H100 and H200).
  std::map<std::string, std::string> compiles_with;
  // Per compiler, the bytes its compiled graph holds besides the model's own weights (its copy
  // of the frozen weights, in the precision it computes in). One is not compiled where the free
  // memory (WholeGraphMeasurer::free_bytes) is under memory_slack times it: every compiled
  // graph is held until the pick, and a search that exhausts memory kills the user's process.
  // The 1.2B Llama in f32: 4.9 GB of weights, OpenVINO's compile took 4.9 GB more and
  // Inductor's another copy, three copies where the user's Inductor holds two. Absent or 0:
  // not checked.
  std::map<std::string, double> compile_bytes;
  // Activations and workspaces on top of the weights' copy.
  double memory_slack = 1.25;
};

struct WholeGraphTrial {
  std::string backend;
  bool compiled = false;
  double compile_s = 0.0;
  double median_s = 0.0;  // median over turns; 0 when not compiled
  std::string skipped;    // why it was not tried (budget), empty otherwise
};

struct WholeGraphSearchPlan {
  std::vector<WholeGraphTrial> trials;  // eager first, then the compilers in the order tried
  std::string pick;                     // "eager" or a compiler's name
  double pick_s = 0.0;
  double eager_s = 0.0;
  double budget_s = 0.0;
  bool refine = false;
  double refine_budget_s = 0.0;  // what is left of the budget for the finer search
  double predicted_gain = 0.0;
  double predicted_refine_s = 0.0;
  std::string reason;  // one line: why refine is (not) run
  std::string notes;   // what the search found unexpected (bounds disproved), else empty
  // A compiler was left out for the memory free at that moment (compile_bytes): the plan holds
  // for that moment only, and is not to be kept for later processes.
  bool memory_limited = false;
};

// Times eager, then compiles in WholeGraphOrder, timing each compiled graph once right away
// (the first turn) so that later compilers are checked against the fastest so far; skips a
// compiler that cannot win (lower_bound_s) or cannot finish in the budget; measures the
// remaining turns round-robin; picks; decides whether to refine.
WholeGraphSearchPlan SearchWholeGraphFirst(const std::vector<std::string>& backends,
                                           const WholeGraphMeasurer& measurer,
                                           const WholeGraphSearchOptions& options);

// The median of `v`; 0 when it is empty.
double Median(std::vector<double> v);

// Sorts `names` by their expected seconds, cheapest first; an unknown cost (absent or <= 0)
// sorts after every known one, and ties keep the given order. The whole-graph order and the
// finer search's rounds (placement_rounds.h) both order compilers this way.
void SortByExpectedCost(std::vector<std::string>* names,
                        const std::map<std::string, double>& expected_s);

// The order whole graphs are compiled in. First the compilers expected to take at most
// `cheap_fraction` of the reference's expected compile, cheapest first: always tried, since
// the budget is only known once the reference has compiled (a reference served from
// Inductor's cache in 3.7 s left a 1.5x budget that skipped OpenVINO's 0.7 s compile of a
// graph it ran 5.4x faster). Then the reference, which fixes the budget. Then the others,
// cheapest expected compile first (unknowns last, as given): more of them fit in the budget.
// A compiler that replays another's compile (`compiles_with`) follows that one directly.
std::vector<std::string> WholeGraphOrder(
    const std::vector<std::string>& backends, const std::string& reference,
    const std::map<std::string, double>& expected_compile_s = {}, double cheap_fraction = 0.25,
    const std::map<std::string, std::string>& compiles_with = {});

}  // namespace tp::passes
