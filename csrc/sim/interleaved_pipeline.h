// Event simulator of Megatron's pipeline schedules on uniform devices: 1F1B (one model chunk per
// device) and interleaved 1F1B (v chunks per device, model stage s on device s mod p). GraphPipe's
// simulator (pipeline_sim.h) runs graph-shaped stage plans with one stage per device; large
// transformer training runs this chain with virtual stages, which that one does not model.
//
// Every device runs its op list in Megatron's order (warm-up forwards, one forward one backward,
// cool-down backwards); an op starts when its device is free and its input has arrived (the
// previous stage's forward, or the next stage's backward, plus the point-to-point send).
#pragma once

#include <vector>

namespace tp::sim {

struct InterleavedPipeline {
  int devices = 1;        // p
  int chunks = 1;         // v: model chunks per device (1: plain 1F1B)
  int micro_batches = 1;  // m; a multiple of p when v > 1
  // Per model stage s = chunk * p + device: one micro-batch's forward and backward time, and
  // the activation bytes it keeps from its forward until its backward.
  std::vector<double> fwd, bwd, act_bytes;
  double send = 0;  // seconds to pass one micro-batch's activation (or gradient) to the next stage
};

struct InterleavedResult {
  double time = 0;                     // first forward to last backward
  double bubble_fraction = 0;          // idle share of device time
  std::vector<double> busy;            // compute seconds per device
  std::vector<double> peak_act_bytes;  // per device: activations held at once
  std::vector<int> peak_in_flight;     // per device: (chunk, micro-batch) forwards held at once
  std::vector<double> last_backward;   // per model stage: when its last backward ends
};

// The op order of one device: (model chunk, micro-batch, backward). Throws
// std::invalid_argument for an impossible shape (m not a multiple of p with v > 1).
struct ChunkOp {
  int chunk = 0, micro_batch = 0;
  bool backward = false;
};
std::vector<ChunkOp> InterleavedOrder(int devices, int chunks, int micro_batches, int device);

InterleavedResult SimulateInterleaved(const InterleavedPipeline& pipe);

}  // namespace tp::sim
