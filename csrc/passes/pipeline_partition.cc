#include "passes/pipeline_partition.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tp::pipeline {
namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

struct Config {
  int b = 1, k = 1;
};

// Entry signature of a plan: (micro-batch, k, in-flight samples) of each stage that its
// upstream feeds, deduplicated to the largest in-flight per (b, k).
using Signature = std::vector<std::array<int64_t, 3>>;

struct StageCost {
  double fwd_flops = 0, bwd_flops = 0, io_bytes = 0, act_bytes = 0, param_bytes = 0, kernels = 0;
  double in_bytes = 0, out_bytes = 0;
};

StageCost CostOfBlocks(const CostGraph& g, const std::vector<std::vector<int>>& consumers,
                       const std::vector<int>& blocks) {
  std::vector<char> in(g.size(), 0);
  for (int v : blocks) in[v] = 1;
  StageCost s;
  std::set<int> producers;
  for (int v : blocks) {
    const CostNode& c = g.nodes[v];
    AddCosts(s, c);
    for (int u : c.inputs)
      if (!in[u]) producers.insert(u);
    bool leaves = false;
    for (int w : consumers[v]) leaves = leaves || !in[w];
    if (leaves) s.out_bytes += c.out_bytes;
  }
  for (int u : producers) s.in_bytes += g.nodes[u].out_bytes;
  return s;
}

struct StageTiming {
  double fwd = 0, bwd = 0, comm = 0, allreduce = 0, tps = 0;
};

StageTiming TimeStage(const StageCost& s, int b, int d, int mini_batch,
                      const cost::DeviceProfile& dev) {
  StageTiming t;
  const double n = std::ceil(static_cast<double>(b) / d);  // samples per replica
  t.fwd = cost::ComputeTime(dev, s.fwd_flops * n, s.param_bytes + s.io_bytes * n, s.kernels);
  t.bwd = cost::ComputeTime(dev, s.bwd_flops * n, 2 * s.param_bytes + 2 * s.io_bytes * n,
                            2 * s.kernels);
  t.comm = 2 * (cost::P2PTime(dev, s.in_bytes * n) + cost::P2PTime(dev, s.out_bytes * n));
  t.allreduce = cost::AllReduceTime(dev, s.param_bytes, d);
  t.tps = (t.fwd + t.bwd + t.comm) / b + t.allreduce / mini_batch;
  return t;
}

double StageMemory(const StageCost& s, int b, int d, int64_t in_flight, double state_factor) {
  const double n = std::ceil(static_cast<double>(b) / d);
  return state_factor * s.param_bytes + s.act_bytes * static_cast<double>(in_flight) * n / b;
}

int64_t InFlightFrom(const Config& c, const Signature& sig) {
  if (sig.empty()) return static_cast<int64_t>(c.k) * c.b;  // a sink stage
  int64_t i = 0;
  for (const auto& e : sig)
    i = std::max(i,
                 ComputeInFlight(c.k, c.b, static_cast<int>(e[1]), static_cast<int>(e[0]), e[2]));
  return i;
}

struct Choice {
  enum class Kind { kNone, kBase, kChild, kSeries, kParallel };
  Kind kind = Kind::kNone;
  int config = -1;  // base: the stage's config
  int r1 = -1, r2 = -1;
  int cm = -1;  // series: the upstream config r2's plan was chosen for
  // Child ranges of r1 and r2 relative to the piece's first child (results are shared by
  // identical pieces at other positions, so absolute indices would be wrong).
  int r1_first = 0, r1_last = 0, r2_first = 0, r2_last = 0;
};

// (absorbed join block, interned signature of the stage that holds it), sorted by block.
using Joins = std::vector<std::pair<int, int>>;

