"""FX bridge: record formats, exact round trip of odd arguments, malformed input -> GraphError
naming the node (never a crash), symbolic sizes, parameters by reference."""

from __future__ import annotations

import operator
import re

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from torch_plugin import _C, GraphError, fx_bridge


def aten_graph(fn, *args, **kw) -> fx.GraphModule:
    return make_fx(fn, **kw)(*args)


def roundtrip(gm: fx.GraphModule) -> fx.GraphModule:
    graph, ctx = fx_bridge.to_ir(gm)
    return fx_bridge.from_ir(graph, ctx)


def test_roundtrip_keeps_code_and_numerics_for_odd_arguments() -> None:
    def f(x, idx):
        y = torch.ops.aten._to_copy.default(
            x, dtype=torch.float64, layout=torch.strided, device=torch.device("cpu")
        )
        z = torch.ops.aten.clone.default(x, memory_format=torch.contiguous_format)
        a, b = torch.ops.aten.split.Tensor(z, 2, 1)
        m = torch.ops.aten.var_mean.correction(x, [1], correction=0, keepdim=True)
        g = torch.ops.aten.index.Tensor(x, [None, idx])
        return y.sum() + a.sum() + b.sum() + m[0].sum() + m[1].sum() + g.sum(), float("inf")

    x, idx = torch.randn(3, 4), torch.tensor([0, 2])
    gm = aten_graph(f, x, idx)
    new = roundtrip(gm)
    assert new.code == gm.code
    for a, b in zip(gm(x, idx), new(x, idx), strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def test_records_fold_getitems_into_multi_output_nodes() -> None:
    gm = aten_graph(
        lambda x: torch.ops.aten.native_layer_norm.default(x, [4], None, None, 1e-5)[0],
        torch.randn(2, 4),
    )
    gm.graph.eliminate_dead_code()  # unused getitems go: those outputs cross unnamed
    gm.recompile()
    graph, ctx = fx_bridge.to_ir(gm)
    inputs, nodes, output = graph.records()
    (ln,) = [n for n in nodes if n[1] == "aten::native_layer_norm.default"]
    assert ln[6] is True and len(ln[4]) == 3
    assert ln[5][0] == "getitem" and ln[5][1] == "" and ln[5][2] == ""
    assert not any(n[1].startswith("python::") for n in nodes)
    assert re.search(
        r"\(%getitem: f32\[[^]]*\], _: f32\[[^]]*\], _: f32\[[^]]*\]\) "
        r"%native_layer_norm",
        str(graph),
    ), str(graph)
    assert fx_bridge.from_ir(graph, ctx).code == gm.code


def test_symbolic_sizes_cross_as_expressions() -> None:
    gm = aten_graph(lambda x: x.view(-1) * 2, torch.randn(3, 4), tracing_mode="symbolic")
    graph, ctx = fx_bridge.to_ir(gm)
    inputs, nodes, _ = graph.records()
    shape = inputs[0][1][1]
    assert all(isinstance(d, tuple) for d in shape), shape
    assert shape[0][1] == 3  # hint
    assert ctx.symbolic_inputs == 1
    assert "f32[s" in str(graph)
    new = fx_bridge.from_ir(graph, ctx)
    assert new.code == gm.code
    assert torch.equal(new(torch.ones(5, 2)), gm(torch.ones(5, 2)))


def test_no_tensor_data_crosses_the_boundary() -> None:
    weight = torch.nn.Parameter(torch.randn(8, 8))
    gm = aten_graph(lambda x, w: x @ w, torch.randn(2, 8), weight)
    graph, ctx = fx_bridge.to_ir(gm, [("user", ""), ("parameter", "fc.weight")])
    inputs, nodes, _ = graph.records()

    def has_tensor(obj) -> bool:
        if isinstance(obj, torch.Tensor):
            return True
        if isinstance(obj, (list, tuple)):
            return any(has_tensor(o) for o in obj)
        return False

    assert not has_tensor(inputs) and not has_tensor(nodes)
    assert inputs[1][2:] == ("parameter", "fc.weight")
    assert ctx.opaques == []


def test_get_attr_constants_stay_in_python() -> None:
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.arange(6.0))

        def forward(self, x):
            return x + self.table

    gm = fx.symbolic_trace(M())
    graph, ctx = fx_bridge.to_ir(gm)
    assert any(n[1] == "fx::get_attr" for n in graph.records()[1])
    new = fx_bridge.from_ir(graph, ctx)
    assert new.code == gm.code
    assert torch.equal(new(torch.ones(6)), torch.arange(6.0) + 1)


