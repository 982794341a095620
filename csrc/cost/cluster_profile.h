// A training cluster as the 3-D layout model sees it: devices grouped in nodes, a fast fabric
// inside a node (NVLink/NVSwitch) and a network between nodes (one NIC per device, rail-optimised),
// and how efficiently a device runs each kind of work. One profile per cluster, fixed before it is
// compared with anything measured on that cluster: no per-row factors.
#pragma once

#include <string>
#include <vector>

namespace tp::cost {

struct ClusterProfile {
  std::string name;
  std::string source;  // where the figures come from (datasheets, papers)
  // Device.
  double peak_flops = 0;                // datasheet dense bf16 FLOP/s: the MFU denominator
  double gemm_efficiency = 0;           // fraction of peak the large GEMMs of a training step reach
  double attention_efficiency = 0;      // flash attention forward, fraction of peak
  double attention_bwd_efficiency = 0;  // its backward
  // The share of those isolated-kernel efficiencies a whole training step sustains (clocks under
  // sustained power, the step's real shapes, launch gaps, communication contending for the SMs):
  // calibrated once per cluster on one published row, then fixed for every other row.
  double sustained = 1.0;
  std::string calibrated_on;  // that row ("" when not calibrated)
  int sms = 0;  // streaming multiprocessors: GEMM tiles run in waves of this many (0: no waves)
  double mem_bandwidth = 0;    // bytes/s of device memory
  double memory_bytes = 0;     // capacity per device
  double usable_memory = 0.9;  // share of it a plan may fill (allocator, NCCL, workspace)
  // Fabric.
  int devices_per_node = 8;
  double intra_bandwidth = 0;  // bytes/s a device sends into the node fabric (bus bandwidth)
  double intra_latency = 0;    // seconds per collective step inside a node
  double inter_bandwidth = 0;  // bytes/s a device sends across nodes (its NIC)
  double inter_latency = 0;    // seconds per collective step across nodes
};

// Presets, each with its source; throws std::invalid_argument naming the valid ones.
const ClusterProfile& FindClusterProfile(const std::string& name);
std::vector<std::string> ClusterProfileNames();

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter };

// A collective over one mesh dimension: `ranks` members `stride` devices apart in rank order
// (devices [0, devices_per_node) share a node). `bytes`: the full tensor (the all-gather's
// output, the reduce-scatter's input). A group inside a node runs a ring over NVLink; a group
// whose members sit in different nodes runs a ring over the NICs; a group that spans both runs
// hierarchically (inside the node, then across nodes on the node's share).
double CollectiveTime(const ClusterProfile& c, CollectiveKind kind, double bytes, int ranks,
                      int stride);
// One point-to-point message between devices `stride` apart.
double SendTime(const ClusterProfile& c, double bytes, int stride);

}  // namespace tp::cost