Joins MergeJoins(Joins a, const Joins& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

int FindJoin(const Joins& joins, int block) {
  for (const auto& [j, sig] : joins)
    if (j == block) return sig;
  return -1;
}

struct Result {
  int t = -1, l = 0, r = 0, d = 0;
  std::vector<int64_t> value;  // per upstream config (last index: no upstream)
  std::vector<int> sig;        // interned signature of the chosen plan, per upstream config
  std::vector<Joins> joins;    // where the chosen plan put each absorbed join
  std::vector<Choice> choice;
};

struct Key {
  int t, l, r, d, sig;
  bool operator==(const Key& o) const {
    return t == o.t && l == o.l && r == o.r && d == o.d && sig == o.sig;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = static_cast<uint64_t>(k.t);
    for (int x : {k.l, k.r, k.d, k.sig}) h = h * 1000003u ^ static_cast<uint64_t>(x);
    return static_cast<size_t>(h);
  }
};

class Search {
 public:
  Search(const CostGraph& g, const SpTree& tree, const PartitionOptions& o,
         std::vector<Config> configs, double memory_limit)
      : g_(g),
        tree_(tree),
        o_(o),
        configs_(std::move(configs)),
        memory_limit_(memory_limit),
        consumers_(g.Consumers()),
        is_join_(g.size(), 0) {
    Intern({});
    for (const auto& node : tree.nodes)
      if (node.join >= 0) is_join_[node.join] = 1;
    // Outside SP regions edges are arbitrary: keep pieces apart by block identity there.
    linearised_ = tree.linearised_regions > 0;
  }

  void Reset(double tmax) {
    tmax_ = tmax;
    memo_.clear();
    results_.clear();
    useful_.clear();
  }
  int64_t states() const { return static_cast<int64_t>(results_.size()); }
  int dummy() const { return static_cast<int>(configs_.size()); }
  const Result& result(int id) const { return results_[id]; }

  int Solve(int t, int l, int r, int d, int sig) {
    const Key key{PieceId(t, l, r), 0, 0, d, sig};
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const int nconf = static_cast<int>(configs_.size()) + 1;
    Result res;
    res.t = t, res.l = l, res.r = r, res.d = d;
    res.value.assign(nconf, kInf);
    res.sig.assign(nconf, 0);
    res.joins.assign(nconf, Joins{});
    res.choice.assign(nconf, Choice{});
    const SpTree::Node& node = tree_.nodes[t];
    const StageCost& sc = Cost(t, l, r);
    // Lower bounds that hold for any plan of this piece on d devices: the slowest stage is at
    // least the average FLOP time, and some device holds at least the average model state.
    if ((sc.fwd_flops + sc.bwd_flops) / (o_.device.peak_flops * d) > tmax_ ||
        o_.state_bytes_per_param_byte * sc.param_bytes / d > memory_limit_) {
      results_.push_back(std::move(res));
      return memo_[key] = static_cast<int>(results_.size()) - 1;
    }

    // Base case: the piece is one stage over all d devices.
    for (int ci = 0; ci < static_cast<int>(configs_.size()); ++ci) {
      const Config& c = configs_[ci];
      if (c.b < d) continue;
      const StageTiming tm = TimeStage(sc, c.b, d, o_.mini_batch, o_.device);
      if (tm.tps > tmax_) continue;
      // A stage never holds more than the mini-batch.
      const int64_t ix = std::min<int64_t>(InFlightFrom(c, signatures_[sig]), o_.mini_batch);
      if (StageMemory(sc, c.b, d, ix, o_.state_bytes_per_param_byte) > memory_limit_) continue;
      const int own = Intern({{c.b, c.k, ix}});
      Joins joins;
      for (int j : JoinsIn(t, l, r)) joins.push_back({j, own});
      for (int cu = 0; cu < nconf; ++cu) {
        const int64_t v =
            cu == dummy() ? ix : ComputeInFlight(configs_[cu].k, configs_[cu].b, c.k, c.b, ix);
        if (v < res.value[cu]) {
          res.value[cu] = v;
          res.sig[cu] = own;
          res.joins[cu] = joins;
          res.choice[cu] = Choice{Choice::Kind::kBase, ci, -1, -1, -1, 0, 0, 0, 0};
        }
      }
    }
    if (node.kind != SpTree::Kind::kLeaf && l == r) {
      const int child = node.children[l];
      if (tree_.nodes[child].kind != SpTree::Kind::kLeaf) {
        const int rc =
            Solve(child, 0, static_cast<int>(tree_.nodes[child].children.size()) - 1, d, sig);
        for (int cu = 0; cu < nconf; ++cu) {
          if (results_[rc].value[cu] < res.value[cu]) {
            res.value[cu] = results_[rc].value[cu];
            res.sig[cu] = results_[rc].sig[cu];
            res.joins[cu] = results_[rc].joins[cu];
            res.choice[cu] = Choice{Choice::Kind::kChild, -1, rc, -1, -1, 0, 0, 0, 0};
          }
        }
      }
    } else if (node.kind == SpTree::Kind::kSeries) {
      for (int m = l; m < r; ++m) {
        const int head_min = MinDevices(t, l, m), tail_min = MinDevices(t, m + 1, r);
        for (int d2 = tail_min; d2 <= d - head_min; ++d2) {
          const int r2 = Solve(t, m + 1, r, d2, sig);
          for (int cm : UsefulTailConfigs(r2)) {
            const int s2 = results_[r2].sig[cm];
            const int r1 = Solve(t, l, m, d - d2, s2);
            for (int cu = 0; cu < nconf; ++cu) {
              if (results_[r1].value[cu] < res.value[cu]) {
                res.value[cu] = results_[r1].value[cu];
                res.sig[cu] = results_[r1].sig[cu];
                res.joins[cu] = MergeJoins(results_[r1].joins[cu], results_[r2].joins[cm]);
                res.choice[cu] =
                    Choice{Choice::Kind::kSeries, -1, r1, r2, cm, 0, m - l, m + 1 - l, r - l};
              }
            }
          }
        }
      }
    } else if (node.kind == SpTree::Kind::kParallel) {
      const int jc = node.join >= 0 ? JoinChild(t) : -1;
      const bool has_join = jc >= l && jc <= r;
      for (int m = l; m < r; ++m) {
        // With an absorbed join, the half holding it (A) is solved first and the other half (B)
        // feeds the stage that holds the join; otherwise both halves feed the downstream.
        const bool join_left = has_join && jc <= m;
        const int al = join_left || !has_join ? l : m + 1, ar = join_left || !has_join ? m : r;
        const int bl = join_left || !has_join ? m + 1 : l, br = join_left || !has_join ? r : m;
        const int a_min = MinDevices(t, al, ar), b_min = MinDevices(t, bl, br);
        for (int da = a_min; da <= d - b_min; ++da) {
          const int ra = Solve(t, al, ar, da, sig);
          std::map<int, int> rb_for_sig;  // B's downstream signature -> B's result
          for (int cu = 0; cu < nconf; ++cu) {
            if (results_[ra].value[cu] >= kInf) continue;
            int bsig = sig;
            if (has_join) {
              bsig = FindJoin(results_[ra].joins[cu], node.join);
              if (bsig < 0) throw std::logic_error("pipeline partitioner lost an absorbed join");
            }
            auto it = rb_for_sig.find(bsig);
            const int rb = it != rb_for_sig.end()
                               ? it->second
                               : (rb_for_sig[bsig] = Solve(t, bl, br, d - da, bsig));
            const int64_t v = std::max(results_[ra].value[cu], results_[rb].value[cu]);
            if (v < res.value[cu]) {
              res.value[cu] = v;
              res.sig[cu] = Union(results_[ra].sig[cu], results_[rb].sig[cu]);
              res.joins[cu] = MergeJoins(results_[ra].joins[cu], results_[rb].joins[cu]);
              res.choice[cu] =
                  Choice{Choice::Kind::kParallel, -1, ra, rb, -1, al - l, ar - l, bl - l, br - l};
            }
          }
        }
      }
    }
    results_.push_back(std::move(res));
    const int id = static_cast<int>(results_.size()) - 1;
    memo_[key] = id;
    return id;
  }

  // Stages of result `id` chosen for upstream config `cu`, placed on the actual piece
  // (t, l, r) (the result may have been computed for an identical piece elsewhere).
  void Emit(int id, int cu, int t, int l, int r, std::vector<Stage>& out) const {
    const Result& res = results_[id];
    const Choice& ch = res.choice[cu];
    switch (ch.kind) {
      case Choice::Kind::kBase: {
        Stage s;
        s.blocks = tree_.Blocks(t, l, r);
        std::sort(s.blocks.begin(), s.blocks.end());
        s.micro_batch = configs_[ch.config].b;
        s.k = configs_[ch.config].k;
        s.replicas = res.d;
        out.push_back(std::move(s));
        return;
      }
      case Choice::Kind::kChild: {
        const int child = tree_.nodes[t].children[l];
        Emit(ch.r1, cu, child, 0, static_cast<int>(tree_.nodes[child].children.size()) - 1, out);
        return;
      }
      case Choice::Kind::kSeries:
        Emit(ch.r1, cu, t, l + ch.r1_first, l + ch.r1_last, out);
        Emit(ch.r2, ch.cm, t, l + ch.r2_first, l + ch.r2_last, out);
        return;
      case Choice::Kind::kParallel:
        Emit(ch.r1, cu, t, l + ch.r1_first, l + ch.r1_last, out);
        Emit(ch.r2, cu, t, l + ch.r2_first, l + ch.r2_last, out);
        return;
      case Choice::Kind::kNone:
        throw std::logic_error("pipeline partitioner: emitting an infeasible plan");
    }
  }

 private:
  int Intern(Signature s) {
    std::sort(s.begin(), s.end());
    Signature dedup;
    for (const auto& e : s) {
      if (!dedup.empty() && dedup.back()[0] == e[0] && dedup.back()[1] == e[1]) {
        dedup.back()[2] = std::max(dedup.back()[2], e[2]);
      } else {
        dedup.push_back(e);
      }
    }
    auto it = sig_ids_.find(dedup);
    if (it != sig_ids_.end()) return it->second;
    signatures_.push_back(dedup);
    return sig_ids_[dedup] = static_cast<int>(signatures_.size()) - 1;
  }
  int Union(int a, int b) {
    Signature s = signatures_[a];
    s.insert(s.end(), signatures_[b].begin(), signatures_[b].end());
    return Intern(std::move(s));
  }
  // Identical pieces (same shape of subtree, same costs, same boundary traffic) share DP
  // results: the repeated branches and layers of real models are solved once.
  int CanonId(int t) {
    auto it = canon_.find(t);
    if (it != canon_.end()) return it->second;
    const auto& node = tree_.nodes[t];
    std::ostringstream key;
    key.precision(17);
    key << static_cast<int>(node.kind) << "|" << node.join << "|";
    if (node.kind == SpTree::Kind::kLeaf) {
      const CostNode& c = g_.nodes[node.block];
      key << c.fwd_flops << "," << c.bwd_flops << "," << c.io_bytes << "," << c.act_bytes << ","
          << c.out_bytes << "," << c.param_bytes << "," << c.kernels << "," << c.inputs.size();
      if (is_join_[node.block] || linearised_) key << ",b" << node.block;
    } else {
      for (int c : node.children) key << CanonId(c) << ",";
    }
    return canon_[t] = Intern(canon_ids_, key.str());
  }
  int PieceId(int t, int l, int r) {
    const Key pk{t, l, r, 0, 0};
    auto it = piece_.find(pk);
    if (it != piece_.end()) return it->second;
    const auto& node = tree_.nodes[t];
    std::ostringstream key;
    key.precision(17);
    key << static_cast<int>(node.kind) << "|" << node.join << "|";
    if (node.kind == SpTree::Kind::kLeaf) {
      key << CanonId(t);
    } else {
      for (int i = l; i <= r; ++i) key << CanonId(node.children[i]) << ",";
      // Where the absorbed join sits relative to the range decides the parallel case.
      if (node.join >= 0) key << "j" << JoinChild(t) - l;
    }
    const StageCost& sc = Cost(t, l, r);
    key << "|" << sc.in_bytes << "," << sc.out_bytes;
    return piece_[pk] = Intern(piece_ids_, key.str());
  }
  static int Intern(std::unordered_map<std::string, int>& ids, const std::string& key) {
    auto it = ids.find(key);
    if (it != ids.end()) return it->second;
    const int id = static_cast<int>(ids.size());
    ids.emplace(key, id);
    return id;
  }

  // Fewest devices on which the piece can meet the TPS target and the memory limit (the same
  // lower bounds Solve checks first), so device splits below it are never tried.
  int MinDevices(int t, int l, int r) {
    const StageCost& sc = Cost(t, l, r);
    const double by_time = (sc.fwd_flops + sc.bwd_flops) / (o_.device.peak_flops * tmax_);
    const double by_memory = o_.state_bytes_per_param_byte * sc.param_bytes / memory_limit_;
    const double need = std::max({1.0, std::ceil(by_time - 1e-9), std::ceil(by_memory - 1e-9)});
    return need > 1e6 ? 1000000 : static_cast<int>(need);
  }

  // In-flight samples each config would hold upstream of a plan with signature `sig`.
  const std::vector<int64_t>& Demand(int sig) {
    // Sized for every signature interned so far, so a second call never moves the vector
    // under a reference the caller still holds.
    if (demand_.size() < signatures_.size()) demand_.resize(signatures_.size());
    auto& dem = demand_[sig];
    if (dem.empty()) {
      dem.resize(configs_.size());
      for (size_t c = 0; c < configs_.size(); ++c)
        dem[c] = std::min<int64_t>(InFlightFrom(configs_[c], signatures_[sig]), o_.mini_batch);
    }
    return dem;
  }
  // The head of a series split only sees the tail through its demand; a tail plan whose
  // demand is nowhere lower than another's (with the same join placement) cannot help.
  const std::vector<int>& UsefulTailConfigs(int r2) {
    auto it = useful_.find(r2);
    if (it != useful_.end()) return it->second;
    std::vector<int> kept;
    const int nconf = static_cast<int>(configs_.size());
    for (int cm = 0; cm < nconf; ++cm) {
      if (results_[r2].value[cm] >= kInf) continue;
      const int s2 = results_[r2].sig[cm];
      bool dominated = false;
      for (int& other : kept) {
        if (other < 0 || results_[r2].joins[other] != results_[r2].joins[cm]) continue;
        const int so = results_[r2].sig[other];
        if (so == s2) {
          dominated = true;
          break;
        }
        const auto& a = Demand(so);
        const auto& b = Demand(s2);
        bool le = true, ge = true;
        for (int c = 0; c < nconf; ++c) le &= a[c] <= b[c], ge &= a[c] >= b[c];
        if (le) {
          dominated = true;
          break;
        }
        if (ge) other = -1;
      }
      kept.erase(std::remove(kept.begin(), kept.end(), -1), kept.end());
      if (!dominated) kept.push_back(cm);
    }
    return useful_[r2] = kept;
  }

  const std::vector<int>& JoinsIn(int t, int l, int r) {
    const Key key{t, l, r, 0, 0};
    auto it = joins_in_.find(key);
    if (it != joins_in_.end()) return it->second;
    std::vector<int> js;
    for (int b : tree_.Blocks(t, l, r))
      if (is_join_[b]) js.push_back(b);
    std::sort(js.begin(), js.end());
    return joins_in_[key] = js;
  }
  int JoinChild(int t) {
    auto it = join_child_.find(t);
    if (it != join_child_.end()) return it->second;
    const auto& node = tree_.nodes[t];
    int found = -1;
    for (size_t c = 0; c < node.children.size() && found < 0; ++c) {
      const auto blocks = tree_.Blocks(node.children[c]);
      if (std::find(blocks.begin(), blocks.end(), node.join) != blocks.end())
        found = static_cast<int>(c);
    }
    return join_child_[t] = found;
  }
  const StageCost& Cost(int t, int l, int r) {
    const Key key{t, l, r, 0, 0};
    auto it = costs_.find(key);
    if (it != costs_.end()) return it->second;
    return costs_[key] = CostOfBlocks(g_, consumers_, tree_.Blocks(t, l, r));
  }

  const CostGraph& g_;
  const SpTree& tree_;
  const PartitionOptions& o_;
  std::vector<Config> configs_;
  double memory_limit_;
  std::vector<std::vector<int>> consumers_;
  double tmax_ = 0;
  std::unordered_map<Key, int, KeyHash> memo_;
  std::vector<Result> results_;
  std::unordered_map<Key, StageCost, KeyHash> costs_;
  std::unordered_map<Key, std::vector<int>, KeyHash> joins_in_;
  std::unordered_map<int, int> join_child_;
  std::unordered_map<int, int> canon_;
  std::unordered_map<Key, int, KeyHash> piece_;
  std::unordered_map<std::string, int> canon_ids_, piece_ids_;
  bool linearised_ = false;
  std::vector<std::vector<int64_t>> demand_;
  std::unordered_map<int, std::vector<int>> useful_;
  std::vector<char> is_join_;
  std::vector<Signature> signatures_;
  std::map<Signature, int> sig_ids_;
};

std::string GiB(double bytes) {
  std::ostringstream os;
  os.precision(3);
  os << bytes / (1024.0 * 1024 * 1024) << " GiB";
  return os.str();
}

struct Found {
  bool ok = false;
  double tps = 0;
  std::vector<Stage> stages;
};

}  // namespace

