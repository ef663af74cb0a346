"""AGG baseline of FedH2L (Li et al., ``papers/fedh2l.txt`` § IV): every node trains on its
private data together with the *whole* shared public seed set (every domain's labeled
``public`` split), one AMSGrad step of cross-entropy per round (10,000 rounds of batch 32).

"AGG is usually a strong baseline to beat in multi-domain learning": it sees the other
domains' seed images with labels directly. Batches are drawn uniformly from the union
(the paper does not say whether private and public samples are balanced).
"""

from __future__ import annotations

import torch

from .base import METHODS
from .stepwise import StepParams, StepwiseMethod


@METHODS.register("agg")
class Agg(StepwiseMethod):
    """AGG: own private data plus all domains' labeled public seed data, plain CE."""

    name = "agg"
    Params = StepParams

    def train_data(self, ctx, c):
        parts = [c.data.get("private")] + [o.data.get("public") for o in ctx.participants]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])
