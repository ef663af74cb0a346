"""Small CNNs of the federated-learning literature, cheap enough for CPU runs.

* ``simple_cnn``: the "SimpleCNN" of FCCL+ Table XVIII (the FedDF-style CIFAR CNN:
  conv 6@5x5, max-pool, conv 16@5x5, max-pool, FC 120, 84). Architecturally LeNet-5
  with ReLU and RGB input, so it subclasses :class:`LeNet`; it is registered under its
  own name because FCCL+ names it so.
* ``fedavg_cnn_mnist`` and ``fedavg_cnn_cifar``: the CNNs of McMahan et al.'s FedAvg
  paper that FedMMD/FedFusion (Yao et al. 2019) train on MNIST and CIFAR-10.

Own implementations, written from the papers' descriptions (torchvision has none).
"""

from __future__ import annotations

import torch
from torch import nn

from .base import MODELS, FedModel, fit_map, make_norm
from .lenet import LeNet


@MODELS.register("simple_cnn")
class SimpleCNN(LeNet):
    """SimpleCNN of FCCL+ Table XVIII (Huang et al., FCCL+, TPAMI; Lin et al., FedDF, NeurIPS 2020).

    Conv 6@5x5, 2x2 max-pool, conv 16@5x5, 2x2 max-pool, FC 120, FC 84 (the features),
    linear classifier; ReLU throughout, no normalisation by default. 32x32 gives the
    5x5x16 = 400 flatten of the original; other sizes are average-pooled to 5x5.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, norm: str = "none"):
        super().__init__(num_classes=num_classes, in_channels=in_channels, norm=norm)


def conv5x5_block(cin: int, cout: int, norm: str, pool: nn.Module) -> list:
    """5x5 'same' conv, optional norm, ReLU, max-pool (the FedAvg CNNs' unit)."""
    return [nn.Conv2d(cin, cout, 5, padding=2, bias=norm == "none"), make_norm(norm, cout),
            nn.ReLU(inplace=True), pool]


@MODELS.register("fedavg_cnn_mnist")
class FedAvgCNNMnist(FedModel):
    """FedAvg's MNIST CNN (McMahan et al., Communication-Efficient Learning, AISTATS 2017; FedMMD/FedFusion 2019).

    Two 5x5 convs (32, 64 channels; 'same' padding), each followed by ReLU and 2x2
    max-pool, FC 512 with ReLU (the features), dropout, linear classifier: 1,663,370
    parameters for 10 classes, as FedAvg states. 28x28 gives the 7x7x64 flatten; a 32x32
    input's 8x8 map is average-pooled to 7x7 so the same weights apply.
    """

    input_sizes = (28, 32)

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        norm: str = "none",  # the paper's CNN has no normalisation
        dropout: float = 0.5,  # FedMMD: "random dropout", rate unstated; 0.5 is the usual rate after FC
    ):
        super().__init__()
        self.num_classes = num_classes
        self.conv = nn.Sequential(
            *conv5x5_block(in_channels, 32, norm, nn.MaxPool2d(2)), *conv5x5_block(32, 64, norm, nn.MaxPool2d(2))
        )
        self.fc = nn.Sequential(nn.Linear(64 * 7 * 7, 512), nn.ReLU(inplace=True))
        self.feature_dim = 512
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(512, num_classes))

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    def pool(self, fmap: torch.Tensor) -> torch.Tensor:
        return self.fc(fit_map(fmap, 7).flatten(1))


@MODELS.register("fedavg_cnn_cifar")
class FedAvgCNNCifar(FedModel):
    """FedAvg's CIFAR-10 CNN (McMahan et al., AISTATS 2017, after the TensorFlow tutorial; FedMMD/FedFusion 2019).

    Two 5x5 convs (64, 64 channels; 'same' padding), each followed by ReLU and 3x3
    max-pool with stride 2, FC 384 and FC 192 with ReLU and dropout (the 192 are the
    features), linear classifier. At 32x32 the flatten is 8x8x64 = 4096 (1,756,426
    parameters for 10 classes; FedAvg's 24x24 crops gave 6x6x64 and about 10^6). The
    tutorial's local response normalisation is left out, as FedMMD describes none.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        norm: str = "none",  # the paper's CNN has no normalisation
        dropout: float = 0.5,  # FedMMD: "random dropout", rate unstated; 0.5 is the usual rate after FC
    ):
        super().__init__()
        self.num_classes = num_classes
        self.conv = nn.Sequential(
            *conv5x5_block(in_channels, 64, norm, nn.MaxPool2d(3, stride=2, padding=1)),
            *conv5x5_block(64, 64, norm, nn.MaxPool2d(3, stride=2, padding=1)),
        )
        self.fc = nn.Sequential(
            nn.Linear(64 * 8 * 8, 384), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(384, 192), nn.ReLU(inplace=True),
        )
        self.feature_dim = 192
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(192, num_classes))

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    def pool(self, fmap: torch.Tensor) -> torch.Tensor:
        return self.fc(fit_map(fmap, 8).flatten(1))
