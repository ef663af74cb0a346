"""Pure loss functions of FCCL / FCCL+ and of the benchmark's counterparts.

Every function takes tensors and returns a scalar tensor (unless stated), keeps the
input dtype (float64 works end to end), is differentiable, never modifies its inputs
in place and holds no state. Weights that the papers put *outside* a loss (FISL's
omega, FCCL's lambda_Loc, MOON's mu, ...) are left to the caller; each docstring says
which equation it implements and which reductions it uses.

Papers: FCCL (Huang et al., CVPR 2022, ``papers/fccl-cvpr2022.txt``), FCCL+ (Huang et
al., TPAMI, ``papers/fccl-plus-tpami.txt``); counterparts as in ``REFERENCE.md``.
Where the paper and the authors' code differ, the authors' form is the default and
the docstring says so.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import ConfigError

#: Parameters as a list/tuple of tensors or a ``name -> tensor`` mapping.
Params = Union[Sequence[Tensor], Mapping[str, Tensor], Iterable[Tensor]]

__all__ = [
    "cross_entropy",
    "cross_correlation",
    "fccm_loss",
    "instance_similarity",
    "fisl_loss",
    "kd_loss",
    "fntd_loss",
    "inter_domain_kd",
    "intra_domain_kd",
    "fccl_dual_distillation_loss",
    "soft_target_loss",
    "fedmd_digest_loss",
    "symmetric_ce_loss",
    "ewc_penalty",
    "diagonal_fisher",
    "prox_term",
    "moon_contrastive_loss",
    "fedproc_alpha",
    "class_prototypes",
    "prototype_contrastive_loss",
    "mutual_learning_losses",
    "agreement_pseudo_labels",
    "fedmatch_unlabeled_loss",
    "rhfl_confidence_weights",
    "weighted_kl_alignment",
    "classwise_aggregate",
]


# --------------------------------------------------------------------------- helpers


def _kl_batchmean(teacher_log_probs: Tensor, student_log_probs: Tensor) -> Tensor:
    """KL(p_teacher || p_student) summed over the last dim, averaged over rows.

    Both arguments are log-probabilities (rows of a ``log_softmax``), so a teacher
    probability of exactly 0 contributes 0 (``xlogy`` convention) without a NaN.
    """
    terms = torch.exp(teacher_log_probs) * (teacher_log_probs - student_log_probs)
    return terms.sum(dim=-1).mean()


def _non_target(x: Tensor, labels: Tensor) -> Tensor:
    """(B, C) -> (B, C-1): drop column ``labels[b]`` of row b, other columns in order."""
    # gather instead of boolean-mask indexing: no data-dependent shape, so no host sync on CUDA.
    c = x.shape[1]
    cols = torch.arange(c - 1, device=x.device).expand(x.shape[0], c - 1)
    cols = cols + (cols >= labels.view(-1, 1)).long()
    return x.gather(1, cols)


def _as_list(params: Params, ref_keys: List[str] | None = None) -> Tuple[List[Tensor], List[str] | None]:
    """Turn a mapping (in ``ref_keys`` order) or an iterable of tensors into a list."""
    if isinstance(params, Mapping):
        keys = list(params.keys()) if ref_keys is None else ref_keys
        missing = [k for k in keys if k not in params]
        if missing:
            raise ValueError(f"parameter mapping lacks keys {missing}")
        return [params[k] for k in keys], keys
    return list(params), None


def _aligned(*groups: Params) -> List[Tuple[Tensor, ...]]:
    """Zip several parameter collections (all mappings keyed alike, or all sequences)."""
    first, keys = _as_list(groups[0])
    lists = [first] + [_as_list(g, keys)[0] for g in groups[1:]]
    if len({len(lst) for lst in lists}) != 1:
        raise ValueError(f"parameter collections differ in length: {[len(lst) for lst in lists]}")
    rows = list(zip(*lists))
    for i, row in enumerate(rows):
        if len({tuple(t.shape) for t in row}) != 1:
            name = keys[i] if keys else str(i)
            raise ValueError(f"parameter {name}: shapes differ: {[tuple(t.shape) for t in row]}")
    return rows


def cross_entropy(logits: Tensor, labels: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Batch-mean cross-entropy; with ``mask`` ((B,), 1 for a real sample, 0 for padding: the padded
    batches of engine.fused_clients) the mean over the real samples (0 when there is none)."""
    if mask is None:
        return F.cross_entropy(logits, labels)
    per = F.cross_entropy(logits, labels, reduction="none")
    w = mask.to(per.dtype)
    return (per * w).sum() / w.sum().clamp(min=1)


