"""Knowledge distillation on logits: one model's output distribution pulled toward a teacher's.
FCCL+'s logit KD and non-target distillation (FNTD, Eq. 7-13), FCCL's dual-domain distillation
(CVPR Eq. 4-6), FedDF's distillation toward an ensemble's probabilities, FedMD's digest toward the
consensus logits and FML's deep mutual learning pair.

Papers: FCCL (``papers/fccl-cvpr2022.txt``), FCCL+ (``papers/fccl-plus-tpami.txt``); FedDF, FedMD
and FML as in ``REFERENCE.md``.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ._common import _kl_batchmean, _non_target

__all__ = [
    "kd_loss",
    "fntd_loss",
    "inter_domain_kd",
    "intra_domain_kd",
    "fccl_dual_distillation_loss",
    "soft_target_loss",
    "fedmd_digest_loss",
    "mutual_learning_losses",
]


def kd_loss(student_logits: Tensor, teacher_logits: Tensor, T: float) -> Tensor:
    """Logit distillation, FCCL+ Eq. 7-8, times ``T^2`` as in Eq. 10.

    ``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, KL summed over classes
    and averaged over the batch. (B, C) logits in, scalar out.
    """
    s = F.log_softmax(student_logits / T, dim=1)
    t = F.log_softmax(teacher_logits / T, dim=1)
    return _kl_batchmean(t, s) * (T * T)


def fntd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    T: float,
    renormalize: bool = False,
) -> Tensor:
    """Federated Non-Target Distillation, FCCL+ Eq. 13, times ``T^2``.

    ``sum_{u != t} p_T^u log(p_T^u / p_S^u)`` with ``t = labels[b]``, averaged over the
    batch and multiplied by ``T^2`` (the local objective is CE + this, Eq. 14).

    * ``renormalize=False`` (default; the paper's Eq. 11/13 and the authors' code):
      ``p = softmax(z / T)`` over *all* C classes and the target term is dropped, so
      the non-target probabilities of teacher and student each sum to
      ``1 - p^t``. Then ``kd_loss = fntd_loss + T^2 * target term`` exactly, and the
      value can be slightly negative (it is not a KL between distributions).
    * ``renormalize=True`` (DKD-style NCKD): softmax over the C-1 non-target logits
      only (the same as masking the target logit to -inf); a proper KL, >= 0.
    """
    if renormalize:
        s = F.log_softmax(_non_target(student_logits / T, labels), dim=1)
        t = F.log_softmax(_non_target(teacher_logits / T, labels), dim=1)
    else:
        s = _non_target(F.log_softmax(student_logits / T, dim=1), labels)
        t = _non_target(F.log_softmax(teacher_logits / T, dim=1), labels)
    return _kl_batchmean(t, s) * (T * T)


def inter_domain_kd(student_logits: Tensor, prev_logits: Tensor, T: float = 1.0) -> Tensor:
    """FCCL (CVPR) Eq. 4: ``KL(softmax(prev / T) || softmax(student / T))``, batch mean.

    ``prev_logits``: the previous round's model (theta^{t-1}) on the private batch, the
    inter-domain teacher. Temperature 1 and no ``T^2`` factor by default (the authors'
    code); ``T`` is exposed for ablations but never squared here.
    """
    return _kl_batchmean(F.log_softmax(prev_logits / T, dim=1), F.log_softmax(student_logits / T, dim=1))


def intra_domain_kd(student_logits: Tensor, pretrained_logits: Tensor, T: float = 1.0) -> Tensor:
    """FCCL (CVPR) Eq. 5: ``KL(softmax(pretrained / T) || softmax(student / T))``, batch mean.

    ``pretrained_logits``: the participant's pretrained (SOLO) model theta^* on the
    private batch, the intra-domain teacher. Same conventions as :func:`inter_domain_kd`.
    """
    return _kl_batchmean(F.log_softmax(pretrained_logits / T, dim=1), F.log_softmax(student_logits / T, dim=1))


def fccl_dual_distillation_loss(
    student_logits: Tensor, prev_logits: Tensor, pretrained_logits: Tensor, T: float = 1.0
) -> Tensor:
    """FCCL (CVPR) dual-domain distillation, Eq. 6: ``L_inter + L_intra`` (Eq. 4 + Eq. 5).

    Unweighted sum of :func:`inter_domain_kd` and :func:`intra_domain_kd`. The local
    objective is Eq. 7, ``CE + lambda_Loc * L_dual``; the coefficient lambda_Loc is the
    caller's (the authors' code adds the terms with weight 1, which is also FCCL+
    Eq. 19). Temperature 1, no ``T^2``.
    """
    return inter_domain_kd(student_logits, prev_logits, T) + intra_domain_kd(student_logits, pretrained_logits, T)


def soft_target_loss(student_logits: Tensor, target_probs: Tensor, T: float) -> Tensor:
    """Distillation toward given probabilities (FedDF's ensemble target), times ``T^2``.

    ``T^2 * KL(target_probs || softmax(student / T))``, summed over classes, batch mean.
    ``target_probs``: (B, C) rows summing to 1 (FedDF: the average of the
    participants' ``softmax(z / T)``); zero entries contribute 0.
    """
    s = F.log_softmax(student_logits / T, dim=1)
    terms = torch.special.xlogy(target_probs, target_probs) - target_probs * s
    return terms.sum(dim=1).mean() * (T * T)


_DIGEST: Dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "l1": F.l1_loss,  # FedMD's digest on logits: mean absolute error
    "l2": F.mse_loss,  # the squared-error variant FCCL+ describes
}


def fedmd_digest_loss(logits: Tensor, consensus_logits: Tensor, kind: str = "l1") -> Tensor:
    """FedMD "digest" step (Li & Wang 2019): distance of logits to the server's consensus.

    ``kind="l1"``: mean absolute error; ``"l2"``: mean squared error; both averaged
    over every element of the (B, C) tensors.
    """
    try:
        fn = _DIGEST[kind]
    except KeyError:
        raise ConfigError(f"fedmd digest kind: unknown {kind!r}; valid: {', '.join(sorted(_DIGEST))}") from None
    return fn(logits, consensus_logits)


def mutual_learning_losses(local_logits: Tensor, meme_logits: Tensor, labels: Tensor,
                           alpha: float, beta: float) -> Tuple[Tensor, Tensor]:
    """FML's deep mutual learning pair (Shen et al. 2020, Eq. 3-4).

    ``L_local = alpha * CE(local) + (1 - alpha) * KL(p_meme || p_local)`` and
    ``L_meme = beta * CE(meme) + (1 - beta) * KL(p_local || p_meme)``; each KL's target
    is detached (the other model is the teacher of that term), KL summed over classes,
    batch mean. ``alpha = beta = 1`` turns both KL terms off (independent training).
    """
    lp_local = F.log_softmax(local_logits, dim=1)
    lp_meme = F.log_softmax(meme_logits, dim=1)
    loss_local = alpha * F.nll_loss(lp_local, labels) + (1 - alpha) * _kl_batchmean(lp_meme.detach(), lp_local)
    loss_meme = beta * F.nll_loss(lp_meme, labels) + (1 - beta) * _kl_batchmean(lp_local.detach(), lp_meme)
    return loss_local, loss_meme
