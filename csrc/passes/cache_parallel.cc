// Pass: cache_parallel; see cache_parallel.h.
#include "passes/cache_parallel.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace tp::passes {
namespace {

constexpr const char* kPass = "cache_parallel";
constexpr const char* kCpOp = "torch_plugin::cp_attention.default";
constexpr const char* kPlaceholderOp = "torch_plugin::cp_cache_placeholder.default";

// One argument by schema position or keyword; nullptr when absent (the schema default).
const ir::Arg* GetArg(const ir::Node& node, size_t pos, const std::string& name) {
  if (pos < node.args.size()) return &node.args[pos];
  for (const auto& kw : node.kwargs)
    if (kw.name == name) return &kw.value;
  return nullptr;
}

bool IsNone(const ir::Arg* a) { return a == nullptr || a->kind == ir::Arg::Kind::kNone; }

std::optional<double> Number(const ir::Arg* a) {
  if (a == nullptr) return std::nullopt;
  if (a->kind == ir::Arg::Kind::kInt) return static_cast<double>(a->i);
  if (a->kind == ir::Arg::Kind::kDouble) return a->d;
  if (a->kind == ir::Arg::Kind::kBool) return a->b ? 1.0 : 0.0;
  return std::nullopt;
}

// A slice bound that is 0 (or absent, which means 0 for a start).
bool IsZeroOrNone(const ir::Arg* a) {
  if (IsNone(a)) return true;
  auto n = Number(a);
  return n && *n == 0;
}

bool IsFlag(const ir::Arg* a, bool value) {
  if (IsNone(a)) return !value;
  auto n = Number(a);
  return n && (*n != 0) == value;
}

const ir::Node* Producer(const ir::Graph& g, ir::ValueId v) {
  const ir::Value& val = g.value(v);
  return val.producer == ir::kNoNode ? nullptr : &g.node(val.producer);
}

std::optional<ir::ValueId> ValueArg(const ir::Arg* a) {
  if (a == nullptr || !a->is_value()) return std::nullopt;
  return a->value();
}

// The SDPA variants AOTAutograd produces, normalised.
struct SdpaCall {
  ir::ValueId q = -1, k = -1, v = -1;
  const ir::Arg* mask = nullptr;
  const ir::Arg* scale = nullptr;
  bool dropout = false, is_causal = false;
};

std::optional<SdpaCall> MatchSdpa(const ir::Node& n) {
  SdpaCall c;
  auto qkv = [&]() {
    auto q = ValueArg(GetArg(n, 0, "query")), k = ValueArg(GetArg(n, 1, "key")),
         v = ValueArg(GetArg(n, 2, "value"));
    if (!q || !k || !v) return false;
    c.q = *q, c.k = *k, c.v = *v;
    return true;
  };
  if (n.op == "aten::scaled_dot_product_attention.default") {
    if (!qkv()) return std::nullopt;
    c.mask = GetArg(n, 3, "attn_mask");
    c.dropout = !IsZeroOrNone(GetArg(n, 4, "dropout_p"));
    c.is_causal = IsFlag(GetArg(n, 5, "is_causal"), true);
    c.scale = GetArg(n, 6, "scale");
    return c;
  }
  if (n.op == "aten::_scaled_dot_product_flash_attention_for_cpu.default") {
    if (!qkv()) return std::nullopt;
    c.dropout = !IsZeroOrNone(GetArg(n, 3, "dropout_p"));
    c.is_causal = IsFlag(GetArg(n, 4, "is_causal"), true);
    c.mask = GetArg(n, 5, "attn_mask");
    c.scale = GetArg(n, 6, "scale");
    return c;
  }
  if (n.op == "aten::_scaled_dot_product_flash_attention.default") {
    if (!qkv()) return std::nullopt;
    c.dropout = !IsZeroOrNone(GetArg(n, 3, "dropout_p"));
    c.is_causal = IsFlag(GetArg(n, 4, "is_causal"), true);
    c.scale = GetArg(n, 6, "scale");
    return c;
  }
  if (n.op == "aten::_scaled_dot_product_efficient_attention.default") {
    if (!qkv()) return std::nullopt;
    c.mask = GetArg(n, 3, "attn_bias");
    c.dropout = !IsZeroOrNone(GetArg(n, 5, "dropout_p"));
    c.is_causal = IsFlag(GetArg(n, 6, "is_causal"), true);
    c.scale = GetArg(n, 7, "scale");
    return c;
  }
  return std::nullopt;
}

struct Slice {
  int64_t dim = 0;
  const ir::Arg* start = nullptr;
  const ir::Arg* end = nullptr;
  const ir::Node* node = nullptr;
};

// Walks `v` up through aten::slice.Tensor; returns the root value and the slices (outermost
// first). Negative dims are normalised with the slice input's rank.
ir::ValueId ThroughSlices(const ir::Graph& g, ir::ValueId v, std::vector<Slice>* slices) {
  while (const ir::Node* p = Producer(g, v)) {
    if (p->op != "aten::slice.Tensor") break;
    auto src = ValueArg(GetArg(*p, 0, "self"));
    if (!src) break;
    const ir::Arg* step = GetArg(*p, 4, "step");
    if (!IsNone(step) && Number(step) != 1.0) break;
    auto dim = Number(GetArg(*p, 1, "dim"));
    int64_t d = dim ? static_cast<int64_t>(*dim) : 0;
    const auto& t = g.type(*src);
    if (d < 0 && t.is_tensor()) d += t.tensor.rank();
    slices->push_back({d, GetArg(*p, 2, "start"), GetArg(*p, 3, "end"), p});
    v = *src;
  }
  return v;
}

// Grouped-query heads expanded for attention, as users write it: repeat_interleave(x, r, dim=1),
// or transformers' repeat_kv, view(clone(expand(unsqueeze(x, 2), [b, kv, r, s, d])), [b, kv*r,
// s, d]) (identity slices allowed). Returns x, or `v` itself when it is no such expansion; the
// expansion's nodes go to `nodes`. cp_attention takes the cache's own heads (GQA natively).
ir::ValueId PeelGqa(const ir::Graph& g, ir::ValueId v, std::set<const ir::Node*>* nodes) {
  const ir::Node* p = Producer(g, v);
  if (p == nullptr) return v;
  auto dim_is = [&](const ir::Node& n, size_t pos, int64_t want) {
    auto d = Number(GetArg(n, pos, "dim"));
    if (!d) return false;
    int64_t dd = static_cast<int64_t>(*d);
    auto in = ValueArg(GetArg(n, 0, "self"));
    if (dd < 0 && in && g.type(*in).is_tensor()) dd += g.type(*in).tensor.rank();
    return dd == want;
  };
  // Only the heads may grow: [b, kv, s, d] -> [b, kv * r, s, d].
  auto heads_only = [&](ir::ValueId src) {
    const auto &in = g.type(src), &out = g.type(v);
    if (!in.is_tensor() || !out.is_tensor() || in.tensor.rank() != 4 || out.tensor.rank() != 4)
      return false;
    for (int d : {0, 2, 3})
      if (!(in.tensor.shape[d] == out.tensor.shape[d])) return false;
    const auto kv = in.tensor.shape[1].hint(), heads = out.tensor.shape[1].hint();
    return kv && heads && *kv > 0 && *heads % *kv == 0;
  };
  if (p->op == "aten::repeat_interleave.self_int") {
    auto src = ValueArg(GetArg(*p, 0, "self"));
    if (!src || !dim_is(*p, 2, 1) || !heads_only(*src)) return v;
    nodes->insert(p);
    return *src;
  }
  if (p->op != "aten::view.default" && p->op != "aten::_unsafe_view.default" &&
      p->op != "aten::reshape.default")
    return v;
  std::set<const ir::Node*> seen = {p};
  auto cur = ValueArg(GetArg(*p, 0, "self"));
  const ir::Node* q = cur ? Producer(g, *cur) : nullptr;
  if (q != nullptr && q->op == "aten::clone.default") {
    seen.insert(q);
    cur = ValueArg(GetArg(*q, 0, "self"));
    q = cur ? Producer(g, *cur) : nullptr;
  }
  if (q == nullptr || q->op != "aten::expand.default") return v;
  seen.insert(q);
  cur = ValueArg(GetArg(*q, 0, "self"));
  q = cur ? Producer(g, *cur) : nullptr;
  // Slices that keep everything (x[:, :, None, :, :] emits some).
  while (q != nullptr && q->op == "aten::slice.Tensor" && IsZeroOrNone(GetArg(*q, 2, "start"))) {
    const ir::Arg* end = GetArg(*q, 3, "end");
    const ir::Arg* step = GetArg(*q, 4, "step");
    auto e = Number(end);
    if (!IsNone(end) && !(e && *e >= 9.2e18)) break;
    if (!IsNone(step) && Number(step) != 1.0) break;  // a strided slice drops positions
    seen.insert(q);
    cur = ValueArg(GetArg(*q, 0, "self"));
    q = cur ? Producer(g, *cur) : nullptr;
  }
  if (q == nullptr || q->op != "aten::unsqueeze.default" || !dim_is(*q, 1, 2)) return v;
  auto src = ValueArg(GetArg(*q, 0, "self"));
  if (!src) return v;
  if (!heads_only(*src)) return v;
  seen.insert(q);
  nodes->insert(seen.begin(), seen.end());
  return *src;
}

// The functionalised cache write rooted at buffer input `buffer`: `updated` is what copy_
// writes back.
struct CacheWrite {
  ir::ValueId buffer = -1, updated = -1, new_values = -1;
  // Slice writes: [start, end) args. Index writes (StaticCache's index_copy_, or
  // cache[:, :, pos] = x): the positions tensor instead, start and end null.
  ir::ValueId positions = -1;
  const ir::Arg* start = nullptr;
  const ir::Arg* end = nullptr;
  // torch.cat growth (DynamicCache-style): the cache is a forward argument `past` that the
  // step returns grown, cat([past, new], 2); the new entries start at past's length.
  bool grown = false;
  ir::Arg grown_start;
  int64_t seq_dim = -1;
  std::set<const ir::Node*> nodes;  // scatters, slices and copy of the chain
  const ir::Node* copy_back = nullptr;
};

bool ArgEq(const ir::Arg* a, const ir::Arg* b) {
  if (a == nullptr || b == nullptr) return a == b;
  return *a == *b;
}

// A slice chain of only batch prefixes (dim 0 from 0) rooted at `buffer`.
bool IsBatchPrefixOf(const ir::Graph& g, ir::ValueId v, ir::ValueId buffer,
                     std::set<const ir::Node*>* nodes) {
  std::vector<Slice> s;
  if (ThroughSlices(g, v, &s) != buffer) return false;
  for (const auto& sl : s) {
    if (sl.dim != 0 || !IsZeroOrNone(sl.start)) return false;
    nodes->insert(sl.node);
  }
  return true;
}

// An index write along the sequence of (a batch prefix of) the buffer: index_copy(x, 2, pos,
// new) or index_put(x, [None, None, pos], new) with accumulate false.
bool MatchIndexWrite(const ir::Graph& g, const ir::Node* p, CacheWrite* w, std::string* why) {
  auto self = ValueArg(GetArg(*p, 0, "self"));
  std::optional<ir::ValueId> pos, src;
  int64_t dim = -1;
  if (p->op == "aten::index_copy.default") {
    auto d = Number(GetArg(*p, 1, "dim"));
    pos = ValueArg(GetArg(*p, 2, "index"));
    src = ValueArg(GetArg(*p, 3, "source"));
    dim = d ? static_cast<int64_t>(*d) : -1;
  } else if (p->op == "aten::index_put.default") {
    const ir::Arg* indices = GetArg(*p, 1, "indices");
    src = ValueArg(GetArg(*p, 2, "values"));
    if (!IsNone(GetArg(*p, 3, "accumulate")) && !IsFlag(GetArg(*p, 3, "accumulate"), false)) {
      *why = "the cache write accumulates (index_put with accumulate=True)";
      return false;
    }
    if (indices != nullptr) {
      for (size_t i = 0; i < indices->items.size(); ++i) {
        if (IsNone(&indices->items[i])) continue;
        if (pos) return false;  // more than one indexed dim
        pos = ValueArg(&indices->items[i]), dim = static_cast<int64_t>(i);
      }
    }
  } else {
    return false;
  }
  if (dim < 0 && self) dim += g.type(*self).tensor.rank();
  if (!self || !pos || !src || dim != 2 || !IsBatchPrefixOf(g, *self, w->buffer, &w->nodes)) {
    *why = "the cache's index write is not along the sequence (dim 2) of the cache buffer";
    return false;
  }
  const auto& pt = g.type(*pos);
  if (!pt.is_tensor() || pt.tensor.rank() != 1) {
    *why = "the cache's write positions are not a 1-D tensor";
    return false;
  }
  w->nodes.insert(p);
  w->seq_dim = 2, w->positions = *pos, w->new_values = *src;
  return true;
}

// The symbol input whose expression is `expr`, as an argument; Int for a concrete size.
std::optional<ir::Arg> SizeArg(const ir::Graph& g, const ir::SymDim& d) {
  if (!d.is_symbolic()) return ir::Arg::Int(d.value);
  for (const auto& in : g.inputs()) {
    if (in.kind != ir::InputKind::kSymbol) continue;
    if (g.type(in.value).expr == d.expr) return ir::Arg::Value(in.value);
  }
  return std::nullopt;
}

// cat([past, new], 2) with past a named forward argument: the grown cache.
std::optional<CacheWrite> MatchCatGrowth(const ir::Graph& g, ir::ValueId grown,
                                         const std::set<ir::ValueId>& named_args,
                                         std::string* why) {
  const ir::Node* p = Producer(g, grown);
  if (p == nullptr || p->op != "aten::cat.default") return std::nullopt;
  const ir::Arg* list = GetArg(*p, 0, "tensors");
  auto dim = Number(GetArg(*p, 1, "dim"));
  int64_t d = dim ? static_cast<int64_t>(*dim) : 0;
  const auto& t = g.type(grown);
  if (t.is_tensor() && d < 0) d += t.tensor.rank();
  if (list == nullptr || list->items.size() != 2 || d != 2) {
    *why = "the cache grows by a cat that is not [past, new] along the sequence (dim 2)";
    return std::nullopt;
  }
  auto past = ValueArg(&list->items[0]), fresh = ValueArg(&list->items[1]);
  if (!past || !fresh || !named_args.count(*past)) {
    *why = "the cache grows by cat from something other than a forward argument (the past)";
    return std::nullopt;
  }
  const auto& pt = g.type(*past);
  auto start = pt.is_tensor() && pt.tensor.rank() == 4 ? SizeArg(g, pt.tensor.shape[2])
                                                      : std::nullopt;
  if (!start) {
    *why = "the past cache's length is not a size of the graph";
    return std::nullopt;
  }
  CacheWrite w;
  w.buffer = *past, w.updated = grown, w.new_values = *fresh, w.seq_dim = 2;
  w.grown = true, w.grown_start = *start;
  w.nodes.insert(p);
  return w;
}

bool IsIndexWrite(const ir::Node* p) {
  return p != nullptr &&
         (p->op == "aten::index_copy.default" || p->op == "aten::index_put.default");
}

std::optional<CacheWrite> UnwindWrite(const ir::Graph& g, ir::ValueId updated, ir::ValueId buffer,
                                      std::string* why) {
  CacheWrite w;
  w.buffer = buffer, w.updated = updated;
  ir::ValueId cur = updated;
  if (const ir::Node* p = Producer(g, cur); IsIndexWrite(p)) {  // the whole buffer indexed
    why->clear();
    if (MatchIndexWrite(g, p, &w, why)) return w;
    if (why->empty()) *why = "the cache's index write indexes more than the sequence";
    return std::nullopt;
  }
  for (int depth = 0; depth < 8; ++depth) {
    const ir::Node* p = Producer(g, cur);
    if (p == nullptr || p->op != "aten::slice_scatter.default") {
      *why = "the cache update is neither a slice_scatter chain nor an index_copy / index_put "
             "along the sequence (a custom write)";
      return std::nullopt;
    }
    w.nodes.insert(p);
    auto base = ValueArg(GetArg(*p, 0, "self"));
    auto src = ValueArg(GetArg(*p, 1, "src"));
    auto dim = Number(GetArg(*p, 2, "dim"));
    const ir::Arg* step = GetArg(*p, 5, "step");
    if (!base || !src || (!IsNone(step) && Number(step) != 1.0) ||
        !IsBatchPrefixOf(g, *base, buffer, &w.nodes)) {
      *why = "the cache update does not scatter into the cache buffer itself";
      return std::nullopt;
    }
    int64_t d = dim ? static_cast<int64_t>(*dim) : 0;
    if (d < 0) d += g.type(buffer).tensor.rank();
    const ir::Node* sp = Producer(g, *src);
    if (IsIndexWrite(sp)) {  // cache[:b].index_copy_(2, pos, new): a batch prefix, indexed
      why->clear();
      if (d != 0 || !IsZeroOrNone(GetArg(*p, 3, "start")) || !MatchIndexWrite(g, sp, &w, why)) {
        if (why->empty()) *why = "the cache's index write is not into a batch prefix";
        return std::nullopt;
      }
      return w;
    }
    if (sp != nullptr && sp->op == "aten::slice_scatter.default") {
      if (d != 0 || !IsZeroOrNone(GetArg(*p, 3, "start"))) {
        *why = "an outer cache scatter is not a batch prefix";
        return std::nullopt;
      }
      cur = *src;
      continue;
    }
    // The innermost scatter writes the new entries along the sequence.
    w.seq_dim = d;
    w.start = GetArg(*p, 3, "start");
    w.end = GetArg(*p, 4, "end");
    if (IsNone(w.start) || IsNone(w.end)) {
      *why = "the cache write has no explicit [start, end) range";
      return std::nullopt;
    }
    if (sp != nullptr && sp->op == "aten::copy.default") {
      auto dst = ValueArg(GetArg(*sp, 0, "self"));
      auto val = ValueArg(GetArg(*sp, 1, "src"));
      std::vector<Slice> ds;
      if (!dst || !val || ThroughSlices(g, *dst, &ds) != buffer) {
        *why = "the cache write copies into something other than the cache";
        return std::nullopt;
      }
      for (const auto& sl : ds) w.nodes.insert(sl.node);
      w.nodes.insert(sp);
      w.new_values = *val;
    } else {
      w.new_values = *src;
    }
    return w;
  }
  *why = "the cache update chain is too deep";
  return std::nullopt;
}

// The keys/values read by attention: a batch prefix of the updated cache, positions [0, end).
// Slice writes: the read must be [0, end) of the write. Index writes: any prefix [0, x) (`*end`
// is x), or the whole cache (`*end` null: its capacity), as StaticCache reads it under a mask.
bool IsReadOfWrite(const ir::Graph& g, ir::ValueId v, const CacheWrite& w,
                   std::set<const ir::Node*>* nodes, std::string* why, const ir::Arg** end) {
  std::vector<Slice> s;
  if (ThroughSlices(g, v, &s) != w.updated) {
    *why = "keys/values are not read from the updated cache";
    return false;
  }
  const bool indexed = w.positions >= 0 || w.grown;
  bool seq_read = false;
  *end = nullptr;
  for (const auto& sl : s) {
    nodes->insert(sl.node);
    if (sl.dim == 0 && IsZeroOrNone(sl.start)) continue;
    if (sl.dim == w.seq_dim && IsZeroOrNone(sl.start) && !IsNone(sl.end) &&
        (indexed || ArgEq(sl.end, w.end))) {
      seq_read = true;
      *end = sl.end;
      continue;
    }
    *why = "attention reads a cache range other than [0, end) of the written positions";
    return false;
  }
  if (!seq_read && !indexed) *why = "attention reads the whole cache, not the filled prefix";
  return seq_read || indexed;
}

bool IsScalarTensor(const ir::Graph& g, const ir::Arg* a, double value) {
  auto v = ValueArg(a);
  if (!v) return false;
  const ir::Node* p = Producer(g, *v);
  if (p == nullptr || p->op != "aten::scalar_tensor.default") return false;
  auto n = Number(GetArg(*p, 0, "s"));
  return n && (std::isinf(value) ? (std::isinf(*n) && (*n < 0) == (value < 0)) : *n == value);
}

// where(tril(ones(s, end), start), 0, -inf) or the bool tril(ones(s, end), start) itself:
// query i sits at position start + i and sees keys up to it.
bool IsOffsetCausalMask(const ir::Graph& g, ir::ValueId mask, const CacheWrite& w) {
  const ir::Node* p = Producer(g, mask);
  if (p == nullptr) return false;
  if (p->op == "aten::where.self") {
    if (!IsScalarTensor(g, GetArg(*p, 1, "self"), 0.0) ||
        !IsScalarTensor(g, GetArg(*p, 2, "other"), -INFINITY))
      return false;
    auto cond = ValueArg(GetArg(*p, 0, "condition"));
    if (!cond) return false;
    p = Producer(g, *cond);
    if (p == nullptr) return false;
  }
  if (p->op != "aten::tril.default" || !ArgEq(GetArg(*p, 1, "diagonal"), w.start)) return false;
  auto ones = ValueArg(GetArg(*p, 0, "self"));
  const ir::Node* o = ones ? Producer(g, *ones) : nullptr;
  if (o == nullptr || o->op != "aten::ones.default") return false;
  const ir::Arg* size = GetArg(*o, 0, "size");
  return size != nullptr && size->items.size() == 2 && ArgEq(&size->items[1], w.end);
}

// SDPA kernels return [B, H, s, D] laid out as [B, s, H, D] (so that transpose(1, 2).view()
// works); the replacement must return the same layout, or such a view fails.
bool SeqMajorLayout(const ir::ValueType& t) {
  if (!t.is_tensor() || t.tensor.stride.size() != 4) return false;
  const auto& st = t.tensor.stride;
  // [B, s, H, D] memory has strides (s*H*D, D, H*D, 1); contiguous [B, H, s, D] has (H*s*D,
  // s*D, D, 1). Compare hints when they differ; otherwise a symbolic stride means contiguous.
  if (st[1].value >= 0 && st[2].value >= 0 && st[1].value != st[2].value)
    return st[1].value < st[2].value;
  return !st[1].is_symbolic() && !st[2].is_symbolic() && st[1].value < st[2].value;
}

int64_t Hint(const ir::SymDim& d) { return d.value > 0 ? d.value : 1; }

std::string Join(const std::vector<std::string>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "; " : "") << v[i];
  return os.str();
}

