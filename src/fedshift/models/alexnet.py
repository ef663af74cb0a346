"""AlexNet for 32x32 inputs (Krizhevsky et al., NeurIPS 2012), a FedH2L participant.

FedH2L deploys AlexNet on PACS and Office-Home; at the benchmark's 32x32 resolution this
is the usual CIFAR variant (bearpaw/pytorch-classification style): AlexNet's five convs
with torchvision's widths (64, 192, 384, 256, 256), the first conv 11x11 at stride 4 with
padding 5, 2x2 max-pools after convs 1, 2 and 5, so 32x32 ends at a 1x1 map of 256
channels; the three fully connected layers are replaced by one linear classifier.
Own implementation, not torchvision's: torchvision's 3x3/2 max-pools and the 6x6
adaptive pool before 9216-wide FC layers do not fit a 32x32 input. No normalisation by
default, as in the original; ``norm`` inserts one after every conv.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import MODELS, FedModel, make_norm


@MODELS.register("alexnet")
class AlexNet(FedModel):
    """AlexNet, CIFAR variant (Krizhevsky, Sutskever & Hinton, ImageNet Classification with DCNNs, NeurIPS 2012)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, norm: str = "none"):
        super().__init__()
        self.num_classes = num_classes
        bias = norm == "none"

        def conv(cin: int, cout: int, k: int, stride: int = 1, padding: int | None = None) -> list:
            p = k // 2 if padding is None else padding
            return [nn.Conv2d(cin, cout, k, stride, p, bias=bias), make_norm(norm, cout), nn.ReLU(inplace=True)]

        self.body = nn.Sequential(
            *conv(in_channels, 64, 11, 4, 5), nn.MaxPool2d(2),
            *conv(64, 192, 5), nn.MaxPool2d(2),
            *conv(192, 384, 3), *conv(384, 256, 3), *conv(256, 256, 3), nn.MaxPool2d(2),
        )
        self.feature_dim = 256
        self.head = nn.Linear(256, num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
