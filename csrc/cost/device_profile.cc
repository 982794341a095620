#include "cost/device_profile.h"

#include <algorithm>
#include <stdexcept>

namespace tp::cost {
namespace {

// Public datasheet figures derated to what dense training kernels reach (~60-70% of the
// tensor-core peak); link figures are per-pair NVLink/PCIe bandwidths.
const std::vector<DeviceProfile>& Presets() {
  static const std::vector<DeviceProfile> presets = {
      {"v100", 80e12, 0.9e12, 32e9, 150e9 / 6, 5e-6, 5e-6},
      {"a100", 200e12, 1.6e12, 80e9, 300e9 / 6, 5e-6, 4e-6},
      {"h100", 600e12, 2.8e12, 80e9, 450e9 / 6, 4e-6, 3e-6},
      {"a5000", 55e12, 0.7e12, 24e9, 25e9, 10e-6, 5e-6},
      {"cpu", 60e9, 15e9, 24e9, 2e9, 50e-6, 10e-6},
  };
  return presets;
}

}  // namespace

const DeviceProfile& FindDeviceProfile(const std::string& name) {
  for (const auto& p : Presets())
    if (p.name == name) return p;
  std::string valid;
  for (const auto& p : Presets()) valid += (valid.empty() ? "" : ", ") + p.name;
  throw std::invalid_argument("unknown device profile '" + name + "'; valid: " + valid);
}

std::vector<std::string> DeviceProfileNames() {
  std::vector<std::string> names;
  for (const auto& p : Presets()) names.push_back(p.name);
  return names;
}

double ComputeTime(const DeviceProfile& d, double flops, double bytes, double kernels) {
  return std::max(flops / d.peak_flops, bytes / d.mem_bandwidth) + kernels * d.kernel_overhead;
}

double P2PTime(const DeviceProfile& d, double bytes) {
  return bytes <= 0 ? 0.0 : d.link_latency + bytes / d.link_bandwidth;
}

double AllReduceTime(const DeviceProfile& d, double bytes, int ranks) {
  if (ranks <= 1 || bytes <= 0) return 0.0;
  const double steps = 2.0 * (ranks - 1);
  return steps * d.link_latency + steps / ranks * bytes / d.link_bandwidth;
}

double AllGatherTime(const DeviceProfile& d, double bytes, int ranks) {
  if (ranks <= 1 || bytes <= 0) return 0.0;
  const double steps = ranks - 1.0;
  return steps * d.link_latency + steps / ranks * bytes / d.link_bandwidth;
}

}  // namespace tp::cost
