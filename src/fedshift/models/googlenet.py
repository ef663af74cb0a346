"""GoogLeNet for 32x32 inputs (Szegedy et al., CVPR 2015), a participant of FCCL+ Office scenarios.

The CIFAR variant the FCCL+ authors use (kuangliu/pytorch-cifar style): the ImageNet
stem (7x7/2 conv, max-pool, 1x1 and 3x3 convs, max-pool) is replaced by one 3x3 conv to
192 channels at stride 1; then inception 3a, 3b, max-pool, 4a-4e, max-pool, 5a, 5b with
the paper's widths, so 32x32 ends at 8x8 with 1024 channels; every conv is followed by
BatchNorm and ReLU; the "5x5" branch is two stacked 3x3 convs; no auxiliary heads.
Own implementation, not torchvision's: torchvision's stem divides 32x32 by 8 before the
first inception module, its stem is fixed to 3 input channels and its "5x5" branch is a
single 3x3 conv. Conv biases are dropped where a norm layer follows (the norm cancels
them), so with norm="batch" the count is that variant's minus 7,904 biases.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import MODELS, FedModel, make_norm


def conv_norm_relu(cin: int, cout: int, k: int, norm: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, padding=k // 2, bias=norm == "none"), make_norm(norm, cout), nn.ReLU(inplace=True)
    )


class Inception(nn.Module):
    """Four parallel branches concatenated: 1x1 | 1x1-3x3 | 1x1-3x3-3x3 | maxpool-1x1."""

    def __init__(self, cin: int, n1: int, n3r: int, n3: int, n5r: int, n5: int, npool: int, norm: str):
        super().__init__()
        self.b1 = conv_norm_relu(cin, n1, 1, norm)
        self.b2 = nn.Sequential(conv_norm_relu(cin, n3r, 1, norm), conv_norm_relu(n3r, n3, 3, norm))
        self.b3 = nn.Sequential(
            conv_norm_relu(cin, n5r, 1, norm), conv_norm_relu(n5r, n5, 3, norm), conv_norm_relu(n5, n5, 3, norm)
        )
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), conv_norm_relu(cin, npool, 1, norm))
        self.out_channels = n1 + n3 + n5 + npool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


# (in, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj): Szegedy et al. Table 1; "M" = max-pool /2.
CFG = (
    (192, 64, 96, 128, 16, 32, 32),
    (256, 128, 128, 192, 32, 96, 64),
    "M",
    (480, 192, 96, 208, 16, 48, 64),
    (512, 160, 112, 224, 24, 64, 64),
    (512, 128, 128, 256, 24, 64, 64),
    (512, 112, 144, 288, 32, 64, 64),
    (528, 256, 160, 320, 32, 128, 128),
    "M",
    (832, 256, 160, 320, 32, 128, 128),
    (832, 384, 192, 384, 48, 128, 128),
)


@MODELS.register("googlenet")
class GoogLeNet(FedModel):
    """GoogLeNet (Inception v1), CIFAR variant (Szegedy et al., Going Deeper with Convolutions, CVPR 2015)."""

    input_sizes = (28, 32)

    def __init__(self, num_classes: int = 10, in_channels: int = 3, norm: str = "batch"):
        super().__init__()
        self.num_classes = num_classes
        layers = [conv_norm_relu(in_channels, 192, 3, norm)]
        for c in CFG:
            layers.append(nn.MaxPool2d(3, stride=2, padding=1) if c == "M" else Inception(*c, norm=norm))
        self.body = nn.Sequential(*layers)
        self.feature_dim = 1024
        self.head = nn.Linear(1024, num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(self.body, x)