def _valid_records():
    t = ("tensor", [2, 2], [2, 1], "float32", "cpu", False)
    inputs = [("x", t, "user", "")]
    nodes = [("neg", "aten::neg.default", [("v", 0)], [], [t], ["neg"], False, "")]
    return inputs, nodes, ("tuple", [("v", 1)])


def test_valid_records_build() -> None:
    g = _C.Graph.from_records(*_valid_records())
    assert g.num_nodes == 1 and g.num_inputs == 1


@pytest.mark.parametrize(
    "mutate, node, fragment",
    [
        # cycle: a uses b's output, b uses a's
        (
            lambda i, n, o: (
                i,
                [
                    ("a", "aten::neg.default", [("v", 2)], [], [i[0][1]], ["a"], False, ""),
                    ("b", "aten::neg.default", [("v", 1)], [], [i[0][1]], ["b"], False, ""),
                ],
                o,
            ),
            "a",
            "cycle",
        ),
        (lambda i, n, o: (i, [(*n[0][:2], [("v", 99)], *n[0][3:])], o), "neg", "dangling"),
        (
            lambda i, n, o: (
                i,
                [("mm", "aten::mm.default", [("v", 0)], [], [i[0][1]], ["mm"], False, "")],
                o,
            ),
            "mm",
            "wrong arity",
        ),
        (
            lambda i, n, o: (i, [(*n[0][:2], [("bogus", 1)], *n[0][3:])], o),
            "neg",
            "unknown argument tag",
        ),
        (lambda i, n, o: (i, [("neg", "aten::neg.default", [("v", 0)])], o), "#0", "8 fields"),
        (
            lambda i, n, o: (
                i,
                [(*n[0][:4], [("tensor", [2], [1], "float99", "cpu", False)], *n[0][5:])],
                o,
            ),
            "neg",
            "unknown dtype",
        ),
        (lambda i, n, o: (i, [(42, *n[0][1:])], o), "#0", "malformed record"),
        (lambda i, n, o: ([("x", i[0][1], "weights", "")], n, o), "x", "unknown input kind"),
        (lambda i, n, o: (i, n, ("tuple", [("v", 5)])), "output", "dangling"),
    ],
    ids=[
        "cycle",
        "dangling",
        "arity",
        "bad_tag",
        "short_record",
        "bad_dtype",
        "bad_name_type",
        "bad_input_kind",
        "dangling_output",
    ],
)
def test_malformed_records_raise_graph_error_naming_node(mutate, node, fragment) -> None:
    with pytest.raises(GraphError) as info:
        _C.Graph.from_records(*mutate(*_valid_records()))
    assert info.value.node == node, str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_resolve_op_errors_are_clear() -> None:
    ctx = fx_bridge.BridgeContext(gm=fx.GraphModule(torch.nn.Module(), fx.Graph()))
    assert fx_bridge.resolve_op("aten::mm.default", ctx) is torch.ops.aten.mm.default
    assert fx_bridge.resolve_op("torch_plugin::bias_gelu.default", ctx) is (
        torch.ops.torch_plugin.bias_gelu.default
    )
    with pytest.raises(fx_bridge.BridgeError, match="cannot resolve op 'aten::no_such_op.default'"):
        fx_bridge.resolve_op("aten::no_such_op.default", ctx)
    with pytest.raises(fx_bridge.BridgeError, match="expected 'namespace::name.overload'"):
        fx_bridge.resolve_op("not an op", ctx)


def test_python_targets_roundtrip() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    s = g.call_function(operator.mul, (x, 3))
    big = g.call_function(operator.add, (s, 2**70))  # beyond int64: crosses as an opaque
    g.output((s, big))
    gm = fx.GraphModule(torch.nn.Module(), g)
    graph, ctx = fx_bridge.to_ir(gm)
    assert graph.records()[1][0][1] == "python::_operator.mul"
    assert ctx.opaques == [2**70]
    new = fx_bridge.from_ir(graph, ctx)
    assert new.code == gm.code and new(4) == (12, 12 + 2**70)


