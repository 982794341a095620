// Bindings of the cache-parallel planner and the decode cost model, as Python dicts. No LibTorch.
#include "passes/cache_parallel.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>

#include "cost/decode_model.h"

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
                 cost::DecodeStrategy::kCacheParallelGatherPartials})
    if (s == cost::DecodeStrategyName(k)) return k;
  throw std::invalid_argument("unknown decode strategy '" + s +
                              "'; valid: dp, tp, cp_gather_qkv, cp_gather_partials");
}

}  // namespace

void BindCacheParallel(py::module_& m) {
  m.def(
      "model_decode_layer",
      [](const py::dict& layer, int world, const std::string& strategy, const std::string& device) {
        const cost::DecodeLayer l = LayerFromDict(layer);
        py::dict out = CostDict(cost::ModelDecodeLayer(l, world, StrategyFromName(strategy),
                                                       cost::FindDeviceProfile(device)));
        out["thesis_cp_bytes"] = cost::ThesisCpBytes(l, world);
        out["thesis_tp_bytes"] = cost::ThesisTpBytes(l, world);
        return out;
      },
      py::arg("layer"), py::arg("world"), py::arg("strategy"), py::arg("device"),
      "Modelled decode step of one layer: times, bytes sent per rank, memory (dict).");

  m.def(
      "plan_cache_parallel",
      [](const ir::Graph& g, const std::map<std::string, std::string>& options) {
        passes::Context ctx;
        ctx.options = options;
        const auto plan =
            passes::PlanCacheParallel(g, passes::CacheParallelOptions::FromContext(ctx));
        py::list sites;
        for (const auto& s : plan.sites) {
          sites.append(py::dict(py::arg("attention_node") = s.attention_node,
                                py::arg("cache_k") = s.cache_k, py::arg("cache_v") = s.cache_v,
                                py::arg("causal") = s.causal, py::arg("batch") = s.batch,
                                py::arg("q_heads") = s.q_heads, py::arg("kv_heads") = s.kv_heads,
                                py::arg("head_dim") = s.head_dim,
                                py::arg("capacity") = s.capacity));
        }
        return py::dict(py::arg("sites") = sites, py::arg("skipped") = plan.skipped,
                        py::arg("scheme") = plan.scheme,
                        py::arg("gather_partials") = CostDict(plan.gather_partials_cost),
                        py::arg("gather_qkv") = CostDict(plan.gather_qkv_cost));
      },
      py::arg("graph"), py::arg("options"),
      "The cache_parallel pass's plan for a graph: sites, skipped nodes and why, scheme.");
}

}  // namespace tp::bindings
