"""Learning from the peers' predictions, weighted or voted: FedMatch's agreement pseudo-labels and
its loss on unlabeled data (Jeong et al. 2021), RHFL's client-confidence weights and weighted KL
alignment (Fang & Ye 2022), and RCFL's class-wise aggregation of scores (Gudur & Perepu 2020).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import _kl_batchmean

__all__ = [
    "agreement_pseudo_labels",
    "fedmatch_unlabeled_loss",
    "rhfl_confidence_weights",
    "weighted_kl_alignment",
    "classwise_aggregate",
]


def agreement_pseudo_labels(own_probs: Tensor, helper_probs: Sequence[Tensor]) -> Tensor:
    """FedMatch's agreement-based pseudo-labels (Jeong et al. 2021, § 3.2): (B,) class indices.

    One vote per model for its arg-max class (the participant's own and each helper's);
    the label is the class with most votes, ties going to the lowest class index (as
    ``argmax`` over the vote counts in the FedMatch code).
    """
    c = own_probs.shape[1]
    votes = F.one_hot(own_probs.argmax(1), c)
    for p in helper_probs:
        votes = votes + F.one_hot(p.argmax(1), c)
    return votes.argmax(1)


def fedmatch_unlabeled_loss(logits: Tensor, strong_logits: Tensor, helper_logits: Sequence[Tensor],
                            confidence: float, lambda_i: float, lambda_a: float) -> Tensor:
    """FedMatch's loss on unlabeled data (inter-client consistency + agreement pseudo-labels).

    Only samples whose own prediction ``softmax(logits)`` reaches ``confidence`` count.
    On those: ``lambda_i * mean_h KL(p_h || p)`` (consistency with each helper's detached
    prediction ``p_h``, KL summed over classes, batch mean) plus ``lambda_a * CE`` of the
    prediction on a strongly augmented view (``strong_logits``) against the agreement
    pseudo-label of the participant and its helpers. 0 (differentiable) if no sample is
    confident. The disjoint-parameter (sigma/psi) regularisers of FedMatch are not part of it.
    """
    p = F.softmax(logits, dim=1)
    conf = p.detach().max(1).values >= confidence
    if not bool(conf.any()):
        return logits.sum() * 0.0 + strong_logits.sum() * 0.0
    lp = F.log_softmax(logits[conf], dim=1)
    helpers = [F.log_softmax(h[conf].detach(), dim=1) for h in helper_logits]
    loss = logits.new_zeros(())
    if helpers:
        loss = loss + lambda_i * torch.stack([_kl_batchmean(h, lp) for h in helpers]).mean()
    pseudo = agreement_pseudo_labels(p[conf].detach(), [h.exp() for h in helpers])
    return loss + lambda_a * F.cross_entropy(strong_logits[conf], pseudo)


def rhfl_confidence_weights(prev_losses: Sequence[float] | None, losses: Sequence[float], beta: float) -> Tensor:
    """RHFL client confidence re-weighting (Fang & Ye 2022, § 3.3, as the RHFL code computes it).

    ``losses``: each participant's mean symmetric-CE loss on its private data now;
    ``prev_losses``: the same one round earlier (None in the first round). Quality
    ``q_k = (prev_k - now_k) / now_k``; ``a_k = 1/(K-1) + beta * q_k / sum_j q_j``; weights
    ``softmax(a)`` over all K participants (float64). First round, or a quality sum of
    0: uniform ``1/(K-1)`` (the RHFL code's start).
    """
    k = len(losses)
    uniform = torch.full((k,), 1.0 / max(k - 1, 1), dtype=torch.float64)
    if prev_losses is None:
        return uniform
    now = torch.tensor([float(v) for v in losses], dtype=torch.float64)
    prev = torch.tensor([float(v) for v in prev_losses], dtype=torch.float64)
    quality = (prev - now) / now
    total = quality.sum()
    if not torch.isfinite(total) or total.abs() < 1e-12:
        return uniform
    return torch.softmax(1.0 / max(k - 1, 1) + beta * quality / total, dim=0)


def weighted_kl_alignment(logits: Tensor, others_logits: Sequence[Tensor], weights: Sequence[float] | Tensor) -> Tensor:
    """RHFL's collaborative loss: ``sum_j w_j KL(p_j || p)`` over the other participants j.

    ``others_logits``: their (B, C) logits (used detached); ``weights``: one per other
    participant (RHFL: its client confidence). KL summed over classes, batch mean
    (``KLDivLoss(reduction="batchmean")`` as the RHFL code).
    """
    lp = F.log_softmax(logits, dim=1)
    w = torch.as_tensor(weights, dtype=logits.dtype, device=logits.device)
    if len(others_logits) != len(w):
        raise ValueError(f"{len(others_logits)} other participants but {len(w)} weights")
    terms = [_kl_batchmean(F.log_softmax(o.detach(), dim=1), lp) for o in others_logits]
    return (torch.stack(terms) * w).sum() if terms else logits.sum() * 0.0


def classwise_aggregate(scores: Tensor, class_mask: Tensor) -> Tensor:
    """RCFL's server aggregation of class scores (Gudur & Perepu 2020).

    ``scores``: (K, B, C) participants' class scores (probabilities) on shared public
    samples; ``class_mask``: (K, C) bool, which classes each participant holds labels of.
    Class c's aggregated score is the mean over the participants that hold c (every
    participant if none does); each row is then renormalised to sum to 1.
    """
    m = class_mask.to(scores.dtype)
    none = m.sum(0) == 0
    m = torch.where(none.unsqueeze(0), torch.ones_like(m), m)
    agg = (scores * m.unsqueeze(1)).sum(0) / m.sum(0).unsqueeze(0)
    return agg / agg.sum(1, keepdim=True).clamp(min=torch.finfo(scores.dtype).tiny)
