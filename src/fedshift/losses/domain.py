"""FedMMD / FedFusion (Yao et al. 2019, ``papers/fedmmd-fedfusion.txt``): the discrepancy between
the global and the local stream's outputs on one batch, multi-kernel RBF MMD² (Eq. 2) or the
two-stream L2 distance, both with the fused engine's padding mask, and FedFusion's exponential
moving average.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    "MMD_BANDWIDTH_MULTIPLIERS",
    "mmd2_rbf",
    "two_stream_l2",
    "ema",
]


#: Widths of FedMMD's multi-kernel RBF MMD: squared bandwidths sigma^2 = m * s, where s is the
#: mean squared distance between distinct samples of the pooled batch (detached) and m runs over
#: these multipliers. The paper says only "a standard RBF kernel with multiple width" (§ 2.2,
#: after Gretton et al.'s MK-MMD); five widths spaced by 2 around the data scale are the usual
#: multi-kernel choice of the deep domain-adaptation code the paper builds on (DAN, Long et al. 2015).
MMD_BANDWIDTH_MULTIPLIERS: Tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)


def mmd2_rbf(x: Tensor, y: Tensor, multipliers: Sequence[float] = MMD_BANDWIDTH_MULTIPLIERS,
             min_scale: float = 0.0, mask: Optional[Tensor] = None) -> Tensor:
    """FedMMD Eq. 2: MMD^2(x, y) = E[K(x, x')] + E[K(y, y')] - 2 E[K(x, y)] (biased V-statistic).

    ``x``: (n, d), ``y``: (m, d) samples (FedMMD: the global and local models' outputs on one
    batch). K is the sum over widths of exp(-||a - b||^2 / sigma^2), with sigma^2 = mult * s and s
    the mean squared distance between distinct pooled samples, detached (the widths follow the
    data but carry no gradient), floored at ``min_scale``; every expectation is the plain mean
    over all pairs, diagonal included. Zero when x and y are the same samples.

    ``mask`` (n = m rows, 0/1 per row; engine.fused_clients' padded batches): the same over the
    rows with weight 1, i.e. ``mmd2_rbf(x[mask == 1], y[mask == 1])``, written with masks so it
    runs under ``vmap``, where boolean indexing cannot.
    """
    if mask is not None:
        return _masked_mmd2_rbf(x, y, mask, multipliers, min_scale)
    z = torch.cat([x, y], 0)
    sq = z.pow(2).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2 * z @ z.T).clamp_min(0)  # no sqrt: smooth gradient at distance 0
    n = z.shape[0]
    scale = (d2.detach().sum() / max(n * n - n, 1)).clamp_min(max(min_scale, torch.finfo(z.dtype).tiny))
    k = sum(torch.exp(-d2 / (scale * m)) for m in multipliers)
    nx = x.shape[0]
    return k[:nx, :nx].mean() + k[nx:, nx:].mean() - 2 * k[:nx, nx:].mean()


def _masked_mmd2_rbf(x: Tensor, y: Tensor, w: Tensor, multipliers: Sequence[float], min_scale: float) -> Tensor:
    """:func:`mmd2_rbf` over the rows with weight 1: the width is the mean squared distance over
    distinct real pairs, every expectation a mean over real pairs."""
    z = torch.cat([x, y], 0)
    wz = torch.cat([w, w], 0)
    sq = z.pow(2).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2 * z @ z.T).clamp_min(0)
    pair = wz[:, None] * wz[None, :]
    n = wz.sum()
    scale = ((d2.detach() * pair).sum() / (n * n - n).clamp(min=1)).clamp_min(
        max(min_scale, torch.finfo(z.dtype).tiny))
    k = sum(torch.exp(-d2 / (scale * m)) for m in multipliers) * pair
    nx = x.shape[0]
    nr2 = w.sum().pow(2).clamp(min=1)
    return (k[:nx, :nx].sum() + k[nx:, nx:].sum() - 2 * k[:nx, nx:].sum()) / nr2


def two_stream_l2(x: Tensor, y: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """FedMMD Figure 4's "two-stream model constrained by L2 norm" (never written out in the paper):
    the batch mean of the squared Euclidean distance between paired outputs, mean_i ||x_i - y_i||^2
    (``mask``, 0/1 per row: the mean over the rows with weight 1)."""
    if mask is not None:
        return ((x - y).pow(2).sum(1) * mask).sum() / mask.sum().clamp(min=1)
    return (x - y).pow(2).sum(1).mean()


def ema(previous: Tensor, new: Tensor, decay: float) -> Tensor:
    """Exponential moving average, ``decay * previous + (1 - decay) * new`` (FedFusion § 3.3)."""
    return decay * previous + (1.0 - decay) * new
