#include "cost/cluster_profile.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace tp::cost {
namespace {

// The calibration inputs: a change to a preset moves every modelled row, so it must be
// deliberate (docs/features/scale_model.md lists their sources).
TEST(ClusterProfile, PresetsAreTheDocumentedFigures) {
  const auto& h = FindClusterProfile("h100-roce");
  EXPECT_DOUBLE_EQ(h.peak_flops, 989e12);
  EXPECT_DOUBLE_EQ(h.gemm_efficiency, 0.70);
  EXPECT_DOUBLE_EQ(h.sustained, 0.7853);
  EXPECT_DOUBLE_EQ(h.attention_efficiency, 0.55);
  EXPECT_DOUBLE_EQ(h.attention_bwd_efficiency, 0.45);
  EXPECT_DOUBLE_EQ(h.mem_bandwidth, 3.35e12);
  EXPECT_DOUBLE_EQ(h.memory_bytes, 80e9);
  EXPECT_EQ(h.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(h.intra_bandwidth, 360e9);
  EXPECT_DOUBLE_EQ(h.inter_bandwidth, 40e9);
  const auto& g = FindClusterProfile("h100-hbm2e-500w");
  EXPECT_DOUBLE_EQ(g.peak_flops, 912e12);
  EXPECT_DOUBLE_EQ(g.sustained, 0.6289);
  EXPECT_DOUBLE_EQ(g.mem_bandwidth, 2.4e12);
  EXPECT_DOUBLE_EQ(g.memory_bytes, 96e9);
  const auto& a = FindClusterProfile("a100-ib");
  EXPECT_DOUBLE_EQ(a.peak_flops, 312e12);
  EXPECT_DOUBLE_EQ(a.gemm_efficiency, 0.80);
  EXPECT_DOUBLE_EQ(a.sustained, 0.7320);
  EXPECT_DOUBLE_EQ(a.inter_bandwidth, 20e9);
  EXPECT_THROW(FindClusterProfile("tpu"), std::invalid_argument);
}

TEST(ClusterProfile, GroupsInsideANodeUseNvlinkAcrossNodesTheNics) {
  const auto& c = FindClusterProfile("h100-roce");
  const double bytes = 1e9;
  // 8 ranks, stride 1: one node, ring over NVLink.
  EXPECT_NEAR(CollectiveTime(c, CollectiveKind::kAllGather, bytes, 8, 1),
              7 * c.intra_latency + 7.0 / 8 * bytes / c.intra_bandwidth, 1e-12);
  // 8 ranks, stride 8: eight nodes, ring over the NICs.
  EXPECT_NEAR(CollectiveTime(c, CollectiveKind::kAllGather, bytes, 8, 8),
              7 * c.inter_latency + 7.0 / 8 * bytes / c.inter_bandwidth, 1e-12);
  // An all-reduce is two passes.
  EXPECT_NEAR(CollectiveTime(c, CollectiveKind::kAllReduce, bytes, 8, 8),
              2 * CollectiveTime(c, CollectiveKind::kReduceScatter, bytes, 8, 8), 1e-12);
  // 16 ranks, stride 1: two nodes of 8, hierarchical; cheaper than a flat ring over NICs.
  const double hier = CollectiveTime(c, CollectiveKind::kAllGather, bytes, 16, 1);
  EXPECT_NEAR(hier,
              7 * c.intra_latency + 7.0 / 8 * bytes / c.intra_bandwidth + c.inter_latency +
                  0.5 * (bytes / 8) / c.inter_bandwidth,
              1e-12);
  EXPECT_LT(hier, CollectiveTime(c, CollectiveKind::kAllGather, bytes, 16, 8));
  EXPECT_EQ(CollectiveTime(c, CollectiveKind::kAllGather, bytes, 1, 1), 0.0);
  EXPECT_GT(SendTime(c, bytes, 8), SendTime(c, bytes, 1));
}

}  // namespace
}  // namespace tp::cost
