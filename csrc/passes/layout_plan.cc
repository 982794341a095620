#include "passes/layout_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "sim/interleaved_pipeline.h"

namespace tp::passes {
namespace {

using cost::CollectiveKind;
using cost::CollectiveTime;

constexpr double kAct = 2;  // bf16 activations and weights

// Rank-order strides of the four mesh dimensions ("tp-cp-pp-dp": tp innermost).
struct Strides {
  int tp = 1, cp = 1, pp = 1, dp = 1;
};

Strides StridesOf(const TrainingLayout& l) {
  std::array<std::string, 4> names;
  std::stringstream ss(l.order);
  std::string part;
  int n = 0;
  while (std::getline(ss, part, '-')) {
    if (n == 4) break;
    names[n++] = part;
  }
  std::array<std::string, 4> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  if (n != 4 || sorted != std::array<std::string, 4>{"cp", "dp", "pp", "tp"})
    throw std::invalid_argument("TrainingLayout.order '" + l.order +
                                "': give tp, cp, pp and dp once each, innermost first "
                                "(e.g. tp-cp-pp-dp)");
  Strides s;
  int stride = 1;
  for (const auto& name : names) {
    const int size = name == "tp" ? l.tp : name == "cp" ? l.cp : name == "pp" ? l.pp : l.dp;
    (name == "tp" ? s.tp : name == "cp" ? s.cp : name == "pp" ? s.pp : s.dp) = stride;
    stride *= size;
  }
  return s;
}

// One GEMM of m x k by k x n on the roofline (bf16 operands), its 128 x 256 output tiles run in
// waves of one tile per SM: a last, partial wave costs a full one (wave quantization, NVIDIA's
// "Matrix Multiplication Background" guide), which is why split weights and small models reach
// a lower share of peak.
double GemmTime(const cost::ClusterProfile& c, double m, double n, double k) {
  const double flops = 2 * m * n * k;
  const double bytes = kAct * (m * k + k * n + m * n);
  double waves_used = 1.0;
  if (c.sms > 0) {
    const double tiles = std::ceil(m / 128) * std::ceil(n / 256);
    waves_used = tiles / (std::ceil(tiles / c.sms) * c.sms);
  }
  return std::max(flops / (c.peak_flops * c.gemm_efficiency * c.sustained * waves_used),
                  bytes / c.mem_bandwidth);
}

// One decoder layer on one device for one micro-batch: forward and backward seconds (backward
// without recomputation) and the bytes it keeps for its backward.
struct LayerCost {
  double fwd = 0, bwd = 0, act_bytes = 0, input_bytes = 0, selective_bytes = 0, elem_fwd = 0;
  double tp_comm_fwd = 0, tp_comm_bwd = 0, cp_comm_fwd = 0, cp_comm_bwd = 0;
  double gemm_fwd = 0;
};

LayerCost CostLayer(const TransformerSpec& m, const TrainingJob& job, const TrainingLayout& l,
                    const Strides& st, const cost::ClusterProfile& c) {
  const double b = l.micro_batch, s = static_cast<double>(job.seq_len);
  const double t = b * s / l.cp;  // tokens this device computes
  const double h = m.hidden, f = m.ffn, d = m.HeadDim();
  const double q = m.heads * d, kv = m.kv_heads * d, tp = l.tp;
  LayerCost lc;
  // GEMMs on this device's 1/tp of each weight.
  const double gemm = GemmTime(c, t, (q + 2 * kv) / tp, h) + GemmTime(c, t, h, q / tp) +
                      (m.gated_mlp ? 2 : 1) * GemmTime(c, t, f / tp, h) + GemmTime(c, t, h, f / tp);
  // Causal flash attention: each of the cp ranks computes 1/cp of the s^2/2 query-key pairs
  // (load-balanced chunks), on its heads.
  const double attn_flops = 4 * b * s * s / 2 * q / tp / l.cp;
  const double attn_fwd = attn_flops / (c.peak_flops * c.attention_efficiency * c.sustained);
  const double attn_bwd =
      2.5 * attn_flops / (c.peak_flops * c.attention_bwd_efficiency * c.sustained);
  // Elementwise traffic (norms, residual adds, rotary, the MLP activation), memory-bound; with
  // sequence parallelism the norms and residuals are split over tp as well.
  const double norm_share = l.sequence_parallel ? tp : 1.0;
  const double elem_bytes =
      kAct * t *
      ((2 * 2 * h + 2 * 3 * h) / norm_share + 2 * (q + kv) / tp + (m.gated_mlp ? 3 : 2) * f / tp);
  const double elem = elem_bytes / c.mem_bandwidth;
  lc.gemm_fwd = gemm;
  lc.elem_fwd = elem;
  lc.fwd = gemm + attn_fwd + elem;
  lc.bwd = 2 * gemm + attn_bwd + 2 * elem;
  // What the backward needs (flash attention keeps O and the row log-sum-exp, not the scores).
  lc.input_bytes = kAct * t * h / norm_share;
  const double mlp_acts = (m.gated_mlp ? 3 : 2) * f;  // gate, up, product; or fc1 out, GeLU out
  lc.act_bytes = kAct * t * ((4 * h) / norm_share + (q + 2 * kv) / tp + q / tp + mlp_acts / tp) +
                 4 * t * m.heads / tp;
  // Selective: the two norms' inputs (the layer input and the residual after attention), the
  // GEMM outputs (q, k, v; gate and up, or fc1) and attention's output; the norms' outputs and
  // the MLP activation's product are recomputed from them.
  const double gemm_outs = (m.gated_mlp ? 2 : 1) * f;
  lc.selective_bytes =
      kAct * t * ((2 * h) / norm_share + (q + 2 * kv) / tp + q / tp + gemm_outs / tp) +
      4 * t * m.heads / tp;
  // Tensor parallelism: two all-gathers and two reduce-scatters of the layer's [t, h] hidden
  // state with sequence parallelism (two all-reduces without), each way.
  const double hidden_bytes = kAct * t * h;
  const double tp_fwd =
      l.sequence_parallel
          ? 2 * (CollectiveTime(c, CollectiveKind::kAllGather, hidden_bytes, l.tp, st.tp) +
                 CollectiveTime(c, CollectiveKind::kReduceScatter, hidden_bytes, l.tp, st.tp))
          : 2 * CollectiveTime(c, CollectiveKind::kAllReduce, hidden_bytes, l.tp, st.tp);
  lc.tp_comm_fwd = l.tp_overlap ? std::max(0.0, tp_fwd - gemm) : tp_fwd;
  lc.tp_comm_bwd = l.tp_overlap ? std::max(0.0, tp_fwd - 2 * gemm) : tp_fwd;
  // Context parallelism: all-gather this device's heads of K and V over the cp ranks before
  // attention, reduce-scatter their gradients after its backward.
  const double kv_bytes = kAct * 2 * b * s * kv / tp;
  lc.cp_comm_fwd = CollectiveTime(c, CollectiveKind::kAllGather, kv_bytes, l.cp, st.cp);
  // The backward gathers K and V again (they are not kept) and reduce-scatters their gradients.
  lc.cp_comm_bwd =
      lc.cp_comm_fwd + CollectiveTime(c, CollectiveKind::kReduceScatter, kv_bytes, l.cp, st.cp);
  return lc;
}

void Require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("TrainingLayout: " + what);
}

std::string Gb(double bytes) {
  std::ostringstream os;
  os.precision(3);
  os << bytes / 1e9 << " GB";
  return os.str();
}

// The planner varies the ZeRO stage innermost, which leaves the pipeline unchanged: the last
// simulation is reused when the next pipeline is the same.
struct SimCache {
  sim::InterleavedPipeline pipe;
  sim::InterleavedResult result;
  bool valid = false;
};

bool SamePipeline(const sim::InterleavedPipeline& a, const sim::InterleavedPipeline& b) {
  return a.devices == b.devices && a.chunks == b.chunks && a.micro_batches == b.micro_batches &&
         a.send == b.send && a.fwd == b.fwd && a.bwd == b.bwd && a.act_bytes == b.act_bytes;
}

StepEstimate Estimate(const TransformerSpec& m, const TrainingJob& job, const TrainingLayout& l,
                      const cost::ClusterProfile& c, SimCache* cache);

}  // namespace

