"""FedH2L (Li et al., ``papers/fedh2l.txt``): mutual learning on the peers' public batches with
gradient projection. The projection over flat gradient vectors (Eq. 7-8, the closed form of the
dual QP Eq. 14, and PCGrad for the Table V ablation), the teaching-confidence weights and the
mutual loss (Eq. 3-6).
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError

__all__ = [
    "PROJECTIONS",
    "project_gradient",
    "confidence_weights",
    "batch_accuracy",
    "h2l_mutual_loss",
]


PROJECTIONS = ("closed_form", "none", "pcgrad")


def project_gradient(g_pub: Tensor, g_loc: Tensor, mode: str = "closed_form") -> Tensor:
    """FedH2L's global update direction from the flat public and local gradients (1-D tensors).

    * ``closed_form`` (Eq. 7-8, the dual of Eq. 14 solved exactly): when
      ``<g_pub, g_loc> < 0``, ``g_pub - <g_pub, g_loc> / ||g_loc||^2 * g_loc`` (the
      closest vector to ``g_pub`` with a non-negative inner product with ``g_loc``);
      otherwise ``g_pub`` unchanged. ``v* = max(0, -<g_pub,g_loc>/||g_loc||^2)``.
    * ``none`` (Table V "no project"): ``g_pub``.
    * ``pcgrad`` (Yu et al. 2020, Table V): each of the two task gradients is projected
      onto the normal plane of the other when they conflict, and the two are summed
      (PCGrad's update). For two tasks the projection of ``g_pub`` equals the closed
      form; PCGrad differs by also carrying the (projected) local gradient.

    A zero ``g_loc`` (or ``g_pub`` for PCGrad's second projection) leaves the other unchanged.
    Inputs are not modified.
    """
    if mode not in PROJECTIONS:
        raise ConfigError(f"projection: invalid value {mode!r}; valid: {', '.join(PROJECTIONS)}")
    if mode == "none":
        return g_pub.clone()
    dot = torch.dot(g_pub, g_loc)
    conflict = dot < 0
    zero = torch.zeros((), dtype=g_pub.dtype, device=g_pub.device)
    v = torch.where(conflict, -dot / g_loc.dot(g_loc).clamp_min(torch.finfo(g_pub.dtype).tiny), zero)
    g_pub_p = g_pub + v * g_loc  # Eq. 14: g~ = v* g_loc + g_pub
    if mode == "closed_form":
        return g_pub_p
    u = torch.where(conflict, -dot / g_pub.dot(g_pub).clamp_min(torch.finfo(g_pub.dtype).tiny), zero)
    return g_pub_p + (g_loc + u * g_pub)


def confidence_weights(peer_acc: Tensor, n_nodes: int) -> Tensor:
    """Eq. 3 weights of the peers' KL terms: ``Acc_j / (N - 1)``.

    ``peer_acc``: (P,) teaching confidences (accuracies as fractions in [0, 1]) of the
    student's P teachers; ``n_nodes - 1`` normalises (Eq. 3), so the weights are not
    normalised to sum to one (the paper's form). With fewer teachers than ``N - 1``
    (random pairs) pass ``n_nodes = P + 1``.
    """
    if n_nodes < 2:
        raise ValueError(f"confidence_weights: needs at least 2 nodes, got {n_nodes}")
    return peer_acc / (n_nodes - 1)


def batch_accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """Fraction of rows whose arg-max equals the label (a 0-d float tensor): the teaching confidence Acc_j."""
    return (logits.argmax(-1) == labels).to(logits.dtype).mean()


def h2l_mutual_loss(student_logits: Tensor, teacher_probs: Tensor, peer_acc: Tensor,
                    labels: Tensor | None = None, kl: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
    """FedH2L's global mutual loss of one student (Eq. 3 + Eq. 5, gradient Eq. 6).

    ``student_logits``: (P, B, C) the student's logits on each of its P teachers' public
    batches; ``teacher_probs``: (P, B, C) each teacher's posteriors on its own batch;
    ``peer_acc``: (P,) the teachers' accuracies on their batches; ``labels``: (P, B)
    the public labels, or None for unlabeled public data (no CE term, § IV-E 2).

    KL term (Eq. 3-4): ``1/P * sum_j Acc_j * KL(p_j || p_i)``, each KL summed over
    classes and averaged over the batch (a proper per-sample KL, no temperature); CE term
    (Eq. 5): ``1/P * sum_j CE(f_i(x_j), y_j)`` with the batch mean. Returns
    ``(total, kl_term, ce_term)``; a switched-off term is a zero tensor.
    """
    if student_logits.shape != teacher_probs.shape or student_logits.dim() != 3:
        raise ValueError(f"h2l_mutual_loss: expected matching (P, B, C) tensors, got {tuple(student_logits.shape)} "
                         f"and {tuple(teacher_probs.shape)}")
    n_peers = student_logits.shape[0]
    zero = student_logits.new_zeros(())
    log_q = F.log_softmax(student_logits, dim=-1)
    kl_term = zero
    if kl:
        per_peer = (torch.special.xlogy(teacher_probs, teacher_probs) - teacher_probs * log_q).sum(-1).mean(-1)
        kl_term = (confidence_weights(peer_acc.to(per_peer.dtype), n_peers + 1) * per_peer).sum()
    ce_term = zero
    if labels is not None:
        ce = F.cross_entropy(student_logits.flatten(0, 1), labels.flatten(), reduction="none")
        ce_term = ce.view(n_peers, -1).mean(-1).sum() / n_peers
    return kl_term + ce_term, kl_term, ce_term