def test_estimates_reach_python() -> None:
    gm = aten_graph(lambda a, b: torch.mm(a, b), torch.randn(4, 8), torch.randn(8, 3))
    graph, _ = fx_bridge.to_ir(gm)
    ((name, op, cls, flops, nbytes, known),) = graph.estimate()
    assert (op, cls, known) == ("aten::mm.default", "matmul", True)
    assert flops == 2 * 4 * 8 * 3 and nbytes == 4 * (32 + 24 + 12)


def test_solver_reachable_from_python() -> None:
    status, obj, values = _C.solve_ilp(
        [(0, 1, 10, True), (0, 1, 13, True), (0, 1, 7, True)],
        [([(0, 4.0), (1, 6.0), (2, 3.0)], "<=", 9.0)],
        maximize=True,
    )
    assert status == "optimal" and abs(obj - 20) < 1e-6 and [round(v) for v in values] == [0, 1, 1]
    with pytest.raises(ValueError, match="sense must be"):
        _C.solve_ilp([(0, 1, 1, True)], [([(0, 1.0)], "<", 1.0)])


@pytest.mark.parametrize(
    "source, path",
    [
        ("L['self']._modules['fc']._parameters['weight']", "fc.weight"),
        ("L['self'].layers[0].attn", "layers.0.attn"),
        ("L['self']._modules['bn']._buffers['running_mean']", "bn.running_mean"),
        ("L__self___fc", "fc"),
        ("L['x']", "x"),
        ("model.layers.0.mlp", "model.layers.0.mlp"),  # make_fx's module stack
        ("model", "model"),
    ],
)
def test_module_path_from_dynamo_sources(source: str, path: str) -> None:
    assert fx_bridge.module_path(source) == path


@pytest.mark.parametrize("name", ["llama", "t5", "mixtral", "gpt2", "vit"])
def test_ir_text_reads_back_exactly_on_hf_training_graphs(name: str) -> None:
    """str(graph) -> _C.Graph.parse -> FX gives the same code as the graph itself, forward and
    backward: the text form golden files use loses nothing the bridge needs."""
    from torch._dynamo.backends.common import aot_autograd

    from torch_plugin.backend import _dynamo_input_kinds
    from torch_plugin.models import hf_suite

    checked: list[int] = []

    def capture(gm, example_inputs):  # type: ignore[no-untyped-def]
        kinds = _dynamo_input_kinds(gm, example_inputs)

        def check(fx_g, _inputs):  # type: ignore[no-untyped-def]
            graph, ctx = fx_bridge.to_ir(fx_g, kinds if not checked else None)
            text = str(graph)
            parsed = _C.Graph.parse(text)
            assert str(parsed) == text
            assert fx_bridge.from_ir(parsed, ctx).code == fx_bridge.from_ir(graph, ctx).code
            checked.append(graph.num_nodes)
            return fx_g

        return aot_autograd(fw_compiler=check, bw_compiler=check)(gm, example_inputs)

    torch._dynamo.reset()
    model, inputs = hf_suite.build(name, layers=1)
    torch.compile(model, backend=capture)(**inputs).loss.backward()
    assert len(checked) >= 2 and max(checked) > 30, checked


def test_scopes_of_a_captured_hf_model_are_its_module_paths() -> None:
    """The sharding and pipeline captures (make_fx, module stacks recorded): each node's IR
    scope is the full path of the module it ran in, so a pipeline's scope_depth of 3 groups a
    whole decoder layer ("model.layers.0"), not half of one ("layers.0.mlp")."""
    from user_programs import default_config_model

    from torch_plugin.runtime.capture import trace_call

    model = default_config_model("llama")
    ids = torch.randint(0, 100, (2, 8))
    traced = trace_call(model, ((), {"input_ids": ids}), record_module_stack=True)
    graph, _ = fx_bridge.to_ir(traced.gm)
    scopes = {node[7] for node in graph.records()[1] if node[7]}  # (name, ..., scope)
    assert "model.layers.0.mlp.down_proj" in scopes, sorted(scopes)[:8]
    assert {s.split(".")[0] for s in scopes} <= {"model", "lm_head"}
