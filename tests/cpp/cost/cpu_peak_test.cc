#include "cost/cpu_peak.h"

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>

namespace tp::cost {
namespace {

// What the rate is depends on the machine; that it is a rate does not.
TEST(CpuPeak, MeasuresAPositiveFiniteRateOnOneAndTwoThreads) {
  for (int threads : {1, 2}) {
    double peak = MeasureF32Peak(threads, 0.005, 2);
    EXPECT_GT(peak, 0.0);
    EXPECT_TRUE(std::isfinite(peak));
    EXPECT_LT(peak, 1e15 * threads);  // no core multiply-adds a PFLOP/s: the clock was read
  }
}

TEST(CpuPeak, ClampsDegenerateArguments) { EXPECT_GT(MeasureF32Peak(0, 0.001, 0), 0.0); }

}  // namespace
}  // namespace tp::cost