struct Matched {
  CacheAttentionSite site;
  const ir::Node* sdpa = nullptr;
  SdpaCall call;
  CacheWrite wk, wv;
  std::optional<ir::ValueId> mask;  // a general mask, applied by cp_attention
  ir::Arg end;                      // attention reads [0, end)
};

std::vector<Matched> MatchSites(const ir::Graph& g, std::vector<std::string>* skipped) {
  const auto users = g.ComputeUsers();
  std::set<ir::ValueId> graph_outputs;
  for (ir::ValueId v : g.OutputValues()) graph_outputs.insert(v);
  // Buffers written back with copy_(buffer, updated).
  std::map<ir::ValueId, const ir::Node*> copy_back;  // updated value -> copy_ node
  // Caches are buffers, or forward arguments written in place (named by their place in the
  // call, which keys the split cache from one step's graph to the next).
  std::set<ir::ValueId> buffers;
  for (const auto& in : g.inputs())
    if (in.kind == ir::InputKind::kBuffer ||
        (in.kind == ir::InputKind::kUser && !in.source.empty()))
      buffers.insert(in.value);
  for (const auto& n : g.nodes()) {
    if (n.op != "aten::copy_.default") continue;
    auto dst = ValueArg(GetArg(n, 0, "self"));
    auto src = ValueArg(GetArg(n, 1, "src"));
    if (dst && src && buffers.count(*dst)) copy_back[*src] = &n;
  }
  std::set<ir::ValueId> named_args;  // forward arguments with a name (a cat-grown past)
  for (const auto& in : g.inputs())
    if (in.kind == ir::InputKind::kUser && !in.source.empty()) named_args.insert(in.value);
  auto source_of = [&](ir::ValueId v) {
    for (const auto& in : g.inputs())
      if (in.value == v) return in.source.empty() ? g.value(v).name : in.source;
    return g.value(v).name;
  };

  std::vector<Matched> sites;
  for (const auto& n : g.nodes()) {
    auto call = MatchSdpa(n);
    if (!call) continue;
    auto skip = [&](const std::string& why) { skipped->push_back(n.name + ": " + why); };
    // Which cache write feeds k and v?
    auto write_for = [&](ir::ValueId kv, std::string* why) -> std::optional<CacheWrite> {
      std::vector<Slice> s;
      ir::ValueId root = ThroughSlices(g, kv, &s);
      auto it = copy_back.find(root);
      if (it == copy_back.end()) {
        why->clear();
        if (auto grown = MatchCatGrowth(g, root, named_args, why)) return grown;
        if (why->empty())
          *why = "keys/values do not come from a KV-cache buffer written in this step";
        return std::nullopt;
      }
      auto dst = ValueArg(GetArg(*it->second, 0, "self"));
      auto w = UnwindWrite(g, root, *dst, why);
      if (w) w->copy_back = it->second;
      return w;
    };
    std::string why;
    std::set<const ir::Node*> gqa;  // expansions of the cache's heads to the query's
    const ir::ValueId keys = PeelGqa(g, call->k, &gqa), values = PeelGqa(g, call->v, &gqa);
    auto wk = write_for(keys, &why);
    if (!wk) {
      skip(why);
      continue;
    }
    auto wv = write_for(values, &why);
    if (!wv) {
      skip(why);
      continue;
    }
    if (wk->buffer == wv->buffer) {
      skip("keys and values share one buffer");
      continue;
    }
    const bool same_positions =
        // (a cat-grown past_k and past_v have a length symbol each; SDPA makes them equal)
        wk->grown ? wv->grown
        : wk->positions >= 0
            ? wk->positions == wv->positions
            : wv->positions < 0 && !wv->grown && ArgEq(wk->start, wv->start) &&
                  ArgEq(wk->end, wv->end);
    if (!same_positions) {
      skip("keys and values are written at different positions");
      continue;
    }
    const auto &bt = g.type(wk->buffer), &qt = g.type(call->q), &nt = g.type(wk->new_values);
    if (!bt.is_tensor() || bt.tensor.rank() != 4 || wk->seq_dim != 2 || !qt.is_tensor() ||
        qt.tensor.rank() != 4 || !nt.is_tensor() || nt.tensor.rank() != 4) {
      skip("the cache layout is not [batch, heads, seq, head_dim] with 4-D q/k/v");
      continue;
    }
    if (call->dropout) {
      skip("attention has dropout");
      continue;
    }
    if (call->is_causal) {
      skip("is_causal=True over a cache aligns the mask top-left, which is not decoding");
      continue;
    }
    bool causal = false;
    std::optional<ir::ValueId> general_mask;
    if (!IsNone(call->mask)) {
      auto mv = ValueArg(call->mask);
      if (mv && wk->positions < 0 && IsOffsetCausalMask(g, *mv, *wk)) {
        causal = true;
      } else if (mv && g.type(*mv).is_tensor() && g.type(*mv).tensor.rank() >= 2 &&
                 g.type(*mv).tensor.rank() <= 4) {
        // Padding, sliding windows, StaticCache's causal mask over the whole cache: applied
        // as given, each rank taking the columns of the positions it holds.
        general_mask = *mv;
      } else {
        skip("the attention mask is not a tensor [..., queries, keys]");
        continue;
      }
    }
    // Everything reading the updated caches must be this attention (or the copy_ back).
    std::set<const ir::Node*> chain = gqa;
    const ir::Arg *k_end = nullptr, *v_end = nullptr;
    if (!IsReadOfWrite(g, keys, *wk, &chain, &why, &k_end) ||
        !IsReadOfWrite(g, values, *wv, &chain, &why, &v_end)) {
      skip(why);
      continue;
    }
    if (!ArgEq(k_end, v_end)) {
      skip("keys and values are read over different ranges");
      continue;
    }
    // A grown cache is returned by the step (a placeholder replaces it there).
    bool private_use = wk->grown || (!graph_outputs.count(wk->updated) &&
                                     !graph_outputs.count(wv->updated));
    for (const ir::Node* c : chain)
      for (ir::ValueId out : c->outputs) private_use = private_use && !graph_outputs.count(out);
    for (const CacheWrite* w : {&*wk, &*wv}) {
      for (ir::NodeId u : users[static_cast<size_t>(w->updated)]) {
        const ir::Node* un = &g.node(u);
        if (un != w->copy_back && un != &n && !chain.count(un)) private_use = false;
      }
      for (const ir::Node* c : chain)
        for (ir::ValueId out : c->outputs)
          for (ir::NodeId u : users[static_cast<size_t>(out)])
            if (&g.node(u) != &n && !chain.count(&g.node(u))) private_use = false;
    }
    if (!private_use) {
      skip("the updated cache is also used outside this attention");
      continue;
    }
    if (n.tuple_output) {
      for (size_t i = 1; i < n.outputs.size(); ++i)
        if (!users[static_cast<size_t>(n.outputs[i])].empty()) private_use = false;
      if (!private_use) {
        skip("attention's log-sum-exp output is used");
        continue;
      }
    }
    Matched m;
    m.sdpa = &n, m.call = *call, m.wk = *wk, m.wv = *wv;
    m.mask = general_mask;
    m.end = wk->grown         ? ir::Arg::Int(-1)  // start + the new entries, at run time
            : k_end != nullptr ? *k_end
                               : ir::Arg::Int(Hint(bt.tensor.shape[2]));
    m.site.attention_node = n.name;
    m.site.masked = general_mask.has_value();
    m.site.indexed_write = wk->positions >= 0;
    m.site.grown = wk->grown;
    m.site.cache_k = source_of(wk->buffer);
    m.site.cache_v = source_of(wv->buffer);
    m.site.causal = causal;
    m.site.batch = Hint(qt.tensor.shape[0]);
    m.site.q_heads = Hint(qt.tensor.shape[1]);
    m.site.head_dim = Hint(qt.tensor.shape[3]);
    m.site.kv_heads = Hint(bt.tensor.shape[1]);
    m.site.capacity = Hint(bt.tensor.shape[2]);
    sites.push_back(std::move(m));
  }
  return sites;
}

}  // namespace

