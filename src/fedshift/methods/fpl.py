"""FPL (Huang, Ye, Shi, Li & Du, "Rethinking Federated Learning with Domain Shift: A
Prototype View", CVPR 2023): Federated Prototypes Learning.

FedAvg (homogeneous) whose local objective adds two prototype terms
(:func:`~fedshift.methods.prototypes.fpl_prototype_loss`): a contrast of each sample's
features with *cluster prototypes* (its class's as positives, every other class's as
negatives, cosine similarity at temperature ``tau``) and an MSE pull toward its class's
*unbiased prototype*. After local updating each participant uploads its class prototypes;
the server clusters each class's uploads with FINCH (:func:`~fedshift.methods.prototypes.finch_partition`),
the cluster means being the cluster prototypes and their mean the unbiased prototype
(:func:`~fedshift.methods.prototypes.fpl_server_prototypes`). No public data.

Official code read (file:line at WenkeHuang/RethinkFL 74201b37, 2024-12-29):

* loss ``CE + sum_{samples with prototypes} (InfoNCE + MSE) / batch size`` (``models/fpl.py:160-184``,
  ``hierarchical_info_loss`` ``:90-104``, ``calculate_infonce`` ``:106-121``); no prototype term
  before the first aggregation (``:165-166``);
* ``tau = 0.02`` (``main.py:55``, ``--infoNCET``);
* local prototypes: mean train-mode features of the last local epoch (``fpl.py:189-197``);
* server: FINCH, cosine distance, last partition (``fpl.py:52-88``; ``utils/finch.py``), unbiased =
  mean of the cluster prototypes (``fpl.py:140-150``);
* parameter averaging after local updating, weighted by the participants' sample counts
  (``fpl.py:131``, ``models/utils/federated_model.py:81-114``, ``main.py:53`` ``--averaing weight``),
  and the global model scored (``utils/training.py:12-14``) = the grid's scoring
  ``{weighting: samples}`` with the global models scored; the local protocol gives the FCCL+
  benchmark's (:mod:`fedshift.methods.fedavg`);
* online clients (``fpl.py:124-126``, ``--online_ratio``): client sampling is honoured (the global
  protocol); prototypes come from the round's clients only (``proto_aggregation`` reads
  ``self.online_clients``, ``:54``);
* the engine settings of the authors' runs (not method parameters): SGD lr 0.01, momentum 0.9,
  weight decay 1e-5 (``fpl.py:136``, ``utils/best_args.py`` ``local_lr``), batch 64
  (``best_args.py``), 10 local epochs and 100 rounds (``main.py:36-37``).

Differs (and why): FINCH's neighbour graph is computed in the prototypes' dtype (the FINCH
code casts to float32, ``finch.py:142``) and the contrast uses ``logsumexp`` (the official
code exponentiates; equal in exact arithmetic, no overflow). A batch in which no sample's
class has prototypes adds 0 (the official code would fail on ``None / i``). Under
``engine.on_nonfinite: skip_batch`` a skipped step shifts which batches count as the last
epoch's. The FPL paper writes the same three terms with unit weights; no difference found
between paper and code in what is implemented here.

Fused clients are refused by name (``local_loss`` overridden: the fused objective would train
another loss). State across rounds: the cluster prototypes, their classes, the unbiased
prototypes and which classes have any (:meth:`FPL.state_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Optional

import torch
import torch.nn.functional as F

from .base import METHODS, ServerParams
from .common import holding_data
from .fedavg import FedAvg
from .prototypes import AbsentClasses, class_sums, fpl_prototype_loss, fpl_server_prototypes


@dataclass(frozen=True)
class FPLParams(ServerParams):
    # init scratch (the authors' runs); the authors' scoring (grid's scoring:): weighting samples (RethinkFL
    # main.py:53 --averaing weight), the global model scored (RethinkFL utils/training.py:12-14)
    tau: float = 0.02  # temperature of the cluster-prototype contrast (RethinkFL main.py:55, --infoNCET)

    def __post_init__(self):
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")


@METHODS.register("fpl")
class FPL(FedAvg):
    """FPL: FedAvg + cluster-prototype contrast + unbiased-prototype consistency (FINCH-clustered prototypes)."""

    name = "fpl"
    Params: ClassVar[type] = FPLParams  # ClassVar[type]: FPL+HEAL names its own
    # the server's prototypes (fpl_server_prototypes); None before the first round's upload
    clusters: Optional[torch.Tensor]
    owner: Optional[torch.Tensor]
    unbiased: Optional[torch.Tensor]
    present: Optional[torch.Tensor]

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self._device = ctx.device
        self.clusters = self.owner = self.unbiased = self.present = None
        self._acc: Dict[str, tuple] = {}
        self._absent = AbsentClasses(self.name, "it has no cluster or unbiased prototype, so its samples add no "
                                                "prototype term (as RethinkFL's fpl.py: only uploaded classes have one)")

    def local_loss(self, ctx, client, x, y, step):
        h, logits = client.model.forward_with_features(x)
        loss = F.cross_entropy(logits, y)
        if (self.clusters is not None and self.owner is not None and self.unbiased is not None
                and self.present is not None):  # all four set by the server, or none
            loss = loss + fpl_prototype_loss(h, y, self.clusters, self.owner, self.unbiased, self.present, self.p.tau)
        if step // ctx.steps_per_epoch(client) == ctx.local_epochs - 1:  # the last local epoch
            s, n = class_sums(h.detach().to(torch.promote_types(h.dtype, torch.float32)), y, ctx.num_classes)
            acc = self._acc.get(client.name)
            self._acc[client.name] = (s, n) if acc is None else (acc[0] + s, acc[1] + n)
        return loss

    def local_update(self, ctx) -> Dict[str, float]:
        self._acc = {}
        metrics = super().local_update(ctx)
        # the round's clients only; one without images (or whose last epoch's steps were all skipped) uploads nothing
        sums = [self._acc[c.name] for c in holding_data(ctx.trained, self.name, ctx.round, "they upload no prototypes")
                if c.name in self._acc]
        self._acc = {}
        if not sums:  # nobody uploaded: the prototypes of the last round with uploads stay
            return metrics
        protos = torch.stack([s / n.clamp(min=1).unsqueeze(1) for s, n in sums])
        has = torch.stack([n > 0 for _, n in sums])
        self.clusters, self.owner, self.unbiased, self.present = fpl_server_prototypes(protos, has)
        self._absent(self.present, ctx.round)
        return metrics

    def state_dict(self) -> Dict[str, Any]:
        if self.clusters is None:
            return {}
        return {k: getattr(self, k).detach().cpu().clone() for k in ("clusters", "owner", "unbiased", "present")}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        keys = {"clusters", "owner", "unbiased", "present"}
        if state and set(state) != keys:
            raise ValueError(f"fpl state has keys {sorted(state)}; expected {sorted(keys)}")
        if not state:
            self.clusters = self.owner = self.unbiased = self.present = None
            return
        for k in keys:
            setattr(self, k, state[k].to(self._device))
        self.present = state["present"].to(self._device).to(torch.bool)
