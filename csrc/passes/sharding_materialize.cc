// Pass: sharding_materialize; see sharding_materialize.h.
#include "passes/sharding_materialize.h"

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tp::passes {
namespace {

using ir::Arg;
using ir::ShardSpec;
using ir::ValueId;
using Kind = ir::ShardSpec::Kind;

constexpr const char* kReshard = "torch_plugin::reshard.default";
constexpr const char* kGradSync = "torch_plugin::grad_sync.default";
constexpr const char* kReplicatedOutput = "torch_plugin::replicated_output.default";
constexpr const char* kVocabEmbedding = "torch_plugin::vocab_embedding.default";

bool IsReshape(const std::string& op) {
  return op.rfind("aten::view.", 0) == 0 || op.rfind("aten::_unsafe_view.", 0) == 0 ||
         op.rfind("aten::reshape.", 0) == 0;
}

std::string SpecTag(const ShardSpec& s) {
  return s.kind == Kind::kShard ? "S" + std::to_string(s.dim) : s.ToString();
}

class Materializer {
 public:
  Materializer(const ir::Graph& g, const ShardingPlan& plan, const MaterializeOptions& o,
               MaterializeStats* stats)
      : g_(g), plan_(plan), o_(o), stats_(stats), remap_(g.values().size(), -1) {
    for (const auto& v : g.values()) names_.insert(v.name);
    for (const auto& n : g.nodes()) names_.insert(n.name);
  }

  ir::Graph Run() {
    CopyInputs();
    for (const auto& n : g_.nodes()) CopyNode(n);
    b_.SetOutput(RebuildOutput(g_.output()));
    return b_.Build();
  }

 private:
  ShardSpec PlannedSpec(const std::string& key) const {
    auto it = plan_.spec.find(key);
    return it == plan_.spec.end() ? ShardSpec::R() : it->second;
  }

  std::string FreshName(const std::string& base) {
    std::string name = base;
    for (int k = 1; names_.count(name); ++k) name = base + "_" + std::to_string(k);
    names_.insert(name);
    return name;
  }

  ValueId AddUnary(const std::string& name, const char* op, std::vector<Arg> args,
                   ir::ValueType type, const ir::ValueType& logical, ShardSpec spec,
                   const std::string& scope) {
    ir::NodeSpec ns;
    ns.name = FreshName(name);
    ns.op = op;
    ns.args = std::move(args);
    ns.output_types = {std::move(type)};
    ns.output_names = {ns.name};
    ns.scope = scope;
    const ir::NodeId id = b_.AddNode(std::move(ns));
    const ValueId out = b_.peek().node(id).outputs[0];
    Track(out, logical, spec);
    return out;
  }

  void Track(ValueId v, const ir::ValueType& logical, ShardSpec spec) {
    if (static_cast<size_t>(v) >= spec_.size()) {
      spec_.resize(static_cast<size_t>(v) + 1);
      logical_.resize(static_cast<size_t>(v) + 1);
    }
    spec_[static_cast<size_t>(v)] = spec;
    logical_[static_cast<size_t>(v)] = logical;
  }

  void CopyInputs() {
    for (const auto& in : g_.inputs()) {
      const ir::Value& v = g_.value(in.value);
      const bool state = in.kind == ir::InputKind::kParameter || in.kind == ir::InputKind::kBuffer;
      // Parameters and buffers arrive as this rank's block; anything else arrives whole.
      const ShardSpec spec = state && v.type.is_tensor() ? PlannedSpec(v.name) : ShardSpec::R();
      if (spec.kind == Kind::kPartial)
        throw ShardingError("input '" + v.name + "' planned Partial; inputs are R or S(d)", 0);
      const ValueId nv = b_.AddInput(v.name, LocalType(v.type, spec, o_.world), in.kind, in.source);
      Track(nv, v.type, spec);
      remap_[static_cast<size_t>(in.value)] = nv;
    }
    // After every input (inputs keep the value ids 0..n-1; the bridge relies on it): one node
    // through which every replicated parameter passes, so the backward sums all their gradient
    // summands in one all-reduce (a bucket) instead of one collective per parameter.
    std::vector<const ir::GraphInput*> synced;
    for (const auto& in : g_.inputs()) {
      const ir::Value& v = g_.value(in.value);
      const ValueId nv = remap_[static_cast<size_t>(in.value)];
      if (o_.training && in.kind == ir::InputKind::kParameter && v.type.is_tensor() &&
          ir::IsFloatingPoint(v.type.tensor.dtype) &&
          spec_[static_cast<size_t>(nv)].kind == Kind::kReplicate && o_.world > 1)
        synced.push_back(&in);
    }
    if (synced.empty()) return;
    ir::NodeSpec ns;
    ns.name = FreshName("grad_sync");
    ns.op = kGradSync;
    std::vector<Arg> params;
    for (const auto* in : synced) {
      params.push_back(Arg::Value(remap_[static_cast<size_t>(in->value)]));
      ns.output_types.push_back(g_.type(in->value));
      ns.output_names.push_back(FreshName(g_.value(in->value).name + "_synced"));
    }
    ns.args = {Arg::List(params), Arg::Int(o_.group)};
    ns.tuple_output = true;
    const ir::NodeId id = b_.AddNode(std::move(ns));
    for (size_t k = 0; k < synced.size(); ++k) {
      const ValueId out = b_.peek().node(id).outputs[k];
      Track(out, g_.type(synced[k]->value), ShardSpec::R());
      remap_[static_cast<size_t>(synced[k]->value)] = out;
    }
    if (stats_) stats_->grad_syncs += static_cast<int>(synced.size());
  }

  // The value `v` (new graph) in spec `want`, through a shared reshard node when it differs.
  ValueId Convert(ValueId v, const ShardSpec& want, const std::string& scope) {
    const ShardSpec have = spec_[static_cast<size_t>(v)];
    if (have == want) return v;
    auto key = std::make_pair(v, want.ToString());
    auto it = reshards_.find(key);
    if (it != reshards_.end()) return it->second;
    const ir::ValueType logical = logical_[static_cast<size_t>(v)];
    const ValueId out =
        AddUnary(b_.peek().value(v).name + "_to_" + SpecTag(want), kReshard,
                 {Arg::Value(v), Arg::String(have.ToString()), Arg::String(want.ToString()),
                  Arg::Int(o_.group), Arg::String(ir::ReshardOpName(ir::ReshardOpFor(have, want)))},
                 LocalType(logical, want, o_.world), logical, want, scope);
    reshards_[key] = out;
    if (stats_) ++stats_->reshards;
    return out;
  }

  // Rebuilds `a` in TensorInputs order, substituting the i-th tensor input by inputs[i].
  Arg Substitute(const Arg& a, const std::vector<ValueId>& inputs, size_t* next) const {
    if (a.is_value()) {
      if (g_.type(a.value()).is_tensor()) return Arg::Value(inputs.at((*next)++));
      return Arg::Value(remap_[static_cast<size_t>(a.value())]);
    }
    if (a.kind != Arg::Kind::kList && a.kind != Arg::Kind::kTuple) return a;
    Arg out = a;
    for (auto& item : out.items) item = Substitute(item, inputs, next);
    return out;
  }

  void CopyNode(const ir::Node& n) {
    const std::vector<ValueId> ins = ir::TensorInputs(g_, n);
    ir::ShardStrategy st;
    auto it = plan_.chosen.find(n.name);
    if (it != plan_.chosen.end()) {
      st = it->second;
    } else {  // no tensor output: nothing to split; it reads whole tensors
      st.name = "replicate";
      st.inputs.assign(ins.size(), ShardSpec::R());
      st.outputs.assign(n.outputs.size(), ShardSpec::R());
    }
    if (st.inputs.size() != ins.size() || st.outputs.size() != n.outputs.size()) {
      throw ShardingError("node '" + n.name + "': its planned strategy '" + st.name + "' has " +
                              std::to_string(st.inputs.size()) + " input specs for " +
                              std::to_string(ins.size()) +
                              " tensor inputs; plan again on this graph",
                          0);
    }
    std::vector<ValueId> local;
    for (size_t i = 0; i < ins.size(); ++i)
      local.push_back(Convert(remap_[static_cast<size_t>(ins[i])], st.inputs[i], n.scope));

    ir::NodeSpec ns;
    ns.name = n.name;
    ns.op = n.op;
    // A local block (or a gathered tensor) need not have the strides the whole tensor had, so a
    // view valid on the whole may not be on the block: reshape is the same view when one exists.
    if (o_.world > 1 && n.op == "aten::view.default") ns.op = "aten::reshape.default";
    size_t next = 0;
    for (const auto& a : n.args) ns.args.push_back(Substitute(a, local, &next));
    for (const auto& kw : n.kwargs)
      ns.kwargs.push_back({kw.name, Substitute(kw.value, local, &next)});
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ns.output_types.push_back(LocalType(g_.type(n.outputs[k]), st.outputs[k], o_.world));
      ns.output_names.push_back(g_.value(n.outputs[k]).name);
    }
    ns.tuple_output = n.tuple_output;
    ns.scope = n.scope;
    ns.attrs = n.attrs;
    if ((IsReshape(n.op) || n.op == "aten::expand.default") && !st.outputs.empty() &&
        st.outputs[0].kind == Kind::kShard)
      RewriteViewSize(n, st.outputs[0].dim, &ns);
    if (st.name == "packed") RewriteSplitSizes(n, &ns);
    if (st.name == "vocab" && n.op == "aten::embedding.default") VocabEmbedding(n, local, &ns);
    const ir::NodeId id = b_.AddNode(std::move(ns));
    const ir::Node& added = b_.peek().node(id);
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      remap_[static_cast<size_t>(n.outputs[k])] = added.outputs[k];
      Track(added.outputs[k], g_.type(n.outputs[k]), st.outputs[k]);
    }
  }

  void RewriteViewSize(const ir::Node& n, int dim, ir::NodeSpec* ns) {
    if (ns->args.size() < 2 || ns->args[1].kind != Arg::Kind::kList ||
        static_cast<size_t>(dim) >= ns->args[1].items.size()) {
      throw ShardingError(
          "node '" + n.name + "': expected a size list to shard dim " + std::to_string(dim), 0);
    }
    Arg& size = ns->args[1].items[static_cast<size_t>(dim)];
    if (size.kind != Arg::Kind::kInt) {
      throw ShardingError("node '" + n.name + "': dim " + std::to_string(dim) +
                              " of its size is symbolic; sharding needs static shapes there "
                              "(capture without dynamic=True)",
                          0);
    }
    if (size.i == -1) return;  // inferred from the (already local) input
    if (size.i % o_.world != 0) {
      throw ShardingError("node '" + n.name + "': size " + std::to_string(size.i) + " of dim " +
                              std::to_string(dim) + " does not split over " +
                              std::to_string(o_.world) + " ranks",
                          0);
    }
    size.i /= o_.world;
    if (stats_) ++stats_->views_rewritten;
  }

  // embedding(weight, indices, padding_idx=-1, ...) on this rank's rows of the vocabulary:
  // vocab_embedding(weight block, indices, padding_idx, group) shifts the indices by the
  // rank's first row and zeroes the lookups outside its rows (scale_grad_by_freq and sparse
  // have no vocabulary-parallel form: such a node is refused).
  void VocabEmbedding(const ir::Node& n, const std::vector<ValueId>& local, ir::NodeSpec* ns) {
    int64_t padding_idx = -1;
    for (size_t k = 2; k < n.args.size(); ++k) {
      const Arg& a = n.args[k];
      if (k == 2 && a.kind == Arg::Kind::kInt) padding_idx = a.i;
      if (k > 2 && a.kind == Arg::Kind::kBool && a.b)
        throw ShardingError("node '" + n.name +
                                "': a vocabulary-parallel embedding cannot scale gradients by "
                                "frequency or be sparse; pin its weight to R or S(1)",
                            0);
    }
    ns->op = kVocabEmbedding;
    ns->args = {Arg::Value(local.at(0)), Arg::Value(local.at(1)), Arg::Int(padding_idx),
                Arg::Int(o_.group)};
    ns->kwargs.clear();
  }

  // split of a strided dim into its parts: each rank splits its block into parts of 1/world.
  void RewriteSplitSizes(const ir::Node& n, ir::NodeSpec* ns) {
    auto divide = [&](Arg* a) {
      if (a->kind != Arg::Kind::kInt || a->i % o_.world != 0)
        throw ShardingError("node '" + n.name + "': split sizes must be integers divisible by " +
                                std::to_string(o_.world) + " to split a packed dim",
                            0);
      a->i /= o_.world;
    };
    if (ns->args.size() < 2) throw ShardingError("node '" + n.name + "': split without sizes", 0);
    Arg& sizes = ns->args[1];
    if (sizes.kind == Arg::Kind::kList || sizes.kind == Arg::Kind::kTuple) {
      for (auto& item : sizes.items) divide(&item);
    } else {
      divide(&sizes);
    }
  }

  Arg RebuildOutput(const Arg& a) {
    if (a.is_value()) {
      ValueId v = remap_[static_cast<size_t>(a.value())];
      if (!g_.type(a.value()).is_tensor()) return Arg::Value(v);
      auto it = outputs_.find(v);
      if (it != outputs_.end()) return Arg::Value(it->second);
      const ValueId whole = Convert(v, ShardSpec::R(), "");
      ValueId out = whole;
      const ir::ValueType& t = g_.type(a.value());
      if (o_.training && o_.world > 1 && ir::IsFloatingPoint(t.tensor.dtype)) {
        out = AddUnary(b_.peek().value(whole).name + "_out", kReplicatedOutput,
                       {Arg::Value(whole), Arg::Int(o_.group)}, t, t, ShardSpec::R(), "");
      }
      outputs_[v] = out;
      return Arg::Value(out);
    }
    if (a.kind != Arg::Kind::kList && a.kind != Arg::Kind::kTuple) return a;
    Arg out = a;
    for (auto& item : out.items) item = RebuildOutput(item);
    return out;
  }

  const ir::Graph& g_;
  const ShardingPlan& plan_;
  const MaterializeOptions& o_;
  MaterializeStats* stats_;
  ir::GraphBuilder b_;
  std::vector<ValueId> remap_;          // old value -> new value
  std::vector<ShardSpec> spec_;         // new value -> spec
  std::vector<ir::ValueType> logical_;  // new value -> whole (unsharded) type
  std::map<std::pair<ValueId, std::string>, ValueId> reshards_;
  std::map<ValueId, ValueId> outputs_;
  std::set<std::string> names_;
};

}  // namespace

ir::ValueType LocalType(const ir::ValueType& type, const ShardSpec& spec, int world) {
  if (!type.is_tensor() || spec.kind != Kind::kShard || world <= 1) return type;
  ir::ValueType local = type;
  auto& shape = local.tensor.shape;
  if (spec.dim < 0 || spec.dim >= static_cast<int>(shape.size()))
    throw ShardingError(
        "spec " + spec.ToString() + " on a tensor of rank " + std::to_string(shape.size()), 0);
  auto& d = shape[static_cast<size_t>(spec.dim)];
  if (d.is_symbolic() || d.value % world != 0)
    throw ShardingError("dim " + std::to_string(spec.dim) + " of size " + d.ToString() +
                            " does not split evenly over " + std::to_string(world) + " ranks",
                        0);
  d = ir::SymDim::Concrete(d.value / world);
  local.tensor.stride.clear();  // the local block is a fresh contiguous tensor
  return local;
}

ir::Graph MaterializeSharding(const ir::Graph& graph, const ShardingPlan& plan,
                              const MaterializeOptions& options, MaterializeStats* stats) {
  if (options.world < 1) throw ShardingError("materialising needs at least one rank", 0);
  return Materializer(graph, plan, options, stats).Run();
}

}  // namespace tp::passes
