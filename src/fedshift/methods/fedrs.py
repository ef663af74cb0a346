"""FedRS (Li & Zhan, "FedRS: Federated Learning with Restricted Softmax for Label
Distribution Non-IID Data", KDD 2021), a counterpart of FCCL+ Table XV (homogeneous).

FedAvg whose local cross-entropy uses a restricted softmax: the logits of classes
absent from the participant's private data are scaled by alpha = 0.5 (FCCL+ Table
VII), so the weights of missing classes get smaller updates
(:func:`fedshift.losses.restricted_softmax_ce`). Everything else is
:class:`~fedshift.methods.fedavg.FedAvg`.

Kept: the restriction of missing classes by alpha, computed once from each
participant's private labels. Differs: FedRS scales the classifier's weight vectors
of missing classes (``alpha * w_c``); scaling the logit also scales the class's bias,
which the FedRS classifier does not have. Under pure domain shift (every participant
holds every class, as on Digits and Office31 with the FCCL+ sizes), no class is
missing and FedRS trains exactly as FedAvg: the method targets label-distribution
skew, which FCCL+'s scenarios barely have.

State: none across rounds (the class masks come from the private data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..losses import restricted_softmax_ce
from .base import METHODS
from .fedavg import FedAvg


@dataclass(frozen=True)
class FedRSParams:
    init: Literal["scratch", "base"] = "scratch"  # authors' baselines start from scratch
    weighting: Literal["samples", "uniform"] = "samples"  # FedAvg: weight by n_k
    alpha: float = 0.5  # scale of the missing classes' logits (FCCL+ Table VII; 1 = FedAvg)

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")


def present_classes(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(C,) bool: which classes occur in ``labels``."""
    return torch.bincount(labels, minlength=num_classes) > 0


@METHODS.register("fedrs")
class FedRS(FedAvg):
    """FedRS: FedAvg with a restricted softmax (missing classes' logits scaled by alpha)."""

    name = "fedrs"
    Params = FedRSParams

    def setup(self, fed) -> None:
        super().setup(fed)
        for c in fed.clients:
            c.state["present"] = present_classes(c.data.get("private")[1], fed.num_classes)

    def local_loss(self, fed, client, x, y, step):
        return restricted_softmax_ce(client.model(x), y, client.state["present"], self.p.alpha)
