"""Model structures: which architecture each participant of a scenario trains.

A structure is a named assignment of registered model names to participants, in the
scenario's participant order: FCCL+ Table VI (heterogeneous defaults), Table XVIII
(alternatives), FedH2L's per-dataset choices, a cheap CPU demo, and ``homo_<model>``
for every registered model (the homogeneous mode FedAvg-style methods need; FCCL+
uses ``homo_resnet12``, FCCL ``homo_resnet18``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..errors import ConfigError
from ..registry import Registry
from .base import MODELS

STRUCTURES: Registry["Structure"] = Registry("structure")


@dataclass(frozen=True)
class Structure:
    """A fixed tuple of architectures (one per participant), or one ``model`` for any count."""

    name: str
    archs: Optional[Tuple[str, ...]]
    doc: str
    model: Optional[str] = None  # homogeneous structures: every participant gets this model

    def __post_init__(self) -> None:
        if (self.archs is None) == (self.model is None):
            raise ValueError(f"structure {self.name!r}: give exactly one of archs and model")
        if self.archs is not None and not self.archs:
            raise ValueError(f"structure {self.name!r}: archs is empty")

    @property
    def homogeneous(self) -> bool:
        """True iff every participant gets the same architecture."""
        return self.archs is None or len(set(self.archs)) == 1

    def assign(self, num_participants: int) -> List[str]:
        """Model names for participants 0..n-1; a fixed structure must match n exactly."""
        if self.archs is None:
            archs = [self.model] * num_participants
        elif len(self.archs) != num_participants:
            raise ConfigError(
                f"structure {self.name!r} assigns {len(self.archs)} architectures "
                f"({', '.join(self.archs)}) but the scenario has {num_participants} participants"
            )
        else:
            archs = list(self.archs)
        for arch in set(archs):
            MODELS.get(arch, key=f"structure {self.name!r}")  # fails listing the models
        return archs


def register(name: str, archs: Tuple[str, ...], doc: str) -> Structure:
    s = Structure(name=name, archs=tuple(archs), doc=doc)
    STRUCTURES.add(name, s)
    return s


def sync_homogeneous() -> None:
    """Register ``homo_<model>`` for every registered model that has none yet (idempotent)."""
    for model in MODELS.names():
        name = f"homo_{model}"
        if name not in STRUCTURES:
            STRUCTURES.add(name, Structure(name=name, archs=None, model=model,
                                           doc=f"every participant trains {model} (homogeneous mode)"))


def get_structure(name: str) -> Structure:
    """Look a structure up; an unknown name raises ConfigError listing the structures."""
    sync_homogeneous()  # models registered after fedshift.models was imported
    return STRUCTURES.get(name, key="structure")


# FCCL+ (TPAMI) Table VI: the default heterogeneous architectures per scenario.
register("fcclplus_digits", ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2"),
         "FCCL+ Table VI, Digits: MNIST ResNet10, USPS ResNet12, SVHN EfficientNet, SYN MobileNet")
register("fcclplus_office_caltech", ("googlenet", "resnet12", "resnet10", "resnet12"),
         "FCCL+ Table VI, Office-Caltech: Amazon GoogLeNet, Caltech ResNet12, DSLR ResNet10, Webcam ResNet12")
register("fcclplus_office31", ("resnet10", "resnet12", "resnet10"),
         "FCCL+ Table VI, Office31: Amazon ResNet10, DSLR ResNet12, Webcam ResNet10")
register("fcclplus_office_home", ("resnet18", "resnet34", "googlenet", "resnet12"),
         "FCCL+ Table VI, Office-Home: Art ResNet18, Clipart ResNet34, Product GoogLeNet, Real World ResNet12")
# FCCL+ Table XVIII: robustness to the choice of networks on Digits.
register("fcclplus_digits_alt1", ("resnet10", "resnet12", "efficientnet_b0", "simple_cnn"),
         "FCCL+ Table XVIII, Digits: ResNet10, ResNet12, EfficientNet, SimpleCNN")
register("fcclplus_digits_alt2", ("resnet18", "resnet12", "efficientnet_b0", "mobilenet_v2"),
         "FCCL+ Table XVIII, Digits: ResNet18, ResNet12, EfficientNet, MobileNet")
# FedH2L: heterogeneous nodes per dataset (homogeneous ResNet18 runs use homo_resnet18).
register("fedh2l_pacs", ("resnet18", "resnet34", "alexnet", "vgg11"),
         "FedH2L, PACS: Photo ResNet18, Art painting ResNet34, Cartoon AlexNet, Sketch VGG11")
register("fedh2l_office_home", ("resnet34", "mobilenet_v2", "alexnet", "resnet50"),
         "FedH2L, Office-Home: Art ResNet34, Clipart MobileNet, Product AlexNet, Real World ResNet50")
register("fedh2l_rotmnist", ("lenet",) * 4, "FedH2L, Rotated MNIST: LeNet on M0, M20, M40, M60")
# Heterogeneous but tiny: for CPU demos and end-to-end tests.
register("demo_mixed", ("lenet", "fedavg_cnn_mnist", "simple_cnn", "lenet"),
         "CPU demo: LeNet-5, FedAvg's MNIST CNN, SimpleCNN, LeNet-5. SimpleCNN is LeNet's architecture "
         "(its own initialisation); the FedAvg CNN (1.7M parameters, 512-d features) makes the "
         "federation truly heterogeneous at about 10x a LeNet's cost")
