"""VGG-11 for 32x32 inputs (Simonyan & Zisserman, ICLR 2015), a FedH2L participant.

FedH2L deploys VGG11 on PACS; at the benchmark's 32x32 resolution this is the usual
CIFAR variant (kuangliu/pytorch-cifar style): configuration A's eight 3x3 convs
(64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M) each followed by BatchNorm and
ReLU, so 32x32 ends at a 1x1 map of 512 channels, and one linear classifier in place of
the three 4096-wide FC layers. Own implementation, not torchvision's: torchvision's
7x7 adaptive pool feeding 25088-wide FC layers does not fit a 32x32 input. Conv biases
are dropped where a norm layer follows (it cancels them): 2,752 fewer parameters than
that variant with norm="batch"; norm="none" gives the plain VGG-11 convs with biases.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import MODELS, FedModel, make_norm

VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


@MODELS.register("vgg11")
class VGG11Net(FedModel):
    """VGG-11 (configuration A) with BatchNorm, CIFAR variant (Simonyan & Zisserman, Very Deep ConvNets, ICLR 2015)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, norm: str = "batch"):
        super().__init__()
        self.num_classes = num_classes
        layers: list = []
        cin = in_channels
        for c in VGG11:
            if c == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, c, 3, padding=1, bias=norm == "none"), make_norm(norm, c),
                           nn.ReLU(inplace=True)]
                cin = c
        self.body = nn.Sequential(*layers)
        self.feature_dim = 512
        self.head = nn.Linear(512, num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