double TransformerSpec::LayerParams() const {
  const double h = hidden, d = HeadDim(), q = heads * d, kv = kv_heads * d;
  double p = h * (q + 2 * kv) + q * h + (gated_mlp ? 3 : 2) * h * ffn;
  p += biases ? (q + 2 * kv) + h + ffn + h + 2 * 2 * h : 2 * h;  // biases, norms
  return p;
}

double TransformerSpec::Params() const {
  const double emb = static_cast<double>(vocab) * hidden;
  return layers * LayerParams() + emb * (tied_embeddings ? 1 : 2) +
         static_cast<double>(positions) * hidden + (biases ? 2 : 1) * hidden;
}

double TransformerSpec::ForwardFlops(int64_t seq) const {
  const double h = hidden, d = HeadDim(), q = heads * d, kv = kv_heads * d, s = seq;
  const double per_token = 2 * (h * (q + 2 * kv) + q * h + (gated_mlp ? 3 : 2) * h * ffn);
  const double attention = 4 * s * s / 2 * q;  // causal: s^2 / 2 query-key pairs
  return layers * (s * per_token + attention) + 2 * s * h * vocab;
}

std::string TrainingLayout::ToString() const {
  std::ostringstream os;
  os << "tp" << tp << " cp" << cp << " pp" << pp << " dp" << dp;
  if (chunks > 1) os << " v" << chunks;
  os << " mb" << micro_batch << " zero" << zero
     << (recompute == "full"        ? " recompute"
         : recompute == "selective" ? " selective"
                                    : "")
     << (tp_overlap ? " async-tp" : "");
  return os.str();
}

