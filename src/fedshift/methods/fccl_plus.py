"""FCCL+ (Huang, Ye, Shi & Du, "Generalizable Heterogeneous Federated Cross-Correlation and
Instance Similarity Learning", TPAMI; ``papers/fccl-plus-tpami.txt``): FCCM + FISL in
collaborative updating, CE + FNTD locally.

Collaborative updating (Alg. 1, Eq. 6), on every unlabeled public batch: each
participant's logits Z_i and features H_i are computed; the targets are the mean
logits Z̄ and the mean instance-similarity distribution S̄ over participants
(detached; the FCCL+ code includes the participant itself); each participant then
minimises L_FCCM(Z_i, Z̄; lam) + omega * L_FISL(S_i, S̄) (Eq. 2, 5) with one Adam step.

Local updating (Eq. 14): CE + FNTD (Eq. 13, times tau²) with the participant's model
as it was at the end of the previous round's local updating as teacher.

Everything else is inherited from FCCL (:mod:`fedshift.methods.fccl`): the one-pass
collaborative loop, the teacher snapshots, the optimiser handling, homogeneous
averaging and the cross-correlation figure. Every ablation of the paper and every
difference of the authors' code is a key of :class:`FCCLPlusParams`:

=====================  ===============  ===================================================================
key                    default          reproduces
=====================  ===============  ===================================================================
fccm, fisl, fntd       true             Table X (without FNTD the local loss is CVPR Eq. 19, as § 4.3 says:
                                        CE + KL(theta^{e-1}) + KL(theta^*), temperature 1; theta^* is
                                        the participant's BASE checkpoint, as in FCCL, whatever ``init``)
local_distill          fntd             Fig. 10 (``kd``: CE + tau² KD, Eq. 10), Table XVI (``ewc``),
                                        Table XIX "w/o FNTD" (``none``: CE only), ``dual`` = Eq. 19
tau                    3                Fig. 10 (temperature of FNTD and KD)
teacher                previous         Fig. 9 (``collaborated``: theta^e, after the collaborative step)
ewc_lambda             1.0              Table XVI (0.01, 0.1, 0.7, 1.0)
kd_ratio               0                Table XVII (KD for the first r of the local epochs, then FNTD)
lam, omega, mu         0.0051, 3, 0.02  Table XI, Table XIV, § 4.1
target                 all              FCCL+ code (``others_prev``: FCCL CVPR code; ``others``)
fresh_optimizer        true             authors' code: a new Adam per public batch
fntd_renormalize       false            paper and code; true = DKD-style softmax over non-targets
teacher_bn             eval             ``train``: the FCCL+ code runs its teacher in train mode
homogeneous_averaging  auto             Table XV: average before local updating when homogeneous
corr_every             sparse           Fig. 8: cross-correlation matrices at 5 rounds (k: every k rounds)
=====================  ===============  ===================================================================

Table XIII (weak vs strong public augmentation) is ``engine.public_aug``, Table XIX's
local epochs ``engine.local_epochs``; the learning-rate decay of the authors' code is
``engine.lr_decay``. ``init`` is ``scratch``: FCCL+ § 1 says FNTD "avoids the
requirement of a well-pretrained model" and the published FCCL+ code does not load
the BASE models for FCCL+ (it does for FCCL); ``init: base`` starts from the BASE
checkpoints instead (variant ``fcclp_base`` in params/ablations/code_variants.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Literal, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.loading import normalize
from ..losses import (diagonal_fisher, ewc_penalty, fccl_dual_distillation_loss, fccm_loss, fisl_loss, fntd_loss,
                      instance_similarity, kd_loss)
from .base import METHODS
from .fccl import FCCL, collaborative_targets
from .fccl_figures import check_corr

LOCAL_DISTILL = ("fntd", "kd", "dual", "ewc", "none")


@dataclass(frozen=True)
class FCCLPlusParams:
    init: Literal["scratch", "base"] = "scratch"  # FCCL+ code: random start (FNTD needs no pretrained teacher); FCCL uses "base"
    lam: float = 0.0051  # FCCM off-diagonal weight lambda (Table VII; Table XI studies it)
    mu: float = 0.02  # FISL similarity temperature (text and code: 0.02; Table VII misprints 0.002)
    omega: float = 3.0  # FISL weight in Eq. 6 (Table XIV; 1 on Office-Home)
    tau: float = 3.0  # FNTD / KD temperature (Fig. 10; 1 on Office-Caltech and Office-Home)
    fccm: bool = True  # Table X ablation: cross-correlation on logits
    fisl: bool = True  # Table X ablation: instance-similarity on features
    fntd: bool = True  # Table X ablation: false = local objective of CVPR Eq. 19 (local_distill "dual")
    local_distill: Literal["fntd", "kd", "dual", "ewc", "none"] = "fntd"  # Eq. 14; Fig. 10 / Tab. XVI / Tab. XIX
    kd_ratio: float = 0.0  # Table XVII: fraction of the local epochs (the first ones) that use KD instead of FNTD
    ewc_lambda: float = 1.0  # Table XVI: EWC weight (the paper tries 0.01, 0.1, 0.7, 1.0)
    fntd_renormalize: bool = False  # paper and code: no renormalisation over the non-target classes
    teacher: Literal["previous", "collaborated"] = "previous"  # Fig. 9: theta^{e-1} (paper) or theta^e
    teacher_bn: Literal["eval", "train"] = "eval"  # teacher's BatchNorm; the FCCL+ code leaves it in train mode
    target: Literal["all", "others", "others_prev"] = "all"  # FCCL+ code: mean of all incl. self (FCCM and FISL)
    fresh_optimizer: bool = True  # authors' code: a new Adam for every public batch (state reset each step)
    homogeneous_averaging: Literal["auto", "none", "before_local", "after_local"] = "auto"  # auto: before local (XV)
    averaging_weights: Literal["uniform", "samples"] = "uniform"  # authors' code averages uniformly
    corr_every: Union[int, Literal["sparse"]] = "sparse"  # Fig. 8 matrices: "sparse" = the figure's 5 rounds; k = every k rounds and the last; 0 = off
    corr_samples: int = 256  # public (and at most as many private) samples per matrix; the authors draw theirs from one public batch of 256

    def __post_init__(self):
        if not self.fntd and self.local_distill != "fntd":
            raise ValueError(f"fntd: false is Table X's shorthand for local_distill: dual (CVPR Eq. 19); "
                             f"do not combine it with local_distill: {self.local_distill}")
        if not 0.0 <= self.kd_ratio <= 1.0:
            raise ValueError(f"kd_ratio must lie in [0, 1], got {self.kd_ratio}")
        if self.kd_ratio > 0 and self.distill != "fntd":
            raise ValueError("kd_ratio mixes KD into FNTD (Table XVII): it needs local_distill: fntd and fntd: true")
        if self.tau <= 0 or self.mu <= 0:
            raise ValueError("tau and mu must be > 0")
        if min(self.lam, self.omega, self.ewc_lambda) < 0:
            raise ValueError("lam, omega and ewc_lambda must be >= 0")
        check_corr(self.corr_every, self.corr_samples)

    @property
    def distill(self) -> str:
        """The local distillation in effect (``fntd: false`` means Eq. 19's ``dual``)."""
        return self.local_distill if self.fntd else "dual"


@METHODS.register("fccl_plus")
class FCCLPlus(FCCL):
    """FCCL+: FCCM + omega*FISL on public data, CE + FNTD(previous-round teacher) locally."""

    name = "fccl_plus"
    Params = FCCLPlusParams
    uses_public = True
    paper_averaging = "before_local"  # § 4.4 / authors' code: average between colla. and local updating
    scenario_defaults = {
        "office_home": {"omega": 1.0, "tau": 1.0},
        "office_caltech": {"tau": 1.0},
    }

    def needs_pretrained(self) -> bool:
        return self.p.distill == "dual"

    @classmethod
    def needs_base(cls, params) -> bool:
        # Eq. 19's theta^* is the pretrained SOLO model (FCCL's own behaviour), even when the
        # participants themselves start from scratch.
        return params.init == "base" or params.distill == "dual"

    def init_state(self, ctx) -> None:
        if self.p.distill == "ewc":
            self._update_ewc(ctx)

    # ---------------------------------------------------------- collaboration
    def collaborates(self) -> bool:
        return self.p.fccm or self.p.fisl

    def colla_losses(self, outs: List[Tuple[Tensor, Tensor]],
                     prev: Optional[List[Tuple[Tensor, Tensor]]]) -> List[Tensor]:
        p = self.p
        terms: List[List[Tensor]] = [[] for _ in outs]
        if p.fccm:
            with torch.no_grad():
                zt = collaborative_targets([z.detach() for _, z in outs], p.target,
                                           [z for _, z in prev] if prev else None)
            for i, (_, z) in enumerate(outs):
                terms[i].append(fccm_loss(z, zt[i], p.lam))
        if p.fisl:
            sims = [instance_similarity(h, p.mu) for h, _ in outs]
            with torch.no_grad():
                st = collaborative_targets([s.detach() for s in sims], p.target,
                                           [instance_similarity(h, p.mu) for h, _ in prev] if prev else None)
            for i, s in enumerate(sims):
                terms[i].append(p.omega * fisl_loss(s, st[i]))
        return [sum(t[1:], t[0]) for t in terms]

    # ---------------------------------------------------------- local updating
    def epoch_modes(self, epochs: int) -> List[str]:
        mode = self.p.distill
        n_kd = int(self.p.kd_ratio * epochs + 0.5) if mode == "fntd" else 0  # round half up
        return ["kd"] * n_kd + [mode] * (epochs - n_kd)

    def end_local(self, ctx) -> None:
        super().end_local(ctx)
        if self.p.distill == "ewc":
            self._update_ewc(ctx)

    def _update_ewc(self, ctx) -> None:
        """EWC anchor = theta^{e-1} (the model now), Fisher on the private data at the round's end."""
        for c in ctx.participants:
            x, y = c.data.get("private")
            b = ctx.local_batch
            batches = [(normalize(x[s:s + b]), y[s:s + b]) for s in range(0, len(y), b) if len(y[s:s + b]) > 1]
            fisher = diagonal_fisher(c.model, batches, F.cross_entropy)
            names = [n for n, q in c.model.named_parameters() if q.requires_grad]
            anchor = dict(c.state["prev"].named_parameters())
            c.state["ewc"] = ([anchor[n] for n in names], [fisher[n] for n in names])

    def local_loss(self, ctx, client, x, y, step):
        model = client.model
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        mode = self._mode
        if mode == "none":
            return loss
        if mode == "ewc":
            anchor, fisher = client.state["ewc"]
            params = [q for q in model.parameters() if q.requires_grad]
            return loss + ewc_penalty(params, anchor, fisher, self.p.ewc_lambda)
        with torch.no_grad():
            t_logits = client.state["teacher"](x)
        if mode == "fntd":
            return loss + fntd_loss(logits, t_logits, y, self.p.tau, self.p.fntd_renormalize)
        if mode == "kd":
            return loss + kd_loss(logits, t_logits, self.p.tau)
        # "dual": CVPR Eq. 19 (the Table X rows without FNTD): temperature 1, no T², weight 1
        with torch.no_grad():
            pre = client.state["pretrained"](x)
        return loss + fccl_dual_distillation_loss(logits, t_logits, pre, 1.0)
