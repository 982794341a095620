"""Property tests (hypothesis) at the Python/C++ boundary.

1. Random ATen graphs from a small grammar (elementwise, matmul, reductions, softmax, layer norm,
   multi-output ops, split/cat, views) go through to_ir -> every pass -> from_ir and must
   compute exactly what the original graph computes (identity: the same code, too).
2. Random corruptions of valid records (references, ops, types, odd Python objects) must give a
   graph or torch_plugin.GraphError naming a node — never a crash or another exception.
Derandomized so CI is reproducible; TP_FUZZ_EXAMPLES raises the example count for long runs.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from torch_plugin import _C, GraphError, PassError, fx_bridge

# Options the registered passes need (cache_parallel: the ranks sharing a KV cache).
PASS_OPTIONS = _C.RewriteOptions(cache_parallel=_C.CacheParallelOptions(world=2))
REWRITES = [p.name for p in _C.registered_passes() if p.rewrite]

EXAMPLES = int(os.environ.get("TP_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

aten = torch.ops.aten
# Every op maps [R, C] tensors to an [R, C] tensor, so any program is well-typed.
UNARY = {
    "relu": aten.relu.default,
    "exp": lambda x: aten.exp.default(aten.clamp.default(x, -5, 5)),
    "tanh": aten.tanh.default,
    "neg": aten.neg.default,
    "sigmoid": aten.sigmoid.default,
    "gelu": lambda x: aten.gelu.default(x, approximate="tanh"),
    "softmax": lambda x: aten._softmax.default(x, 1, False),
    "layer_norm": lambda x: aten.native_layer_norm.default(x, [x.shape[1]], None, None, 1e-5)[0],
    "center": lambda x: aten.sub.Tensor(x, aten.var_mean.correction(x, [1], keepdim=True)[1]),
    "split_cat": lambda x: aten.cat.default(list(aten.split.Tensor(x, 1, 1))[::-1], 1),
    "double_t": lambda x: aten.t.default(aten.clone.default(aten.t.default(x))),
    "row_sum": lambda x: aten.add.Tensor(x, aten.sum.dim_IntList(x, [1], True)),
    "to_f64_back": lambda x: aten._to_copy.default(
        aten._to_copy.default(x, dtype=torch.float64), dtype=torch.float32
    ),
}
BINARY = {
    "add": aten.add.Tensor,
    "mul": aten.mul.Tensor,
    "sub": lambda a, b: aten.sub.Tensor(a, b, alpha=2),
    "maximum": aten.maximum.default,
    "where": lambda a, b: aten.where.self(aten.gt.Tensor(a, b), a, b),
    "matmul_w": None,  # a @ W with the square weight input
}


@st.composite
def programs(draw):
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    n_inputs = draw(st.integers(1, 3))
    steps = []
    for _ in range(draw(st.integers(1, 12))):
        pool = n_inputs + len(steps)
        if draw(st.booleans()):
            steps.append(
                ("u", draw(st.sampled_from(sorted(UNARY))), draw(st.integers(0, pool - 1)))
            )
        else:
            a, b = draw(st.integers(0, pool - 1)), draw(st.integers(0, pool - 1))
            steps.append(("b", draw(st.sampled_from(sorted(BINARY))), a, b))
    n_out = draw(st.integers(1, min(3, n_inputs + len(steps))))
    outputs = draw(
        st.lists(st.integers(0, n_inputs + len(steps) - 1), min_size=n_out, max_size=n_out)
    )
    return rows, cols, n_inputs, steps, outputs


def build(program):
    rows, cols, n_inputs, steps, outputs = program

    def fn(weight, *xs):
        pool = list(xs)
        for step in steps:
            if step[0] == "u":
                pool.append(UNARY[step[1]](pool[step[2]]))
            elif step[1] == "matmul_w":
                pool.append(aten.mm.default(pool[step[2]], weight))
            else:
                pool.append(BINARY[step[1]](pool[step[2]], pool[step[3]]))
        return tuple(pool[i] for i in outputs)

    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(cols, cols, generator=gen)] + [
        torch.randn(rows, cols, generator=gen) for _ in range(n_inputs)
    ]
    return make_fx(fn)(*inputs), inputs


@SETTINGS
@given(programs())
def test_random_graphs_survive_every_pass(program) -> None:
    gm, inputs = build(program)
    expected = gm(*inputs)
    for passes in [[]] + [[name] for name in REWRITES]:
        graph, ctx = fx_bridge.to_ir(gm)
        out_graph, _ = _C.PassManager().run(graph, passes, PASS_OPTIONS)
        new = fx_bridge.from_ir(out_graph, ctx)
        if not passes:
            assert new.code == gm.code
        for a, b in zip(expected, new(*inputs), strict=True):
            assert torch.equal(a, b), f"passes={passes}"
    # The sharding planner takes any graph: a plan (every value with a spec) or PlanError.
    graph, _ = fx_bridge.to_ir(gm)
    pm = _C.PassManager()
    options = _C.ShardingOptions(world=2, device="cpu", training=False, time_limit_s=10.0)
    assert pm.plan_sharding(graph, options).status in ("optimal", "feasible")
    # Placement's C++ half takes any graph: candidates of every rule set, then a DP cover in
    # which every node is placed exactly once (measured costs stood in for by group sizes).
    cands = _C.placement_candidates(graph, list(_C.pattern.known_rule_sets()))["candidates"]
    choices = [
        _C.PlacementChoice(
            candidate=c["id"],
            nodes=c["node_ids"],
            cost=1e-6 * len(c["node_ids"]),
            backend=c["backend"],
        )
        for c in cands
    ]
    chosen = pm.place_op_level(graph, choices, _C.PlacementOptions(), switch_penalty=1e-7).chosen
    by_id = {c["id"]: c for c in cands}
    placed = sorted(n for i in chosen for n in by_id[i]["node_ids"])
    assert placed == list(range(graph.num_nodes))


def _mutate(value, draw, depth=0):
    """Returns a corrupted copy of a record component."""
    choice = draw(st.integers(0, 9))
    junk = st.one_of(
        st.none(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=4),
        st.tuples(st.text(max_size=3), st.integers(-3, 50)), st.lists(st.integers(), max_size=2),
    )  # fmt: skip
    if choice < 3 or depth > 3:
        return draw(junk)
    if isinstance(value, (list, tuple)) and value:
        items = list(value)
        i = draw(st.integers(0, len(items) - 1))
        action = draw(st.integers(0, 2))
        if action == 0:
            items[i] = _mutate(items[i], draw, depth + 1)
        elif action == 1:
            del items[i]
        else:
            items.insert(i, draw(junk))
        return type(value)(items) if isinstance(value, tuple) else items
    return draw(junk)


@SETTINGS
@given(programs(), st.data())
def test_corrupted_records_raise_graph_error_not_crash(program, data) -> None:
    gm, _ = build(program)
    graph, _ = fx_bridge.to_ir(gm)
    inputs, nodes, output = graph.records()
    nodes = [n[:8] for n in nodes]  # node records carry their output ids last; builders don't
    target = data.draw(st.sampled_from(["inputs", "nodes", "output"]))
    if target == "inputs" and inputs:
        inputs = _mutate(inputs, data.draw)
        inputs = inputs if isinstance(inputs, list) else [inputs]
    elif target == "nodes" and nodes:
        nodes = _mutate(nodes, data.draw)
        nodes = nodes if isinstance(nodes, list) else [nodes]
    else:
        output = _mutate(output, data.draw)
    try:
        rebuilt = _C.Graph.from_records(inputs, nodes, output)
    except GraphError as e:
        assert str(e) and isinstance(e.node, str)
        return
    # Accepted: it must then be a graph every tool can handle.
    str(rebuilt)
    rebuilt.estimate()
    rebuilt.records()
    try:
        _C.PassManager().run(rebuilt, REWRITES, PASS_OPTIONS)
    except PassError as e:
        pytest.fail(f"a verified graph failed a pass: {e}")
