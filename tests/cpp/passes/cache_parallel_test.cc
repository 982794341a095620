// cache_parallel: the functionalised KV-cache decode attention of a Llama layer, built by hand
// as AOTAutograd emits it, is rewritten into one cp_attention node; variants are left alone.
#include "passes/cache_parallel.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ir/verify.h"
#include "test_graphs.h"

namespace tp::passes {
namespace {

using testing::Op;
using testing::Tensor;
using testing::V;

ir::ValueType SymInt(const std::string& e) {
  return ir::ValueType::Scalar(ir::ValueKind::kSymInt, e);
}

struct DecodeGraphSpec {
  int64_t batch = 2;
  bool mask = true;         // offset-causal mask; false: no mask
  bool user_mask = false;   // a mask from a graph input instead
  int64_t user_mask_rank = 2;  // its rank (1 is no [queries, keys] mask)
  bool index_write = false;  // the cache written by index_copy at a positions input
  bool whole_read = false;   // (index_write) attention reads the whole cache under the mask
  bool leak_cache = false;  // the updated cache is also a graph output
  bool dropout = false;
  int64_t seq_dim = 2;
  // How the cache's 2 heads reach the query's 4: "" (SDPA's own GQA), "repeat_interleave", or
  // "repeat_kv" (transformers: unsqueeze, expand, clone, view).
  std::string gqa;
};

ir::Graph DecodeGraph(const DecodeGraphSpec& s) {
  ir::GraphBuilder b;
  const int64_t B = s.batch, H = 4, HKV = 2, D = 16, S = 64;
  auto start = b.AddInput("start", SymInt("s0"), ir::InputKind::kSymbol);
  auto q = b.AddInput("q", Tensor({B, H, 1, D}), ir::InputKind::kUser);
  auto kn = b.AddInput("k_new", Tensor({B, HKV, 1, D}), ir::InputKind::kUser);
  auto vn = b.AddInput("v_new", Tensor({B, HKV, 1, D}), ir::InputKind::kUser);
  auto ck = b.AddInput("cache_k", Tensor({4, HKV, S, D}), ir::InputKind::kBuffer, "attn.cache_k");
  auto cv = b.AddInput("cache_v", Tensor({4, HKV, S, D}), ir::InputKind::kBuffer, "attn.cache_v");
  ir::ValueId user_mask = -1;
  if (s.user_mask)
    user_mask = b.AddInput("mask", s.user_mask_rank == 1 ? Tensor({1}) : Tensor({1, 1}),
                           ir::InputKind::kUser);
  ir::ValueId positions = -1;
  if (s.index_write) {
    ir::TensorType pt = testing::F32({1});
    pt.dtype = ir::DType::kInt64;
    positions = b.AddInput("pos", ir::ValueType::Tensor(pt), ir::InputKind::kUser);
  }
  auto out0 = [&](ir::NodeId n) { return b.peek().node(n).outputs[0]; };
  auto end = out0(
      b.AddNode(Op("end", "python::_operator.add", {V(start), ir::Arg::Int(1)}, SymInt("s0 + 1"))));
  auto I = [](int64_t v) { return ir::Arg::Int(v); };
  auto chain = [&](const std::string& p, ir::ValueId cache, ir::ValueId nv) {
    if (s.index_write) {  // cache[:B].index_copy_(2, pos, new), functionalised
      auto s5 = out0(b.AddNode(Op(p + "s5", "aten::slice.Tensor", {V(cache), I(0), I(0), I(B)},
                                  Tensor({B, HKV, S, D}))));
      auto ic = out0(b.AddNode(Op(p + "ic", "aten::index_copy.default",
                                  {V(s5), I(2), V(positions), V(nv)}, Tensor({B, HKV, S, D}))));
      auto ss1 = out0(b.AddNode(Op(p + "ss1", "aten::slice_scatter.default",
                                   {V(cache), V(ic), I(0), I(0), I(B)}, Tensor({4, HKV, S, D}))));
      auto r1 = out0(b.AddNode(
          Op(p + "r1", "aten::slice.Tensor", {V(ss1), I(0), I(0), I(B)}, Tensor({B, HKV, S, D}))));
      if (s.whole_read) return std::make_pair(ss1, r1);
      auto r2 = out0(b.AddNode(
          Op(p + "r2", "aten::slice.Tensor", {V(r1), I(2), I(0), V(end)}, Tensor({B, HKV, 1, D}))));
      return std::make_pair(ss1, r2);
    }
    auto s3 = out0(b.AddNode(
        Op(p + "s3", "aten::slice.Tensor", {V(cache), I(0), I(0), I(B)}, Tensor({B, HKV, S, D}))));
    auto s4 = out0(b.AddNode(Op(p + "s4", "aten::slice.Tensor",
                                {V(s3), I(s.seq_dim), V(start), V(end)}, Tensor({B, HKV, 1, D}))));
    auto cp = out0(
        b.AddNode(Op(p + "copy", "aten::copy.default", {V(s4), V(nv)}, Tensor({B, HKV, 1, D}))));
    auto s5 = out0(b.AddNode(
        Op(p + "s5", "aten::slice.Tensor", {V(cache), I(0), I(0), I(B)}, Tensor({B, HKV, S, D}))));
    auto ss =
        out0(b.AddNode(Op(p + "ss", "aten::slice_scatter.default",
                          {V(s5), V(cp), I(s.seq_dim), V(start), V(end)}, Tensor({B, HKV, S, D}))));
    auto ss1 = out0(b.AddNode(Op(p + "ss1", "aten::slice_scatter.default",
                                 {V(cache), V(ss), I(0), I(0), I(B)}, Tensor({4, HKV, S, D}))));
    auto r1 = out0(b.AddNode(
        Op(p + "r1", "aten::slice.Tensor", {V(ss1), I(0), I(0), I(B)}, Tensor({B, HKV, S, D}))));
    auto r2 = out0(b.AddNode(
        Op(p + "r2", "aten::slice.Tensor", {V(r1), I(2), I(0), V(end)}, Tensor({B, HKV, 1, D}))));
    return std::make_pair(ss1, r2);
  };
  auto [kup, keys] = chain("k_", ck, kn);
  auto [vup, values] = chain("v_", cv, vn);
  auto expand = [&](const std::string& p, ir::ValueId x) {
    if (s.gqa == "repeat_interleave" || s.gqa == "repeat_interleave_seq") {
      const bool seq = s.gqa == "repeat_interleave_seq";
      ir::NodeSpec r = Op(p + "rep", "aten::repeat_interleave.self_int", {V(x), I(H / HKV)},
                          seq ? Tensor({B, HKV, 2, D}) : Tensor({B, H, 1, D}));
      r.kwargs.push_back({"dim", I(seq ? 2 : 1)});
      return out0(b.AddNode(r));
    }
    if (s.gqa == "repeat_kv" || s.gqa == "repeat_kv_strided") {
      auto u = out0(b.AddNode(
          Op(p + "unsq", "aten::unsqueeze.default", {V(x), I(2)}, Tensor({B, HKV, 1, 1, D}))));
      ir::NodeSpec all = Op(p + "all", "aten::slice.Tensor",
                            {V(u), I(3), I(0), I(9223372036854775807)}, Tensor({B, HKV, 1, 1, D}));
      if (s.gqa == "repeat_kv_strided") all.args.push_back(I(2));  // every other position
      auto sl = out0(b.AddNode(all));
      auto e = out0(b.AddNode(Op(p + "exp", "aten::expand.default",
                                 {V(sl), ir::Arg::List({I(B), I(HKV), I(H / HKV), I(1), I(D)})},
                                 Tensor({B, HKV, H / HKV, 1, D}))));
      auto c = out0(
          b.AddNode(Op(p + "clone", "aten::clone.default", {V(e)}, Tensor({B, HKV, H / HKV, 1, D}))));
      return out0(b.AddNode(Op(p + "view", "aten::_unsafe_view.default",
                               {V(c), ir::Arg::List({I(B), I(H), I(1), I(D)})},
                               Tensor({B, H, 1, D}))));
    }
    return x;
  };
  keys = expand("k_", keys);
  values = expand("v_", values);
  ir::NodeSpec sdpa = Op("sdpa", "aten::_scaled_dot_product_flash_attention_for_cpu.default",
                         {V(q), V(keys), V(values)}, Tensor({B, H, 1, D}));
  if (s.dropout) sdpa.args.push_back(ir::Arg::Double(0.1));
  if (s.mask) {
    ir::NodeSpec ones = Op("ones", "aten::ones.default", {ir::Arg::List({ir::Arg::Int(1), V(end)})},
                           Tensor({1, 1}));
    ones.kwargs.push_back({"dtype", ir::Arg::Tagged(ir::Arg::Kind::kDtype, "bool")});
    auto o = out0(b.AddNode(ones));
    auto tril = out0(b.AddNode(Op("tril", "aten::tril.default", {V(o), V(start)}, Tensor({1, 1}))));
    auto zero =
        out0(b.AddNode(Op("zero", "aten::scalar_tensor.default", {ir::Arg::Int(0)}, Tensor({}))));
    auto ninf = out0(b.AddNode(
        Op("ninf", "aten::scalar_tensor.default", {ir::Arg::Double(-INFINITY)}, Tensor({}))));
    auto where = out0(
        b.AddNode(Op("where", "aten::where.self", {V(tril), V(zero), V(ninf)}, Tensor({1, 1}))));
    sdpa.kwargs.push_back({"attn_mask", V(where)});
  } else if (s.user_mask) {
    sdpa.kwargs.push_back({"attn_mask", V(user_mask)});
  }
  sdpa.output_types.push_back(Tensor({B, H, 1}));
  sdpa.output_names = {"attn_out", ""};
  sdpa.tuple_output = true;
  auto sd = b.AddNode(sdpa);
  auto attn = b.peek().node(sd).outputs[0];
  auto proj = out0(
      b.AddNode(Op("proj", "aten::mul.Tensor", {V(attn), ir::Arg::Int(2)}, Tensor({B, H, 1, D}))));
  b.AddNode(Op("copy_k", "aten::copy_.default", {V(ck), V(kup)}, Tensor({4, HKV, S, D})));
  b.AddNode(Op("copy_v", "aten::copy_.default", {V(cv), V(vup)}, Tensor({4, HKV, S, D})));
  std::vector<ir::Arg> outs = {V(proj)};
  if (s.leak_cache) outs.push_back(V(kup));
  b.SetOutput(ir::Arg::List(outs, /*tuple=*/true));
  return b.Build();
}

CacheParallelOptions WorldOptions(int world, const std::string& scheme = "auto",
                                  bool split = false) {
  CacheParallelOptions o;
  o.world = world;
  o.handle = 7;
  o.scheme = scheme;
  o.allow_batch_split = split;
  return o;
}

PassResult CacheParallelPass(const ir::Graph& g, const CacheParallelOptions& o) {
  Context ctx;
  return CacheParallel(g, o, ctx);
}

int Count(const ir::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.op == op;
  return n;
}

TEST(CacheParallel, RewritesCausalDecodeAttention) {
  CacheParallelOptions ctx = WorldOptions(2);
  PassResult r = CacheParallelPass(DecodeGraph({}), ctx);
  ASSERT_TRUE(r.changed);
  ir::Verify(r.graph);
  EXPECT_EQ(Count(r.graph, "torch_plugin::cp_attention.default"), 1);
  for (const char* gone : {"aten::copy_.default", "aten::slice_scatter.default", "aten::where.self",
                           "aten::tril.default", "aten::ones.default", "aten::copy.default",
                           "aten::_scaled_dot_product_flash_attention_for_cpu.default"})
    EXPECT_EQ(Count(r.graph, gone), 0) << gone;
  for (const auto& n : r.graph.nodes()) {
    if (n.op != "torch_plugin::cp_attention.default") continue;
    ASSERT_EQ(n.args.size(), 15u);
    EXPECT_TRUE(n.args[13].kind == ir::Arg::Kind::kNone);  // no general mask
    EXPECT_TRUE(n.args[14].kind == ir::Arg::Kind::kNone);  // no positions: a slice write
    EXPECT_EQ(r.graph.value(n.args[0].value()).name, "q");
    EXPECT_EQ(r.graph.value(n.args[1].value()).name, "k_new");
    EXPECT_EQ(r.graph.value(n.args[2].value()).name, "v_new");
    EXPECT_EQ(r.graph.value(n.args[3].value()).name, "start");
    EXPECT_EQ(r.graph.value(n.args[4].value()).name, "end");
    EXPECT_TRUE(n.args[5].b);  // causal
    EXPECT_EQ(n.args[7].s, "attn.cache_k");
    EXPECT_EQ(n.args[8].s, "attn.cache_v");
    EXPECT_EQ(n.args[9].i, 64);  // capacity
    EXPECT_EQ(n.args[10].i, 7);  // handle
    EXPECT_EQ(n.args[11].s, "gather_partials");
    EXPECT_EQ(n.name, "attn_out");
  }
}

TEST(CacheParallel, NoMaskMeansAllKeysBeforeEnd) {
  DecodeGraphSpec s;
  s.mask = false;
  CacheParallelOptions ctx = WorldOptions(4);
  PassResult r = CacheParallelPass(DecodeGraph(s), ctx);
  ASSERT_TRUE(r.changed);
  for (const auto& n : r.graph.nodes())
    if (n.op == "torch_plugin::cp_attention.default") {
      EXPECT_FALSE(n.args[5].b);
    }
}

TEST(CacheParallel, LeavesDeviatingAttentionAloneAndSaysWhy) {
  struct Case {
    DecodeGraphSpec spec;
    std::string why;
  };
  std::vector<Case> cases(4);
  cases[0].spec.mask = false, cases[0].spec.user_mask = true, cases[0].why = "mask";
  cases[0].spec.user_mask_rank = 1;  // not [..., queries, keys]
  cases[1].spec.leak_cache = true, cases[1].why = "outside this attention";
  cases[2].spec.dropout = true, cases[2].why = "dropout";
  cases[3].spec.seq_dim = 1, cases[3].why = "";  // writes along heads: not a cache append
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    const ir::Graph g = DecodeGraph(c.spec);
    CacheParallelOptions o;
    o.world = 2;
    CacheParallelPlan plan = PlanCacheParallel(g, o);
    EXPECT_TRUE(plan.sites.empty());
    ASSERT_EQ(plan.skipped.size(), 1u);
    EXPECT_NE(plan.skipped[0].find("sdpa: "), std::string::npos);
    EXPECT_NE(plan.skipped[0].find(c.why), std::string::npos) << plan.skipped[0];
    CacheParallelOptions ctx = WorldOptions(2);
    PassResult r = CacheParallelPass(g, ctx);
    EXPECT_FALSE(r.changed);
    EXPECT_EQ(r.graph.nodes().size(), g.nodes().size());
  }
}

// Padding and sliding windows reach attention as a mask tensor: passed to cp_attention, which
// applies each rank's columns of it.
TEST(CacheParallel, AGeneralMaskIsPassedToTheAttention) {
  DecodeGraphSpec spec;
  spec.mask = false, spec.user_mask = true;
  const ir::Graph g = DecodeGraph(spec);
  const CacheParallelPlan plan = PlanCacheParallel(g, WorldOptions(2));
  ASSERT_EQ(plan.sites.size(), 1u) << plan.ToString();
  EXPECT_TRUE(plan.sites[0].masked);
  EXPECT_FALSE(plan.sites[0].causal);
  EXPECT_NE(plan.ToString().find("masked"), std::string::npos);
  PassResult r = CacheParallelPass(g, WorldOptions(2));
  ASSERT_TRUE(r.changed);
  ir::Verify(r.graph);
  for (const auto& n : r.graph.nodes()) {
    if (n.op != "torch_plugin::cp_attention.default") continue;
    ASSERT_EQ(n.args.size(), 15u);
    EXPECT_EQ(r.graph.value(n.args[13].value()).name, "mask");
  }
}

// StaticCache writes with index_copy_ at cache positions; attention reads a prefix, or the
// whole cache under its mask (then up to the capacity).
TEST(CacheParallel, IndexWritesAtPositionsAreCacheAppends) {
  for (bool whole : {false, true}) {
    DecodeGraphSpec spec;
    spec.index_write = true, spec.whole_read = whole, spec.mask = false, spec.user_mask = whole;
    const ir::Graph g = DecodeGraph(spec);
    const CacheParallelPlan plan = PlanCacheParallel(g, WorldOptions(2));
    ASSERT_EQ(plan.sites.size(), 1u) << plan.ToString();
    EXPECT_TRUE(plan.sites[0].indexed_write);
    PassResult r = CacheParallelPass(g, WorldOptions(2));
    ASSERT_TRUE(r.changed);
    ir::Verify(r.graph);
    EXPECT_EQ(Count(r.graph, "aten::index_copy.default"), 0);
    EXPECT_EQ(Count(r.graph, "aten::copy_.default"), 0);
    for (const auto& n : r.graph.nodes()) {
      if (n.op != "torch_plugin::cp_attention.default") continue;
      EXPECT_EQ(n.args[3].i, -1);  // no start: the positions say
      if (whole) {
        EXPECT_EQ(n.args[4].i, 64);  // the whole cache
      } else {
        EXPECT_EQ(r.graph.value(n.args[4].value()).name, "end");
      }
      EXPECT_EQ(r.graph.value(n.args[14].value()).name, "pos");
    }
  }
}

// DynamicCache-style growth: k = cat([past_k, k_new], 2) attended and returned. The past is a
// named forward argument whose length is a graph symbol (one per past, as Dynamo gives them).
ir::Graph CatGrowthGraph() {
  ir::GraphBuilder b;
  const int64_t B = 2, H = 4, HKV = 2, D = 16;
  auto sym_dim = [](const std::string& e) {
    ir::SymDim d;
    d.value = 7, d.expr = e;
    return d;
  };
  auto past_type = [&](const std::string& e) {
    ir::TensorType t = testing::F32({B, HKV, 1, D});
    t.shape[2] = sym_dim(e);
    return ir::ValueType::Tensor(t);
  };
  auto sk = b.AddInput("s0", SymInt("s0"), ir::InputKind::kSymbol);
  b.AddInput("s1", SymInt("s1"), ir::InputKind::kSymbol);
  auto q = b.AddInput("q", Tensor({B, H, 1, D}), ir::InputKind::kUser, "q");
  auto kn = b.AddInput("k_new", Tensor({B, HKV, 1, D}), ir::InputKind::kUser, "k_new");
  auto vn = b.AddInput("v_new", Tensor({B, HKV, 1, D}), ir::InputKind::kUser, "v_new");
  auto pk = b.AddInput("past_k", past_type("s0"), ir::InputKind::kUser, "past_k");
  auto pv = b.AddInput("past_v", past_type("s1"), ir::InputKind::kUser, "past_v");
  auto out0 = [&](ir::NodeId n) { return b.peek().node(n).outputs[0]; };
  auto grown = [&](const std::string& e) {
    ir::TensorType t = testing::F32({B, HKV, 1, D});
    t.shape[2] = sym_dim(e + " + 1");
    return ir::ValueType::Tensor(t);
  };
  auto ck = out0(b.AddNode(Op("cat_k", "aten::cat.default",
                              {ir::Arg::List({V(pk), V(kn)}), ir::Arg::Int(2)}, grown("s0"))));
  auto cv = out0(b.AddNode(Op("cat_v", "aten::cat.default",
                              {ir::Arg::List({V(pv), V(vn)}), ir::Arg::Int(2)}, grown("s1"))));
  ir::NodeSpec sdpa = Op("sdpa", "aten::scaled_dot_product_attention.default",
                         {V(q), V(ck), V(cv)}, Tensor({B, H, 1, D}));
  sdpa.kwargs.push_back({"enable_gqa", ir::Arg::Bool(true)});
  auto attn = out0(b.AddNode(sdpa));
  auto proj = out0(
      b.AddNode(Op("proj", "aten::mul.Tensor", {V(attn), ir::Arg::Int(2)}, Tensor({B, H, 1, D}))));
  (void)sk;
  b.SetOutput(ir::Arg::List({V(proj), V(ck), V(cv)}, /*tuple=*/true));
  return b.Build();
}

TEST(CacheParallel, ACacheGrownByCatIsSplitAndReturnedAsAPlaceholder) {
  const ir::Graph g = CatGrowthGraph();
  const CacheParallelPlan plan = PlanCacheParallel(g, WorldOptions(2));
  ASSERT_EQ(plan.sites.size(), 1u) << plan.ToString();
  EXPECT_TRUE(plan.sites[0].grown);
  EXPECT_NE(plan.ToString().find("grown by cat"), std::string::npos);
  PassResult r = CacheParallelPass(g, WorldOptions(2));
  ASSERT_TRUE(r.changed);
  ir::Verify(r.graph);
  EXPECT_EQ(Count(r.graph, "aten::cat.default"), 0);
  EXPECT_EQ(Count(r.graph, "torch_plugin::cp_cache_placeholder.default"), 2);
  for (const auto& n : r.graph.nodes()) {
    if (n.op != "torch_plugin::cp_attention.default") continue;
    EXPECT_EQ(r.graph.value(n.args[3].value()).name, "s0");  // the past's length
    EXPECT_EQ(n.args[4].i, -1);                               // end: start + the new entries
    EXPECT_EQ(n.args[9].i, -1);                               // capacity: grows
    EXPECT_EQ(n.args[7].s, "past_k");
  }
  // What the step returns for the caches are the placeholders.
  const auto outs = r.graph.OutputValues();
  ASSERT_EQ(outs.size(), 3u);
  for (size_t i = 1; i < 3; ++i)
    EXPECT_EQ(r.graph.node(r.graph.value(outs[i]).producer).op,
              "torch_plugin::cp_cache_placeholder.default");
}

TEST(CacheParallel, SeesThroughGroupedQueryExpansions) {
  for (const std::string gqa : {"repeat_interleave", "repeat_kv"}) {
    DecodeGraphSpec spec;
    spec.gqa = gqa;
    const ir::Graph g = DecodeGraph(spec);
    const CacheParallelPlan plan = PlanCacheParallel(g, WorldOptions(2));
    ASSERT_EQ(plan.sites.size(), 1u) << gqa << ": " << plan.ToString();
    EXPECT_EQ(plan.sites[0].q_heads, 4);
    EXPECT_EQ(plan.sites[0].kv_heads, 2);
    PassResult r = CacheParallelPass(g, WorldOptions(2));
    ASSERT_TRUE(r.changed) << gqa;
    ir::Verify(r.graph);
    EXPECT_EQ(Count(r.graph, "torch_plugin::cp_attention.default"), 1) << gqa;
    for (const char* gone : {"aten::repeat_interleave.self_int", "aten::expand.default",
                             "aten::_unsafe_view.default", "aten::unsqueeze.default"})
      EXPECT_EQ(Count(r.graph, gone), 0) << gqa << " left " << gone;
  }
  // A repeat along the sequence, or a strided slice on the way, is no GQA: left alone, with
  // its reason.
  for (const std::string gqa : {"repeat_interleave_seq", "repeat_kv_strided"}) {
    DecodeGraphSpec spec;
    spec.gqa = gqa;
    const CacheParallelPlan plan = PlanCacheParallel(DecodeGraph(spec), WorldOptions(2));
    EXPECT_TRUE(plan.sites.empty()) << gqa;
    ASSERT_EQ(plan.skipped.size(), 1u) << gqa;
    EXPECT_NE(plan.skipped[0].find("sdpa: keys/values do not come from a KV-cache buffer"),
              std::string::npos)
        << plan.skipped[0];
  }
}

TEST(CacheParallel, OptionErrorsSayWhatToDo) {
  try {
    CacheParallelPass(DecodeGraph({}), CacheParallelOptions{});
    FAIL() << "expected PassError";
  } catch (const PassError& e) {
    EXPECT_NE(std::string(e.what()).find("torch_plugin.cache_parallel(model, mesh)"),
              std::string::npos);
  }
  CacheParallelOptions bad_scheme = WorldOptions(2, "ring");
  EXPECT_THROW(CacheParallelPass(DecodeGraph({}), bad_scheme), PassError);
  CacheParallelOptions no_split = WorldOptions(2, "gather_qkv", /*split=*/false);
  EXPECT_THROW(CacheParallelPass(DecodeGraph({}), no_split), PassError);
  DecodeGraphSpec odd;
  odd.batch = 3;
  CacheParallelOptions odd_ctx = WorldOptions(2, "gather_qkv", /*split=*/true);
  EXPECT_THROW(CacheParallelPass(DecodeGraph(odd), odd_ctx), PassError);
}

TEST(CacheParallel, SchemeFollowsTheCostModel) {
  const ir::Graph g = DecodeGraph({});
  CacheParallelOptions o;
  o.world = 2;
  o.allow_batch_split = true;
  CacheParallelPlan plan = PlanCacheParallel(g, o);
  ASSERT_EQ(plan.sites.size(), 1u);
  const bool qkv_cheaper = plan.gather_qkv_cost.total_s < plan.gather_partials_cost.total_s;
  EXPECT_EQ(plan.scheme, qkv_cheaper ? "gather_qkv" : "gather_partials");
  // Without batch splitting only gather_partials is possible, whatever it costs.
  o.allow_batch_split = false;
  EXPECT_EQ(PlanCacheParallel(g, o).scheme, "gather_partials");
  // An odd batch cannot be split over two ranks.
  DecodeGraphSpec odd;
  odd.batch = 3;
  o.allow_batch_split = true;
  EXPECT_EQ(PlanCacheParallel(DecodeGraph(odd), o).scheme, "gather_partials");
}

}  // namespace
}  // namespace tp::passes
