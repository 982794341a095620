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
    os.environ["TORCH_PLUGIN_TESTS_PROFILE_DIR"] = _PROFILE_DIR.name
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("TORCH_PLUGIN_TESTS_PROFILE_DIR"):
    # A parallel worker (make test-py's first phase) keeps a cache of its own beside the
    # controller's: two workers' decisions would otherwise land in each other's tests in an
    # order that changes from run to run.
    _worker_dir = os.path.join(
        os.environ["TORCH_PLUGIN_TESTS_PROFILE_DIR"], os.environ["PYTEST_XDIST_WORKER"]
    )
    os.makedirs(_worker_dir, exist_ok=True)
    os.environ["TORCH_PLUGIN_PROFILE_DB"] = os.path.join(_worker_dir, "profile.db")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "multirank: starts rank processes (gloo, torchrun); make test-py runs these one at a "
        "time, after the others ran two at a time, so no collective's timeout races another "
        "test for the two cores",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The `gloo` fixture's users are multi-rank by construction; the tests that spawn ranks
    # themselves carry the marker (and _ranks_only_where_marked catches one that does not).
    for item in items:
        if "gloo" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.multirank)


@pytest.fixture(autouse=True)
def _ranks_only_where_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test that starts rank processes without the multirank marker fails, naming the fix:
    unmarked, it would run beside another test in make test-py's parallel phase."""
    if request.node.get_closest_marker("multirank") is not None:
        yield
        return
    import gloo_pool
    import torch.multiprocessing

    def refuse(*args, **kwargs):
        raise RuntimeError(
            f"{request.node.nodeid} starts rank processes: mark it @pytest.mark.multirank "
            "(make test-py runs the unmarked tests two at a time)"
        )

    monkeypatch.setattr(torch.multiprocessing, "spawn", refuse)
    monkeypatch.setattr(torch.multiprocessing, "start_processes", refuse)
    monkeypatch.setattr(gloo_pool.GlooPool, "_start", refuse)
    yield


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
