#include "sim/interleaved_pipeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace tp::sim {

std::vector<ChunkOp> InterleavedOrder(int p, int v, int m, int d) {
  if (p < 1 || v < 1 || m < 1 || d < 0 || d >= p)
    throw std::invalid_argument("InterleavedOrder: need devices, chunks, micro-batches >= 1");
  if (v > 1 && m % p != 0)
    throw std::invalid_argument("interleaved 1F1B needs the micro-batch count (" +
                                std::to_string(m) + ") to be a multiple of the pipeline depth (" +
                                std::to_string(p) + ")");
  const int total = m * v;
  // Megatron: the k-th forward of a device runs chunk (k / p) % v on micro-batch
  // (k / (p v)) p + k % p; backwards walk the chunks in reverse.
  auto op = [&](int k, bool backward) {
    ChunkOp o;
    const int c = (k / p) % v;
    o.chunk = backward ? v - 1 - c : c;
    o.micro_batch = v == 1 ? k : (k / (p * v)) * p + k % p;
    o.backward = backward;
    return o;
  };
  // Megatron runs every forward first when m == p with interleaving.
  const int warmup = v == 1   ? std::min(p - d - 1, m)
                     : m == p ? total
                              : std::min((p - d - 1) * 2 + (v - 1) * p, total);
  std::vector<ChunkOp> order;
  order.reserve(2 * total);
  for (int k = 0; k < warmup; ++k) order.push_back(op(k, false));
  for (int i = 0; i < total - warmup; ++i) {
    order.push_back(op(warmup + i, false));
    order.push_back(op(i, true));
  }
  for (int i = total - warmup; i < total; ++i) order.push_back(op(i, true));
  return order;
}

InterleavedResult SimulateInterleaved(const InterleavedPipeline& pipe) {
  const int p = pipe.devices, v = pipe.chunks, m = pipe.micro_batches;
  const int stages = p * v;
  if (static_cast<int>(pipe.fwd.size()) != stages || static_cast<int>(pipe.bwd.size()) != stages ||
      static_cast<int>(pipe.act_bytes.size()) != stages)
    throw std::invalid_argument(
        "SimulateInterleaved: fwd, bwd and act_bytes need devices * chunks "
        "entries");
  std::vector<std::vector<ChunkOp>> orders(p);
  for (int d = 0; d < p; ++d) orders[d] = InterleavedOrder(p, v, m, d);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> fw(stages, std::vector<double>(m, nan)), bw = fw;
  InterleavedResult res;
  res.busy.assign(p, 0);
  res.peak_act_bytes.assign(p, 0);
  res.peak_in_flight.assign(p, 0);
  res.last_backward.assign(stages, 0);
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0), held(p, 0);
  std::vector<int> in_flight(p, 0);
  size_t done = 0, total = 0;
  for (const auto& o : orders) total += o.size();
  while (done < total) {
    bool progressed = false;
    for (int d = 0; d < p; ++d) {
      while (next[d] < orders[d].size()) {
        const ChunkOp& op = orders[d][next[d]];
        const int s = op.chunk * p + d;
        double ready = 0;
        if (!op.backward) {
          if (s > 0) {
            if (std::isnan(fw[s - 1][op.micro_batch])) break;
            ready = fw[s - 1][op.micro_batch] + pipe.send;
          }
        } else if (s + 1 < stages) {
          if (std::isnan(bw[s + 1][op.micro_batch])) break;
          ready = bw[s + 1][op.micro_batch] + pipe.send;
        } else {
          if (std::isnan(fw[s][op.micro_batch])) break;
          ready = fw[s][op.micro_batch];
        }
        const double start = std::max(ready, free_at[d]);
        const double cost = op.backward ? pipe.bwd[s] : pipe.fwd[s];
        free_at[d] = start + cost;
        res.busy[d] += cost;
        if (op.backward) {
          bw[s][op.micro_batch] = free_at[d];
          res.last_backward[s] = std::max(res.last_backward[s], free_at[d]);
          held[d] -= pipe.act_bytes[s];
          --in_flight[d];
        } else {
          fw[s][op.micro_batch] = free_at[d];
          held[d] += pipe.act_bytes[s];
          res.peak_act_bytes[d] = std::max(res.peak_act_bytes[d], held[d]);
          res.peak_in_flight[d] = std::max(res.peak_in_flight[d], ++in_flight[d]);
        }
        ++next[d];
        ++done;
        progressed = true;
      }
    }
    if (!progressed)
      throw std::runtime_error(
          "SimulateInterleaved: the schedule deadlocks (p=" + std::to_string(p) +
          ", v=" + std::to_string(v) + ", m=" + std::to_string(m) + ")");
  }
  res.time = *std::max_element(free_at.begin(), free_at.end());
  double busy = 0;
  for (double b : res.busy) busy += b;
  res.bubble_fraction = res.time > 0 ? 1.0 - busy / (res.time * p) : 0.0;
  return res;
}

}  // namespace tp::sim
