"""EfficientNet-B0 for 32x32 inputs (Tan & Le, ICML 2019), the SVHN participant of FCCL+.

``efficientnet_b0`` is the CIFAR variant the FCCL+ authors' code trains (the one behind
their tables): B0's seven MBConv stages (expansion, channels, repeats, kernel, stride)
with the stem at stride 1 and every stage at its ImageNet stride, so 32x32 ends at
2x2; squeeze-and-excitation with ``in_channels // 4`` units, SiLU ("swish"), dropout
0.2 before the classifier, and no final 1x1 conv to 1280 channels (the classifier
reads the 320-channel map). Its stochastic depth is off: the authors' code computes a
drop rate ``0.2 * b / blocks`` but never advances ``b``, so every block's rate is 0.
It costs 0.061 GFLOPs per 32x32 image, as theirs (``docs/models.md``); their printed
parameter count (3.87 M) adds a projection head FCCL+ never calls (``encoder``,
320 -> 320 -> 512: 267,072) and the unused 1x1 expansion conv of the first block (1,088).

``efficientnet_b0_s1`` is fedshift's earlier variant: the second stage at stride 1
instead of 2 (as the CIFAR MobileNetV2 does), so 32x32 ends at 4x4, and stochastic
depth rising to 0.2 over the blocks. Same parameters, 3.6x the FLOPs (0.219 GFLOPs);
kept for comparisons, it does not reproduce the published tables.

Own implementation, not torchvision's: torchvision's stem is stride 2 and fixed to 3
input channels, and its B0 carries the 1280-channel head.
"""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from .base import MODELS, FedModel, make_norm

# (expansion, out_channels, repeats, kernel, stride): B0's stages (ImageNet strides; the
# CIFAR variants differ only by the stride-1 stem and, for ``efficientnet_b0_s1``, stage 2).
B0_STAGES = (
    (1, 16, 1, 3, 1),
    (6, 24, 2, 3, 2),  # efficientnet_b0_s1: stride 1
    (6, 40, 2, 5, 2),
    (6, 80, 3, 3, 2),
    (6, 112, 3, 5, 1),
    (6, 192, 4, 5, 2),
    (6, 320, 1, 3, 1),
)


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop whole samples of a residual branch with probability ``p``."""
    if not training or p == 0.0:
        return x
    keep = 1.0 - p
    mask = x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(keep).div_(keep)
    return x * mask


class SqueezeExcite(nn.Module):
    """Channel gates from the globally pooled map: C -> r -> C, SiLU then sigmoid."""

    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, reduced, 1)
        self.fc2 = nn.Conv2d(reduced, channels, 1)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(self.act(self.fc1(s))))


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand (skipped at expansion 1), kxk depthwise, SE, 1x1 project."""

    def __init__(self, cin: int, cout: int, expansion: int, kernel: int, stride: int, norm: str, drop: float):
        super().__init__()
        mid = cin * expansion
        bias = norm == "none"
        layers: List[nn.Module] = []
        if expansion != 1:
            layers += [nn.Conv2d(cin, mid, 1, bias=bias), make_norm(norm, mid), nn.SiLU(inplace=True)]
        layers += [
            nn.Conv2d(mid, mid, kernel, stride=stride, padding=kernel // 2, groups=mid, bias=bias),
            make_norm(norm, mid),
            nn.SiLU(inplace=True),
            SqueezeExcite(mid, max(1, cin // 4)),
            nn.Conv2d(mid, cout, 1, bias=bias),
            make_norm(norm, cout),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout
        self.drop = drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        if self.residual:
            out = drop_path(out, self.drop, self.training)
            out += x  # in place: ``out`` is a fresh tensor (norm output or masked copy)
        return out


class EfficientNetB0(FedModel):
    """EfficientNet-B0, CIFAR variant (Tan & Le, EfficientNet, ICML 2019)."""

    input_sizes = (28, 32)

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        norm: str = "batch",
        dropout: float = 0.2,  # B0's classifier dropout (authors' code: 0.2)
        drop_path_rate: float = 0.0,  # authors' code: 0 in effect (see the module docstring); B0 paper: 0.2
        stage2_stride: int = 2,  # authors' code and ImageNet B0: 2; efficientnet_b0_s1: 1
    ):
        super().__init__()
        self.num_classes = num_classes
        bias = norm == "none"
        layers: List[nn.Module] = [
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=bias), make_norm(norm, 32), nn.SiLU(inplace=True)
        ]
        total = sum(s[2] for s in B0_STAGES)
        cin, b = 32, 0
        for i, (expansion, cout, repeats, kernel, stride) in enumerate(B0_STAGES):
            stride = stage2_stride if i == 1 else stride
            for j in range(repeats):
                layers.append(
                    MBConv(cin, cout, expansion, kernel, stride if j == 0 else 1, norm, drop_path_rate * b / total)
                )
                cin, b = cout, b + 1
        self.body = nn.Sequential(*layers)
        self.feature_dim = cin
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(cin, num_classes))

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(self.body, x)


@MODELS.register("efficientnet_b0")
def efficientnet_b0(num_classes: int = 10, in_channels: int = 3, norm: str = "batch") -> EfficientNetB0:
    """EfficientNet-B0 as the FCCL+ authors' code trains it (Tan & Le, ICML 2019): 2x2 final map."""
    return EfficientNetB0(num_classes, in_channels, norm)


@MODELS.register("efficientnet_b0_s1")
def efficientnet_b0_s1(num_classes: int = 10, in_channels: int = 3, norm: str = "batch") -> EfficientNetB0:
    """EfficientNet-B0 (Tan & Le, ICML 2019), stage 2 at stride 1 (4x4 final map), stochastic depth 0.2."""
    return EfficientNetB0(num_classes, in_channels, norm, drop_path_rate=0.2, stage2_stride=1)