# ------------------------------------------------------------------ FCCL / FCCL+: collaborative


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


# ------------------------------------------------------------------ FCCL / FCCL+: local


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


# ------------------------------------------------------------------ counterparts


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


def ewc_penalty(params: Params, anchor_params: Params, fisher: Params, lam: float) -> Tensor:
    """Elastic weight consolidation (Kirkpatrick et al. 2017), FCCL+ Tab. XVI's alternative.

    ``lam / 2 * sum_i F_i (theta_i - theta*_i)^2`` over all parameter tensors.
    ``params``, ``anchor_params`` (theta*, detached) and ``fisher`` (from
    :func:`diagonal_fisher`) are either three sequences in the same order or three
    mappings with the same keys (the order of ``params``' keys is used).
    """
    rows = _aligned(params, anchor_params, fisher)
    if not rows:
        raise ValueError("ewc_penalty: no parameters given")
    total = torch.stack([(f * (w - a).pow(2)).sum() for w, a, f in rows]).sum()
    return 0.5 * lam * total


def diagonal_fisher(
    model: nn.Module,
    loader_batches: Iterable[Tuple[Tensor, Tensor]],
    loss_fn: Callable[[Tensor, Tensor], Tensor],
) -> Dict[str, Tensor]:
    """Empirical diagonal Fisher: the mean over batches of squared gradients.

    ``loader_batches`` yields ``(inputs, targets)``; for each, ``g = d loss_fn(model(inputs),
    targets) / d theta`` and ``F = mean_batches g^2``. Returns ``name -> tensor`` for
    every parameter that requires grad (detached). The model is run in eval mode
    (so BatchNorm's running statistics are not updated) and its previous mode is
    restored; its ``.grad`` fields are left untouched (gradients come from
    ``torch.autograd.grad``). Note: per-batch squared gradients of a batch-mean loss,
    not per-sample ones (mammoth-style EWC uses per-sample, probability-weighted ones).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    acc = [torch.zeros_like(p) for _, p in named]
    count = 0
    was_training = model.training
    model.eval()
    try:
        for inputs, targets in loader_batches:
            loss = loss_fn(model(inputs), targets)
            grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
            acc = [a if g is None else a + g.detach().pow(2) for a, g in zip(acc, grads)]
            count += 1
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("diagonal_fisher: loader_batches yielded no batch")
    return {n: a / count for (n, _), a in zip(named, acc)}


def prox_term(params: Params, global_params: Params, mu: float) -> Tensor:
    """FedProx proximal term (Li et al. 2020): ``(mu / 2) * sum ||w - w_g||^2``.

    ``params`` and ``global_params`` (detached) as in :func:`ewc_penalty`; mu 0.01 in
    FCCL+ Tab. VII.
    """
    rows = _aligned(params, global_params)
    if not rows:
        raise ValueError("prox_term: no parameters given")
    return 0.5 * mu * torch.stack([(w - g).pow(2).sum() for w, g in rows]).sum()


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


# ------------------------------------------------- counterparts of FCCL+ Tables VIII/IX/XV (issue 11)
# FedProx, MOON, FedRS and RHFL's symmetric CE are above (prox_term, moon_contrastive_loss,
# fedrs_class_scales / restricted_logits, symmetric_ce_loss). Below: FedProc, FML, FedMatch, RHFL's
# collaborative step and RCFL.


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
# ------------------------------------------------------------------ FedH2L (Li et al., papers/fedh2l.txt)
# Gradient projection over flat vectors (Eq. 7-8, closed form of the dual QP Eq. 14),
# PCGrad for the Table V ablation, the confidence weights and the mutual loss (Eq. 3-6).

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


__all__ += ["project_gradient", "confidence_weights", "batch_accuracy", "h2l_mutual_loss"]
# ---------------------------------------------------------------------------------------
# FedMMD / FedFusion (Yao et al. 2019, papers/fedmmd-fedfusion.txt)
# ---------------------------------------------------------------------------------------

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
