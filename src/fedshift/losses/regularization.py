"""Penalties in parameter space: the model is held near anchor weights. EWC (Kirkpatrick et al.
2017, FCCL+ Tab. XVI's alternative) with its empirical diagonal Fisher, and FedProx's proximal
term (Li et al. 2020).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Tuple

import torch
from torch import Tensor, nn

from ._common import Params, _aligned

__all__ = [
    "ewc_penalty",
    "diagonal_fisher",
    "prox_term",
]


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
