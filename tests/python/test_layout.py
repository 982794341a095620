"""The package layout is the architecture: capabilities depend downward only, in one stated
order, and no module imports another in a cycle (function-level imports included, since those
hide cycles rather than remove them). Read from the source with `ast`, so the check is instant
and says which import breaks the rule."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "torch_plugin"

# Lower layers first; a module may import its own layer and those before it. The root package
# (the public API) and `models` (built on everything, used by tests and examples) are outside.
LAYERS = [
    ["_C", "_compat", "_build_info", "ops", "fx_bridge"],
    ["runtime"],
    ["checkpoint"],
    ["sharding"],
    ["scale"],  # layouts for clusters we cannot run: the C++ model only
    ["placement"],
    ["pipeline"],  # a module-level stage may place its compute
    ["backend", "options"],  # the compile path
    ["cache_parallelism"],
    ["schedule"],
    ["distributed"],
]
OUTSIDE = {"", "models"}
# Entry points that sit above the compile path though their package is below it.
ENTRY_POINTS = {"torch_plugin.placement": "distributed"}  # place() compiles with the backend


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _runtime_imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The modules of ours `mod` imports when it runs (anywhere in it; not under
    TYPE_CHECKING), other than its own ancestors."""
    tree = ast.parse(path.read_text())
    for node in list(ast.walk(tree)):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found = [name] if name in mods else []
            found += [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in mods]
            out.update(found)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
    return {t for t in out if t != mod and not mod.startswith(t + ".")}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _runtime_imports(m, p, mods) for m, p in mods.items()}


def _part(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(mod: str) -> int | None:
    part = ENTRY_POINTS.get(mod, _part(mod))
    return next((i for i, names in enumerate(LAYERS) if part in names), None)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_another_in_a_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"torch_plugin.a": {"torch_plugin.b"}, "torch_plugin.b": {"torch_plugin.a"}}
    assert _cycles(graph) == [["torch_plugin.a", "torch_plugin.b"]]


def test_every_package_is_in_a_layer() -> None:
    parts = {_part(m) for m in _modules()} - OUTSIDE
    assert sorted(p for p in parts if _layer(f"torch_plugin.{p}") is None) == []


def test_packages_depend_downward_only() -> None:
    upward = []
    for mod, targets in _graph().items():
        mine = _layer(mod)
        if mine is None:
            continue
        for t in sorted(targets):
            theirs = _layer(t)
            if theirs is not None and theirs > mine:
                upward.append(f"{mod} imports {t} (layer {_part(t)} is above {_part(mod)})")
    assert upward == []


@pytest.mark.parametrize("mod", sorted(m for m in _modules() if m != "torch_plugin"))
def test_every_module_imports(mod: str) -> None:
    importlib.import_module(mod)


def test_no_package_shadows_a_public_name() -> None:
    """Importing a subpackage binds its name on the parent: a package named like a public
    function (torch_plugin.cache_parallel) would replace it once anything imports the package."""
    import types

    import torch_plugin

    for mod in _modules():
        importlib.import_module(mod)
    exported_packages = {"distributed", "models", "placement", "scale"}
    shadowed = [
        name
        for name in torch_plugin.__all__
        if isinstance(getattr(torch_plugin, name), types.ModuleType)
        and name not in exported_packages
    ]
    assert shadowed == []
    assert callable(torch_plugin.cache_parallel)