int64_t ComputeInFlight(int kx, int bx, int ky, int by, int64_t iy) {
  const int64_t X = static_cast<int64_t>(kx) * bx, Y = static_cast<int64_t>(ky) * by;
  const int64_t M = std::max(bx, by);
  if (X < Y) {
    if (X < by) return iy + by;  // b_x <= k_x b_x < b_y <= k_y b_y
    return X == M ? iy + M : iy + 2 * M;
  }
  if (X == Y) return Y == M ? iy + Y : iy + 2 * M;
  // X > Y
  if (Y < bx) return iy + X - Y + bx;  // b_y <= k_y b_y < b_x <= k_x b_x
  if (bx <= by) return Y == by ? iy + X : iy + X - Y + 2 * by;
  return Y == bx ? iy + X : iy + X - Y + 2 * bx;
}

std::vector<std::vector<int>> StageGraph::Successors() const {
  std::vector<std::vector<int>> s(stages.size());
  for (const auto& e : edges) s[e.from].push_back(e.to);
  return s;
}

std::vector<std::vector<int>> StageGraph::Predecessors() const {
  std::vector<std::vector<int>> p(stages.size());
  for (const auto& e : edges) p[e.to].push_back(e.from);
  return p;
}

int StageGraph::Depth() const {
  std::vector<int> depth(stages.size(), 1);
  const auto preds = Predecessors();
  int best = stages.empty() ? 0 : 1;
  for (size_t s = 0; s < stages.size(); ++s) {
    for (int p : preds[s]) depth[s] = std::max(depth[s], depth[p] + 1);
    best = std::max(best, depth[s]);
  }
  return best;
}

