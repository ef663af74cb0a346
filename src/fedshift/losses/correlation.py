"""FCCL / FCCL+'s collaborative terms on the public data: the cross-correlation matrix and the
FCCM loss on logits (FCCL+ Eq. 1-2, FCCL CVPR Eq. 1-2), and the instance-similarity matrix and
the FISL loss on features (FCCL+ Eq. 3-5). Each compares one participant's outputs with the
participants' (detached) mean.

Papers: FCCL (Huang et al., CVPR 2022, ``papers/fccl-cvpr2022.txt``), FCCL+ (Huang et al.,
TPAMI, ``papers/fccl-plus-tpami.txt``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import _kl_batchmean

__all__ = [
    "cross_correlation",
    "fccm_loss",
    "instance_similarity",
    "fisl_loss",
]


def cross_correlation(z: Tensor, z_target: Tensor, eps: float = 0.0) -> Tensor:
    """Cross-correlation matrix of FCCL+ Eq. 1 (FCCL CVPR Eq. 1), as the authors compute it.

    ``z``: (B, C) logits of the participant; ``z_target``: (B, C') target logits (the
    mean of the participants' logits, detached by the caller). Each column of both is
    standardised over the batch, ``(x - mean) / std`` with the *unbiased* std (dim 0),
    and ``M = z_norm^T z_target_norm / B``: shape (C, C').

    Because the std is unbiased while the product is divided by B, two identical
    columns give ``M_uu = (B - 1) / B``, not 1 (the authors' code does the same).
    ``eps`` (default 0, the authors' form) is added to the std; a column that is
    constant over the batch then gives NaN unless ``eps > 0``.
    """
    if z.dim() != 2 or z_target.dim() != 2 or z.shape[0] != z_target.shape[0]:
        raise ValueError(
            f"cross_correlation: expected (B, C) and (B, C'), got {tuple(z.shape)} and {tuple(z_target.shape)}"
        )
    batch = z.shape[0]
    z_norm = (z - z.mean(dim=0)) / (z.std(dim=0, unbiased=True) + eps)
    t_norm = (z_target - z_target.mean(dim=0)) / (z_target.std(dim=0, unbiased=True) + eps)
    return z_norm.transpose(0, 1) @ t_norm / batch


def fccm_loss(logits: Tensor, target_logits: Tensor, lam: float, eps: float = 0.0) -> Tensor:
    """FCCM loss, FCCL+ Eq. 2 (FCCL CVPR Eq. 2).

    ``sum_u (1 - M_uu)^2 + lam * sum_{u != v} (1 + M_uv)^2`` with ``M`` from
    :func:`cross_correlation` (the diagonal pulled to +1, the off-diagonal pushed to
    -1, as written in the papers and in the authors' code). ``lam`` is 0.0051 in the
    papers. Sums, no averaging. ``logits`` and ``target_logits``: (B, C).
    """
    if logits.shape[1:] != target_logits.shape[1:]:
        raise ValueError(f"fccm_loss: class dims differ: {tuple(logits.shape)} vs {tuple(target_logits.shape)}")
    m = cross_correlation(logits, target_logits, eps=eps)
    diag = torch.diagonal(m)
    on_diag = (1.0 - diag).pow(2).sum()
    # All entries minus the diagonal's (no boolean mask: sync-free on CUDA).
    off_diag = (1.0 + m).pow(2).sum() - (1.0 + diag).pow(2).sum()
    return on_diag + lam * off_diag


def instance_similarity(features: Tensor, mu: float) -> Tensor:
    """Instance-similarity matrix of FCCL+ Eq. 3-4, diagonal removed.

    ``features``: (B, d) extractor features. Rows are L2-normalised, the (B, B) cosine
    similarities divided by the softening temperature ``mu`` (0.02 in the authors'
    code), and the diagonal dropped: the result is (B, B-1), row i holding the
    similarities to j = 0..B-1, j != i, in increasing j. (Eq. 4 prints
    (B-1) x (B-1); removing one entry per row gives B x (B-1), as the authors' code.)
    """
    if features.dim() != 2 or features.shape[0] < 2:
        raise ValueError(f"instance_similarity: expected (B, d) with B >= 2, got {tuple(features.shape)}")
    h = F.normalize(features, p=2, dim=1)
    sim = h @ h.transpose(0, 1) / mu
    batch = sim.shape[0]
    # Drop the diagonal by reshaping: after the first element, the flattened matrix is
    # (B-1) rows of [B off-diagonal entries + 1 diagonal entry] (no host sync on CUDA).
    return sim.flatten()[1:].view(batch - 1, batch + 1)[:, :-1].reshape(batch, batch - 1)


def fisl_loss(sim: Tensor, target_sim: Tensor) -> Tensor:
    """FISL loss, FCCL+ Eq. 5: ``KL(softmax(target_sim) || softmax(sim))`` row-wise.

    ``sim``: (B, B-1) from :func:`instance_similarity` for this participant;
    ``target_sim``: same shape, the mean over participants (detached by the caller).
    Softmax over dim 1, KL summed over columns and averaged over rows (PyTorch's
    ``batchmean``, the authors' reduction). The weight omega of Eq. 6 is the caller's.
    """
    return _kl_batchmean(F.log_softmax(target_sim, dim=1), F.log_softmax(sim, dim=1))
