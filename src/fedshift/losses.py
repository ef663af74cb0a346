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

from typing import Callable, Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import ConfigError

#: Parameters as a list/tuple of tensors or a ``name -> tensor`` mapping.
Params = Union[Sequence[Tensor], Mapping[str, Tensor], Iterable[Tensor]]

__all__ = [
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
    "restricted_softmax_ce",
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


def restricted_softmax_ce(logits: Tensor, labels: Tensor, present_mask: Tensor, alpha: float) -> Tensor:
    """FedRS restricted-softmax cross-entropy (Li & Zhan 2021).

    Logits of classes absent from the participant's data (``present_mask`` False; a
    (C,) or (B, C) bool tensor) are multiplied by ``alpha`` (0.5 in FCCL+ Tab. VII),
    present ones kept, then the usual cross-entropy, batch mean.
    """
    one = torch.ones((), dtype=logits.dtype, device=logits.device)
    scale = torch.where(present_mask.to(torch.bool), one, one * alpha)
    return F.cross_entropy(logits * scale, labels)


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
             min_scale: float = 0.0) -> Tensor:
    """FedMMD Eq. 2: MMD^2(x, y) = E[K(x, x')] + E[K(y, y')] - 2 E[K(x, y)] (biased V-statistic).

    ``x``: (n, d), ``y``: (m, d) samples (FedMMD: the global and local models' outputs on one
    batch). K is the sum over widths of exp(-||a - b||^2 / sigma^2), with sigma^2 = mult * s and s
    the mean squared distance between distinct pooled samples, detached (the widths follow the
    data but carry no gradient), floored at ``min_scale``; every expectation is the plain mean
    over all pairs, diagonal included. Zero when x and y are the same samples.
    """
    z = torch.cat([x, y], 0)
    sq = z.pow(2).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2 * z @ z.T).clamp_min(0)  # no sqrt: smooth gradient at distance 0
    n = z.shape[0]
    scale = (d2.detach().sum() / max(n * n - n, 1)).clamp_min(max(min_scale, torch.finfo(z.dtype).tiny))
    k = sum(torch.exp(-d2 / (scale * m)) for m in multipliers)
    nx = x.shape[0]
    return k[:nx, :nx].mean() + k[nx:, nx:].mean() - 2 * k[:nx, nx:].mean()


def two_stream_l2(x: Tensor, y: Tensor) -> Tensor:
    """FedMMD Figure 4's "two-stream model constrained by L2 norm" (never written out in the paper):
    the batch mean of the squared Euclidean distance between paired outputs, mean_i ||x_i - y_i||^2."""
    return (x - y).pow(2).sum(1).mean()


def ema(previous: Tensor, new: Tensor, decay: float) -> Tensor:
    """Exponential moving average, ``decay * previous + (1 - decay) * new`` (FedFusion § 3.3)."""
    return decay * previous + (1.0 - decay) * new