namespace {

// The plan, and the matched sites it was made from (the rewrite needs their nodes).
CacheParallelPlan PlanWithMatches(const ir::Graph& graph, const CacheParallelOptions& o,
                                  std::vector<Matched>* matched) {
  if (o.world < 1) {
    throw PassError(kPass, "", "needs the number of ranks sharing the KV cache",
                    "use torch_plugin.cache_parallel(model, mesh) or compile with "
                    "options={'passes': ['cache_parallel'], 'mesh': mesh}");
  }
  if (o.scheme != "auto" && o.scheme != "gather_partials" && o.scheme != "gather_qkv") {
    throw PassError(kPass, "", "unknown scheme '" + o.scheme + "'",
                    "valid: auto, gather_partials, gather_qkv");
  }
  if (o.scheme == "gather_qkv" && !o.allow_batch_split) {
    throw PassError(kPass, "", "scheme 'gather_qkv' runs the rest of the model data parallel",
                    "use torch_plugin.cache_parallel(model, mesh), which splits the batch, or "
                    "scheme 'gather_partials'");
  }
  const cost::DeviceProfile* device = nullptr;
  try {
    device = &cost::FindDeviceProfile(o.device);
  } catch (const std::invalid_argument& e) {
    throw PassError(kPass, "", e.what());
  }
  CacheParallelPlan plan;
  *matched = MatchSites(graph, &plan.skipped);
  for (const auto& m : *matched) plan.sites.push_back(m.site);
  if (plan.sites.empty()) return plan;

  // The per-layer shape for the decision: attention from the first site, the rest of the
  // weights (FFN, projections, embeddings) spread evenly over the attention layers.
  const auto& s = plan.sites.front();
  cost::DecodeLayer& l = plan.layer;
  l.batch = o.batch > 0 ? o.batch : s.batch;
  l.context = o.context > 0 ? o.context : s.capacity;
  l.q_heads = s.q_heads, l.kv_heads = s.kv_heads, l.head_dim = s.head_dim;
  l.hidden = s.q_heads * s.head_dim;
  l.layers = static_cast<int64_t>(plan.sites.size());
  double param_elems = 0;
  for (const auto& in : graph.inputs()) {
    if (in.kind != ir::InputKind::kParameter) continue;
    auto n = graph.type(in.value).tensor.NumelHint();
    if (n) param_elems += static_cast<double>(*n);
    l.dtype_bytes = ir::ItemSize(graph.type(in.value).tensor.dtype);
  }
  const double per_layer = param_elems / static_cast<double>(l.layers);
  const double attn = 2.0 * l.hidden * (l.q_heads + l.kv_heads) * l.head_dim;
  l.ffn_hidden = static_cast<int64_t>(std::max(0.0, (per_layer - attn) / (3.0 * l.hidden)));

  plan.gather_partials_cost = cost::ModelDecodeLayer(
      l, o.world, cost::DecodeStrategy::kCacheParallelGatherPartials, *device);
  plan.gather_qkv_cost =
      cost::ModelDecodeLayer(l, o.world, cost::DecodeStrategy::kCacheParallelGatherQkv, *device);
  const bool qkv_possible = o.allow_batch_split && l.batch % o.world == 0;
  if (o.scheme == "gather_qkv" && l.batch % o.world != 0) {
    throw PassError(kPass, s.attention_node,
                    "scheme 'gather_qkv' needs the batch (" + std::to_string(l.batch) +
                        ") divisible by the ranks (" + std::to_string(o.world) + ")",
                    "use scheme 'gather_partials' or 'auto'");
  }
  if (o.scheme != "auto") {
    plan.scheme = o.scheme;
  } else {
    plan.scheme = qkv_possible && plan.gather_qkv_cost.total_s < plan.gather_partials_cost.total_s
                      ? "gather_qkv"
                      : "gather_partials";
  }
  return plan;
}

}  // namespace

