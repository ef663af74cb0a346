"""FedMatch (Jeong, Yoon, Yang & Hwang, "Federated Semi-Supervised Learning with
Inter-Client Consistency & Disjoint Learning", ICLR 2021), in the model-heterogeneous
form of the FCCL+ benchmark (Tables VIII-IX), which keeps its inter-client
consistency and agreement-based pseudo-labels on the unlabeled public data.

Each round:

1. Helpers: every participant gets the ``helpers`` (FedMatch: 2) other participants
   whose predictions are most similar to its own (cosine similarity of the softmax
   outputs on the first ``probe`` public images, eval mode). FedMatch's server
   ranks clients the same way (model outputs on one fixed random input, a KD-tree).
2. Collaborative step on the public set: on every batch each participant keeps the
   samples it predicts with confidence >= 0.75, and minimises on them
   ``lambda_i * mean_h KL(p_h || p)`` (consistency with its helpers' detached
   predictions) ``+ lambda_a * CE(strong view, agreement pseudo-label)`` where the
   pseudo-label is the majority vote of its own and its helpers' arg-max classes
   (:func:`fedshift.losses.fedmatch_unlabeled_loss`); one optimiser step per batch,
   all predictions taken before any update.
3. Local updating: cross-entropy on the private (labeled) data.

Constants from the FedMatch code (config.py): 2 helpers, confidence 0.75,
lambda_i = lambda_a = 1e-2 (with Adam the common scale of the two barely matters;
their ratio does). The prediction is taken on the engine's public view
(``engine.public_aug``, weak by default) and the pseudo-label's CE on a strongly
augmented view of the same images (FedMatch: the un-augmented image and RandAugment).

Not kept: the disjoint decomposition of parameters into supervised sigma and
unsupervised psi (with its L1/L2 regularisers and sparse psi communication), which
needs one shared architecture; helpers are the other participants' current models
rather than last round's downloads refreshed every 10 rounds (``h_interval``);
FedMatch's labeled loss weight lambda_s = 10 lives in another phase here (local
updating) where Adam makes a constant factor irrelevant. Homogeneous mode:
parameters averaged before local updating (FCCL+ § 4.4).

State across rounds: none (helpers are re-selected from the current models every
round), apart from the public optimisers' moments when ``fresh_optimizer`` is false.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping

import torch
import torch.nn.functional as F

from ..data.augment import augment
from ..data.loading import normalize
from ..losses import fedmatch_unlabeled_loss
from .base import METHODS
from .common import PublicOptimizerState
from .homogeneous import AveragingMethod


@dataclass(frozen=True)
class FedMatchParams:
    init: Literal["scratch", "base"] = "scratch"  # authors' baselines start from scratch
    helpers: int = 2  # helpers per participant (FedMatch config.py: num_helpers 2); capped at K-1
    confidence: float = 0.75  # own-prediction confidence threshold (FedMatch config.py)
    lambda_i: float = 1e-2  # inter-client consistency weight (FedMatch config.py)
    lambda_a: float = 1e-2  # agreement pseudo-label weight (FedMatch config.py)
    strong_view: bool = True  # pseudo-label CE on a strong augmentation (FedMatch); false: the same view
    probe: int = 256  # public images that rank the helpers each round
    fresh_optimizer: bool = True  # a new optimiser per public batch (as the FCCL+ code's baselines)
    homogeneous_averaging: Literal["auto", "none", "before_local", "after_local"] = "auto"  # auto: before local
    averaging_weights: Literal["uniform", "samples"] = "uniform"  # FCCL+ code averages uniformly

    def __post_init__(self):
        if self.helpers < 0 or self.probe < 1:
            raise ValueError("helpers must be >= 0 and probe >= 1")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence must lie in [0, 1], got {self.confidence}")
        if min(self.lambda_i, self.lambda_a) < 0:
            raise ValueError("lambda_i and lambda_a must be >= 0")


def select_helpers(outputs: List[torch.Tensor], n: int) -> List[List[int]]:
    """For each participant, the ``n`` others with the most similar outputs (cosine of flattened
    (B, C) probabilities); ties by lower index."""
    flat = F.normalize(torch.stack([o.flatten().double() for o in outputs]), dim=1)
    sim = flat @ flat.t()
    k = len(outputs)
    out = []
    for i in range(k):
        others = sorted((j for j in range(k) if j != i), key=lambda j: (-float(sim[i, j]), j))
        out.append(others[: min(n, k - 1)])
    return out


@METHODS.register("fedmatch")
class FedMatch(PublicOptimizerState, AveragingMethod):
    """FedMatch: inter-client consistency + agreement pseudo-labels on public data, then CE."""

    name = "fedmatch"
    weight_copies = 2
    Params = FedMatchParams
    uses_public = True
    paper_averaging = "before_local"  # FCCL+ § 4.4: average between collaborative and local updating

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self._ctx = ctx
        self.helper_index: List[List[int]] = []

    @torch.no_grad()
    def rank_helpers(self, ctx) -> List[List[int]]:
        x = normalize(ctx.public[: self.p.probe])
        outs = []
        for c in ctx.participants:
            was = c.model.training
            c.model.eval()
            outs.append(F.softmax(c.model(x).float(), dim=1))
            c.model.train(was)
        return select_helpers(outs, self.p.helpers)

    def collaborate(self, ctx) -> Dict[str, float]:
        p = self.p
        clients = ctx.participants
        self.helper_index = helpers = self.rank_helpers(ctx)
        confident = torch.zeros(len(clients), device=ctx.device)  # share of public samples above the threshold
        batches = [0]

        def batch_losses(raw):
            batches[0] += 1
            xb = augment(raw, ctx.public_aug, ctx.aug_gen)
            xs = augment(raw, "strong", ctx.aug_gen) if p.strong_view else xb
            zs = [c.model(xb) for c in clients]
            z_strong = [c.model(xs) for c in clients] if p.strong_view else zs
            with torch.no_grad():
                confident.add_(torch.stack([(F.softmax(z, dim=1).max(1).values >= p.confidence).float().mean()
                                            for z in zs]))
            return [fedmatch_unlabeled_loss(zs[i], z_strong[i], [zs[h] for h in helpers[i]], p.confidence,
                                            p.lambda_i, p.lambda_a) for i in range(len(clients))]

        # The shared collaborative loop (non-finite checks included) on raw batches: both views augment here.
        metrics = self.public_step(ctx, batch_losses, "colla_loss", aug="none")
        shares = (confident / max(batches[0], 1)).tolist()
        metrics.update({f"{c.name}/train/confident": v for c, v in zip(clients, shares)})
        return metrics

    def state_dict(self) -> Dict[str, Any]:
        opts = self.optimizer_state()
        return {"public_opts": opts} if opts else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = sorted(set(state) - {"public_opts"})
        if unknown:
            raise ValueError(f"fedmatch state has unknown keys {unknown}")
        self.load_optimizer_state(self._ctx, state.get("public_opts", {}))
