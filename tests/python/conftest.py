"""Shared pytest setup: seeds, a clean Dynamo state per test, the helpers module on sys.path."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, os.cpu_count() or 1))
# The default compile's profile cache of this run, not the user's (~/.cache/torch_plugin):
# decisions measured earlier on this machine made a default-compile test pick another
# compiler than a fresh machine does (test_dynamic_batch_compiles_once_for_all_sizes then
# compared OpenVINO's outputs bit for bit). Rank processes inherit it.
if "TORCH_PLUGIN_PROFILE_DB" not in os.environ:
    import tempfile

    _PROFILE_DIR = tempfile.TemporaryDirectory(prefix="torch_plugin_tests_")
    os.environ["TORCH_PLUGIN_PROFILE_DB"] = os.path.join(_PROFILE_DIR.name, "profile.db")


@pytest.fixture(autouse=True)
def _fresh_state():
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


@pytest.fixture
def fixed_profile(monkeypatch) -> Callable[[dict[str, float]], None]:
    """A stub measurer for the placement search, so no test depends on this machine's speed.

    fixed_profile({"onnxruntime": 1e-5}) makes every group that compiles and matches eager on
    that backend cost 1e-5 s (ATen's and any backend not named: 1e-3 s). Groups are still
    compiled and checked against eager; every end-to-end timing (evolution, finalists, the
    check against eager) returns the same figure, so the DP's pick is what runs."""
    import stub_profile

    def apply(seconds: dict[str, float]) -> None:
        stub_profile.install(seconds, monkeypatch.setattr)
        stub_profile.install_whole_graph(seconds, monkeypatch.setattr)

    return apply


@pytest.fixture(scope="module")
def gloo():
    """gloo(world): `world` gloo ranks kept alive for the test module (gloo_pool.py)."""
    from gloo_pool import GlooPool

    pools: dict[int, GlooPool] = {}

    def get(world: int) -> GlooPool:
        if world not in pools:
            pools[world] = GlooPool(world)
        return pools[world]

    yield get
    for pool in pools.values():
        pool.close()
