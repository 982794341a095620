// Pass: cache_parallel (issue 7).
//
// Finds decode attention over a KV cache in an ATen graph and rewrites it for a KV cache split
// along the sequence over `world` ranks. The pattern, as AOTAutograd functionalises
// `cache[:b, :, start:end] = k; keys = cache[:b, :, :end]; sdpa(q, keys, values, mask)`:
//
//   upd  = slice_scatter(cache, slice_scatter(slice(cache), copy(slice(..), k_new), 2, st, en))
//   keys = slice(slice(upd, 0, 0, b), 2, 0, en)       -> sdpa(q, keys, values, attn_mask=M)
//   copy_(cache, upd)                                 (the buffer mutation, at the end)
//
// with M absent or the offset-causal mask where(tril(ones(s, en), st), 0, -inf). Each match
// becomes one `torch_plugin::cp_attention` node that appends k_new/v_new to the rank-local
// cache shard (torch_plugin/runtime/kv_cache.py), computes split-KV attention over it and
// merges the partials of all ranks; the cache write, the copy_ back and the mask die. A
// candidate that deviates anywhere (other readers of the cache, another mask, dropout, a cache
// layout other than [batch, heads, seq, head_dim]) is left alone with a note saying why.
//
// The communication scheme is chosen by cost/decode_model.h: all-gather of partials (the rest
// of the model replicated) or the thesis's all-gather q/k/v + all-to-all (rest data parallel
// over the batch, possible only when the runtime may split the batch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cost/decode_model.h"
#include "passes/pass.h"

namespace tp::passes {

struct CacheParallelOptions {
  int world = 0;                   // ranks sharing the cache; required (>= 1)
  int64_t handle = 0;              // the runtime's KV cache manager
  std::string scheme = "auto";     // "auto" | "gather_partials" | "gather_qkv"
  bool allow_batch_split = false;  // the runtime can run the rest data parallel
  std::string device = "cpu";      // profile for the cost model
  int64_t context = 0;             // expected KV length for the decision; 0: cache capacity
  int64_t batch = 0;               // global batch for the decision; 0: the traced batch
};

struct CacheAttentionSite {
  std::string attention_node;    // the SDPA node replaced
  std::string cache_k, cache_v;  // buffer sources
  bool causal = false;           // offset-causal mask (prefill-capable) vs all keys < end
  bool masked = false;           // a general mask (padding, window) passed to cp_attention
  bool indexed_write = false;    // written by index_copy / index_put at a positions tensor
  bool grown = false;            // cat([past, new]) of a forward argument, returned grown
  int64_t batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0, capacity = 0;
};

struct CacheParallelPlan {
  std::vector<CacheAttentionSite> sites;
  std::vector<std::string> skipped;  // "node: why" for attention nodes left alone
  std::string scheme;                // chosen: "gather_partials" or "gather_qkv"
  cost::DecodeCost gather_partials_cost, gather_qkv_cost;  // per layer, modelled
  cost::DecodeLayer layer;                                 // the shape the model was fed

  // Sites, refusals and the modelled costs, one per line (repr, golden files).
  std::string ToString() const;
};

CacheParallelPlan PlanCacheParallel(const ir::Graph& graph, const CacheParallelOptions& options);

// Rewrites every site of the plan; the graph is unchanged when there is none.
PassResult CacheParallel(const ir::Graph& graph, const CacheParallelOptions& options, Context& ctx);

}  // namespace tp::passes
