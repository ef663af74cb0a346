"""IND baseline of FedH2L (Li et al., ``papers/fedh2l.txt`` § IV): every node trains on its
own private data only, one AMSGrad step of cross-entropy per round (the paper's schedule:
10,000 rounds of batch 32, lr 1e-3, weight decay 1e-4). No communication.

Differs from ``base`` (SOLO/BASE of FCCL+) only by the schedule and optimiser: a round is
one minibatch step, as in FedH2L, so IND, AGG and FedH2L see the same number of local steps.
"""

from __future__ import annotations

from .base import METHODS
from .stepwise import StepParams, StepwiseMethod


@METHODS.register("ind")
class Ind(StepwiseMethod):
    """IND: own private data only (SGD on CE in the paper's words; AMSGrad as FedH2L)."""

    name = "ind"
    Params = StepParams
