#include "ir/sharding.h"

#include <algorithm>
#include <functional>

#include "ir/op_registry.h"

namespace tp::ir {
namespace {

using S = ShardSpec;

int64_t Size(const TensorType& t, int d) {
  const auto& s = t.shape[static_cast<size_t>(d)];
  return s.value > 0 ? s.value : -1;  // symbolic without hint: unknown
}

bool Divisible(const TensorType& t, int d, int world) {
  const int64_t n = Size(t, d);
  return n > 0 && n % world == 0;
}

const TensorType* TensorOf(const Graph& g, ValueId v) {
  const auto& t = g.type(v);
  return t.is_tensor() ? &t.tensor : nullptr;
}

ShardStrategy Replicated(const Graph& g, const Node& n) {
  ShardStrategy s;
  s.name = "replicate";
  s.inputs.assign(TensorInputs(g, n).size(), S::R());
  s.outputs.assign(n.outputs.size(), S::R());
  return s;
}

int64_t Prefix(const TensorType& t, int d) {
  int64_t p = 1;
  for (int i = 0; i < d; ++i) {
    const int64_t s = Size(t, i);
    // Unknown, or past int64 (sizes come from outside): no prefix to match.
    if (s < 0 || __builtin_mul_overflow(p, s, &p)) return -1;
  }
  return p;
}

// Where a Shard(d) of `in` lands in `out` when only the shape changes (view, reshape): the dim
// with the same prefix product whose size equals d's, merges d with later dims, or is d's
// leading factor. Block sharding of the leading factor equals block sharding of the whole.
int MapDimThroughReshape(const TensorType& in, const TensorType& out, int d, int world) {
  const int64_t p = Prefix(in, d), s = Size(in, d);
  if (p < 0 || s <= 0) return -1;
  for (int o = 0; o < out.rank(); ++o) {
    if (Prefix(out, o) != p) continue;
    const int64_t so = Size(out, o);
    if (so <= 0) return -1;
    if (so == s) return o;
    if (so > s && so % s == 0 && s % world == 0) return o;   // d merged with later dims
    if (so < s && s % so == 0 && so % world == 0) return o;  // d split; o is its leading part
  }
  return -1;
}

bool IsOp(const Node& n, const char* op) { return n.op == op; }

void AddMatmulStrategies(const Graph& g, const Node& n, int world,
                         std::vector<ShardStrategy>* out) {
  // mm(a [M, K], b [K, N]); addmm(bias [N] or [M, N], a, b).
  const bool addmm = IsOp(n, "aten::addmm.default");
  auto ins = TensorInputs(g, n);
  if (ins.size() != (addmm ? 3u : 2u)) return;
  const TensorType* a = TensorOf(g, ins[addmm ? 1 : 0]);
  const TensorType* b = TensorOf(g, ins[addmm ? 2 : 1]);
  if (a == nullptr || b == nullptr || a->rank() != 2 || b->rank() != 2) return;
  const TensorType* bias = addmm ? TensorOf(g, ins[0]) : nullptr;
  const double f = 1.0 / world;
  auto with_bias = [&](S bias_spec, S as, S bs, S o, const char* name) {
    ShardStrategy s;
    s.name = name;
    if (addmm) s.inputs.push_back(bias_spec);
    s.inputs.push_back(as);
    s.inputs.push_back(bs);
    s.outputs = {o};
    s.compute_fraction = f;
    out->push_back(s);
  };
  const bool bias_1d = bias != nullptr && bias->rank() == 1;
  if (Divisible(*a, 0, world)) {  // rows: a split by rows, b replicated
    S bias_spec = bias == nullptr ? S::R() : (bias_1d ? S::R() : S::S(0));
    with_bias(bias_spec, S::S(0), S::R(), S::S(0), "row");
  }
  if (Divisible(*b, 1, world)) {  // columns (Megatron column-parallel)
    S bias_spec = bias == nullptr ? S::R() : S::S(bias_1d ? 0 : 1);
    with_bias(bias_spec, S::R(), S::S(1), S::S(1), "col");
  }
  for (int n : kStridedSections) {  // columns of a packed weight, each part split
    if (!Divisible(*b, 1, world * n)) continue;
    S bias_spec = bias == nullptr ? S::R() : S::S(bias_1d ? 0 : 1, n);
    with_bias(bias_spec, S::R(), S::S(1, n), S::S(1, n), n == 2 ? "col_packed2" : "col_packed3");
  }
  if (Divisible(*a, 1, world)) {  // contraction (Megatron row-parallel): partial sums
    with_bias(S::P(), S::S(1), S::S(0), S::P(), "inner");
  }
}

void AddElementwiseStrategies(const Graph& g, const Node& n, int world,
                              std::vector<ShardStrategy>* out) {
  if (n.outputs.size() != 1) return;
  const TensorType* o = TensorOf(g, n.outputs[0]);
  if (o == nullptr) return;
  auto ins = TensorInputs(g, n);
  // tril/triu index their last two dims: a slice of those is a different matrix.
  const bool matrix_op = IsOp(n, "aten::tril.default") || IsOp(n, "aten::triu.default");
  const int limit = static_cast<int>(o->rank()) - (matrix_op ? 2 : 0);
  for (int d = 0; d < limit; ++d) {
    if (!Divisible(*o, d, world)) continue;
    ShardStrategy s;
    s.name = "dim" + std::to_string(d);
    s.compute_fraction = 1.0 / world;
    bool some_input_sharded = false;
    for (ValueId v : ins) {
      const TensorType* t = TensorOf(g, v);
      const int di = t == nullptr ? -1 : d - static_cast<int>(o->rank() - t->rank());
      // A broadcast (size-1 or missing) dim stays replicated.
      const bool split = di >= 0 && Size(*t, di) == Size(*o, d);
      s.inputs.push_back(split ? S::S(di) : S::R());
      some_input_sharded = some_input_sharded || split;
    }
    // An op whose output is not split by any input's split (a factory, a pure broadcast) would
    // produce the whole tensor on every rank.
    if (!some_input_sharded) continue;
    s.outputs = {S::S(d)};
    out->push_back(s);
  }
  // Partial passes through sums and through products with one replicated factor.
  const std::string base = n.op.substr(0, n.op.find('.'));
  if ((base == "aten::add" || base == "aten::sub") && ins.size() == 2) {
    out->push_back({"partial", {S::P(), S::P()}, {S::P()}, 1.0});
  } else if ((base == "aten::mul" || base == "aten::div") && !ins.empty()) {
    ShardStrategy s{"partial", {}, {S::P()}, 1.0};
    for (size_t i = 0; i < ins.size(); ++i) s.inputs.push_back(i == 0 ? S::P() : S::R());
    out->push_back(s);
  } else if (base == "aten::neg" && ins.size() == 1) {
    out->push_back({"partial", {S::P()}, {S::P()}, 1.0});
  }
}

// Shard every tensor (inputs and outputs) along the same leading dim d < `limit`.
void AddSameDimStrategies(const Graph& g, const Node& n, int world, int limit, const char* name,
                          std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  if (ins.empty()) return;
  const TensorType* first = TensorOf(g, ins[0]);
  if (first == nullptr) return;
  for (int d = 0; d < std::min<int>(limit, static_cast<int>(first->rank())); ++d) {
    bool ok = true;
    ShardStrategy s;
    s.name = std::string(name) + std::to_string(d);
    s.compute_fraction = 1.0 / world;
    for (ValueId v : ins) {
      const TensorType* t = TensorOf(g, v);
      if (t != nullptr && t->rank() == first->rank() && Size(*t, d) == 1 && Size(*first, d) != 1) {
        s.inputs.push_back(S::R());  // broadcast along d (an attention mask over heads)
      } else if (t != nullptr && t->rank() == first->rank()) {
        ok = ok && Divisible(*t, d, world);
        s.inputs.push_back(S::S(d));
      } else {
        s.inputs.push_back(S::R());  // weights of a norm, masks of other rank, scalars
      }
    }
    for (ValueId v : n.outputs) {
      const TensorType* t = TensorOf(g, v);
      if (t != nullptr && t->rank() > d) {
        ok = ok && Divisible(*t, d, world);
        s.outputs.push_back(S::S(d));
      } else {
        s.outputs.push_back(S::R());
      }
    }
    if (ok) out->push_back(s);
  }
}

int64_t IntArg(const Node& n, size_t pos, int64_t fallback) {
  if (pos < n.args.size() && n.args[pos].kind == Arg::Kind::kInt) return n.args[pos].i;
  return fallback;
}

// split(x, size or sizes, dim): any other dim passes through to every part; a dim strided into
// as many equal parts as the split makes yields plain Shard(dim) parts (the packed-QKV case).
void AddSplitStrategies(const Graph& g, const Node& n, int world, std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  if (ins.size() != 1) return;
  const TensorType* t = TensorOf(g, ins[0]);
  if (t == nullptr) return;
  int64_t dim = IntArg(n, 2, 0);
  if (dim < 0) dim += t->rank();
  const size_t parts = n.outputs.size();
  for (int d = 0; d < t->rank(); ++d) {
    if (d == dim || !Divisible(*t, d, world)) continue;
    out->push_back(
        {"dim" + std::to_string(d), {S::S(d)}, std::vector<ShardSpec>(parts, S::S(d)), 1.0});
  }
  bool equal = parts > 1;
  for (ValueId v : n.outputs) {
    const TensorType* o = TensorOf(g, v);
    equal = equal && o != nullptr && Size(*o, static_cast<int>(dim)) > 0 &&
            Size(*o, static_cast<int>(dim)) * static_cast<int64_t>(parts) ==
                Size(*t, static_cast<int>(dim));
  }
  if (equal && Divisible(*t, static_cast<int>(dim), world * static_cast<int>(parts))) {
    const int d = static_cast<int>(dim);
    out->push_back({"packed",
                    {S::S(d, static_cast<int>(parts))},
                    std::vector<ShardSpec>(parts, S::S(d)),
                    1.0});
  }
  out->push_back({"partial", {S::P()}, std::vector<ShardSpec>(parts, S::P()), 1.0});
}

// sum / mean / amax over `dims` (keepdim or not): a split dim that is kept stays split (moved
// left past the dims reduced before it); a split dim that is summed gives partial sums (sum
// only: a local mean or max of a block is not a summand of the whole's). Partial inputs stay
// partial through the linear ones (sum, mean).
void AddReductionStrategies(const Graph& g, const Node& n, int world,
                            std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  if (ins.size() != 1 || n.outputs.size() != 1) return;
  const TensorType* t = TensorOf(g, ins[0]);
  if (t == nullptr) return;
  const std::string base = n.op.substr(0, n.op.find('.'));
  const bool full = n.op == "aten::sum.default" || n.op == "aten::mean.default";
  std::vector<bool> reduced(static_cast<size_t>(t->rank()), full);
  bool keepdim = false;
  if (!full) {
    if (n.args.size() < 2) return;
    const Arg& dims = n.args[1];
    std::vector<int64_t> ds;
    if (dims.kind == Arg::Kind::kInt) ds.push_back(dims.i);
    for (const auto& item : dims.items) {
      if (item.kind != Arg::Kind::kInt) return;
      ds.push_back(item.i);
    }
    if (dims.kind == Arg::Kind::kNone || (dims.kind == Arg::Kind::kList && ds.empty()))
      reduced.assign(reduced.size(), true);
    for (int64_t d : ds) {
      if (d < 0) d += t->rank();
      if (d < 0 || d >= t->rank()) return;
      reduced[static_cast<size_t>(d)] = true;
    }
    keepdim = n.args.size() > 2 && n.args[2].kind == Arg::Kind::kBool && n.args[2].b;
  }
  const bool linear = base == "aten::sum" || base == "aten::mean";
  int removed = 0;
  for (int d = 0; d < t->rank(); ++d) {
    if (reduced[static_cast<size_t>(d)]) {
      if (base == "aten::sum" && Divisible(*t, d, world))
        out->push_back({"reduce_dim" + std::to_string(d), {S::S(d)}, {S::P()}, 1.0 / world});
      ++removed;
      continue;
    }
    if (Divisible(*t, d, world)) {
      const int od = keepdim ? d : d - removed;
      out->push_back({"dim" + std::to_string(d), {S::S(d)}, {S::S(od)}, 1.0 / world});
    }
  }
  if (linear) out->push_back({"partial", {S::P()}, {S::P()}, 1.0});
}

// cat(tensors, dim): every part split alike along another dim; partial parts stay partial.
void AddCatStrategies(const Graph& g, const Node& n, int world, std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  const TensorType* o = n.outputs.size() == 1 ? TensorOf(g, n.outputs[0]) : nullptr;
  if (ins.empty() || o == nullptr) return;
  int64_t dim = IntArg(n, 1, 0);
  if (dim < 0) dim += o->rank();
  for (int d = 0; d < o->rank(); ++d) {
    if (d == dim) continue;
    bool ok = Divisible(*o, d, world);
    for (ValueId v : ins) {
      const TensorType* t = TensorOf(g, v);
      ok = ok && t != nullptr && t->rank() == o->rank() && Divisible(*t, d, world);
    }
    if (ok)
      out->push_back({"dim" + std::to_string(d),
                      std::vector<ShardSpec>(ins.size(), S::S(d)),
                      {S::S(d)},
                      1.0 / world});
  }
  out->push_back({"partial", std::vector<ShardSpec>(ins.size(), S::P()), {S::P()}, 1.0});
}

// convolution(x, w, bias?, stride, padding, dilation, transposed, output_padding, groups), plain
// (not transposed, one group): by batch, by output channels (w's rows), or by input channels
// (partial sums; the bias joins once, as a zero-padded partial).
void AddConvStrategies(const Graph& g, const Node& n, int world, std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  if (ins.size() < 2 || ins.size() > 3 || n.args.size() != 9) return;
  if (n.args[6].kind != Arg::Kind::kBool || n.args[6].b) return;      // transposed
  if (n.args[8].kind != Arg::Kind::kInt || n.args[8].i != 1) return;  // groups
  const TensorType* x = TensorOf(g, ins[0]);
  const TensorType* w = TensorOf(g, ins[1]);
  if (x == nullptr || w == nullptr || x->rank() < 3 || w->rank() != x->rank()) return;
  const bool bias = ins.size() == 3;
  const double f = 1.0 / world;
  auto add = [&](const char* name, S xs, S ws, S bs, S o) {
    ShardStrategy st{name, {xs, ws}, {o}, f};
    if (bias) st.inputs.push_back(bs);
    out->push_back(st);
  };
  if (Divisible(*x, 0, world)) add("batch", S::S(0), S::R(), S::R(), S::S(0));
  if (Divisible(*w, 0, world)) add("out_channels", S::R(), S::S(0), S::S(0), S::S(1));
  if (Divisible(*w, 1, world)) add("in_channels", S::S(1), S::S(1), S::P(), S::P());
}

// bmm(a [b, m, k], c [b, k, n]): by batch, by a's rows, by c's columns, or by the contraction.
void AddBmmStrategies(const Graph& g, const Node& n, int world, std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  if (ins.size() != 2) return;
  const TensorType* a = TensorOf(g, ins[0]);
  const TensorType* c = TensorOf(g, ins[1]);
  if (a == nullptr || c == nullptr || a->rank() != 3 || c->rank() != 3) return;
  const double f = 1.0 / world;
  if (Divisible(*a, 0, world)) out->push_back({"batch", {S::S(0), S::S(0)}, {S::S(0)}, f});
  if (Divisible(*a, 1, world)) out->push_back({"row", {S::S(1), S::R()}, {S::S(1)}, f});
  if (Divisible(*c, 2, world)) out->push_back({"col", {S::R(), S::S(2)}, {S::S(2)}, f});
  if (Divisible(*a, 2, world)) out->push_back({"inner", {S::S(2), S::S(1)}, {S::P()}, f});
}

// embedding(weight [V, E], indices [...]): split the lookups (any indices dim), the feature
// dim E, or the vocabulary V (Megatron's vocabulary-parallel embedding: each rank looks up the
// indices in its rows and writes zeros for the others, so the output is a partial sum; the
// materialiser emits torch_plugin::vocab_embedding, which shifts and masks the indices). Every
// rank writes the whole output then, so its compute is not divided.
void AddEmbeddingStrategies(const Graph& g, const Node& n, int world,
                            std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  if (ins.size() != 2) return;
  const TensorType* w = TensorOf(g, ins[0]);
  const TensorType* idx = TensorOf(g, ins[1]);
  if (w == nullptr || idx == nullptr || w->rank() != 2) return;
  const double f = 1.0 / world;
  for (int d = 0; d < idx->rank(); ++d)
    if (Divisible(*idx, d, world))
      out->push_back({"lookups" + std::to_string(d), {S::R(), S::S(d)}, {S::S(d)}, f});
  if (Divisible(*w, 1, world))
    out->push_back({"features", {S::S(1), S::R()}, {S::S(static_cast<int>(idx->rank()))}, f});
  if (Divisible(*w, 0, world) && world > 1)
    out->push_back({"vocab", {S::S(0), S::R()}, {S::P()}, 1.0});
}

// Ops that move (or keep) the one input's dims without touching values: a split of input dim d
// is a split of output dim map(d) (map < 0: none), and partial sums stay partial.
void AddDimMapStrategies(const Graph& g, const Node& n, int world,
                         const std::function<int(int)>& map, double compute_fraction,
                         std::vector<ShardStrategy>* out) {
  auto ins = TensorInputs(g, n);
  if (ins.size() != 1 || n.outputs.size() != 1) return;
  const TensorType* t = TensorOf(g, ins[0]);
  if (t == nullptr) return;
  for (int d = 0; d < t->rank(); ++d) {
    const int od = map(d);
    if (od >= 0 && Divisible(*t, d, world))
      out->push_back({"dim" + std::to_string(d), {S::S(d)}, {S::S(od)}, compute_fraction});
  }
  out->push_back({"partial", {S::P()}, {S::P()}, 1.0});
}

}  // namespace

std::string ShardSpec::ToString() const {
  switch (kind) {
    case Kind::kReplicate:
      return "R";
    case Kind::kPartial:
      return "P";
    case Kind::kShard:
      return "S(" + std::to_string(dim) + ")" +
             (sections > 1 ? "x" + std::to_string(sections) : "");
  }
  return "?";
}

ReshardOp ReshardOpFor(const ShardSpec& from, const ShardSpec& to) {
  using K = ShardSpec::Kind;
  if (from == to) return ReshardOp::kNone;
  if (from.kind == K::kReplicate)
    return to.kind == K::kPartial ? ReshardOp::kKeepOnRankZero : ReshardOp::kSlice;
  if (from.kind == K::kShard) {
    if (to.kind == K::kPartial) return ReshardOp::kZeroPad;
    if (to.kind == K::kReplicate) return ReshardOp::kAllGather;
    return from.dim == to.dim ? ReshardOp::kGatherSlice : ReshardOp::kAllToAll;
  }
  return to.kind == K::kReplicate ? ReshardOp::kAllReduce : ReshardOp::kReduceScatter;
}

const char* ReshardOpName(ReshardOp op) {
  switch (op) {
    case ReshardOp::kNone:
      return "none";
    case ReshardOp::kSlice:
      return "slice";
    case ReshardOp::kZeroPad:
      return "zero_pad";
    case ReshardOp::kKeepOnRankZero:
      return "keep_on_rank_zero";
    case ReshardOp::kAllGather:
      return "all_gather";
    case ReshardOp::kGatherSlice:
      return "all_gather_slice";
    case ReshardOp::kAllToAll:
      return "all_to_all";
    case ReshardOp::kAllReduce:
      return "all_reduce";
    case ReshardOp::kReduceScatter:
      return "reduce_scatter";
  }
  return "?";
}

ShardSpec GradientSpec(const ShardSpec& spec) {
  if (spec.kind == ShardSpec::Kind::kReplicate) return ShardSpec::P();
  if (spec.kind == ShardSpec::Kind::kPartial) return ShardSpec::R();
  return spec;
}

std::vector<ValueId> TensorInputs(const Graph& graph, const Node& node) {
  std::vector<ValueId> out;
  std::function<void(const Arg&)> visit = [&](const Arg& a) {
    if (a.is_value()) {
      if (graph.type(a.value()).is_tensor()) out.push_back(a.value());
    } else {
      for (const auto& item : a.items) visit(item);
    }
  };
  for (const auto& a : node.args) visit(a);
  for (const auto& kw : node.kwargs) visit(kw.value);
  return out;
}

std::vector<ShardSpec> InputSpecs(const TensorType& type, int world, bool strided) {
  std::vector<ShardSpec> specs = {S::R()};
  if (world <= 1) return specs;
  for (int d = 0; d < type.rank(); ++d)
    if (Divisible(type, d, world)) specs.push_back(S::S(d));
  // Strided specs for parameters' packed dims (the consumers decide whether any rule takes them).
  for (int d = 0; strided && d < type.rank(); ++d)
    for (int n : kStridedSections)
      if (Divisible(type, d, world * n)) specs.push_back(S::S(d, n));
  return specs;
}

std::vector<ShardStrategy> ShardingStrategies(const Graph& g, const Node& n, int world) {
  std::vector<ShardStrategy> out = {Replicated(g, n)};
  if (world <= 1) return out;
  for (ValueId v : n.outputs)
    if (!g.type(v).is_tensor()) return out;
  const OpInfo* info = OpRegistry::Default().Find(n.op);
  if (info == nullptr || !info->pure) return out;
  auto ins = TensorInputs(g, n);
  if (IsOp(n, "aten::mm.default") || IsOp(n, "aten::addmm.default")) {
    AddMatmulStrategies(g, n, world, &out);
  } else if (IsOp(n, "aten::split.Tensor") || IsOp(n, "aten::split_with_sizes.default")) {
    AddSplitStrategies(g, n, world, &out);
  } else if (info->cls == OpClass::kReduction &&
             (n.op.rfind("aten::sum.", 0) == 0 || n.op.rfind("aten::mean.", 0) == 0 ||
              n.op == "aten::amax.default")) {
    AddReductionStrategies(g, n, world, &out);
  } else if (IsOp(n, "aten::cat.default")) {
    AddCatStrategies(g, n, world, &out);
  } else if (IsOp(n, "aten::convolution.default")) {
    AddConvStrategies(g, n, world, &out);
  } else if (IsOp(n, "aten::permute.default")) {
    const TensorType* t = ins.size() == 1 ? TensorOf(g, ins[0]) : nullptr;
    if (t != nullptr && n.args.size() > 1 && n.args[1].items.size() == size_t(t->rank())) {
      std::vector<int> to(static_cast<size_t>(t->rank()), -1);  // input dim -> output dim
      for (int i = 0; i < t->rank(); ++i) {
        int64_t d = n.args[1].items[static_cast<size_t>(i)].i;  // output dim i = input dim d
        if (d < 0) d += t->rank();
        if (d >= 0 && d < t->rank()) to[static_cast<size_t>(d)] = i;
      }
      AddDimMapStrategies(
          g, n, world, [&](int d) { return to[static_cast<size_t>(d)]; }, 1.0, &out);
    }
  } else if (IsOp(n, "aten::bmm.default")) {
    AddBmmStrategies(g, n, world, &out);
  } else if (IsOp(n, "aten::embedding.default")) {
    AddEmbeddingStrategies(g, n, world, &out);
  } else if (IsOp(n, "aten::clone.default") || IsOp(n, "aten::detach.default") ||
             IsOp(n, "aten::alias.default")) {
    AddDimMapStrategies(g, n, world, [](int d) { return d; }, 1.0 / world, &out);
  } else if (IsOp(n, "aten::unsqueeze.default")) {
    const TensorType* t = ins.size() == 1 ? TensorOf(g, ins[0]) : nullptr;
    if (t != nullptr) {
      int64_t at = IntArg(n, 1, 0);
      if (at < 0) at += t->rank() + 1;
      AddDimMapStrategies(g, n, world, [at](int d) { return d >= at ? d + 1 : d; }, 1.0, &out);
    }
  } else if (IsOp(n, "aten::slice.Tensor")) {
    // x[..., a:b] along one dim (rotary halves, a causal mask cut to the keys): every other
    // dim passes through unchanged.
    const TensorType* t = ins.size() == 1 ? TensorOf(g, ins[0]) : nullptr;
    if (t != nullptr) {
      int64_t at = IntArg(n, 1, 0);
      if (at < 0) at += t->rank();
      AddDimMapStrategies(
          g, n, world, [at](int d) { return d == at ? -1 : d; }, 1.0 / world, &out);
    }
  } else if (IsOp(n, "aten::expand.default")) {
    // Broadcasting new or size-1 dims (GQA's repeat_kv): a dim whose size is kept maps to the
    // same dim, counted from the right; the size list is rewritten when materialised.
    const TensorType* t = ins.size() == 1 ? TensorOf(g, ins[0]) : nullptr;
    const TensorType* o = TensorOf(g, n.outputs[0]);
    if (t != nullptr && o != nullptr && o->rank() >= t->rank()) {
      const int shift = o->rank() - t->rank();
      AddDimMapStrategies(
          g, n, world,
          [&](int d) { return Size(*o, d + shift) == Size(*t, d) ? d + shift : -1; }, 1.0,
          &out);
    }
  } else if (IsOp(n, "aten::t.default") || IsOp(n, "aten::transpose.int")) {
    const TensorType* t = ins.size() == 1 ? TensorOf(g, ins[0]) : nullptr;
    if (t != nullptr) {
      int a = 0, b = 1;
      if (IsOp(n, "aten::transpose.int")) {
        a = static_cast<int>(IntArg(n, 1, 0)), b = static_cast<int>(IntArg(n, 2, 1));
        if (a < 0) a += t->rank();
        if (b < 0) b += t->rank();
      }
      AddDimMapStrategies(
          g, n, world, [a, b](int d) { return d == a   ? b
                                              : d == b ? a
                                                       : d; }, 1.0, &out);
    }
  } else if (info->cls == OpClass::kView &&
             (n.op.rfind("aten::view.", 0) == 0 || n.op.rfind("aten::_unsafe_view.", 0) == 0 ||
              n.op.rfind("aten::reshape.", 0) == 0)) {
    const TensorType* t = ins.size() == 1 ? TensorOf(g, ins[0]) : nullptr;
    const TensorType* o = TensorOf(g, n.outputs[0]);
    if (t != nullptr && o != nullptr) {
      for (int d = 0; d < t->rank(); ++d) {
        if (!Divisible(*t, d, world)) continue;
        const int od = MapDimThroughReshape(*t, *o, d, world);
        if (od >= 0) out.push_back({"dim" + std::to_string(d), {S::S(d)}, {S::S(od)}, 1.0});
        // A packed dim survives a view only unchanged (its size and what precedes it).
        for (int n : kStridedSections) {
          if (od < 0 || !Divisible(*t, d, world * n) || Size(*o, od) != Size(*t, d)) continue;
          out.push_back({"dim" + std::to_string(d) + "x" + std::to_string(n),
                         {S::S(d, n)},
                         {S::S(od, n)},
                         1.0});
        }
      }
      out.push_back({"partial", {S::P()}, {S::P()}, 1.0});
    }
  } else if (info->cls == OpClass::kElementwise) {
    AddElementwiseStrategies(g, n, world, &out);
  } else if (info->cls == OpClass::kSoftmax &&
             (n.op.rfind("aten::_softmax.", 0) == 0 || n.op.rfind("aten::_log_softmax.", 0) == 0)) {
    const TensorType* t = ins.size() == 1 ? TensorOf(g, ins[0]) : nullptr;
    if (t != nullptr) {
      int64_t dim = IntArg(n, 1, -1);
      if (dim < 0) dim += t->rank();
      for (int d = 0; d < t->rank(); ++d)
        if (d != dim && Divisible(*t, d, world))
          out.push_back({"dim" + std::to_string(d), {S::S(d)}, {S::S(d)}, 1.0 / world});
    }
  } else if (info->cls == OpClass::kNorm && n.op.rfind("aten::native_layer_norm.", 0) == 0) {
    // native_layer_norm(x, normalized_shape, weight, bias, eps): dims before the normalised ones.
    const TensorType* t = ins.empty() ? nullptr : TensorOf(g, ins[0]);
    if (t != nullptr && !n.args.empty() && n.args.size() > 1) {
      const int normalized = static_cast<int>(n.args[1].items.size());
      AddSameDimStrategies(g, n, world, static_cast<int>(t->rank()) - normalized, "dim", &out);
    }
  } else if (info->cls == OpClass::kAttention && n.op.find("backward") == std::string::npos) {
    // q, k, v [B, H, S, D]: batch or heads; the mask (if any) must then be broadcast over them.
    AddSameDimStrategies(g, n, world, 2, "attn_dim", &out);
  }
  return out;
}

}  // namespace tp::ir
