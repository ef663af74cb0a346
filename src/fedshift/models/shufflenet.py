"""ShuffleNetV2 1.0x for 32x32 inputs (Ma et al., ECCV 2018).

The common CIFAR variant (kuangliu/pytorch-cifar style): the ImageNet stem (3x3/2
conv + max-pool) becomes one 3x3 conv to 24 channels at stride 1, so 32x32 runs
through the three stages (116, 232, 464 channels; 4, 8, 4 units, the first of each
stride 2) to a 4x4 map, then a 1x1 conv to 1024, global average pooling and a linear
classifier. The units are the paper's (channel split, channel shuffle with 2 groups).
Own implementation, not torchvision's: torchvision's stem divides 32x32 by 4 before the
first stage, is fixed to 3 input channels and hard-codes BatchNorm.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import MODELS, FedModel, make_norm


def channel_shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


def pointwise(cin: int, cout: int, norm: str, relu: bool = True) -> list:
    layers = [nn.Conv2d(cin, cout, 1, bias=norm == "none"), make_norm(norm, cout)]
    return layers + [nn.ReLU(inplace=True)] if relu else layers


def depthwise(c: int, stride: int, norm: str) -> list:
    return [nn.Conv2d(c, c, 3, stride=stride, padding=1, groups=c, bias=norm == "none"), make_norm(norm, c)]


class ShuffleUnit(nn.Module):
    """Stride 1: split channels in half, transform one half, concatenate, shuffle.
    Stride 2: both branches see the whole input and halve the resolution."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str):
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride == 2:
            self.left = nn.Sequential(*depthwise(cin, 2, norm), *pointwise(cin, half, norm))
            right_in = cin
        else:
            self.left = None
            right_in = half
        self.right = nn.Sequential(
            *pointwise(right_in, half, norm), *depthwise(half, stride, norm), *pointwise(half, half, norm)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.left is None:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.right(x2)), 1)
        else:
            out = torch.cat((self.left(x), self.right(x)), 1)
        return channel_shuffle(out)


@MODELS.register("shufflenet_v2")
class ShuffleNetV2(FedModel):
    """ShuffleNetV2 1.0x, CIFAR variant (Ma et al., ShuffleNet V2: Practical Guidelines, ECCV 2018)."""

    input_sizes = (28, 32)

    def __init__(self, num_classes: int = 10, in_channels: int = 3, norm: str = "batch"):
        super().__init__()
        self.num_classes = num_classes
        layers = [nn.Conv2d(in_channels, 24, 3, padding=1, bias=norm == "none"), make_norm(norm, 24),
                  nn.ReLU(inplace=True)]
        cin = 24
        for cout, units in ((116, 4), (232, 8), (464, 4)):
            for j in range(units):
                layers.append(ShuffleUnit(cin, cout, 2 if j == 0 else 1, norm))
                cin = cout
        layers += pointwise(cin, 1024, norm)
        self.body = nn.Sequential(*layers)
        self.feature_dim = 1024
        self.head = nn.Linear(1024, num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(self.body, x)
