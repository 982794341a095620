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
