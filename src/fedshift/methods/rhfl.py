"""RHFL (Fang & Ye, "Robust Federated Learning with Noisy and Heterogeneous Clients",
CVPR 2022), a model-heterogeneous counterpart of FCCL+ Tables VIII-IX.

Each round (the RHFL code's order):

1. Client confidence re-weighting (CCR): every participant's mean symmetric-CE loss
   on its private data is measured; with last round's value it gives a quality
   ``(L_prev - L_now) / L_now`` and the confidence weights
   :func:`fedshift.losses.rhfl_confidence_weights` (beta = 0.5, the RHFL code);
   uniform ``1/(K-1)`` in the first round.
2. Collaborative step on the unlabeled public set: on every batch each participant
   minimises ``sum_{j != i} w_j KL(p_j || p_i)`` toward the others' detached
   predictions (:func:`fedshift.losses.weighted_kl_alignment`), one Adam step per
   batch with a fresh Adam (the RHFL code), all predictions taken before any update.
3. Local updating with the symmetric cross-entropy ``alpha CE + beta RCE``
   (:func:`fedshift.losses.symmetric_ce_loss`, alpha 0.1, beta 1.0: FCCL+ Table VII
   and the RHFL code), robust to label noise.

Kept: all three parts and their constants. Differs: the confidence losses are
measured with the models in eval mode without gradient (the RHFL code leaves them in
train mode, which also moves BatchNorm's running statistics on the private data);
the number of local epochs is the engine's (the benchmark's) instead of RHFL's
``|public| / |private|``; a quality sum of exactly 0 falls back to uniform weights
(the RHFL code would divide by 0). FCCL+ uses no label noise, so RHFL's robustness
is not exercised here. Homogeneous mode: parameters averaged before local updating
(FCCL+ § 4.4), see :mod:`fedshift.methods.homogeneous`.

State across rounds: last round's per-participant confidence losses (and the public
optimisers' moments when ``fresh_optimizer`` is false).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping, Optional

import torch

from ..data.loading import normalize
from ..losses import rhfl_confidence_weights, symmetric_ce_loss, weighted_kl_alignment
from .base import METHODS
from .common import PublicOptimizerState
from .homogeneous import AveragingMethod


@dataclass(frozen=True)
class RHFLParams:
    init: Literal["scratch", "base"] = "scratch"  # authors' baselines start from scratch (RHFL: pretrained)
    alpha: float = 0.1  # CE weight of the symmetric CE (FCCL+ Table VII, RHFL code)
    beta: float = 1.0  # reverse-CE weight of the symmetric CE (FCCL+ Table VII, RHFL code)
    sce_clip: float = 1e-4  # one-hot clamp in the reverse CE, log(1e-4) = A (RHFL / SCE code)
    ccr: bool = True  # client confidence re-weighting; false = uniform 1/(K-1) weights
    ccr_beta: float = 0.5  # CCR's mixing weight (RHFL code: Client_Confidence_Reweight beta 0.5)
    fresh_optimizer: bool = True  # RHFL code: a new Adam for every public batch
    homogeneous_averaging: Literal["auto", "none", "before_local", "after_local"] = "auto"  # auto: before local
    averaging_weights: Literal["uniform", "samples"] = "uniform"  # FCCL+ code averages uniformly

    def __post_init__(self):
        if min(self.alpha, self.beta, self.ccr_beta) < 0 or not 0 < self.sce_clip < 1:
            raise ValueError("alpha, beta and ccr_beta must be >= 0 and sce_clip in (0, 1)")


@METHODS.register("rhfl")
class RHFL(PublicOptimizerState, AveragingMethod):
    """RHFL: confidence-weighted KL alignment on public data, symmetric cross-entropy locally."""

    name = "rhfl"
    Params = RHFLParams
    uses_public = True
    paper_averaging = "before_local"  # FCCL+ § 4.4: average between collaborative and local updating

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self._ctx = ctx
        self.prev_losses: Optional[List[float]] = None
        self.weights: Optional[torch.Tensor] = None

    @torch.no_grad()
    def private_losses(self, ctx) -> List[float]:
        """Every participant's mean symmetric-CE loss over its private data (eval mode)."""
        out = []
        for c in ctx.participants:
            x, y = c.data.get("private")
            was = c.model.training
            c.model.eval()
            b = ctx.eval_batch
            total = sum(float(symmetric_ce_loss(c.model(normalize(x[s:s + b])), y[s:s + b], self.p.alpha,
                                                self.p.beta, self.p.sce_clip)) * len(y[s:s + b])
                        for s in range(0, len(y), b))
            c.model.train(was)
            out.append(total / max(len(y), 1))
        return out

    def collaborate(self, ctx) -> Dict[str, float]:
        k = len(ctx.participants)
        metrics: Dict[str, float] = {}
        if self.p.ccr:
            losses = self.private_losses(ctx)
            w = rhfl_confidence_weights(self.prev_losses, losses, self.p.ccr_beta)
            self.prev_losses = losses
        else:
            w = torch.full((k,), 1.0 / max(k - 1, 1), dtype=torch.float64)
        self.weights = w
        metrics.update({f"{c.name}/train/confidence": float(w[i]) for i, c in enumerate(ctx.participants)})
        wl = w.tolist()

        def batch_losses(xb):
            zs = [c.model(xb) for c in ctx.participants]
            return [weighted_kl_alignment(z, [zs[j] for j in range(k) if j != i], [wl[j] for j in range(k) if j != i])
                    for i, z in enumerate(zs)]

        metrics.update(self.public_step(ctx, batch_losses, "colla_loss"))
        return metrics

    def local_loss(self, ctx, client, x, y, step):
        return symmetric_ce_loss(client.model(x), y, self.p.alpha, self.p.beta, self.p.sce_clip)

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {}
        if self.prev_losses is not None:
            state["prev_losses"] = [float(v) for v in self.prev_losses]
        opts = self.optimizer_state()
        if opts:
            state["public_opts"] = opts
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = sorted(set(state) - {"prev_losses", "public_opts"})
        if unknown:
            raise ValueError(f"rhfl state has unknown keys {unknown}")
        prev = state.get("prev_losses")
        self.prev_losses = [float(v) for v in prev] if prev is not None else None
        self.load_optimizer_state(self._ctx, state.get("public_opts", {}))
