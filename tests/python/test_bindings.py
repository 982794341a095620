"""The binding's surface (csrc/bindings): typed options and plans, and no wide calls."""

from __future__ import annotations

import inspect

import pytest

from torch_plugin import _C


def _params(doc: str) -> list[str]:
    """Parameters of a pybind11 signature line "name(a: T, b: U = x, *, c: V) -> R"."""
    start = doc.index("(") + 1
    depth, cur, out = 0, "", []
    for ch in doc[start:]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _positional(doc: str) -> int:
    n = 0
    for p in _params(doc):
        if p == "*" or p.startswith("*"):
            break
        n += 1
    return n


def _callables() -> list[tuple[str, str]]:
    """(qualified name, signature line) of every function and method the binding defines."""
    out = []
    modules = [_C, _C.pattern]
    for mod in modules:
        for name, obj in vars(mod).items():
            if name.startswith("__"):
                continue
            targets = [(name, obj)]
            if inspect.isclass(obj) and obj.__module__.startswith("torch_plugin._C"):
                targets = [
                    (f"{name}.{m}", f)
                    for m, f in vars(obj).items()
                    if callable(f) and (not m.startswith("__") or m == "__init__")
                ]
            for qual, f in targets:
                doc = getattr(f, "__doc__", None) or ""
                # pybind11 functions document every overload's signature first.
                for line in doc.splitlines():
                    line = line.strip()
                    if "(" in line and ") ->" in line:
                        line = line.split(". ", 1)[-1] if line[:1].isdigit() else line
                        out.append((f"{mod.__name__}.{qual}", line))
    return out


def test_no_call_across_the_binding_takes_more_than_four_positional_arguments() -> None:
    calls = _callables()
    assert len(calls) > 40, "the walk found too few bound callables"
    widest = max(calls, key=lambda c: _positional(c[1]))
    print(f"widest call: {widest[0]}: {_positional(widest[1])} positional ({widest[1]})")
    too_wide = [(q, s) for q, s in calls if _positional(s) > 4]
    assert not too_wide, too_wide


def test_every_pass_is_registered_with_typed_options_and_result() -> None:
    passes = {p.name: p for p in _C.registered_passes()}
    for name in (
        "dead_code_elimination",
        "placement_search",
        "placement_dp",
        "sharding_ilp",
        "sharding_materialize",
        "pipeline_partition",
        "cache_parallel",
    ):
        assert name in passes, name
    for p in passes.values():
        assert p.summary and p.result
        # Each named type is bound, with keyword construction, repr and to_dict.
        for type_name in (p.options, p.result):
            if type_name and type_name != "Graph":
                cls = getattr(_C, type_name)
                assert hasattr(cls, "to_dict") and cls.__repr__ is not object.__repr__, type_name
    assert {p.name for p in passes.values() if p.rewrite} == {
        "dead_code_elimination",
        "cache_parallel",
    }


def test_options_are_typed_and_say_what_is_wrong() -> None:
    o = _C.ShardingOptions(world=4, level="fast", pinned={"fc.weight": "S(0)"})
    assert (o.world, o.level, o.pinned) == (4, "fast", {"fc.weight": "S(0)"})
    assert repr(o).startswith("ShardingOptions(world=4, device='a100'")
    assert _C.ShardingOptions(**o.to_dict()).to_dict() == o.to_dict()
    with pytest.raises(TypeError, match="unknown field 'worlds'; fields: world, device"):
        _C.ShardingOptions(worlds=4)
    with pytest.raises(TypeError, match="ShardingOptions.world takes a int, got 'four'"):
        _C.ShardingOptions(world="four")
    with pytest.raises(ValueError, match="bad shard spec"):
        _C.ShardingOptions(pinned={"w": "Shard(0)"})
    # The one spec parser, which the runtime's reshards and checkpoint layouts read through.
    assert [_C.parse_spec(s) for s in ("R", "P", "S(1)", "S(0)x3")] == [
        ("R", -1, 1),
        ("P", -1, 1),
        ("S", 1, 1),
        ("S", 0, 3),
    ]
    for bad in ("S(1)y", "S(0)x1", "S(a)", "S(1a)", "Q"):
        with pytest.raises(ValueError, match="bad shard spec"):
            _C.parse_spec(bad)
    with pytest.raises(ValueError, match="methods: exhaustive, coordinate_descent"):
        _C.TuneOptions(method="random")
    assert _C.TuneOptions(method="coordinate_descent").method == "coordinate_descent"


def test_pass_manager_runs_rewrites_and_refuses_plan_passes() -> None:
    text = (
        "graph(%x: f32[4, 8] user):\n"
        "  %relu: f32[4, 8] = aten::relu.default(%x)\n"
        "  %dead: f32[4, 8] = aten::neg.default(%x)\n"
        "  return (%relu,)\n"
    )
    g = _C.Graph.parse(text)
    lines: list[str] = []
    out, report = _C.PassManager(log=lines.append).run(g, ["dead_code_elimination"])
    assert out.num_nodes == 1 and str(_C.Graph.parse(str(out))) == str(out)
    assert report.passes[0].nodes_before == 2 and report.passes[0].changed
    assert "dead_code_elimination" in repr(report) and lines
    with pytest.raises(_C.PassError, match="planning pass"):
        _C.PassManager().run(g, ["sharding_ilp"])
    with pytest.raises(_C.GraphError, match="line 2"):
        _C.Graph.parse(text.replace("%x)\n  %dead", "%y)\n  %dead"))
