"""MobileNetV2 for 32x32 inputs (Sandler et al., CVPR 2018), the SYN participant of FCCL+.

The CIFAR variant the FCCL+ authors use (kuangliu/pytorch-cifar style): stem 3x3 at
stride 1 (32 channels), the second stage at stride 1 instead of 2, so 32x32 ends at
4x4; last 1x1 conv to 1280 channels, global average pooling, linear classifier. That
variant differs from the paper in two details this module keeps, so that parameter
counts and behaviour match the authors' networks: the first block (expansion 1) still
has its 1x1 expansion conv, and every stride-1 block whose width changes gets a 1x1
projection shortcut (the paper has a residual only where the shape is unchanged);
and its activations are ReLU rather than ReLU6. It is layer for layer the network of
the FCCL+ authors' code (0.182 GFLOPs per 32x32 image); their printed parameter count
(4.59 M) adds a projection head FCCL+ never calls (``encoder``, 1280 -> 1280 -> 512:
2,295,552 parameters), see ``docs/models.md``.
Own implementation, not torchvision's: torchvision's stem is stride 2, fixed to 3 input
channels, and has neither of the two details above.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import MODELS, FedModel, make_norm

# (expansion, out_channels, repeats, stride): MobileNetV2, CIFAR strides.
STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),  # stride 2 in the ImageNet network
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    """1x1 expand, 3x3 depthwise, 1x1 linear projection; shortcut on every stride-1 block."""

    def __init__(self, cin: int, cout: int, expansion: int, stride: int, norm: str):
        super().__init__()
        mid = cin * expansion
        bias = norm == "none"
        self.block = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=bias), make_norm(norm, mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride=stride, padding=1, groups=mid, bias=bias), make_norm(norm, mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=bias), make_norm(norm, cout),
        )
        self.stride = stride
        if stride == 1 and cin != cout:
            self.shortcut: nn.Module = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=bias), make_norm(norm, cout))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        if self.stride == 1:
            out += self.shortcut(x)  # in place: ``out`` is the last norm's fresh output
        return out


@MODELS.register("mobilenet_v2")
class MobileNetV2(FedModel):
    """MobileNetV2, CIFAR variant (Sandler et al., MobileNetV2: Inverted Residuals, CVPR 2018)."""

    input_sizes = (28, 32)

    def __init__(self, num_classes: int = 10, in_channels: int = 3, norm: str = "batch"):
        super().__init__()
        self.num_classes = num_classes
        bias = norm == "none"
        layers = [nn.Conv2d(in_channels, 32, 3, padding=1, bias=bias), make_norm(norm, 32), nn.ReLU(inplace=True)]
        cin = 32
        for expansion, cout, repeats, stride in STAGES:
            for j in range(repeats):
                layers.append(InvertedResidual(cin, cout, expansion, stride if j == 0 else 1, norm))
                cin = cout
        layers += [nn.Conv2d(cin, 1280, 1, bias=bias), make_norm(norm, 1280), nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*layers)
        self.feature_dim = 1280
        self.head = nn.Linear(1280, num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(self.body, x)
