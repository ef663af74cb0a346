"""LeNet-5 (LeCun et al. 1998), the Rotated-MNIST model of FedH2L."""

from __future__ import annotations

import torch
from torch import nn

from .base import MODELS, FedModel, fit_map, make_norm


@MODELS.register("lenet")
class LeNet(FedModel):
    """LeNet-5 (LeCun et al., Gradient-Based Learning Applied to Document Recognition, 1998).

    Two 5x5 conv + 2x2 max-pool stages (6, 16 channels), then FC 120 -> 84 (the
    features) -> classes, with ReLU as in current practice. Works on 28x28 (MNIST) and
    32x32 inputs: the 16-channel map is average-pooled to LeNet-5's 5x5 (400 inputs)
    when it is not already 5x5 (28x28 gives 4x4).
    """

    input_sizes = (28, 32)

    def __init__(self, num_classes: int = 10, in_channels: int = 1, norm: str = "none"):
        super().__init__()
        self.num_classes = num_classes
        bias = norm == "none"  # a conv bias right before a norm layer is cancelled by it
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, bias=bias), make_norm(norm, 6), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, bias=bias), make_norm(norm, 16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        self.fc = nn.Sequential(
            nn.Linear(16 * 25, 120), nn.ReLU(inplace=True), nn.Linear(120, 84), nn.ReLU(inplace=True)
        )
        self.feature_dim = 84
        self.head = nn.Linear(84, num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    def pool(self, fmap: torch.Tensor) -> torch.Tensor:
        return self.fc(fit_map(fmap, 5).flatten(1))
