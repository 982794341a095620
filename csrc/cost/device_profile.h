// Device profiles and the analytic cost model shared by the pipeline, sharding and cache passes.
//
// Compute time is a roofline (max of FLOPs over peak and bytes over bandwidth) plus a fixed
// per-kernel launch overhead: the overhead and the weights read once per micro-batch are why
// bigger micro-batches run at higher operational intensity (GraphPipe §3.2). Communication is
// alpha-beta: latency per message plus bytes over link bandwidth; collectives use ring costs.
#pragma once

#include <string>
#include <vector>

namespace tp::cost {

struct DeviceProfile {
  std::string name;
  double peak_flops = 0;       // achievable dense FLOP/s for training math (mixed precision)
  double mem_bandwidth = 0;    // bytes/s of device memory
  double memory_bytes = 0;     // capacity per device
  double link_bandwidth = 0;   // bytes/s between two devices (point-to-point)
  double link_latency = 0;     // seconds per message
  double kernel_overhead = 0;  // seconds per kernel launch
  // Bytes/s a decode attention kernel reaches reading the KV cache (a measured kernel's
  // fraction of the measured read bandwidth); 0: priced with everything else at mem_bandwidth.
  double attention_bandwidth = 0;
};

// Presets: "v100", "a100", "h100", "a5000", "cpu" (a 2-core box running gloo). Throws
// std::invalid_argument naming the valid presets for an unknown name.
const DeviceProfile& FindDeviceProfile(const std::string& name);
std::vector<std::string> DeviceProfileNames();

// Time of `kernels` kernels doing `flops` FLOPs and moving `bytes` bytes on one device.
double ComputeTime(const DeviceProfile& d, double flops, double bytes, double kernels);
// One message of `bytes` between two devices.
double P2PTime(const DeviceProfile& d, double bytes);
// Ring all-reduce of `bytes` over `ranks` devices (0 for one rank).
double AllReduceTime(const DeviceProfile& d, double bytes, int ranks);
// Ring all-gather / reduce-scatter: each rank ends with (or contributes) `bytes` in total.
double AllGatherTime(const DeviceProfile& d, double bytes, int ranks);

}  // namespace tp::cost
