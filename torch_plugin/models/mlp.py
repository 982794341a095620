"""A plain MLP."""

from __future__ import annotations

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: list[int], out_features: int):
        super().__init__()
        dims = [in_features, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            layers += [nn.Linear(a, b), nn.GELU()]
        layers.append(nn.Linear(dims[-1], out_features))
        self.layers = nn.Sequential(*layers)
        self.in_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_mlp(small: bool = False, **kw: object) -> MLP:
    cfg = (
        dict(in_features=64, hidden=[128, 128], out_features=10)
        if small
        else dict(in_features=784, hidden=[4096, 4096], out_features=1000)
    )
    cfg.update(kw)
    return MLP(**cfg)  # type: ignore[arg-type]


def mlp_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, model.in_features),)
