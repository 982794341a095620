"""Model zoo for tests, examples and benchmarks: random weights, built offline.

    model, inputs = torch_plugin.models.build("gpt2", small=True, batch=2)

Defaults are the published shapes (GPT-2 small, BERT-base, ResNet-50, the GraphPipe thesis's
MMT / DLRM / CANDLE-Uno); `small=True` gives the same topology at test size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from . import cnn, gpt, hf, llama, mlp, multibranch


@dataclasses.dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[..., nn.Module]  # build(small: bool, **overrides) -> model
    inputs: Callable[[nn.Module, int], tuple[Any, ...]]  # (model, batch) -> example inputs
    default_batch: int
    small_batch: int
    has_batchnorm: bool = False
    needs_transformers: bool = False


ZOO: dict[str, ZooModel] = {
    "mlp": ZooModel("mlp", mlp.build_mlp, mlp.mlp_inputs, 64, 4),
    "resnet50": ZooModel("resnet50", cnn.build_resnet50, cnn.image_inputs, 8, 2, True),
    "resnext50": ZooModel("resnext50", cnn.build_resnext50, cnn.image_inputs, 8, 2, True),
    "dcgan": ZooModel("dcgan", cnn.build_dcgan, cnn.dcgan_inputs, 16, 2, True),
    "nasnet": ZooModel("nasnet", cnn.build_nasnet, cnn.image_inputs, 8, 2, True),
    "bert": ZooModel("bert", hf.build_bert, hf.token_inputs, 4, 2, needs_transformers=True),
    "gpt2": ZooModel("gpt2", hf.build_gpt2, hf.token_inputs, 4, 2, needs_transformers=True),
    "gpt": ZooModel("gpt", gpt.build_gpt, hf.token_inputs, 8, 2),
    "llama": ZooModel("llama", llama.build_llama, llama.llama_inputs, 2, 2),
    "mmt": ZooModel("mmt", multibranch.build_mmt, multibranch.mmt_inputs, 64, 2),
    "dlrm": ZooModel("dlrm", multibranch.build_dlrm, multibranch.dlrm_inputs, 256, 2),
    "candle_uno": ZooModel(
        "candle_uno", multibranch.build_candle_uno, multibranch.candle_inputs, 4096, 2
    ),
}


def names() -> list[str]:
    return list(ZOO)


def build(
    name: str, small: bool = False, batch: int | None = None, seed: int = 0, **overrides: Any
) -> tuple[nn.Module, tuple[Any, ...]]:
    """Builds a zoo model with random weights (seeded) and example inputs of `batch` rows."""
    if name not in ZOO:
        raise ValueError(f"unknown zoo model {name!r}; available: {', '.join(ZOO)}")
    spec = ZOO[name]
    torch.manual_seed(seed)
    model = spec.build(small=small, **overrides)
    if batch is None:
        batch = spec.small_batch if small else spec.default_batch
    torch.manual_seed(seed + 1)
    return model, spec.inputs(model, batch)


def loss_of(output: Any) -> torch.Tensor:
    """A scalar from any model output (tensor, tuple, dataclass): the sum of float tensors."""
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        parts = [loss_of(o) for o in output if isinstance(o, (torch.Tensor, list, tuple, dict))]
        return torch.stack(parts).sum()
    raise TypeError(f"cannot make a loss of {type(output).__name__}")


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor of a model output (tensor, tuple, list, dict, HF ModelOutput), in order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for o in output for t in output_tensors(o)]
    return []


__all__ = ["ZOO", "ZooModel", "build", "loss_of", "names", "output_tensors"]
