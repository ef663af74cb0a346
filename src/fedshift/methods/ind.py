"""IND baseline of FedH2L (Li et al., ``papers/fedh2l.txt`` § IV): every node trains on its
own private data only, one AMSGrad step of cross-entropy per round (the paper's schedule:
10,000 rounds of batch 32, lr 1e-3, weight decay 1e-4). No communication.

Differs from ``base`` (SOLO/BASE of FCCL+) only by the schedule and optimiser: a round is
one minibatch step, as in FedH2L, so IND, AGG and FedH2L see the same number of local steps.

``local_data`` (issue 21 item 6): ``private`` trains on the node's private split only;
``private+seed`` adds its own domain's labeled seed split, the reading under which § IV-A's
"the performance of IND ... is independent of alpha" holds (the seed split is carved out of
the domain's private share, so IND on private only loses alpha of its data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .base import METHODS
from .stepwise import StepParams, StepwiseMethod


@dataclass(frozen=True)
class IndParams(StepParams):
    # § IV-A: "the performance of IND, FedAvg and FedProx is independent of alpha", which holds only if
    # IND also trains on its own domain's seed split (the seed set is carved out of the private share):
    # private+seed. Default private (own private split only, as before).
    local_data: Literal["private", "private+seed"] = "private"


@METHODS.register("ind")
class Ind(StepwiseMethod):
    """IND: own private data only (SGD on CE in the paper's words; AMSGrad as FedH2L)."""

    name = "ind"
    Params = IndParams

    def train_data(self, ctx, c):
        """Own private split, plus the node's own domain's seed split under ``local_data: private+seed``."""
        if self.p.local_data == "private":
            return c.data.get("private")
        (xp, yp), (xs, ys) = c.data.get("private"), c.data.get("public")
        if bool((ys < 0).any()):
            from ..errors import ConfigError
            raise ConfigError(f"methods.{self.name}.local_data: private+seed needs a labeled seed split, but "
                              f"{c.name}'s is unlabeled; use local_data: private")
        return torch.cat([xp, xs]), torch.cat([yp, ys])
