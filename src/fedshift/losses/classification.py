"""Losses against the labels: cross-entropy (with the padding mask of the fused engine),
RHFL's symmetric cross-entropy (robust to noisy labels) and FedRS's restricted softmax (the
per-class logit scales of a participant that misses classes).

Papers: RHFL (Fang & Ye 2022, after Wang et al. 2019), FedRS (Li & Zhan 2021); see ``REFERENCE.md``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "cross_entropy",
    "symmetric_ce_loss",
    "RESTRICTIONS",
    "fedrs_class_scales",
    "restricted_logits",
]


def cross_entropy(logits: Tensor, labels: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Batch-mean cross-entropy; with ``mask`` ((B,), 1 for a real sample, 0 for padding: the padded
    batches of engine.fused_clients) the mean over the real samples (0 when there is none)."""
    if mask is None:
        return F.cross_entropy(logits, labels)
    per = F.cross_entropy(logits, labels, reduction="none")
    w = mask.to(per.dtype)
    return (per * w).sum() / w.sum().clamp(min=1)


def symmetric_ce_loss(logits: Tensor, labels: Tensor, alpha: float, beta: float, clip: float = 1e-4) -> Tensor:
    """Symmetric cross-entropy of RHFL (Fang & Ye 2022, after Wang et al. 2019).

    ``alpha * CE + beta * RCE`` with ``RCE = -sum_k p_k log q_k``, ``p = softmax(z)``
    and ``q`` the one-hot label clamped to ``[clip, 1]``, i.e. ``-log(clip) * (1 - p_y)``.
    Both terms averaged over the batch. The predicted probabilities are not clamped
    (RHFL's code clamps them to ``>= 1e-7``, which changes the value by < 1e-6 per class).
    """
    ce = F.cross_entropy(logits, labels)
    p = F.softmax(logits, dim=1)
    q = F.one_hot(labels, num_classes=logits.shape[1]).to(logits.dtype).clamp(min=clip, max=1.0)
    rce = -(p * torch.log(q)).sum(dim=1).mean()
    return alpha * ce + beta * rce


RESTRICTIONS = ("count", "missing")


def fedrs_class_scales(counts: Tensor, alpha: float, restriction: str = "count") -> Tensor:
    """FedRS's per-class logit scales s_c from a participant's (C,) class counts.

    ``count`` (FedRepo code): ``alpha + (1 - alpha) * n_c / max_k n_k``;
    ``missing`` (FedRS paper text): ``alpha`` where ``n_c == 0``, else 1.
    """
    counts = counts.to(torch.float64)
    if restriction == "count":
        s = alpha + (1.0 - alpha) * counts / counts.max().clamp(min=1.0)
    elif restriction == "missing":
        s = torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, alpha))
    else:
        raise ValueError(f"unknown FedRS restriction {restriction!r}; valid: {', '.join(RESTRICTIONS)}")
    return s.to(torch.float32)


def restricted_logits(logits: Tensor, scales: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``s_c (w_c . h) + b_c`` from the classifier's logits ``w_c . h + b_c``: the scale restricts the
    weight vectors only (FedRS's classifier has no bias; ours keeps its bias unscaled)."""
    scales = scales.to(logits.dtype)
    if bias is None:
        return logits * scales
    b = bias.to(logits.dtype)
    return (logits - b) * scales + b
