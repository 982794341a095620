// Analytic model of one decoder layer's decode step (one new token per request) under the four
// ways of spreading it over devices that cache parallelism is weighed against (thesis ch. 4):
// data parallel, tensor parallel (Megatron), and cache parallel with either communication scheme.
//
// Decode is memory-bound: each step reads the layer's weights once and every request's KV cache
// once, so time is a roofline over those bytes plus collectives (alpha-beta, device_profile.h)
// plus a per-device bookkeeping term linear in the KV blocks a device indexes (the block-table
// management the thesis measures as "CPU overhead"; TP pays it for the whole cache on every
// device because it shards heads, not sequence). Bytes sent per rank are exact counts of what our
// collectives send, so the runtime's counters can be checked against them.
#pragma once

#include <cstdint>
#include <string>

#include "cost/device_profile.h"

namespace tp::cost {

struct DecodeLayer {
  int64_t batch = 1;    // requests, one new token each (global, over all devices)
  int64_t context = 0;  // KV entries per request
  int64_t hidden = 0;   // model width E
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn_hidden = 0;   // gated MLP (three matrices); 0: attention only
  int64_t dtype_bytes = 2;  // weights, activations and cache
  int64_t layers = 1;       // for the memory check only
  int64_t kv_block = 16;    // tokens per KV block (paged cache bookkeeping)
  // Host-side bookkeeping per indexed KV block per step: building the block table and copying
  // it to the device (4 bytes over PCIe plus the allocator's Python work). An assumption, sized
  // so that bookkeeping is the share of a long-context step the thesis's breakdown (Fig. 4.5)
  // attributes to CPU overhead; benchmarks/cache_parallel.py prints the figures it implies.
  double seconds_per_block = 4e-9;
  // DP only: the busiest device's KV bytes over the mean (requests of different lengths land
  // on different devices; CP and TP split every request, so they are balanced by design).
  double dp_imbalance = 1.0;
};

enum class DecodeStrategy {
  kDataParallel,  // requests split over devices, everything local
  // Heads and FFN columns split; two all-reduces per layer. Beyond kv_heads devices each KV
  // head is duplicated on world / kv_heads devices (its cache read there too).
  kTensorParallel,
  kCacheParallelGatherQkv,       // rest data parallel; all-gather q/k/v, all-to-all partials
  kCacheParallelGatherPartials,  // rest replicated; all-gather attention partials
  // Helix (TensorRT-LLM): attention KV-sharded by sequence over all devices (q/k/v projections
  // replicated), one all-to-all of the partials so each device merges its 1/n of the heads,
  // then the output projection and the MLP tensor-parallel over the same devices (two
  // all-reduces, as TP).
  kHelix,
};
const char* DecodeStrategyName(DecodeStrategy s);

struct DecodeCost {
  double compute_s = 0;
  double comm_s = 0;
  double overhead_s = 0;
  double total_s = 0;
  double bytes_sent_per_rank = 0;  // what one rank sends in this layer's collectives
  double memory_per_rank = 0;      // weights (all layers) + this rank's KV cache (all layers)
  bool fits = true;                // memory_per_rank <= profile capacity
  bool valid = true;               // false when the strategy cannot split this shape
  std::string why_invalid;
};

DecodeCost ModelDecodeLayer(const DecodeLayer& layer, int world, DecodeStrategy strategy,
                            const DeviceProfile& device);

// The thesis's per-GPU communication volumes (1 byte per element): CP = (N-1)3BE/N +
// (N-1)B(E+2H)/2, TP = 4(N-1)BE. Reported beside ours, which count GQA, fp32 partials and the
// ring algorithm exactly.
double ThesisCpBytes(const DecodeLayer& layer, int world);
double ThesisTpBytes(const DecodeLayer& layer, int world);

// Ring-free all-to-all: every rank sends (N-1)/N of its `bytes` buffer in N-1 messages.
double AllToAllTime(const DeviceProfile& d, double bytes, int ranks);

}  // namespace tp::cost