CacheParallelPlan PlanCacheParallel(const ir::Graph& graph, const CacheParallelOptions& o) {
  std::vector<Matched> matched;
  return PlanWithMatches(graph, o, &matched);
}

PassResult CacheParallel(const ir::Graph& graph, const CacheParallelOptions& o, Context& ctx) {
  std::vector<Matched> matched;
  CacheParallelPlan plan = PlanWithMatches(graph, o, &matched);
  PassResult result;
  for (const auto& why : plan.skipped) ctx.Log("cache_parallel: left alone " + why);
  if (plan.sites.empty()) {
    result.graph = graph;
    result.notes.push_back(plan.skipped.empty() ? "no decode attention over a KV cache found"
                                                : "no site rewritten: " + Join(plan.skipped));
    return result;
  }
  std::map<const ir::Node*, const Matched*> by_sdpa;
  std::set<const ir::Node*> drop;  // the copy_ back of every rewritten cache
  for (const auto& m : matched) {
    by_sdpa[m.sdpa] = &m;
    drop.insert(m.wk.copy_back);
    drop.insert(m.wv.copy_back);
  }

  ir::GraphBuilder b;
  std::vector<ir::ValueId> remap = b.CopyInputs(graph);
  for (const auto& n : graph.nodes()) {
    if (drop.count(&n)) continue;
    auto it = by_sdpa.find(&n);
    if (it != by_sdpa.end()) {
      const Matched& m = *it->second;
      ir::NodeSpec spec;
      const ir::Value& out = graph.value(n.outputs[0]);
      spec.name = out.name.empty() ? n.name : out.name;
      spec.op = kCpOp;
      const double scale = Number(m.call.scale).value_or(0.0);
      spec.args = {ir::Arg::Value(m.call.q),
                   ir::Arg::Value(m.wk.new_values),
                   ir::Arg::Value(m.wv.new_values),
                   m.wk.grown             ? m.wk.grown_start
                   : m.wk.start != nullptr ? *m.wk.start
                                           : ir::Arg::Int(-1),
                   m.end,
                   ir::Arg::Bool(m.site.causal),
                   ir::Arg::Double(scale),
                   ir::Arg::String(m.site.cache_k),
                   ir::Arg::String(m.site.cache_v),
                   ir::Arg::Int(m.wk.grown ? -1 : m.site.capacity),  // -1: grows
                   ir::Arg::Int(o.handle),
                   ir::Arg::String(plan.scheme),
                   ir::Arg::Bool(SeqMajorLayout(out.type)),
                   m.mask ? ir::Arg::Value(*m.mask) : ir::Arg::None(),
                   m.wk.positions >= 0 ? ir::Arg::Value(m.wk.positions) : ir::Arg::None()};
      for (auto& a : spec.args) a = a.Remap(remap);
      spec.output_types = {out.type};
      spec.output_names = {spec.name};
      spec.scope = n.scope;
      spec.attrs = n.attrs;
      spec.attrs["cache_parallel.replaces"] = n.name;
      const ir::NodeId id = b.AddNode(std::move(spec));
      remap[static_cast<size_t>(n.outputs[0])] = b.peek().node(id).outputs[0];
      continue;
    }
    b.CopyNode(graph, n, &remap);
  }
  // A grown cache the step returns becomes a placeholder of its shape (zeros broadcast from one
  // element: no memory), which the next step passes back; the ranks hold the split cache.
  for (const auto& m : matched) {
    for (const CacheWrite* w : {&m.wk, &m.wv}) {
      if (!w->grown) continue;
      ir::NodeSpec spec;
      spec.name = graph.value(w->updated).name + "_placeholder";
      spec.op = kPlaceholderOp;
      spec.args = {ir::Arg::Value(w->new_values), w->grown_start};
      for (auto& a : spec.args) a = a.Remap(remap);
      spec.output_types = {graph.type(w->updated)};
      spec.output_names = {spec.name};
      const ir::NodeId id = b.AddNode(std::move(spec));
      remap[static_cast<size_t>(w->updated)] = b.peek().node(id).outputs[0];
    }
  }
  b.SetOutput(graph.output().Remap(remap));
  // The scatter chains, slices and masks are dead now.
  ir::Graph rewritten = b.Build();
  PassResult dce = DeadCodeElimination(rewritten, ctx);
  result.graph = std::move(dce.graph);
  result.changed = true;
  std::ostringstream note;
  note << "rewrote " << plan.sites.size() << " attention node(s) over KV caches for " << o.world
       << " rank(s), scheme " << plan.scheme << " (modelled per layer: "
       << "gather_partials " << plan.gather_partials_cost.total_s * 1e6 << " us, gather_qkv "
       << (plan.gather_qkv_cost.valid ? std::to_string(plan.gather_qkv_cost.total_s * 1e6) + " us"
                                      : std::string("n/a"))
       << ")";
  result.notes.push_back(note.str());
  ctx.Log(note.str());
  return result;
}

}  // namespace tp::passes

namespace tp::passes {

std::string CacheParallelPlan::ToString() const {
  std::ostringstream os;
  os << "cache_parallel plan: " << sites.size() << " site(s), scheme "
     << (scheme.empty() ? "-" : scheme) << "\n";
  for (const auto& s : sites) {
    os << "  site " << s.attention_node << ": caches " << s.cache_k << ", " << s.cache_v
       << (s.causal ? ", causal" : "") << (s.masked ? ", masked" : "")
       << (s.indexed_write ? ", index write" : "") << (s.grown ? ", grown by cat" : "")
       << ", batch " << s.batch << ", heads "
       << s.q_heads << "/" << s.kv_heads << ", head_dim " << s.head_dim << ", capacity "
       << s.capacity << "\n";
  }
  for (const auto& s : skipped) os << "  skipped " << s << "\n";
  if (!sites.empty()) {
    os << "  modelled per layer: gather_partials " << gather_partials_cost.total_s * 1e6
       << " us";
    if (gather_qkv_cost.valid) os << ", gather_qkv " << gather_qkv_cost.total_s * 1e6 << " us";
    os << "\n";
  }
  return os.str();
}

}  // namespace tp::passes
