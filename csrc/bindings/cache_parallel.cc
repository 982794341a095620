// Bindings of the cache-parallel planner and the decode cost model, as Python dicts. No LibTorch.
#include "passes/cache_parallel.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>

#include "bindings/typed.h"
#include "cost/decode_model.h"
#include "passes/pass_manager.h"

namespace py = pybind11;

namespace tp::bindings {
namespace {

py::dict CostDict(const cost::DecodeCost& c) {
  return py::dict(py::arg("compute_s") = c.compute_s, py::arg("comm_s") = c.comm_s,
                  py::arg("overhead_s") = c.overhead_s, py::arg("total_s") = c.total_s,
                  py::arg("bytes_sent_per_rank") = c.bytes_sent_per_rank,
                  py::arg("memory_per_rank") = c.memory_per_rank, py::arg("fits") = c.fits,
                  py::arg("valid") = c.valid, py::arg("why_invalid") = c.why_invalid);
}

cost::DecodeLayer LayerFromDict(const py::dict& d) {
  cost::DecodeLayer l;
  auto get = [&](const char* k, int64_t* out) {
    if (d.contains(k)) *out = d[k].cast<int64_t>();
  };
  get("batch", &l.batch), get("context", &l.context), get("hidden", &l.hidden);
  get("q_heads", &l.q_heads), get("kv_heads", &l.kv_heads), get("head_dim", &l.head_dim);
  get("ffn_hidden", &l.ffn_hidden), get("dtype_bytes", &l.dtype_bytes);
  get("layers", &l.layers), get("kv_block", &l.kv_block);
  if (d.contains("seconds_per_block")) l.seconds_per_block = d["seconds_per_block"].cast<double>();
  if (d.contains("dp_imbalance")) l.dp_imbalance = d["dp_imbalance"].cast<double>();
  const std::vector<std::string> known = {
      "batch",      "context",     "hidden", "q_heads",  "kv_heads",          "head_dim",
      "ffn_hidden", "dtype_bytes", "layers", "kv_block", "seconds_per_block", "dp_imbalance"};
  for (const auto& item : d) {
    const auto key = item.first.cast<std::string>();
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw std::invalid_argument("unknown decode-layer field '" + key + "'");
  }
  return l;
}

cost::DecodeStrategy StrategyFromName(const std::string& s) {
  for (auto k : {cost::DecodeStrategy::kDataParallel, cost::DecodeStrategy::kTensorParallel,
                 cost::DecodeStrategy::kCacheParallelGatherQkv,
                 cost::DecodeStrategy::kCacheParallelGatherPartials, cost::DecodeStrategy::kHelix})
    if (s == cost::DecodeStrategyName(k)) return k;
  throw std::invalid_argument("unknown decode strategy '" + s +
                              "'; valid: dp, tp, cp_gather_qkv, cp_gather_partials, helix");
}

// A preset by name, or a dict: {"base": preset (default "h100"), and any of the profile's
// fields} (a profile from measured figures: read bandwidth, a kernel's fraction of it).
cost::DeviceProfile DeviceFromObject(const py::object& device) {
  if (py::isinstance<py::str>(device)) return cost::FindDeviceProfile(device.cast<std::string>());
  const auto d = device.cast<py::dict>();
  cost::DeviceProfile p = cost::FindDeviceProfile(d.contains("base") ? d["base"].cast<std::string>()
                                                                     : std::string("h100"));
  const std::vector<std::pair<const char*, double*>> fields = {
      {"peak_flops", &p.peak_flops},
      {"mem_bandwidth", &p.mem_bandwidth},
      {"memory_bytes", &p.memory_bytes},
      {"link_bandwidth", &p.link_bandwidth},
      {"link_latency", &p.link_latency},
      {"kernel_overhead", &p.kernel_overhead},
      {"attention_bandwidth", &p.attention_bandwidth}};
  for (const auto& item : d) {
    const auto key = item.first.cast<std::string>();
    if (key == "base") continue;
    if (key == "name") {
      p.name = item.second.cast<std::string>();
      continue;
    }
    auto it =
        std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return key == f.first; });
    if (it == fields.end())
      throw std::invalid_argument("unknown device-profile field '" + key + "'");
    *it->second = item.second.cast<double>();
  }
  return p;
}

}  // namespace

