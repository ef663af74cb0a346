"""RCFL (Gudur & Perepu, "Resource-Constrained Federated Learning with Heterogeneous
Labels and Models", SIGKDD AIoT workshop, arXiv 2020), a model-heterogeneous
counterpart: participants share class scores on a public set, the server aggregates
them class by class, and participants distil toward the aggregate.

Each round:

1. Distillation (from round 2): every participant trains toward last round's
   aggregated scores on the same public subset, ``T² KL(target || softmax(z / T))``
   (:func:`fedshift.losses.soft_target_loss`), ``distill_epochs`` passes with its own
   optimiser (fresh every round).
2. Local updating: cross-entropy on the private data.
3. Scoring (end of the round, the models as they leave local updating): a fresh
   random public subset is scored by every participant (``softmax(z / T)``, eval
   mode); the server averages each class's score over the participants whose private
   data hold that class (:func:`fedshift.losses.classwise_aggregate`, RCFL's answer
   to heterogeneous label sets) and renormalises each row.

Kept: class-wise score aggregation over a shared unlabeled set and distillation
toward it, across heterogeneous architectures. No public code exists for RCFL; its
paper leaves the score type, temperature and distillation loss open: here
probabilities at ``T`` = 1 with a KL loss (as FedDF's), the subset size that of
FedMD (5,000, i.e. FCCL+'s whole public set). When every participant holds every
class (FCCL+'s scenarios) the class-wise average is the plain average of the
participants' probabilities. RCFL's activity-recognition models, label-set
mapping and on-device resource budget are not part of the benchmark.

Homogeneous mode (FCCL+ § 4.4, CVPR § 4.1: "the model parameter averaging operation
between collaborative updating and local updating" for every method of the table): on
one shared architecture the participants are averaged uniformly after the
distillation and before local updating (``homogeneous_averaging: auto``,
:class:`~fedshift.methods.homogeneous.ParameterAveraging`), the position of every
method in the FCCL+ code; the scores are then taken from the local models.

State across rounds: the scored public indices and the aggregated scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal, Mapping, Optional

import torch
import torch.nn.functional as F

from ..data.loading import normalize
from ..losses import classwise_aggregate, soft_target_loss
from .base import METHODS, Method
from .common import digest
from .homogeneous import ParameterAveraging


@dataclass(frozen=True)
class RCFLParams:
    init: Literal["scratch", "base"] = "scratch"  # authors' baselines start from scratch
    public_subset: int = 5000  # public samples scored per round (FedMD's 5,000; FCCL+ public sets hold 5,000)
    distill_epochs: int = 1  # passes toward the aggregated scores per round (FedMD's digest: 1)
    tau: float = 1.0  # temperature of the scores and of the distillation (unstated in RCFL; T² scaling)
    # Homogeneous mode (FCCL+ § 4.4 / CVPR § 4.1: "the model parameter averaging operation between
    # collaborative updating and local updating"): auto = before local updating on one shared architecture
    homogeneous_averaging: Literal["auto", "none", "before_local", "after_local"] = "auto"
    averaging_weights: Literal["uniform", "samples"] = "uniform"  # authors' aggregate_nets(None): uniform

    def __post_init__(self):
        if self.public_subset < 2 or self.distill_epochs < 0 or self.tau <= 0:
            raise ValueError("public_subset must be >= 2, distill_epochs >= 0 and tau > 0")


@METHODS.register("rcfl")
class RCFL(ParameterAveraging, Method):
    """RCFL: class-wise aggregated public class scores, distilled back into every participant."""

    name = "rcfl"
    Params = RCFLParams
    uses_public = True

    def setup(self, ctx) -> None:
        self.resolve_averaging(ctx)
        self._device = ctx.device
        self.index: Optional[torch.Tensor] = None  # public indices scored last round (CPU, int64)
        self.scores: Optional[torch.Tensor] = None  # (n, C) aggregated scores on them
        self.class_mask = torch.stack([torch.bincount(c.data.get("private")[1], minlength=ctx.num_classes) > 0
                                       for c in ctx.participants])

    def collaborate(self, ctx) -> Dict[str, float]:
        if self.scores is None or self.index is None or self.p.distill_epochs == 0:  # both None before round 1's scores
            return {}
        pub = ctx.public
        x_all = pub[self.index.to(pub.device)]
        target = self.scores.to(ctx.device)
        tau = self.p.tau
        return {f"{c.name}/train/distill_loss": digest(ctx, c, x_all, target, lambda z, t: soft_target_loss(z, t, tau),
                                                       self.p.distill_epochs, "distill_loss")
                for c in ctx.participants}

    @torch.no_grad()
    def after_round(self, ctx) -> None:
        pub = ctx.public
        idx = torch.randperm(len(pub), generator=ctx.public_gen)[: self.p.public_subset]
        x_all = pub[idx.to(pub.device)]
        b = ctx.eval_batch
        scores = []
        for c in ctx.participants:
            was = c.model.training
            c.model.eval()
            z = torch.cat([c.model(normalize(x_all[s:s + b])) for s in range(0, len(x_all), b)])
            c.model.train(was)
            scores.append(F.softmax(z.float() / self.p.tau, dim=1))
        self.index = idx
        self.scores = classwise_aggregate(torch.stack(scores), self.class_mask.to(ctx.device)).cpu()

    def state_dict(self) -> Dict[str, Any]:
        if self.scores is None or self.index is None:
            return {}
        return {"index": self.index.clone(), "scores": self.scores.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            self.index = self.scores = None
            return
        if set(state) != {"index", "scores"}:
            raise ValueError(f"rcfl state must hold 'index' and 'scores', got {sorted(state)}")
        self.index, self.scores = state["index"].long().cpu(), state["scores"].float().cpu()