std::string StageGraph::ToString(const CostGraph& graph) const {
  std::ostringstream os;
  os << kind << ": " << stages.size() << " stages on " << num_devices << " devices, depth "
     << Depth() << ", bottleneck " << bottleneck_tps * 1e6 << " us/sample, peak memory "
     << GiB(max_memory_bytes) << "\n";
  const auto succ = Successors();
  for (const auto& s : stages) {
    os << "  S" << s.id << " b=" << s.micro_batch << " k=" << s.k << " d=" << s.replicas
       << " inflight=" << s.in_flight << " tps=" << s.tps * 1e6 << "us mem=" << GiB(s.memory_bytes)
       << " [";
    for (size_t i = 0; i < s.blocks.size(); ++i)
      os << (i ? ", " : "") << graph.nodes[s.blocks[i]].name;
    os << "] ->";
    for (int t : succ[s.id]) os << " S" << t;
    os << "\n";
  }
  return os.str();
}

void EvaluateStageGraph(const CostGraph& graph, const PartitionOptions& o, StageGraph& sg) {
  const auto consumers = graph.Consumers();
  const auto succ = sg.Successors();
  sg.bottleneck_tps = 0;
  sg.max_memory_bytes = 0;
  for (int s = static_cast<int>(sg.stages.size()) - 1; s >= 0; --s) {
    Stage& st = sg.stages[s];
    const StageCost sc = CostOfBlocks(graph, consumers, st.blocks);
    const StageTiming tm = TimeStage(sc, st.micro_batch, st.replicas, o.mini_batch, o.device);
    st.fwd_time = tm.fwd;
    st.bwd_time = tm.bwd;
    st.comm_time = tm.comm;
    st.allreduce_time = tm.allreduce;
    st.tps = tm.tps;
    st.in_flight = succ[s].empty() ? static_cast<int64_t>(st.k) * st.micro_batch : 0;
    for (int t : succ[s]) {
      const Stage& y = sg.stages[t];
      st.in_flight = std::max(
          st.in_flight, ComputeInFlight(st.k, st.micro_batch, y.k, y.micro_batch, y.in_flight));
    }
    st.in_flight = std::min<int64_t>(st.in_flight, o.mini_batch);
    st.memory_bytes =
        StageMemory(sc, st.micro_batch, st.replicas, st.in_flight, o.state_bytes_per_param_byte);
    sg.bottleneck_tps = std::max(sg.bottleneck_tps, st.tps);
    sg.max_memory_bytes = std::max(sg.max_memory_bytes, st.memory_bytes);
  }
}

