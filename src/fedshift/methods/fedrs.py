"""FedRS (Li & Zhan, "FedRS: Federated Learning with Restricted Softmax for Label
Distribution Non-IID Data", KDD 2021), a counterpart of FCCL+ Table XV (homogeneous).

FedAvg whose local cross-entropy uses a restricted softmax: participant k's logit of
class c is scaled by s_c before the softmax, so the classifier weights of classes the
participant has few or no samples of get smaller updates. Two readings of s_c
(``restriction``):

* ``count`` (the authors' code, default in the FCCL+ grids):
  ``s_c = alpha + (1 - alpha) * n_c / max_k n_k`` with n_c the participant's private
  count of class c, for *every* class (lxcnju/FedRepo ``algorithms/fedrs.py:53-56``
  counts the classes, ``:185-189`` scales ``hs.mm(ws.T)`` by the normalised counts).
  When every participant holds every class with unequal counts (Digits, Office31),
  FedRS still differs from FedAvg.
* ``missing`` (the paper's text, § 4: "restrict the logits of missing classes"):
  ``s_c = alpha`` for classes absent from the private data, 1 otherwise; under pure
  domain shift no class is missing and FedRS trains exactly as FedAvg.

The scale multiplies ``w_c . h`` only: FedRepo's classifier has no bias
(``networks/basic_nets.py:84``, ``bias=False``), ours has one, which stays unscaled
(``z_c = s_c (w_c . h) + b_c``, :func:`fedshift.losses.restricted_logits`). alpha = 0.5
(FCCL+ Table VII). Everything else is :class:`~fedshift.methods.fedavg.FedAvg`.

State: none across rounds (the scales come from the private labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch

import torch.nn.functional as F

from ..losses import fedrs_class_scales, restricted_logits
from .base import METHODS, ServerParams
from .fedavg import FedAvg


@dataclass(frozen=True)
class FedRSParams(ServerParams):
    alpha: float = 0.5  # the smallest logit scale (FCCL+ Table VII; 1 = FedAvg)
    # count: s_c = alpha + (1 - alpha) n_c / max n (FedRepo code); missing: alpha for absent classes (paper text)
    restriction: Literal["count", "missing"] = "count"

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")


def present_classes(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(C,) bool: which classes occur in ``labels``."""
    return torch.bincount(labels, minlength=num_classes) > 0


def last_linear(model: torch.nn.Module) -> torch.nn.Linear:
    """The classifier's final linear layer (whose bias the restriction leaves unscaled)."""
    head = cast(torch.nn.Module, model.head)  # a FedModel's classifier module
    return [m for m in head.modules() if isinstance(m, torch.nn.Linear)][-1]


@METHODS.register("fedrs")
class FedRS(FedAvg):
    """FedRS: FedAvg with a restricted softmax (class logits scaled by s_c, ``restriction``)."""

    name = "fedrs"
    Params = FedRSParams

    def setup(self, ctx) -> None:
        super().setup(ctx)
        for c in ctx.participants:
            counts = torch.bincount(c.data.get("private")[1], minlength=ctx.num_classes)
            c.state["scales"] = fedrs_class_scales(counts, self.p.alpha, self.p.restriction).to(ctx.device)

    def local_loss(self, ctx, client, x, y, step):
        bias = last_linear(client.model).bias
        return F.cross_entropy(restricted_logits(client.model(x), client.state["scales"], bias), y)
