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

from contextlib import nullcontext
from typing import Callable, Tuple

import torch
from torch import nn

from ..registry import Registry

MODELS: Registry[Callable[..., "FedModel"]] = Registry(
    "model", group="fedshift.models", check=lambda obj: "" if callable(obj) else "not a callable model factory")


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


class _KeepBuffers:
    """Context of a block's recomputation: its buffers (BatchNorm running mean / variance / batch
    count) are put back on exit, so they are updated once per step, as without recomputation."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __enter__(self):
        self.saved = [(b, b.clone()) for b in self.module.buffers()]

    def __exit__(self, *exc):
        with torch.no_grad():
            for b, v in self.saved:
                b.copy_(v)
        self.saved = []
        return False


class FedModel(nn.Module):
    """Base class: subclasses define ``feature_map`` (or override ``features``) and ``head``."""

    feature_dim: int
    num_classes: int
    has_feature_map: bool = True
    # Input sizes (square, pixels) the architecture is defined for and tested at.
    input_sizes: Tuple[int, ...] = (32,)

    # engine.recompute: while training with autograd, keep only each block's input and recompute
    # its activations in the backward pass (activation checkpointing; see run_blocks).
    recompute: bool = False
    # engine.recompute_budget_mb: checkpoint only batches larger than this (0: every batch), so a
    # participant whose activations fit the budget at a phase's batch trains without recomputing.
    recompute_batch: int = 0
    # engine.bf16_train: the feature extractor's training-mode forward under bf16 autocast (CPU,
    # hardware bf16); its output comes back as float32, so heads and losses stay float32.
    train_bf16: bool = False
    # (without, with recompute) MB of counted activations per training sample (resources.model_activations),
    # set by the engine; (0, 0) = not counted
    activation_mb: Tuple[float, float] = (0.0, 0.0)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_blocks(self, seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """``seq(x)``; with ``recompute`` on (and autograd recording, in training mode) every composite
        child of ``seq`` (a residual / inverted-residual / MBConv block) runs under non-reentrant
        activation checkpointing: its inner activations are freed after the forward and recomputed
        in the backward. Same outputs and gradients (the recomputation replays the RNG state and
        leaves the BatchNorm running statistics as one forward left them); one more forward of
        each block per backward, for a fraction of the activation memory."""
        if not (self.recompute and self.training and torch.is_grad_enabled()) or len(x) <= self.recompute_batch:
            return seq(x)
        from torch.utils.checkpoint import checkpoint

        for m in seq:
            if next(m.children(), None) is None:  # a single layer (stem conv, norm, activation)
                x = m(x)
            else:
                x = checkpoint(m, x, use_reentrant=False, context_fn=lambda m=m: (nullcontext(), _KeepBuffers(m)))
        return x

    def pool(self, fmap: torch.Tensor) -> torch.Tensor:
        """Feature map -> (B, d). Default: global average pooling."""
        if fmap.shape[-2] == fmap.shape[-1] == 1:  # already pooled (VGG/AlexNet at 32x32): a view
            return fmap.flatten(1)
        # mean() rather than adaptive_avg_pool2d(., 1): same values, several times faster
        # on CPU for channels_last maps.
        return fmap.mean((2, 3))

    def recomputes(self, batch: int) -> bool:
        """Whether a training step at ``batch`` samples runs its blocks under checkpointing."""
        return bool(self.recompute) and batch > self.recompute_batch

    def graph_mb(self, batch: int) -> float:
        """Counted MB of the activations a training step at ``batch`` keeps for its backward pass."""
        full, checkpointed = self.activation_mb
        return (checkpointed if self.recomputes(batch) else full) * batch / (2 if self.train_bf16 else 1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if self.train_bf16 and self.training:
            # The same in a graph-recording pass and a no_grad pass (FCCL's one-graph step
            # relies on both giving the same targets); evaluation (eval mode) is engine.bf16's.
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                fmap = self.feature_map(x)
            return self.pool(fmap.float())
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