StageGraph BuildStageGraph(const CostGraph& graph, const PartitionOptions& o,
                           std::vector<Stage> stages) {
  StageGraph sg;
  sg.kind = o.sequential ? "spp" : "gpp";
  sg.mini_batch = o.mini_batch;
  sg.num_devices = o.num_devices;
  sg.stages = std::move(stages);
  // Topological order of stages (a stage holding a join comes after every branch it joins),
  // lowest first block first among ready stages.
  {
    const int n = static_cast<int>(sg.stages.size());
    std::vector<int> owner(graph.size(), -1);
    for (int i = 0; i < n; ++i)
      for (int v : sg.stages[i].blocks) {
        if (v < 0 || v >= graph.size() || owner[v] != -1)
          throw std::invalid_argument("stage blocks must partition the graph (block " +
                                      std::to_string(v) + ")");
        owner[v] = i;
      }
    for (int v = 0; v < graph.size(); ++v)
      if (owner[v] < 0)
        throw std::invalid_argument("block '" + graph.nodes[v].name + "' is in no stage");
    std::vector<std::set<int>> succ(n);
    std::vector<int> indegree(n, 0);
    for (int v = 0; v < graph.size(); ++v)
      for (int u : graph.nodes[v].inputs)
        if (owner[u] != owner[v] && succ[owner[u]].insert(owner[v]).second) ++indegree[owner[v]];
    std::set<std::pair<int, int>> ready;
    for (int i = 0; i < n; ++i)
      if (indegree[i] == 0) ready.insert({sg.stages[i].blocks.front(), i});
    std::vector<Stage> ordered;
    while (!ready.empty()) {
      const int i = ready.begin()->second;
      ready.erase(ready.begin());
      ordered.push_back(sg.stages[i]);
      for (int j : succ[i])
        if (--indegree[j] == 0) ready.insert({sg.stages[j].blocks.front(), j});
    }
    if (static_cast<int>(ordered.size()) != n)
      throw std::invalid_argument("stages depend on each other in a cycle (a stage is not convex)");
    sg.stages = std::move(ordered);
  }
  std::vector<int> stage_of(graph.size(), -1);
  int device = 0;
  for (size_t i = 0; i < sg.stages.size(); ++i) {
    Stage& s = sg.stages[i];
    s.id = static_cast<int>(i);
    for (int v : s.blocks) stage_of[v] = s.id;
    s.devices.clear();
    for (int r = 0; r < s.replicas; ++r) s.devices.push_back(device++);
  }
  std::map<std::pair<int, int>, double> bytes;
  std::set<std::pair<int, int>> seen_producer;  // (block, consumer stage)
  for (int v = 0; v < graph.size(); ++v) {
    for (int u : graph.nodes[v].inputs) {
      const int a = stage_of[u], b = stage_of[v];
      if (a == b) continue;
      if (seen_producer.insert({u, b}).second) bytes[{a, b}] += graph.nodes[u].out_bytes;
    }
  }
  for (const auto& [ab, by] : bytes) sg.edges.push_back({ab.first, ab.second, by, true});
  if (o.sequential) {
    for (size_t i = 0; i + 1 < sg.stages.size(); ++i) {
      if (!bytes.count({static_cast<int>(i), static_cast<int>(i) + 1}))
        sg.edges.push_back({static_cast<int>(i), static_cast<int>(i) + 1, 0, false});
    }
  }
  std::sort(sg.edges.begin(), sg.edges.end(), [](const StageEdge& a, const StageEdge& b) {
    return std::make_pair(a.from, a.to) < std::make_pair(b.from, b.to);
  });
  EvaluateStageGraph(graph, o, sg);
  return sg;
}

