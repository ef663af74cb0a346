"""FedNova (Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020, arXiv:2007.07481), § 4 with local (momentum) SGD.

Clients that take different numbers of local steps pull FedAvg's average toward the objectives of
those that take more (its objective inconsistency). FedNova normalises each client's change by its
number of effective steps: with ``a_i`` the weights of client i's ``tau_i`` gradients in its change
(Eq. 6: ``x - y_i = eta G_i a_i``), the server moves

    x <- x - tau_eff * sum_i p_i (x - y_i) / ||a_i||_1,   tau_eff = sum_i p_i ||a_i||_1

(Eq. 7 with § 4's choice of ``tau_eff``; :func:`fednova_step`). ``||a_i||_1`` (:func:`effective_steps`) is
``tau_i`` for plain SGD and ``[tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)`` for SGD with momentum
``rho`` (§ 4, "local momentum"; torch's heavy-ball buffer, started afresh each round by the engine's
fresh optimiser); ``tau_i`` is the client's optimiser steps this round (``ctx.steps``).

Kept: the normalised update and ``tau_eff``; ``p_i`` the grid's scoring weighting over the round's
clients (``samples`` = the paper's ``n_i / n``, renormalised over the sampled clients as the official code;
``uniform`` = ``1 / |S|``). Differs: buffers (BatchNorm running statistics) are averaged as FedAvg's (the
paper normalises gradients; buffers are not trained); a client with no step this round contributes
nothing (its ``p_i`` is dropped). The FedProx variant of ``a_i`` and server momentum are not implemented.

Requirements (checked by ``fedshift validate``): ``engine.optimizer: sgd`` (``a_i`` is derived for SGD
steps; Adam's are not a linear combination of the gradients). State across rounds: none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Sequence

import torch

from ..engine.averaging import weighted_average
from .base import METHODS, Requirements, ServerParams, State
from .fedavg import ServerAveraging


@dataclass(frozen=True)
class FedNovaParams(ServerParams):
    """FedNova: the server-averaging fields alone (init from scratch)."""


def effective_steps(steps: int, momentum: float) -> float:
    """``||a_i||_1`` of ``steps`` local SGD steps with heavy-ball ``momentum`` (FedNova § 4)."""
    if momentum == 0.0:
        return float(steps)
    return (steps - momentum * (1.0 - momentum ** steps) / (1.0 - momentum)) / (1.0 - momentum)


def fednova_step(x: Mapping[str, torch.Tensor], trained: Sequence[Mapping[str, torch.Tensor]],
                 weights: Sequence[float], norms: Sequence[float]) -> Dict[str, torch.Tensor]:
    """``x - tau_eff sum_i p_i (x - y_i) / ||a_i||_1`` on the floating tensors, computed in float64
    (``p_i`` = ``weights`` normalised, ``||a_i||_1`` = ``norms``, ``tau_eff = sum_i p_i ||a_i||_1``);
    buffers are the weighted average of the clients' and integer tensors the first client's. A client
    with ``norms == 0`` is left out."""
    keep = [i for i, a in enumerate(norms) if a > 0]
    if not keep:  # nobody stepped: the global model stays
        return dict(x)
    total = sum(weights[i] for i in keep)
    p = {i: weights[i] / total for i in keep}
    tau_eff = sum(p[i] * norms[i] for i in keep)
    average = weighted_average([trained[i] for i in keep], [weights[i] for i in keep])
    out = {}
    for k, v in x.items():
        if not torch.is_floating_point(v):
            out[k] = average[k]
            continue
        step = sum((v.double() - trained[i][k].double()) * (p[i] / norms[i]) for i in keep)
        out[k] = (v.double() - tau_eff * step).to(v.dtype)
    return out


@METHODS.register("fednova")
class FedNova(ServerAveraging):
    """FedNova: each client's change normalised by its effective local steps, then FedAvg's server."""

    name = "fednova"
    Params = FedNovaParams
    requires = Requirements(optimizer="sgd")

    def server_step(self, ctx, start: Mapping[str, State], trained: Mapping[str, State]) -> Dict[str, State]:
        names = list(trained)
        by_name = {p.name: p for p in ctx.participants}
        norms = [effective_steps(ctx.steps.get(n, 0), ctx.momentum) for n in names]
        new = fednova_step(start[names[0]], [trained[n] for n in names],
                           ctx.weights([by_name[n] for n in names]), norms)
        return ctx.to_all(new)
