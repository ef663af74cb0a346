"""CIFAR-style ResNets (He et al., CVPR 2016), the backbones of FCCL/FCCL+ and FedH2L.

The FCCL/FCCL+ authors' ResNets are the CIFAR variant: a 3x3 stride-1 stem with 64
filters and no max-pool, so a 32x32 input keeps full resolution in the first stage and
the last stage sees 4x4 maps. ``resnet10`` ([1,1,1,1]) and ``resnet12`` ([2,1,1,1]) are
the authors' shallow variants. Own implementation, not torchvision's: torchvision's
stem (7x7 stride 2 + max-pool) shrinks 32x32 to 8x8 before the first block and its
stem is fixed to 3 input channels. The blocks match torchvision's (stride on the 3x3
conv of the bottleneck, "ResNet v1.5"), so the parameter counts differ from
torchvision's only by the stem and the classifier.
"""

from __future__ import annotations

from typing import List, Sequence, Type

import torch
from torch import nn

from .base import MODELS, FedModel, make_norm


def conv3x3(cin: int, cout: int, stride: int = 1, bias: bool = False) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)


def shortcut(cin: int, cout: int, stride: int, norm: str) -> nn.Module:
    """Identity, or a strided 1x1 projection where the shape changes (option B of He et al.)."""
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=norm == "none"), make_norm(norm, cout))


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, norm: str):
        super().__init__()
        bias = norm == "none"  # a conv bias right before a norm layer is cancelled by it
        self.conv1 = conv3x3(cin, planes, stride, bias)
        self.bn1 = make_norm(norm, planes)
        self.conv2 = conv3x3(planes, planes, 1, bias)
        self.bn2 = make_norm(norm, planes)
        self.shortcut = shortcut(cin, planes, stride, norm)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)  # in place: ``out`` is a fresh tensor owned by this block
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a residual connection (ResNet-50)."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, norm: str):
        super().__init__()
        bias = norm == "none"
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=bias)
        self.bn1 = make_norm(norm, planes)
        self.conv2 = conv3x3(planes, planes, stride, bias)
        self.bn2 = make_norm(norm, planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=bias)
        self.bn3 = make_norm(norm, cout)
        self.shortcut = shortcut(cin, cout, stride, norm)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += self.shortcut(x)
        return self.relu(out)


class ResNet(FedModel):
    """CIFAR ResNet: 3x3 stem (64), four stages (64, 128, 256, 512 planes; strides 1, 2, 2, 2),
    global average pooling, linear classifier. ``feature_map`` is the last stage's output."""

    input_sizes = (28, 32)

    def __init__(
        self,
        block: Type[nn.Module],
        num_blocks: Sequence[int],
        num_classes: int = 10,
        in_channels: int = 3,
        norm: str = "batch",
    ):
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Sequential(
            conv3x3(in_channels, 64, 1, bias=norm == "none"), make_norm(norm, 64), nn.ReLU(inplace=True)
        )
        layers: List[nn.Module] = []
        cin = 64
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), num_blocks)):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(block(cin, planes, stride, norm))
                cin = planes * block.expansion
        self.layers = nn.Sequential(*layers)
        self.feature_dim = cin
        self.head = nn.Linear(cin, num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(self.layers, self.stem(x))


@MODELS.register("resnet10")
def resnet10(**kw) -> ResNet:
    """ResNet-10, BasicBlocks [1,1,1,1] (He et al. 2016; FCCL+, TPAMI, Table VI)."""
    return ResNet(BasicBlock, (1, 1, 1, 1), **kw)


@MODELS.register("resnet12")
def resnet12(**kw) -> ResNet:
    """ResNet-12, BasicBlocks [2,1,1,1] (He et al. 2016; FCCL+, TPAMI, Table VI)."""
    return ResNet(BasicBlock, (2, 1, 1, 1), **kw)


@MODELS.register("resnet18")
def resnet18(**kw) -> ResNet:
    """ResNet-18, BasicBlocks [2,2,2,2] (He et al., Deep Residual Learning, CVPR 2016)."""
    return ResNet(BasicBlock, (2, 2, 2, 2), **kw)


@MODELS.register("resnet34")
def resnet34(**kw) -> ResNet:
    """ResNet-34, BasicBlocks [3,4,6,3] (He et al., Deep Residual Learning, CVPR 2016)."""
    return ResNet(BasicBlock, (3, 4, 6, 3), **kw)


@MODELS.register("resnet50")
def resnet50(**kw) -> ResNet:
    """ResNet-50, Bottlenecks [3,4,6,3] (He et al., Deep Residual Learning, CVPR 2016)."""
    return ResNet(Bottleneck, (3, 4, 6, 3), **kw)
