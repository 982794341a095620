#include "cost/cluster_profile.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tp::cost {
namespace {

// Datasheet figures (peak, memory, links) as published; the kernel efficiencies are priors for
// isolated kernels on that device; `sustained` is the one factor per cluster calibrated on one
// published row (`benchmarks/scale_model.py --calibrate`) and then fixed for all the others
// (docs/features/scale_model.md lists where each figure comes from).
const std::vector<ClusterProfile>& Presets() {
  static const std::vector<ClusterProfile> presets = [] {
    std::vector<ClusterProfile> v;
    ClusterProfile h100;
    h100.name = "h100-roce";
    h100.source =
        "H100 SXM5 80GB HBM3 (989 TFLOP/s dense bf16, 3.35 TB/s), 8 per node on NVLink 4/NVSwitch "
        "(450 GB/s per direction), one 400 Gb/s NIC per GPU (Llama 3 paper, section 3.3.1)";
    h100.peak_flops = 989e12;
    h100.gemm_efficiency = 0.70;
    h100.attention_efficiency = 0.55;
    h100.attention_bwd_efficiency = 0.45;
    h100.sustained = 0.7853;
    h100.calibrated_on = "megatron-7.1b (Megatron-LM README, H100 table)";
    h100.sms = 132;
    h100.mem_bandwidth = 3.35e12;
    h100.memory_bytes = 80e9;
    h100.devices_per_node = 8;
    h100.intra_bandwidth = 360e9;  // NCCL bus bandwidth reached on NVSwitch, below the 450 line
    h100.intra_latency = 10e-6;
    h100.inter_bandwidth = 40e9;  // 400 Gb/s = 50 GB/s line rate, ~80% reached
    h100.inter_latency = 20e-6;
    v.push_back(h100);

    ClusterProfile ib = h100;
    ib.name = "h100-ib";
    ib.source =
        "H100 SXM5 80GB, 8 per node on NVLink 4/NVSwitch, one 400 Gb/s InfiniBand NDR NIC per GPU";
    v.push_back(ib);

    // torchtitan's benchmark cluster (Grand Teton): an HBM2e H100 at a 500 W limit whose peak
    // the benchmark page places between the SXM part (989) and the NVL part (835): the midpoint.
    ClusterProfile gt = h100;
    gt.name = "h100-hbm2e-500w";
    gt.source =
        "H100 HBM2e 96GB (2.4 TB/s) at a 500 W power limit, peak between SXM and NVL (912 TFLOP/s "
        "taken), 8 per node on NVLink, 400 Gb/s RDMA per GPU (torchtitan "
        "benchmarks/llama3_h100_202412_torchtitan.md)";
    gt.peak_flops = 912e12;
    gt.mem_bandwidth = 2.4e12;
    gt.memory_bytes = 96e9;
    gt.sustained = 0.6289;
    gt.calibrated_on = "torchtitan-8b-128-fsdp-compile (torchtitan H100 benchmark, Table 3)";
    v.push_back(gt);

    ClusterProfile a100;
    a100.name = "a100-ib";
    a100.source =
        "DGX A100 80GB (312 TFLOP/s dense bf16/fp16, 2.0 TB/s), 8 per node on NVLink 3/NVSwitch "
        "(300 GB/s per direction), eight 200 Gb/s HDR InfiniBand NICs per node (Megatron-LM SC21, "
        "section 5)";
    a100.peak_flops = 312e12;
    a100.gemm_efficiency = 0.80;
    a100.attention_efficiency = 0.40;  // no flash attention in 2021: unfused softmax kernels
    a100.attention_bwd_efficiency = 0.35;
    a100.sustained = 0.7320;
    a100.calibrated_on = "korthikanti-22b (arXiv 2205.05198, Table 5)";
    a100.sms = 108;
    a100.mem_bandwidth = 2.0e12;
    a100.memory_bytes = 80e9;
    a100.devices_per_node = 8;
    a100.intra_bandwidth = 230e9;
    a100.intra_latency = 10e-6;
    a100.inter_bandwidth = 20e9;  // 200 Gb/s = 25 GB/s line rate, ~80% reached
    a100.inter_latency = 20e-6;
    v.push_back(a100);
    return v;
  }();
  return presets;
}

double Ring(double bytes, int ranks, double bandwidth, double latency, double passes) {
  const double steps = passes * (ranks - 1);
  return steps * latency + steps / ranks * bytes / bandwidth;
}

}  // namespace

const ClusterProfile& FindClusterProfile(const std::string& name) {
  for (const auto& p : Presets())
    if (p.name == name) return p;
  std::string valid;
  for (const auto& p : Presets()) valid += (valid.empty() ? "" : ", ") + p.name;
  throw std::invalid_argument("unknown cluster profile '" + name + "'; valid: " + valid);
}

std::vector<std::string> ClusterProfileNames() {
  std::vector<std::string> names;
  for (const auto& p : Presets()) names.push_back(p.name);
  return names;
}

double CollectiveTime(const ClusterProfile& c, CollectiveKind kind, double bytes, int ranks,
                      int stride) {
  if (ranks <= 1 || bytes <= 0) return 0.0;
  if (stride < 1) throw std::invalid_argument("CollectiveTime: stride must be at least 1");
  const double passes = kind == CollectiveKind::kAllReduce ? 2.0 : 1.0;
  const int node = c.devices_per_node;
  // Members of the group that share a node, and how many nodes the group spans.
  const int local = stride >= node ? 1 : std::min(ranks, std::max(1, node / stride));
  const int nodes = (ranks + local - 1) / local;
  if (nodes == 1) return Ring(bytes, ranks, c.intra_bandwidth, c.intra_latency, passes);
  if (local == 1) return Ring(bytes, ranks, c.inter_bandwidth, c.inter_latency, passes);
  // Hierarchical: a ring inside the node over the whole tensor, then each of the `local`
  // devices runs a ring across nodes over its 1/local share, on its own NIC.
  return Ring(bytes, local, c.intra_bandwidth, c.intra_latency, passes) +
         Ring(bytes / local, nodes, c.inter_bandwidth, c.inter_latency, passes);
}

double SendTime(const ClusterProfile& c, double bytes, int stride) {
  if (bytes <= 0) return 0.0;
  return stride >= c.devices_per_node ? c.inter_latency + bytes / c.inter_bandwidth
                                      : c.intra_latency + bytes / c.intra_bandwidth;
}

}  // namespace tp::cost
