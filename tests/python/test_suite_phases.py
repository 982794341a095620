"""make test-py runs the tests that start no rank process two at a time, then the multi-rank
ones one at a time (conftest.py): a test that starts ranks must say so."""

from __future__ import annotations

import dist_workers
import pytest
from gloo_pool import GlooPool


def test_an_unmarked_test_cannot_start_ranks() -> None:
    with pytest.raises(RuntimeError, match=r"test_suite_phases.*mark it @pytest.mark.multirank"):
        dist_workers.spawn(print, 2)
    with pytest.raises(RuntimeError, match="mark it @pytest.mark.multirank"):
        GlooPool(2).run(print)


def test_the_gloo_fixture_marks_its_users_multirank(gloo, request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("multirank") is not None
