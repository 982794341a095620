"""Helpers for identity round-trip tests: run a zoo model under a backend, collect everything
a bit-exact comparison needs (outputs, parameter gradients, buffers after the step)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch._dynamo

from torch_plugin.models import build, loss_of


def tensors_in(inputs: Any) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, (list, tuple)):
        return [t for x in inputs for t in tensors_in(x)]
    return []


def run_model(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    backend: str | None,
    options: dict[str, Any] | None = None,
    dynamic: bool = False,
    train: bool = True,
    seed: int = 1234,
) -> dict[str, Any]:
    """One step of `model` (a fresh deep copy) under `backend` (None = eager)."""
    model = copy.deepcopy(model)
    model.train(train)
    torch._dynamo.reset()
    fn = model
    if backend is not None:
        if dynamic:
            for t in tensors_in(inputs):
                torch._dynamo.mark_dynamic(t, 0)
        fn = torch.compile(
            model, backend=backend, options=options, dynamic=None if dynamic else False
        )
    torch.manual_seed(seed)
    with torch.set_grad_enabled(train):
        out = fn(*inputs)
        if train:
            loss_of(out).backward()
    return {
        "out": out.detach() if isinstance(out, torch.Tensor) else out,
        "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
        "fn": fn,
        "model": model,
    }


def assert_bit_exact(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    assert torch.equal(a["out"], b["out"]), f"{what}: outputs differ"
    assert a["grads"].keys() == b["grads"].keys(), f"{what}: different parameters got gradients"
    for n in a["grads"]:
        assert torch.equal(a["grads"][n], b["grads"][n]), f"{what}: gradient of {n} differs"
    for n in a["buffers"]:
        assert torch.equal(a["buffers"][n], b["buffers"][n]), f"{what}: buffer {n} differs"


def small_model(name: str, batch: int | None = None) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    return build(name, small=True, batch=batch)
