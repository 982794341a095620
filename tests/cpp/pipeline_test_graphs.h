// Cost graphs for the pipeline passes' tests: chains, multi-branch models and random SP graphs.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "cost/device_profile.h"
#include "passes/pipeline_graph.h"
#include "passes/pipeline_partition.h"

namespace tp::testing {

inline pipeline::CostNode Block(std::string name, std::vector<int> inputs, double flops,
                                double params = 1e6, std::string scope = "") {
  pipeline::CostNode n;
  n.name = std::move(name);
  n.scope = std::move(scope);
  n.inputs = std::move(inputs);
  n.fwd_flops = flops;
  n.bwd_flops = 2 * flops;
  n.io_bytes = flops / 50;
  n.act_bytes = flops / 100;
  n.out_bytes = 4096;
  n.param_bytes = params;
  n.kernels = 4;
  return n;
}

// in -> chain of n blocks.
inline pipeline::CostGraph Chain(int n, double flops = 1e9) {
  pipeline::CostGraph g;
  for (int i = 0; i < n; ++i)
    g.nodes.push_back(Block("c" + std::to_string(i),
                            i ? std::vector<int>{i - 1} : std::vector<int>{},
                            flops * (1 + 0.25 * (i % 3))));
  g.nodes.back().is_output = true;
  return g;
}

// `branches` independent chains of `depth` blocks (no common source), joined by a concat and a
// head block: the MMT / CANDLE-Uno shape.
inline pipeline::CostGraph Branches(int branches, int depth, double flops = 1e9,
                                    double skew = 0.5) {
  pipeline::CostGraph g;
  std::vector<int> ends;
  for (int b = 0; b < branches; ++b) {
    for (int i = 0; i < depth; ++i) {
      std::vector<int> in;
      if (i) in.push_back(g.size() - 1);
      g.nodes.push_back(Block("b" + std::to_string(b) + "_" + std::to_string(i), in,
                              flops * (1 + skew * b), 1e6, "branches." + std::to_string(b)));
    }
    ends.push_back(g.size() - 1);
  }
  g.nodes.push_back(Block("cat", ends, 0, 0));
  g.nodes.push_back(Block("head", {g.size() - 1}, flops / 2));
  g.nodes.back().is_output = true;
  return g;
}

inline pipeline::PartitionOptions Options(int devices, int mini_batch,
                                          const std::string& device = "a100") {
  pipeline::PartitionOptions o;
  o.num_devices = devices;
  o.mini_batch = mini_batch;
  o.device = cost::FindDeviceProfile(device);
  return o;
}

// A random two-terminal series-parallel graph of about `size` blocks.
inline pipeline::CostGraph RandomSp(std::mt19937& rng, int size) {
  // Build an SP expression over edges, then number nodes topologically.
  struct Edge {
    int from, to;
  };
  std::vector<Edge> edges = {{0, 1}};
  int nodes = 2;
  std::uniform_real_distribution<double> u(0, 1);
  while (nodes < size) {
    const int e = static_cast<int>(rng() % edges.size());
    if (u(rng) < 0.6) {  // series: subdivide the edge
      const int mid = nodes++;
      const Edge old = edges[e];
      edges[e] = {old.from, mid};
      edges.push_back({mid, old.to});
    } else {  // parallel: a new path of one node beside the edge
      const int mid = nodes++;
      edges.push_back({edges[e].from, mid});
      edges.push_back({mid, edges[e].to});
    }
  }
  // Topological numbering (Kahn).
  std::vector<std::vector<int>> succ(nodes);
  std::vector<int> indeg(nodes, 0);
  for (auto [a, b] : edges) succ[a].push_back(b), ++indeg[b];
  std::vector<int> order, stack = {0}, pos(nodes);
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    pos[v] = static_cast<int>(order.size());
    order.push_back(v);
    for (int w : succ[v])
      if (--indeg[w] == 0) stack.push_back(w);
  }
  pipeline::CostGraph g;
  g.nodes.resize(nodes);
  for (int v = 0; v < nodes; ++v)
    g.nodes[pos[v]] = Block("n" + std::to_string(pos[v]), {}, 1e9 * (0.5 + u(rng)));
  for (auto [a, b] : edges) g.nodes[pos[b]].inputs.push_back(pos[a]);
  for (auto& n : g.nodes) std::sort(n.inputs.begin(), n.inputs.end());
  g.nodes[pos[1]].is_output = true;
  return g;
}

}  // namespace tp::testing
