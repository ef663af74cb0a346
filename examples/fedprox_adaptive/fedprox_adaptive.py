"""FedProx with an adaptive proximal weight: a fedshift method from an outside package.

FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020, arXiv:1812.06127) adds ``(mu / 2) ||w - w_global||²``
to each participant's local objective. Its Appendix C.3.3 ("adaptively setting mu")
changes mu between rounds from the training loss: raise it by a step (0.1) when the
loss went up, lower it by a step when the loss went down several rounds in a row,
starting from 1 on heterogeneous (non-IID) data. That is this method:

* :func:`prox_loss` - the batch loss, a pure function of logits, labels, parameters,
  anchors and mu: cross-entropy plus fedshift's proximal term (``fedshift.losses.prox_term``,
  the one FedProx uses), unit-tested against an independent formula;
* :func:`next_mu` - the between-rounds rule, a pure function;
* :class:`FedProxAdaptive` - FedAvg's round (fedshift's built-in ``fedavg``) with that
  loss; the loss it watches is the mean over participants of the round's local loss
  (proximal term included, i.e. the objective each participant minimised);
* its state across rounds (mu, the previous loss, the improvement streak) is in
  ``state_dict()`` / ``load_state_dict()``, so a killed run resumes bit-identically.

Installed with ``pip install -e examples/fedprox_adaptive``; the entry point in
``pyproject.toml`` registers it as ``fedprox_adaptive`` (see docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Sequence, Tuple

import torch.nn.functional as F
from torch import Tensor

from fedshift.losses import prox_term
from fedshift.methods.base import ServerParams
from fedshift.methods.fedavg import FedAvg


@dataclass(frozen=True)
class FedProxAdaptiveParams(ServerParams):  # init: as every FedAvg-family method (the grid's scoring: scores it)
    mu: float = 1.0  # mu of round 1 (Appendix C.3.3: 1 on non-IID data, 0 on IID)
    # how much mu moves per adjustment (Appendix C.3.3); `search`: the values a grid's tune block tries
    # when it lists fedprox_adaptive with no space of its own (docs/tuning.md)
    step: float = field(default=0.1, metadata={"search": [0.05, 0.1, 0.2]})
    patience: int = 5  # consecutive loss decreases before mu is lowered
    mu_max: float = 1.0  # upper bound of mu (0 is the lower bound)

    def __post_init__(self):
        if not 0 <= self.mu <= self.mu_max:
            raise ValueError(f"mu must lie in [0, mu_max={self.mu_max}], got {self.mu}")
        if self.step < 0 or self.patience < 1:
            raise ValueError(f"step must be >= 0 and patience >= 1, got {self.step}, {self.patience}")


def prox_loss(logits: Tensor, y: Tensor, params: Sequence[Tensor], anchor: Sequence[Tensor], mu: float) -> Tensor:
    """``CE(logits, y) + (mu / 2) * sum_k ||params_k - anchor_k||²`` (anchors are constants)."""
    if len(params) != len(anchor):
        raise ValueError(f"prox_loss: {len(params)} parameters but {len(anchor)} anchors")
    return F.cross_entropy(logits, y) + prox_term(params, [a.detach() for a in anchor], mu)


def next_mu(mu: float, loss: float, prev_loss: float, streak: int, step: float, patience: int,
            mu_max: float) -> Tuple[float, int]:
    """(mu, streak) for the next round: up one step after a rise (streak restarts), down one step
    after ``patience`` decreases in a row (streak restarts), else unchanged; clipped to [0, mu_max]."""
    if loss > prev_loss:
        return min(mu_max, mu + step), 0
    streak += 1
    if streak >= patience:
        return max(0.0, mu - step), 0
    return mu, streak


class FedProxAdaptive(FedAvg):
    """FedAvg's round with the FedProx local loss, mu adapted between rounds."""

    name = "fedprox_adaptive"
    Params = FedProxAdaptiveParams

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.mu, self.prev_loss, self.streak = float(self.p.mu), float("inf"), 0

    def begin_round(self, ctx, global_state: Dict[str, Tensor]) -> None:
        # w_global: the weights every sampled participant starts the round from
        model = ctx.participants[0].model
        self._anchor = [global_state[n] for n, q in model.named_parameters() if q.requires_grad]

    def local_loss(self, ctx, client, x, y, step):
        params = [q for q in client.model.parameters() if q.requires_grad]
        return prox_loss(client.model(x), y, params, self._anchor, self.mu)

    def local_update(self, ctx) -> Dict[str, float]:
        losses = super().local_update(ctx)
        used = self.mu
        loss = sum(losses.values()) / len(losses)
        self.mu, self.streak = next_mu(self.mu, loss, self.prev_loss, self.streak, self.p.step,
                                       self.p.patience, self.p.mu_max)
        self.prev_loss = loss
        return {**losses, "fedprox_adaptive/mu": used}

    def state_dict(self) -> Dict[str, Any]:
        return {"mu": self.mu, "prev_loss": self.prev_loss, "streak": self.streak}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mu, self.prev_loss, self.streak = float(state["mu"]), float(state["prev_loss"]), int(state["streak"])