void BindCacheParallel(py::module_& m, py::class_<passes::PassManager>& pm) {
  m.def(
      "model_decode_layer",
      [](const py::dict& layer, int world, const std::string& strategy, const py::object& device) {
        const cost::DecodeLayer l = LayerFromDict(layer);
        py::dict out = CostDict(
            cost::ModelDecodeLayer(l, world, StrategyFromName(strategy), DeviceFromObject(device)));
        out["thesis_cp_bytes"] = cost::ThesisCpBytes(l, world);
        out["thesis_tp_bytes"] = cost::ThesisTpBytes(l, world);
        return out;
      },
      py::arg("layer"), py::arg("world"), py::arg("strategy"), py::arg("device"),
      "Modelled decode step of one layer: times, bytes sent per rank, memory (dict). device: a "
      "preset name, or a dict {'base': preset, field: value} (mem_bandwidth, "
      "attention_bandwidth, link_bandwidth, ...).");

  using passes::CacheParallelOptions;
  Struct<CacheParallelOptions>(m, "CacheParallelOptions",
                               "Options of the cache_parallel pass (csrc/passes/cache_parallel.h).")
      .field("world", &CacheParallelOptions::world, "ranks sharing the cache (required)")
      .field("handle", &CacheParallelOptions::handle, "the runtime's KV cache manager")
      .field("scheme", &CacheParallelOptions::scheme, "'auto', 'gather_partials', 'gather_qkv'")
      .field("allow_batch_split", &CacheParallelOptions::allow_batch_split)
      .field("device", &CacheParallelOptions::device)
      .field("context", &CacheParallelOptions::context)
      .field("batch", &CacheParallelOptions::batch);

  using passes::CacheAttentionSite;
  Struct<CacheAttentionSite>(m, "CacheAttentionSite", "One attention node over a KV cache.")
      .field("attention_node", &CacheAttentionSite::attention_node)
      .field("cache_k", &CacheAttentionSite::cache_k)
      .field("cache_v", &CacheAttentionSite::cache_v)
      .field("causal", &CacheAttentionSite::causal)
      .field("masked", &CacheAttentionSite::masked)
      .field("indexed_write", &CacheAttentionSite::indexed_write)
      .field("grown", &CacheAttentionSite::grown)
      .field("batch", &CacheAttentionSite::batch)
      .field("q_heads", &CacheAttentionSite::q_heads)
      .field("kv_heads", &CacheAttentionSite::kv_heads)
      .field("head_dim", &CacheAttentionSite::head_dim)
      .field("capacity", &CacheAttentionSite::capacity);

  using passes::CacheParallelPlan;
  Struct<CacheParallelPlan>(m, "CacheParallelPlan",
                            "The cache_parallel pass's plan: sites, refusals and why, scheme.",
                            [](const CacheParallelPlan& p) { return p.ToString(); })
      .field("sites", &CacheParallelPlan::sites)
      .field("skipped", &CacheParallelPlan::skipped, "'node: why' per attention node left alone")
      .field("scheme", &CacheParallelPlan::scheme)
      .computed("gather_partials",
                [](const CacheParallelPlan& p) { return CostDict(p.gather_partials_cost); })
      .computed("gather_qkv",
                [](const CacheParallelPlan& p) { return CostDict(p.gather_qkv_cost); });

  pm.def(
      "plan_cache_parallel",
      [](passes::PassManager&, const ir::Graph& g, const CacheParallelOptions& o) {
        return passes::PlanCacheParallel(g, o);
      },
      py::arg("graph"), py::arg("options"),
      "The cache_parallel pass's plan for a graph, without rewriting it.");
}

}  // namespace tp::bindings
