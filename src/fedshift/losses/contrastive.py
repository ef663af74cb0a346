"""Contrastive terms on representations: a sample's feature drawn to a positive and pushed from
negatives under a softmax over similarities. MOON's model-contrastive loss (Li et al. 2021) and
FedProc's prototype-contrastive loss (Mu et al. 2021) with its class prototypes and its weight
schedule.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError

__all__ = [
    "moon_contrastive_loss",
    "fedproc_alpha",
    "class_prototypes",
    "prototype_contrastive_loss",
]


def moon_contrastive_loss(z: Tensor, z_global: Tensor, z_prev: Tensor, tau: float) -> Tensor:
    """MOON's model-contrastive loss (Li et al. 2021, Eq. 3).

    ``-log(exp(cos(z, z_g) / tau) / (exp(cos(z, z_g) / tau) + exp(cos(z, z_p) / tau)))``
    per sample, averaged over the batch. ``z``: (B, d) representations of the local
    model, ``z_global`` of the global model (positive), ``z_prev`` of the previous
    local model (negative); the weight mu is the caller's.
    """
    pos = F.cosine_similarity(z, z_global, dim=1)
    neg = F.cosine_similarity(z, z_prev, dim=1)
    logits = torch.stack([pos, neg], dim=1) / tau
    # the positive is class 0 of a two-way softmax
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


def fedproc_alpha(round_index: int, rounds: int, alpha: float, schedule: str = "constant") -> float:
    """Weight of FedProc's prototype-contrastive term in round ``round_index`` (1-based).

    ``constant``: ``alpha`` (FCCL+ Tab. VII: 0.5). ``linear``: ``1 - (r - 1) / (R - 1)``,
    from 1 in the first round down to 0 in the last (the annealing of the FedProc paper
    and of public FedProc code); 1 when ``rounds == 1``.
    """
    if schedule == "constant":
        return float(alpha)
    if schedule == "linear":
        if rounds <= 1:
            return 1.0
        return 1.0 - (round_index - 1) / (rounds - 1)
    raise ConfigError(f"fedproc alpha_schedule: unknown {schedule!r}; valid: constant, linear")


def class_prototypes(features: Tensor, labels: Tensor, num_classes: int) -> Tuple[Tensor, Tensor]:
    """Per-class mean feature: ``(num_classes, d)`` prototypes and ``(num_classes,)`` counts.

    Classes without a sample get a zero row and count 0.
    """
    counts = torch.bincount(labels, minlength=num_classes).to(features.dtype)
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, labels, features)
    protos = sums / counts.clamp(min=1).unsqueeze(1)
    return protos, counts


def prototype_contrastive_loss(features: Tensor, labels: Tensor, prototypes: Tensor, present: Tensor,
                               tau: float = 1.0, similarity: str = "cosine") -> Tensor:
    """FedProc's prototype-level contrastive loss (Mu et al. 2021).

    Per sample ``-log( exp(s(h, c_y) / tau) / sum_k exp(s(h, c_k) / tau) )`` over the
    global prototypes ``c_k`` of the classes present (``present``, a (C,) bool mask);
    ``s`` is the cosine similarity (``cosine``) or the dot product (``dot``). Samples
    whose class has no prototype are left out; batch mean over the rest (0, still
    differentiable, when none is left).
    """
    present = present.to(torch.bool)
    if similarity == "cosine":
        sim = F.normalize(features, dim=1) @ F.normalize(prototypes, dim=1).t()
    elif similarity == "dot":
        sim = features @ prototypes.t()
    else:
        raise ConfigError(f"fedproc similarity: unknown {similarity!r}; valid: cosine, dot")
    logits = (sim / tau).masked_fill(~present.unsqueeze(0), float("-inf"))
    keep = present[labels]
    if not bool(keep.any()):
        return features.sum() * 0.0
    return F.cross_entropy(logits[keep], labels[keep])