StepEstimate EstimateTrainingStep(const TransformerSpec& m, const TrainingJob& job,
                                  const TrainingLayout& l, const cost::ClusterProfile& c) {
  return Estimate(m, job, l, c, nullptr);
}

namespace {

StepEstimate Estimate(const TransformerSpec& m, const TrainingJob& job, const TrainingLayout& l,
                      const cost::ClusterProfile& c, SimCache* cache) {
  Require(m.layers > 0 && m.hidden > 0 && m.heads > 0 && m.kv_heads > 0 && m.vocab > 0,
          "the model spec needs layers, hidden, heads, kv_heads and vocab");
  Require(l.tp >= 1 && l.cp >= 1 && l.pp >= 1 && l.dp >= 1 && l.chunks >= 1 && l.micro_batch >= 1,
          "every degree, chunks and micro_batch must be at least 1");
  Require(static_cast<int64_t>(l.tp) * l.cp * l.pp * l.dp == job.world,
          "tp x cp x pp x dp = " + std::to_string(l.tp * l.cp * l.pp * l.dp) +
              " is not the world size " + std::to_string(job.world));
  Require(m.heads % l.tp == 0, "tp " + std::to_string(l.tp) + " does not divide " +
                                   std::to_string(m.heads) + " attention heads");
  Require(m.kv_heads % l.tp == 0, "tp " + std::to_string(l.tp) + " does not divide " +
                                      std::to_string(m.kv_heads) +
                                      " key/value heads (Megatron splits whole query groups)");
  Require(
      !l.sequence_parallel || (job.seq_len / l.cp) % l.tp == 0,
      "sequence parallelism needs each cp rank's tokens to split over tp " + std::to_string(l.tp));
  Require(job.seq_len % (2 * l.cp) == 0 || l.cp == 1,
          "cp " + std::to_string(l.cp) + " needs the sequence length to split in 2 cp chunks");
  Require(job.global_batch % l.dp == 0, "dp " + std::to_string(l.dp) +
                                            " does not divide the global batch " +
                                            std::to_string(job.global_batch));
  const int64_t per_replica = job.global_batch / l.dp;
  Require(per_replica % l.micro_batch == 0, "micro_batch " + std::to_string(l.micro_batch) +
                                                " does not divide the replica's batch " +
                                                std::to_string(per_replica));
  const int mb = static_cast<int>(per_replica / l.micro_batch);
  const int stages = l.pp * l.chunks;
  Require(stages <= m.layers, "pp x chunks = " + std::to_string(stages) + " exceeds the " +
                                  std::to_string(m.layers) + " layers");
  Require(l.chunks == 1 || l.pp > 1, "interleaving (chunks > 1) needs a pipeline (pp > 1)");
  Require(l.chunks == 1 || mb % l.pp == 0, "interleaved 1F1B needs the micro-batch count (" +
                                               std::to_string(mb) + ") to be a multiple of pp " +
                                               std::to_string(l.pp));
  Require(l.zero >= 0 && l.zero <= 3, "zero must be 0, 1, 2 or 3");
  Require(l.recompute == "none" || l.recompute == "selective" || l.recompute == "full",
          "recompute '" + l.recompute + "': give none, selective or full");
  const Strides st = StridesOf(l);

  const LayerCost lc = CostLayer(m, job, l, st, c);
  // Layers per model stage: as even as possible, the remainder on the middle stages (the first
  // holds the embedding, the last the output layer and the loss).
  std::vector<int> layers(stages, static_cast<int>(m.layers / stages));
  int rest = static_cast<int>(m.layers % stages);
  for (int s = 1; s + 1 < stages && rest > 0; ++s, --rest) ++layers[s];
  for (int s : {0, stages - 1})
    if (rest > 0) ++layers[s], --rest;

  const double b = l.micro_batch, t = b * job.seq_len / l.cp, h = m.hidden, tp = l.tp;
  const double norm_share = l.sequence_parallel ? tp : 1.0;
  // The output layer and the loss (fp32 logits over this device's 1/tp of the vocabulary).
  const double head_fwd =
      GemmTime(c, t, m.vocab / tp, h) + 3 * 4 * t * m.vocab / tp / c.mem_bandwidth;
  const double head_bwd =
      2 * GemmTime(c, t, m.vocab / tp, h) + 2 * 4 * t * m.vocab / tp / c.mem_bandwidth;
  const double logits_bytes = (4 + 4) * t * m.vocab / tp;
  const double embed = 2 * kAct * t * h / c.mem_bandwidth;

  sim::InterleavedPipeline pipe;
  pipe.devices = l.pp;
  pipe.chunks = l.chunks;
  pipe.micro_batches = mb;
  // The slowest hop sets the pace: if any two consecutive stages sit in different nodes, every
  // send is priced across nodes.
  const bool crosses = st.pp >= c.devices_per_node || st.pp * l.pp > c.devices_per_node;
  pipe.send = cost::SendTime(c, kAct * t * h / norm_share, crosses ? c.devices_per_node : st.pp);
  const double layer_fwd = lc.fwd + lc.tp_comm_fwd + lc.cp_comm_fwd;
  const bool full = l.recompute == "full", selective = l.recompute == "selective";
  const double layer_bwd = lc.bwd + lc.tp_comm_bwd + lc.cp_comm_bwd +
                           (full ? lc.fwd + lc.tp_comm_fwd + lc.cp_comm_fwd : 0.0) +
                           (selective ? lc.elem_fwd : 0.0);
  const double layer_act = full ? lc.input_bytes : selective ? lc.selective_bytes : lc.act_bytes;
  for (int s = 0; s < stages; ++s) {
    pipe.fwd.push_back(layers[s] * layer_fwd + (s == 0 ? embed : 0) +
                       (s == stages - 1 ? head_fwd : 0));
    pipe.bwd.push_back(layers[s] * layer_bwd + (s == 0 ? embed : 0) +
                       (s == stages - 1 ? head_bwd : 0));
    pipe.act_bytes.push_back(layers[s] * layer_act);
  }
  if (cache && !(cache->valid && SamePipeline(cache->pipe, pipe))) {
    cache->pipe = pipe;
    cache->result = sim::SimulateInterleaved(pipe);
    cache->valid = true;
  }
  const sim::InterleavedResult sim = cache ? cache->result : sim::SimulateInterleaved(pipe);

  StepEstimate e;
  e.micro_batches = mb;
  e.pipeline_time = sim.time;
  e.bubble_fraction = sim.bubble_fraction;
  e.pp_send_time = l.pp > 1 ? pipe.send : 0.0;
  e.tp_comm_time = 0;
  e.cp_comm_time = 0;
  // Per device: parameters held, compute, and its data-parallel traffic.
  const double layer_params = m.LayerParams() / tp;
  const double vocab_params = static_cast<double>(m.vocab) * h / tp;
  double worst_state = 0, worst_memory = 0, worst_act = 0, dp_exposed = 0, optimizer = 0;
  // Ranks of one cp group hold the same weights: gradients are reduced, and ZeRO shards the
  // state, over dp x cp (Megatron's data_parallel_group_with_cp, torchtitan's dp_shard_cp).
  const double shard = static_cast<double>(l.dp) * l.cp;
  auto dp_collective = [&](CollectiveKind kind, double bytes) {
    // Over cp first on the whole tensor, then over dp on each cp rank's share (an all-reduce:
    // reduce-scatter and all-gather over cp around an all-reduce over dp).
    const double inner =
        kind == CollectiveKind::kAllReduce
            ? CollectiveTime(c, CollectiveKind::kReduceScatter, bytes, l.cp, st.cp) +
                  CollectiveTime(c, CollectiveKind::kAllGather, bytes, l.cp, st.cp)
            : CollectiveTime(c, kind, bytes, l.cp, st.cp);
    return inner + CollectiveTime(c, kind, bytes / l.cp, l.dp, st.dp);
  };
  for (int d = 0; d < l.pp; ++d) {
    double params = 0, layers_here = 0;
    std::vector<std::pair<double, double>> grads;  // (ready at, bytes) per chunk
    for (int k = 0; k < l.chunks; ++k) {
      const int s = k * l.pp + d;
      double p = layers[s] * layer_params;
      if (s == 0) p += vocab_params;  // the embedding
      // The output layer: its own weights, or the tied embedding's copy on the last stage.
      if (s == stages - 1 && (!m.tied_embeddings || stages > 1)) p += vocab_params;
      params += p;
      layers_here += layers[s];
      // Gradients leave in per-layer buckets as the chunk's last backward produces them (the
      // output layer's first, the embedding's last).
      const double end = sim.last_backward[s], span = pipe.bwd[s];
      const int buckets = std::max(1, layers[s]);
      for (int i = 0; i < buckets; ++i)
        grads.push_back({end - span * (buckets - 1 - i) / buckets, p / buckets});
    }
    // Weights (bf16), gradients (fp32 accumulation), fp32 master weights and Adam's two moments.
    const double weights = kAct * params / (l.zero >= 3 ? shard : 1.0);
    const double gradients = 4 * params / (l.zero >= 2 ? shard : 1.0);
    const double states = 12 * params / (l.zero >= 1 ? shard : 1.0);
    // FSDP gathers one layer's weights at a time (and prefetches the next).
    const double gathered = l.zero >= 3 ? 2 * kAct * layer_params : 0.0;
    const double state = weights + gradients + states;
    // Recomputation rebuilds one layer's activations at a time in the backward.
    const double transient =
        (full ? lc.act_bytes : 0.0) + (d == (stages - 1) % l.pp ? logits_bytes : 0.0) + gathered;
    const double memory = state + sim.peak_act_bytes[d] + transient;
    if (memory > worst_memory) {
      worst_memory = memory;
      worst_state = state;
      worst_act = sim.peak_act_bytes[d];
    }
    e.tp_comm_time = std::max(
        e.tp_comm_time,
        layers_here * mb * (lc.tp_comm_fwd + lc.tp_comm_bwd + (full ? lc.tp_comm_fwd : 0.0)));
    e.cp_comm_time = std::max(
        e.cp_comm_time,
        layers_here * mb * (lc.cp_comm_fwd + lc.cp_comm_bwd + (full ? lc.cp_comm_fwd : 0.0)));
    e.compute_time = std::max(e.compute_time, sim.busy[d]);
    // Data parallelism: gradients are reduced (scattered with ZeRO) over dp bucket by bucket as
    // the last backward of their chunk produces them, one collective at a time on the device's
    // network stream; the updated weights are gathered back (ZeRO 1-2) behind the next step's
    // forward, except the first chunk's. FSDP (ZeRO 3) also gathers the weights for every
    // micro-batch's forward and backward, prefetched behind compute: only what exceeds the compute
    // is exposed.
    std::sort(grads.begin(), grads.end());
    const auto reduce = l.zero >= 1 ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
    double net = 0;
    for (const auto& [ready, p] : grads) net = std::max(net, ready) + dp_collective(reduce, 4 * p);
    double exposed = std::max(0.0, net - sim.time);
    // With sharded gradients (ZeRO 2-3) there is no full-size accumulation buffer: every earlier
    // micro-batch's gradients are reduce-scattered too, behind compute.
    if (l.zero >= 2 && mb > 1)
      exposed += std::max(0.0, (mb - 1) * dp_collective(reduce, 4 * params) - sim.busy[d]);
    // ZeRO 1-2 gather the updated weights behind the next step's forward, bucket by bucket:
    // the first layer's bucket is exposed.
    if (l.zero >= 1 && l.zero <= 2 && shard > 1)
      exposed += dp_collective(CollectiveKind::kAllGather,
                               kAct * (layer_params + (d == 0 ? vocab_params : 0.0)));
    if (l.zero >= 3) {
      // Weights are dropped after each micro-batch's forward and gathered again for its
      // backward: two gathers per micro-batch, behind that micro-batch's compute.
      const double gather = 2.0 * mb * dp_collective(CollectiveKind::kAllGather, kAct * params);
      exposed += std::max(0.0, gather - sim.busy[d]);
    }
    dp_exposed = std::max(dp_exposed, exposed);
    // AdamW on this device's shard: read gradient, master, two moments; write them and the bf16
    // weight.
    optimizer = std::max(
        optimizer, (4 + 3 * 4 * 2 + kAct) * params / (l.zero >= 1 ? shard : 1.0) / c.mem_bandwidth);
  }
  e.state_bytes = worst_state;
  e.activation_bytes = worst_act;
  e.memory_bytes = worst_memory;
  e.dp_exposed_time = dp_exposed;
  e.optimizer_time = optimizer;
  e.step_time = sim.time + dp_exposed + optimizer;
  e.model_flops = 3 * m.ForwardFlops(job.seq_len) * static_cast<double>(job.global_batch);
  e.tflops_per_device = e.model_flops / e.step_time / job.world / 1e12;
  e.mfu = e.model_flops / e.step_time / job.world / c.peak_flops;
  const double limit = c.memory_bytes * c.usable_memory;
  e.feasible = e.memory_bytes <= limit;
  if (!e.feasible)
    e.reason = "needs " + Gb(e.memory_bytes) + " per device (" + Gb(e.state_bytes) +
               " weights, gradients and optimizer states, " + Gb(e.activation_bytes) +
               " activations) of " + Gb(limit) + " usable";
  return e;
}

}  // namespace

