"""The interface every registered model follows: a feature extractor and a classifier.

FCCL+'s FISL works on the extractor's features ``H = f(x)`` and FCCM on the logits
``Z = phi(f(x))``; FedFusion fuses the last feature map before the classifier. So each
model exposes:

* ``feature_map(x) -> (B, C, H, W)`` the last spatial map (``None`` support flag
  ``has_feature_map`` for models that have none worth fusing);
* ``features(x) -> (B, d)`` the pooled/flattened representation, ``d = feature_dim``;
* ``classifier(h) -> (B, num_classes)``;
* ``forward(x) = classifier(features(x))``;
* ``forward_with_features(x) -> (h, logits)`` one pass giving both.
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch
from torch import nn

from ..registry import Registry

MODELS: Registry[Callable[..., "FedModel"]] = Registry("model")


def make_norm(kind: str, channels: int) -> nn.Module:
    """BatchNorm (the papers' default) or GroupNorm (safer under parameter averaging)."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        # 32 groups as in Wu & He 2018 where the channels allow it.
        groups = 32 if channels % 32 == 0 else (8 if channels % 8 == 0 else 1)
        return nn.GroupNorm(groups, channels)
    if kind == "none":
        return nn.Identity()
    from ..errors import ConfigError

    raise ConfigError(f"norm: unknown normalisation {kind!r}; valid: batch, group, none")


def fit_map(fmap: torch.Tensor, size: int) -> torch.Tensor:
    """Average-pool a map to ``size x size`` so a fixed-width FC layer accepts any input size.

    A no-op (no copy) at the size the architecture was defined for.
    """
    if fmap.shape[-2] == fmap.shape[-1] == size:
        return fmap
    return nn.functional.adaptive_avg_pool2d(fmap, size)


class FedModel(nn.Module):
    """Base class: subclasses define ``feature_map`` (or override ``features``) and ``head``."""

    feature_dim: int
    num_classes: int
    has_feature_map: bool = True
    # Input sizes (square, pixels) the architecture is defined for and tested at.
    input_sizes: Tuple[int, ...] = (32,)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def pool(self, fmap: torch.Tensor) -> torch.Tensor:
        """Feature map -> (B, d). Default: global average pooling."""
        if fmap.shape[-2] == fmap.shape[-1] == 1:  # already pooled (VGG/AlexNet at 32x32): a view
            return fmap.flatten(1)
        # mean() rather than adaptive_avg_pool2d(., 1): same values, several times faster
        # on CPU for channels_last maps.
        return fmap.mean((2, 3))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.feature_map(x))

    def classifier(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def forward_with_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.features(x)
        return h, self.classifier(h)


def create_model(name: str, num_classes: int = 10, in_channels: int = 3, **kwargs) -> FedModel:
    """Build a registered model; an unknown name raises ConfigError listing the models."""
    factory = MODELS.get(name, key="model")
    model = factory(num_classes=num_classes, in_channels=in_channels, **kwargs)
    model.arch = name
    return model
