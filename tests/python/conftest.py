"""Shared pytest setup: seeds, a clean Dynamo state per test, the helpers module on sys.path."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _fresh_state():
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