std::string LayoutPlan::ToString() const {
  std::ostringstream os;
  os.precision(4);
  os << "LayoutPlan(" << layout.ToString() << ": " << estimate.step_time << " s/step, "
     << estimate.tflops_per_device << " TFLOP/s per device, MFU " << estimate.mfu << ", "
     << estimate.memory_bytes / 1e9 << " GB per device; " << feasible << " of " << evaluated
     << " layouts fit)";
  return os.str();
}

namespace {

std::vector<int> PowersOfTwoUpTo(int64_t limit) {
  std::vector<int> out;
  for (int v = 1; v <= limit; v *= 2) out.push_back(v);
  return out;
}

}  // namespace

LayoutPlan PlanTrainingLayout(const TransformerSpec& m, const TrainingJob& job,
                              const cost::ClusterProfile& c, const LayoutSearch& search) {
  auto or_default = [](const std::vector<int>& v, std::vector<int> dflt) {
    return v.empty() ? dflt : v;
  };
  const auto tps = or_default(search.tp, PowersOfTwoUpTo(c.devices_per_node));
  const auto cps = or_default(search.cp, PowersOfTwoUpTo(32));
  // Pipeline depths: every divisor of the world up to 64 stages (Megatron ran 35 and 6).
  std::vector<int> depths;
  for (int d = 1; d <= std::min<int64_t>(m.layers, 64); ++d)
    if (job.world % d == 0) depths.push_back(d);
  const auto pps = or_default(search.pp, depths);
  const auto vs = or_default(search.chunks, {1, 2, 3, 4, 6, 8});
  const auto mbs = or_default(search.micro_batch, {1, 2, 4, 8});
  const auto zeros = or_default(search.zero, {1, 2, 3});
  const std::vector<std::string> recs = search.recompute.empty()
                                            ? std::vector<std::string>{"none", "selective", "full"}
                                            : search.recompute;
  LayoutPlan plan;
  std::vector<LayoutCandidate> all;
  SimCache cache;
  LayoutCandidate closest;  // the infeasible layout needing the least memory
  closest.estimate.memory_bytes = -1;
  for (int tp : tps)
    for (int cp : cps)
      for (int pp : pps) {
        const int64_t inner = static_cast<int64_t>(tp) * cp * pp;
        if (inner > job.world || job.world % inner != 0) continue;
        const int dp = static_cast<int>(job.world / inner);
        if (job.global_batch % dp != 0 || m.heads % tp != 0 || m.kv_heads % tp != 0) continue;
        if (search.sequence_parallel && tp > 1 && (job.seq_len / cp) % tp != 0) continue;
        if (cp > 1 && job.seq_len % (2 * cp) != 0) continue;
        for (int v : vs)
          for (int mb : mbs) {
            const int64_t replica = job.global_batch / dp;
            if (replica % mb != 0 || pp * v > m.layers) continue;
            if (v > 1 && ((replica / mb) % pp != 0 || pp == 1)) continue;
            for (const std::string& rec : recs)
              for (int zero : zeros) {
                TrainingLayout l;
                l.tp = tp, l.cp = cp, l.pp = pp, l.dp = dp, l.chunks = v, l.micro_batch = mb;
                l.zero = zero, l.recompute = rec, l.order = search.order;
                l.sequence_parallel = search.sequence_parallel && tp > 1;
                l.tp_overlap = search.tp_overlap;
                const StepEstimate e = Estimate(m, job, l, c, &cache);
                ++plan.evaluated;
                if (!e.feasible) {
                  if (closest.estimate.memory_bytes < 0 ||
                      e.memory_bytes < closest.estimate.memory_bytes)
                    closest = {l, e};
                  continue;
                }
                ++plan.feasible;
                all.push_back({l, e});
              }
          }
      }
  if (plan.evaluated == 0)
    throw std::runtime_error("PlanTrainingLayout: no layout of the candidates tiles " +
                             std::to_string(job.world) + " devices with a global batch of " +
                             std::to_string(job.global_batch) + " sequences");
  if (all.empty())
    throw std::runtime_error("PlanTrainingLayout: none of " + std::to_string(plan.evaluated) +
                             " layouts fits in memory; the closest, " + closest.layout.ToString() +
                             ", " + closest.estimate.reason);
  const size_t keep = std::min(all.size(), static_cast<size_t>(std::max(1, search.keep)));
  std::partial_sort(all.begin(), all.begin() + keep, all.end(),
                    [](const LayoutCandidate& a, const LayoutCandidate& b) {
                      return a.estimate.step_time < b.estimate.step_time;
                    });
  plan.best.assign(all.begin(), all.begin() + keep);
  plan.layout = plan.best.front().layout;
  plan.estimate = plan.best.front().estimate;
  return plan;
}

}  // namespace tp::passes
