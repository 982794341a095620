#include "cost/decode_model.h"

#include <algorithm>
#include <cmath>

namespace tp::cost {

const char* DecodeStrategyName(DecodeStrategy s) {
  switch (s) {
    case DecodeStrategy::kDataParallel:
      return "dp";
    case DecodeStrategy::kTensorParallel:
      return "tp";
    case DecodeStrategy::kCacheParallelGatherQkv:
      return "cp_gather_qkv";
    case DecodeStrategy::kCacheParallelGatherPartials:
      return "cp_gather_partials";
    case DecodeStrategy::kHelix:
      return "helix";
  }
  return "?";
}

double AllToAllTime(const DeviceProfile& d, double bytes, int ranks) {
  if (ranks <= 1 || bytes <= 0) return 0.0;
  const double steps = ranks - 1.0;
  return steps * d.link_latency + steps / ranks * bytes / d.link_bandwidth;
}

double ThesisCpBytes(const DecodeLayer& l, int world) {
  const double n = world, b = static_cast<double>(l.batch), e = static_cast<double>(l.hidden);
  return (n - 1) * 3 * b * e / n + (n - 1) * b * (e + 2.0 * static_cast<double>(l.q_heads)) / 2;
}

double ThesisTpBytes(const DecodeLayer& l, int world) {
  return 4.0 * (world - 1) * static_cast<double>(l.batch) * static_cast<double>(l.hidden);
}

DecodeCost ModelDecodeLayer(const DecodeLayer& l, int world, DecodeStrategy strategy,
                            const DeviceProfile& device) {
  DecodeCost c;
  const double n = std::max(world, 1);
  const double bytes = static_cast<double>(l.dtype_bytes);
  const double e = static_cast<double>(l.hidden), d = static_cast<double>(l.head_dim);
  const double hq = static_cast<double>(l.q_heads), hkv = static_cast<double>(l.kv_heads);
  const double b = static_cast<double>(l.batch), ctx = static_cast<double>(l.context);
  // Parameters of one layer: q, k, v, o projections and a gated MLP.
  const double qkv_params = e * hq * d + 2 * e * hkv * d;
  const double params = qkv_params + hq * d * e + 3 * e * l.ffn_hidden;
  const double kv_per_token = 2 * hkv * d * bytes;  // k and v, one layer
  const double partial_bytes = hq * (d + 1) * 4.0;  // fp32 out + lse per request
  const double blocks = b * std::ceil(ctx / static_cast<double>(std::max<int64_t>(l.kv_block, 1)));
  const double kernels = 12;

  double tokens = b, weight_share = 1, kv_share = 1 / n, block_share = 1 / n;
  switch (strategy) {
    case DecodeStrategy::kDataParallel:
      if (l.batch % world != 0) {
        c.valid = false;
        c.why_invalid = "batch not divisible by the number of devices";
      }
      tokens = b / n;
      break;
    case DecodeStrategy::kTensorParallel:
      if (l.q_heads % world != 0 ||
          (l.kv_heads % world != 0 && (l.kv_heads == 0 || world % l.kv_heads != 0))) {
        c.valid = false;
        c.why_invalid = "heads not divisible by the number of devices";
      }
      weight_share = 1 / n;
      // Past kv_heads devices a device holds (and reads) a whole KV head: 1/kv_heads.
      if (world > l.kv_heads && l.kv_heads > 0) kv_share = 1 / hkv;
      block_share = 1;  // every device indexes every request's whole cache
      break;
    case DecodeStrategy::kHelix:
      if (l.q_heads % world != 0) {
        c.valid = false;
        c.why_invalid = "query heads not divisible by the number of devices";
      }
      // q/k/v projections replicated, the output projection and the MLP split n ways.
      weight_share = params > 0 ? (qkv_params + (params - qkv_params) / n) / params : 1;
      break;
    case DecodeStrategy::kCacheParallelGatherQkv:
      if (l.batch % world != 0) {
        c.valid = false;
        c.why_invalid = "batch not divisible by the number of devices";
      }
      tokens = b / n;
      break;
    case DecodeStrategy::kCacheParallelGatherPartials:
      break;
  }
  // Matmul work on `tokens` tokens (TP: 1/n of it), attention over this device's KV share.
  const double proj_flops = 2 * params * tokens * weight_share;
  // DP's busiest device holds the longest requests: its KV share is scaled by the imbalance.
  const double imbalance =
      strategy == DecodeStrategy::kDataParallel ? std::max(l.dp_imbalance, 1.0) : 1.0;
  const double kv_bytes = b * ctx * kv_per_token * kv_share * imbalance;
  const double attn_flops = 4 * b * ctx * hq * d * kv_share * imbalance;
  const double weight_bytes = params * bytes * weight_share;
  if (device.attention_bandwidth > 0) {
    // The attention kernel at its own measured rate, after the projections and the MLP.
    DeviceProfile attention = device;
    attention.mem_bandwidth = device.attention_bandwidth;
    c.compute_s = ComputeTime(device, proj_flops, weight_bytes, kernels) +
                  ComputeTime(attention, attn_flops, kv_bytes, 0);
  } else {
    c.compute_s = ComputeTime(device, proj_flops + attn_flops, weight_bytes + kv_bytes, kernels);
  }
  c.overhead_s = blocks * block_share * l.seconds_per_block;

  switch (strategy) {
    case DecodeStrategy::kDataParallel:
      break;
    case DecodeStrategy::kTensorParallel: {
      const double act = b * e * bytes;
      c.comm_s = 2 * AllReduceTime(device, act, world);
      c.bytes_sent_per_rank = world > 1 ? 2 * 2 * (n - 1) / n * act : 0;
      break;
    }
    case DecodeStrategy::kCacheParallelGatherQkv: {
      const double qkv_local = b / n * (hq + 2 * hkv) * d * bytes;
      const double partials = b * partial_bytes;
      c.comm_s =
          AllGatherTime(device, qkv_local * n, world) + AllToAllTime(device, partials, world);
      c.bytes_sent_per_rank = (n - 1) * qkv_local + (n - 1) / n * partials;
      break;
    }
    case DecodeStrategy::kCacheParallelGatherPartials: {
      const double partials = b * partial_bytes;
      c.comm_s = AllGatherTime(device, partials * n, world);
      c.bytes_sent_per_rank = (n - 1) * partials;
      break;
    }
    case DecodeStrategy::kHelix: {
      const double partials = b * partial_bytes;  // every head's partial, to its owner
      const double act = b * e * bytes;
      c.comm_s = AllToAllTime(device, partials, world) + 2 * AllReduceTime(device, act, world);
      c.bytes_sent_per_rank = world > 1 ? (n - 1) / n * partials + 2 * 2 * (n - 1) / n * act : 0;
      break;
    }
  }
  c.total_s = c.compute_s + c.comm_s + c.overhead_s;
  const double layers = static_cast<double>(std::max<int64_t>(l.layers, 1));
  // 1/n of all KV entries per device (DP: whole caches of 1/n requests), but TP past kv_heads
  // devices duplicates each head.
  const double kv_memory = b * ctx * kv_per_token * layers * kv_share;
  c.memory_per_rank = params * bytes * layers * weight_share + kv_memory;
  c.fits = c.memory_per_rank <= device.memory_bytes;
  return c;
}

}  // namespace tp::cost
