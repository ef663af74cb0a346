"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020), a counterpart of FCCL+ Table XV (homogeneous).

FedAvg whose local objective adds the proximal term ``(mu / 2) ||w - w_global||²``
(:func:`fedshift.losses.prox_term`) over every trainable parameter, ``w_global`` being
the model the participant received at the start of the round; mu = 0.01 (FCCL+
Table VII). Everything else is :class:`~fedshift.methods.fedavg.FedAvg`: one global
start, sample-weighted averaging of all parameters after local updating, or, with
``eval_models: local`` (the FCCL+ grids; ``fccl+/models/fedprox.py:32-36``), a uniform
average at the start of the round, ``w_global`` being that average, and each
participant scored after local updating.

Kept: the proximal term and FedAvg's aggregation. Differs from the FedProx paper: no
partial work (every participant runs the same number of local epochs, no stragglers
or inexact solutions) and full participation, as in the FCCL+ benchmark; the local
optimiser is the engine's (Adam, FCCL+ § 4.1) rather than SGD.

State: none across rounds (the global model of a round is the weights every
participant holds when the round starts, which the engine saves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch.nn.functional as F

from ..engine.fused import masked_cross_entropy
from ..losses import prox_term
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

    def local_update(self, fed, r: int) -> Dict[str, float]:
        for c in fed.clients:  # w_global: what the participant holds before local updating
            c.state["global_params"] = [q.detach().clone() for q in c.model.parameters() if q.requires_grad]
        try:
            return super().local_update(fed, r)
        finally:
            for c in fed.clients:
                c.state.pop("global_params", None)

    def fused_objective(self, fed):
        """CE + (mu/2)||w - w_global||^2 on stacked weights (engine.fused_clients): ``w_global`` is what
        every sampled client holds at the start of the round (the working model before training)."""
        mu = self.p.mu
        glob = {n: q.detach().clone() for n, q in fed.clients[0].model.named_parameters() if q.requires_grad}

        def objective(call, params, x, y, mask):
            loss = masked_cross_entropy(call, params, x, y, mask)
            if mu > 0:
                loss = loss + (mu / 2) * sum((params[n] - g).pow(2).sum() for n, g in glob.items())
            return loss
        return objective

    def local_loss(self, fed, client, x, y, step):
        loss = F.cross_entropy(client.model(x), y)
        if self.p.mu > 0:
            params = [q for q in client.model.parameters() if q.requires_grad]
            loss = loss + prox_term(params, client.state["global_params"], self.p.mu)
        return loss
