#include "sim/interleaved_pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

namespace tp::sim {
namespace {

InterleavedPipeline Uniform(int p, int v, int m, double f, double b, double send = 0) {
  InterleavedPipeline x;
  x.devices = p, x.chunks = v, x.micro_batches = m, x.send = send;
  for (int s = 0; s < p * v; ++s) {
    x.fwd.push_back(f / v);
    x.bwd.push_back(b / v);
    x.act_bytes.push_back(1.0 / v);
  }
  return x;
}

// Megatron's closed form for uniform stages and free sends: m (f + b) of work plus a bubble of
// (p - 1) (f + b) / v (Narayanan et al., SC21, section 2.2.2).
TEST(InterleavedPipeline, UniformStagesMatchTheClosedForm) {
  for (int p : {1, 2, 4, 8})
    for (int v : {1, 2, 3, 4})
      for (int m : {4, 8, 16}) {
        if (v > 1 && m % p != 0) continue;
        const auto r = SimulateInterleaved(Uniform(p, v, m, 1.0, 2.0));
        EXPECT_NEAR(r.time, (m + (p - 1.0) / v) * 3.0, 1e-9) << p << " " << v << " " << m;
        EXPECT_NEAR(r.bubble_fraction, 1.0 - m * 3.0 / r.time, 1e-9);
      }
}

TEST(InterleavedPipeline, FirstDeviceHoldsTheWarmupPlusOne) {
  for (int p : {2, 4, 8})
    for (int v : {1, 2, 4}) {
      const int m = 2 * p;
      const auto r = SimulateInterleaved(Uniform(p, v, m, 1.0, 2.0));
      const int warmup = v == 1 ? p - 1 : 2 * (p - 1) + (v - 1) * p;
      EXPECT_EQ(r.peak_in_flight[0], std::min(warmup + 1, m * v)) << p << " " << v;
      // The last device runs one forward, one backward from the start.
      EXPECT_EQ(r.peak_in_flight[p - 1], v == 1 ? 1 : std::min((v - 1) * p + 1, m * v));
      EXPECT_NEAR(r.peak_act_bytes[0], r.peak_in_flight[0] * 1.0 / v, 1e-12);
    }
}

TEST(InterleavedPipeline, SendsDelayEveryHop) {
  const double send = 0.25;
  const auto slow = SimulateInterleaved(Uniform(4, 1, 8, 1.0, 2.0, send));
  const auto free = SimulateInterleaved(Uniform(4, 1, 8, 1.0, 2.0));
  // The first micro-batch crosses 3 hops forward and 3 back before the pipeline drains.
  EXPECT_GE(slow.time, free.time + 6 * send - 1e-9);
}

TEST(InterleavedPipeline, OrderRunsEveryPassOnceForwardsFirst) {
  for (int p : {2, 4})
    for (int v : {1, 2, 3})
      for (int d = 0; d < p; ++d) {
        const int m = 2 * p;
        const auto order = InterleavedOrder(p, v, m, d);
        ASSERT_EQ(static_cast<int>(order.size()), 2 * m * v);
        std::vector<int> fwd(m * v, -1);
        for (int i = 0; i < static_cast<int>(order.size()); ++i) {
          const auto& o = order[i];
          const int key = o.chunk * m + o.micro_batch;
          if (!o.backward) {
            EXPECT_EQ(fwd[key], -1);
            fwd[key] = i;
          } else {
            EXPECT_GE(fwd[key], 0) << "backward before its forward";
          }
        }
      }
}

TEST(InterleavedPipeline, RejectsShapesMegatronCannotRun) {
  EXPECT_THROW(InterleavedOrder(4, 2, 6, 0), std::invalid_argument);  // m not a multiple of p
  InterleavedPipeline bad = Uniform(2, 1, 4, 1, 2);
  bad.fwd.pop_back();
  EXPECT_THROW(SimulateInterleaved(bad), std::invalid_argument);
}

}  // namespace
}  // namespace tp::sim
