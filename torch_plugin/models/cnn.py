"""Convolutional zoo models, hand-written (no torchvision): ResNet-50, ResNeXt-50, DCGAN
generator and a NASNet-A-like cell network."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)
    )


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, groups: int, base_width: int):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        cout = planes * self.expansion
        self.conv1 = conv_bn(cin, width, 1)
        self.conv2 = conv_bn(width, width, 3, stride, groups)
        self.conv3 = conv_bn(width, cout, 1)
        self.downsample = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.conv1(x))
        out = F.relu(self.conv2(out))
        return F.relu(self.conv3(out) + identity)


class ResNet(nn.Module):
    """ResNet/ResNeXt with bottleneck blocks (He et al. 2016; Xie et al. 2017)."""

    def __init__(
        self,
        layers: list[int],
        width: int = 64,
        groups: int = 1,
        base_width: int = 64,
        num_classes: int = 1000,
        image_size: int = 224,
    ):
        super().__init__()
        self.image_size = image_size
        self.stem = nn.Sequential(conv_bn(3, width, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        cin = width
        for i, n in enumerate(layers):
            planes = width * 2**i
            for j in range(n):
                blocks.append(
                    Bottleneck(cin, planes, 2 if (j == 0 and i > 0) else 1, groups, base_width)
                )
                cin = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_resnet50(small: bool = False, **kw: object) -> ResNet:
    cfg = (
        dict(layers=[1, 1, 1, 1], width=8, num_classes=10, image_size=32)
        if small
        else dict(layers=[3, 4, 6, 3])
    )
    cfg.update(kw)
    return ResNet(**cfg)  # type: ignore[arg-type]


def build_resnext50(small: bool = False, **kw: object) -> ResNet:
    cfg = (
        dict(layers=[1, 1, 1, 1], width=16, groups=4, base_width=16, num_classes=10, image_size=32)
        if small
        else dict(layers=[3, 4, 6, 3], groups=32, base_width=4)
    )
    cfg.update(kw)
    return ResNet(**cfg)  # type: ignore[arg-type]


def image_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor]:
    s = model.image_size
    return (torch.randn(batch, 3, s, s),)


class DCGANGenerator(nn.Module):
    """DCGAN generator (Radford et al. 2016): z [B, nz, 1, 1] -> image [B, nc, 64, 64]."""

    def __init__(self, nz: int = 100, ngf: int = 64, nc: int = 3):
        super().__init__()
        self.nz = nz

        def up(cin: int, cout: int, stride: int, pad: int) -> list[nn.Module]:
            return [
                nn.ConvTranspose2d(cin, cout, 4, stride, pad, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(True),
            ]

        self.main = nn.Sequential(
            *up(nz, ngf * 8, 1, 0),
            *up(ngf * 8, ngf * 4, 2, 1),
            *up(ngf * 4, ngf * 2, 2, 1),
            *up(ngf * 2, ngf, 2, 1),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


def build_dcgan(small: bool = False, **kw: object) -> DCGANGenerator:
    cfg = dict(nz=16, ngf=8) if small else {}
    cfg.update(kw)
    return DCGANGenerator(**cfg)  # type: ignore[arg-type]


def dcgan_inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, model.nz, 1, 1),)


class SepConv(nn.Module):
    """ReLU -> depthwise k x k -> pointwise 1x1 -> BN, twice (NASNet's separable conv)."""

    def __init__(self, c: int, k: int, stride: int = 1):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(2):
            layers += [
                nn.ReLU(),
                nn.Conv2d(c, c, k, stride if i == 0 else 1, k // 2, groups=c, bias=False),
                nn.Conv2d(c, c, 1, bias=False),
                nn.BatchNorm2d(c),
            ]
        self.op = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class NasCell(nn.Module):
    """A NASNet-A cell (Zoph et al. 2018): five two-branch blocks over (h_prev, h), concat.

    Normal cells keep the resolution; reduction cells halve it (stride 2 on their branches).
    """

    def __init__(self, c_prev: int, c_in: int, c: int, reduction: bool, prev_reduced: bool):
        super().__init__()
        self.reduction = reduction
        self.pre_prev = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(c_prev, c, 1, 2 if prev_reduced else 1, bias=False),
            nn.BatchNorm2d(c),
        )
        self.pre = nn.Sequential(nn.ReLU(), nn.Conv2d(c_in, c, 1, bias=False), nn.BatchNorm2d(c))
        s = 2 if reduction else 1
        self.b0 = nn.ModuleList([SepConv(c, 3, s), SepConv(c, 5, s)])
        self.b1 = nn.ModuleList([SepConv(c, 5, s), SepConv(c, 3, s)])
        self.b4 = nn.ModuleList([SepConv(c, 5, s), SepConv(c, 3, s)])
        self.stride = s
        self.out_channels = 5 * c

    def forward(self, h_prev: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        p, x = self.pre_prev(h_prev), self.pre(h)
        s = self.stride
        down = (
            (lambda t: F.avg_pool2d(t, 3, s, 1, count_include_pad=False))
            if s > 1
            else (lambda t: t)
        )
        y0 = self.b0[0](x) + self.b0[1](p)
        y1 = self.b1[0](p) + self.b1[1](x)
        y2 = F.avg_pool2d(x, 3, s, 1, count_include_pad=False) + down(p)
        y3 = F.max_pool2d(p, 3, s, 1) + F.avg_pool2d(p, 3, s, 1, count_include_pad=False)
        y4 = self.b4[0](p) + self.b4[1](x)
        return torch.cat([y0, y1, y2, y3, y4], dim=1)


class NasNetLike(nn.Module):
    def __init__(
        self,
        channels: int = 44,
        cells_per_stage: int = 4,
        stages: int = 3,
        num_classes: int = 1000,
        image_size: int = 224,
    ):
        super().__init__()
        self.image_size = image_size
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, 2, 1, bias=False), nn.BatchNorm2d(channels)
        )
        cells: list[NasCell] = []
        c_prev, c_in, prev_reduced = channels, channels, False
        c = channels
        for stage in range(stages):
            if stage > 0:
                c *= 2
                cells.append(NasCell(c_prev, c_in, c, True, prev_reduced))
                c_prev, c_in, prev_reduced = c_in, cells[-1].out_channels, True
            for _ in range(cells_per_stage):
                cells.append(NasCell(c_prev, c_in, c, False, prev_reduced))
                c_prev, c_in, prev_reduced = c_in, cells[-1].out_channels, False
        self.cells = nn.ModuleList(cells)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h_prev = h = self.stem(x)
        for cell in self.cells:
            h_prev, h = h, cell(h_prev, h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(h), 1), 1))


def build_nasnet(small: bool = False, **kw: object) -> NasNetLike:
    cfg = (
        dict(channels=8, cells_per_stage=1, stages=2, num_classes=10, image_size=32)
        if small
        else {}
    )
    cfg.update(kw)
    return NasNetLike(**cfg)  # type: ignore[arg-type]