StageGraph PartitionPipeline(const CostGraph& graph, const PartitionOptions& o,
                             PartitionStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  graph.Validate();
  if (graph.size() == 0) throw std::invalid_argument("pipeline partitioner: empty graph");
  if (o.mini_batch <= 0)
    throw std::invalid_argument("pipeline partitioner: mini_batch must be > 0");
  if (o.num_devices <= 0)
    throw std::invalid_argument("pipeline partitioner: num_devices must be > 0");
  if (o.device.peak_flops <= 0)
    throw std::invalid_argument("pipeline partitioner: device profile is not set");
  std::vector<int> sizes = o.micro_batch_sizes;
  if (sizes.empty())
    for (int b = 1; b <= o.mini_batch; b *= 2)
      if (o.mini_batch % b == 0) sizes.push_back(b);
  for (int b : sizes)
    if (b <= 0 || o.mini_batch % b != 0)
      throw std::invalid_argument("micro-batch size " + std::to_string(b) +
                                  " does not divide the mini-batch " +
                                  std::to_string(o.mini_batch));
  const double memory_limit = o.memory_limit > 0 ? o.memory_limit : o.device.memory_bytes;
  std::vector<SpTree> trees;
  if (o.sequential) {
    trees.push_back(LinearChain(graph));
  } else {
    trees.push_back(DecomposeSeriesParallel(graph, o.absorb_joins));
    // The join on the lightest branch is a different search space; try it when it differs.
    if (o.absorb_joins && trees[0].join_choice_matters)
      trees.push_back(DecomposeSeriesParallel(graph, true, /*lightest=*/true));
  }
  const auto deadline = o.time_limit_s > 0
                            ? t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(o.time_limit_s))
                            : std::chrono::steady_clock::time_point::max();

  // SPP uses one micro-batch size for every stage; GPP lets each stage pick its own.
  std::vector<std::vector<Config>> config_sets;
  auto configs_for = [&](const std::vector<int>& bs) {
    std::vector<Config> cs;
    for (int b : bs)
      for (int k : o.k_values)
        if (k >= 1 && static_cast<int64_t>(k) * b <= o.mini_batch) cs.push_back({b, k});
    return cs;
  };
  if (o.sequential) {
    for (int b : sizes) config_sets.push_back(configs_for({b}));
    // Larger micro-batches first: under a time limit the likelier winners are searched.
    std::reverse(config_sets.begin(), config_sets.end());
  } else {
    config_sets.push_back(configs_for(sizes));
  }

  PartitionStats st;
  st.blocks = graph.size();
  st.linearised_regions = trees[0].linearised_regions;
  st.sp_tree = trees[0].ToString();
  Found best;
  for (const SpTree& tree : trees) {
    const int root_last = tree.nodes[tree.root].kind == SpTree::Kind::kLeaf
                              ? 0
                              : static_cast<int>(tree.nodes[tree.root].children.size()) - 1;
    for (const auto& configs : config_sets) {
      Search search(graph, tree, o, configs, memory_limit);
      auto feasible = [&](double tmax, Found* out) {
        search.Reset(tmax);
        const int r = search.Solve(tree.root, 0, root_last, o.num_devices, 0);
        st.dp_states += search.states();
        ++st.iterations;
        if (search.result(r).value[search.dummy()] >= kInf) return false;
        if (out) {
          out->ok = true;
          out->tps = tmax;
          out->stages.clear();
          search.Emit(r, search.dummy(), tree.root, 0, root_last, out->stages);
        }
        return true;
      };
      // The bottleneck TPS a plan actually has (stage times do not depend on the edges).
      auto actual_tps = [&](const std::vector<Stage>& stages) {
        StageGraph probe;
        probe.mini_batch = o.mini_batch;
        probe.stages = stages;
        for (size_t i = 0; i < probe.stages.size(); ++i) probe.stages[i].id = static_cast<int>(i);
        EvaluateStageGraph(graph, o, probe);
        return probe.bottleneck_tps;
      };
      Found local;
      if (!feasible(std::numeric_limits<double>::infinity(), &local)) continue;
      local.tps = actual_tps(local.stages);
      // No plan beats the whole model's FLOP time spread over every device.
      double total_flops = 0;
      for (const auto& node : graph.nodes) total_flops += node.fwd_flops + node.bwd_flops;
      double lo = total_flops / (o.device.peak_flops * o.num_devices), hi = local.tps;
      for (int it = 0; it < o.max_iterations && hi - lo > o.epsilon * hi; ++it) {
        if (std::chrono::steady_clock::now() >= deadline) {
          st.timed_out = true;
          break;
        }
        const double mid = 0.5 * (lo + hi);
        Found f;
        if (feasible(mid, &f)) {
          // The plan found often beats the target: its own bottleneck is the new upper bound.
          hi = std::min(mid, actual_tps(f.stages));
          local = std::move(f);
        } else {
          lo = mid;
        }
      }
      local.tps = hi;
      if (!best.ok || local.tps < best.tps) best = std::move(local);
    }
  }
  if (!best.ok) {
    const bool unbounded = memory_limit >= std::numeric_limits<double>::max();
    // Without a memory limit the only obstacle is the device count: every stage needs a
    // device and every replica a sample of each micro-batch.
    const std::string too_many = "no pipeline plan uses exactly " + std::to_string(o.num_devices) +
                                 " devices for " + std::to_string(graph.size()) +
                                 " blocks and a mini-batch of " + std::to_string(o.mini_batch) +
                                 " (each stage needs a device, each replica a sample). " +
                                 "Use fewer devices or a larger mini-batch.";
    if (unbounded) throw PartitionError(too_many, -1);
    // Find how much memory a plan would need, to say so (once: the retry is unbounded).
    PartitionOptions relaxed = o;
    relaxed.memory_limit = std::numeric_limits<double>::max();
    relaxed.max_iterations = 0;
    double need = -1;
    try {
      need = PartitionPipeline(graph, relaxed, nullptr).max_memory_bytes;
    } catch (const PartitionError&) {
      throw PartitionError(too_many, -1);
    }
    throw PartitionError("no pipeline plan fits " + std::to_string(o.num_devices) +
                             " devices with " + GiB(memory_limit) +
                             " each; the leanest plan found needs " + GiB(need) +
                             " per device. Add devices, raise the memory limit, or lower the "
                             "mini-batch size.",
                         need);
  }

  StageGraph sg = BuildStageGraph(graph, o, std::move(best.stages));
  if (!o.sequential && o.absorb_joins && sg.max_memory_bytes > memory_limit) {
    // Safety net: the DP's in-flight figures are exact or conservative, so this should not
    // happen; if the evaluated plan still exceeds memory, search the strict SP tree instead.
    PartitionOptions strict = o;
    strict.absorb_joins = false;
    PartitionStats strict_stats;
    sg = PartitionPipeline(graph, strict, &strict_stats);
    st.iterations += strict_stats.iterations;
    st.dp_states += strict_stats.dp_states;
  }
  st.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats) *stats = st;
  return sg;
}

}  // namespace tp::pipeline
