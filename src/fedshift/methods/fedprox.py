"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020), a counterpart of FCCL+ Table XV (homogeneous).

FedAvg whose local objective adds the proximal term ``(mu / 2) ||w - w_global||²``
(:func:`fedshift.losses.prox_term`) over every trainable parameter, ``w_global`` being
the model the participant received at the start of the round; mu = 0.01 (FCCL+
Table VII). Everything else is :class:`~fedshift.methods.fedavg.FedAvg`: one global
start, the server's weighted average after local updating (under the FCCL+ grids' local
scoring protocol, ``fccl+/models/fedprox.py:32-36``, received at the start of the next round,
``w_global`` being that average, each participant scored after local updating).

Kept: the proximal term and FedAvg's aggregation. Differs from the FedProx paper: no
partial work (every participant runs the same number of local epochs, no stragglers
or inexact solutions) and full participation, as in the FCCL+ benchmark; the local
optimiser is the engine's (Adam, FCCL+ § 4.1) rather than SGD.

State: none across rounds (the global model of a round is the weights every
participant holds when the round starts, which the engine saves). One loss,
:meth:`FedProx.objective`, serves the sequential and the fused (engine.fused_clients) paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch

from ..losses import cross_entropy, prox_term
from .base import METHODS, ServerParams
from .fedavg import FedAvg


@dataclass(frozen=True)
class FedProxParams(ServerParams):
    mu: float = 0.01  # proximal weight (FCCL+ Table VII)

    def __post_init__(self):
        if self.mu < 0:
            raise ValueError(f"mu must be >= 0, got {self.mu}")


@METHODS.register("fedprox")
class FedProx(FedAvg):
    """FedProx: FedAvg + (mu/2)||w - w_global||² in the local objective."""

    name = "fedprox"
    Params = FedProxParams

    def begin_round(self, ctx, global_state: Dict[str, torch.Tensor]) -> None:
        # w_global: the weights every participant holds before local updating (both paths, every protocol)
        self._anchor = {n: global_state[n] for n, q in ctx.participants[0].model.named_parameters() if q.requires_grad}

    def objective(self, call, params: Dict[str, torch.Tensor], x, y, mask=None) -> torch.Tensor:
        """CE + (mu/2)||w - w_global||², the one loss of both paths: ``call(params, x)`` runs the model;
        ``mask`` marks a padded batch's real samples (engine.fused_clients), None on the sequential path."""
        loss = cross_entropy(call(params, x), y, mask)
        if self.p.mu > 0:
            loss = loss + prox_term(params, self._anchor, self.p.mu)
        return loss

    def fused_objective(self, ctx):
        """:meth:`objective` on stacked weights (engine.fused_clients)."""
        return self.objective

    def after_round(self, ctx) -> None:
        super().after_round(ctx)
        self._anchor = {}  # no copy of the old global weights held between rounds

    def local_loss(self, ctx, client, x, y, step):
        params = {n: q for n, q in client.model.named_parameters() if q.requires_grad}
        return self.objective(lambda _, inputs: client.model(inputs), params, x, y)
