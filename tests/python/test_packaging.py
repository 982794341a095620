"""Packaging: the metadata ships every subpackage, and a torch of another minor release than the
extension's is refused at import with both versions named (CI's test-wheel installs the wheel
in a fresh venv and runs scripts/wheel_smoke.py from another directory)."""

from __future__ import annotations

import os

import pytest
import setuptools
import tomllib

import torch_plugin
from torch_plugin import _build_info, _compat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_subpackage_is_in_the_distribution() -> None:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    shipped = set(setuptools.find_packages(ROOT, include=find["include"]))
    on_disk = {
        os.path.relpath(d, ROOT).replace(os.sep, ".")
        for d, _, files in os.walk(os.path.dirname(torch_plugin.__file__))
        if "__init__.py" in files
    }
    assert on_disk and on_disk <= shipped, sorted(on_disk - shipped)


def test_another_torch_minor_is_refused_naming_both(monkeypatch) -> None:
    monkeypatch.setattr(_build_info, "TORCH_VERSION", "2.12.1+cpu")
    with pytest.raises(
        ImportError, match=r"built against torch 2\.12\.1\+cpu .* loads only into torch 2\.12\.x"
    ):
        _compat.check_torch()
    monkeypatch.setattr(_build_info, "TORCH_VERSION", "2.13.7")  # a patch release: fine
    _compat.check_torch()


@pytest.mark.parametrize("torch_has_optimization_hint", [True, False])
def test_a_symbolic_size_is_read_without_a_guard_on_every_supported_torch(
    monkeypatch: pytest.MonkeyPatch, torch_has_optimization_hint: bool
) -> None:
    """torch 2.11 (the CUDA image's) has no optimization_hint: importing it made every default
    compile on the H200 fall back to the unrewritten graph."""
    import torch.fx.experimental.symbolic_shapes as sym
    from torch._dynamo.source import ConstantSource

    from torch_plugin._compat import size_hint

    if not torch_has_optimization_hint:
        monkeypatch.delattr(sym, "optimization_hint", raising=False)
    env = sym.ShapeEnv()
    s = env.create_symintnode(env.create_symbol(7, ConstantSource("n")), hint=7)
    assert size_hint(s) == 7 and size_hint(5) == 5
    assert not env.guards  # int(s) would have added one
