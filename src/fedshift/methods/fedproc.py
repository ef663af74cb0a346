"""FedProc (Mu, Shen, Cheng, Geng, Fu, Zhang & Zhang, "FedProc: Prototypical Contrastive
Federated Learning on Non-IID Data", arXiv 2109.12273, 2021; FGCS 2023), a counterpart
of FCCL+ Table XV (homogeneous).

FedAvg with global class prototypes. After local updating each participant computes
its class prototypes (mean feature per class on its private data); the server
averages them per class over the participants holding the class. In the next
round's local updating the loss is ``(1 - alpha) * CE + alpha * L_pc``, with ``L_pc``
the prototype-contrastive loss (:func:`fedshift.losses.prototype_contrastive_loss`):
softmax over the similarities of a sample's feature to every global prototype, its
own class's prototype as the positive.

Kept: prototypes from the backbone features, per-class server averaging, the
contrastive form and the weighting of FedProc's objective. ``alpha`` = 0.5 as FCCL+
Table VII prints; ``alpha_schedule: linear`` anneals it as FedProc's paper and the
public FedProc code (MarsFL) do, ``alpha = 1 - (r - 1)/(R - 1)`` (from 1 to 0). In
the first round there are no prototypes yet and the loss is CE alone (MarsFL).

Unstated in FCCL+ and chosen here (switches): the similarity (``cosine``, or the raw
``dot`` product), its temperature (``tau`` 1), and the server's prototype averaging
(``uniform`` over the participants holding the class, as MarsFL; ``samples``
weights by their class counts). Prototypes are computed after local updating with
the local model in eval mode over all private data (MarsFL collects them from the
train-mode features of the last local epoch). The local optimiser is Adam.

Scoring: the grid's, as for :mod:`fedshift.methods.fedavg` (each participant's own model in the
FCCL+ grids). The prototypes come from every participant's own model, so FedProc refuses
client sampling and ``engine.server_model`` at validation.

State across rounds: the global prototypes (C x d) and which classes have one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal, Mapping

import torch
import torch.nn.functional as F

from ..data.loading import normalize
from ..losses import class_prototypes, fedproc_alpha, prototype_contrastive_loss
from .base import METHODS, ServerParams
from .fedavg import FedAvg


@dataclass(frozen=True)
class FedProcParams(ServerParams):
    alpha: float = 0.5  # weight of L_pc in (1-alpha) CE + alpha L_pc (FCCL+ Table VII)
    alpha_schedule: Literal["constant", "linear"] = "constant"  # FCCL+: constant; FedProc / MarsFL: 1 - r/(R-1)
    tau: float = 1.0  # similarity temperature (unstated in FCCL+; FedProc: none)
    similarity: Literal["cosine", "dot"] = "cosine"  # sample-prototype similarity (unstated in FCCL+)
    proto_weighting: Literal["uniform", "samples"] = "uniform"  # server average per class (MarsFL: uniform)

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")


def aggregate_prototypes(protos, counts, weighting: str = "uniform"):
    """Server step: (K, C, d) participant prototypes + (K, C) counts -> (C, d) global, (C,) present.

    ``uniform``: mean over the participants holding the class; ``samples``: weighted
    by their counts of it.
    """
    has = (counts > 0).to(protos.dtype)
    w = has if weighting == "uniform" else counts.to(protos.dtype)
    total = w.sum(0)
    glob = (protos * w.unsqueeze(2)).sum(0) / total.clamp(min=1e-12).unsqueeze(1)
    return glob, total > 0


@METHODS.register("fedproc")
class FedProc(FedAvg):
    """FedProc: FedAvg + prototype-contrastive learning toward global class prototypes."""

    name = "fedproc"
    Params = FedProcParams
    # Under engine.server_model (one shared model) or client sampling this state would be the last-trained
    # client's, or the global model for the clients that sat out (issue 21 item 8): refused at validation.
    supports_sampling = False
    supports_server_model = False
    per_client_state = "builds every participant's class prototypes from its own model"

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.protos = None  # (C, d) global prototypes, None before the first aggregation
        self.present = None  # (C,) bool
        self._alpha = 0.0
        self._device = ctx.device

    def local_update(self, ctx) -> Dict[str, float]:
        self._alpha = fedproc_alpha(ctx.round, ctx.rounds, self.p.alpha, self.p.alpha_schedule)
        metrics = super().local_update(ctx)
        self._update_prototypes(ctx)  # with the local models, before FedAvg's averaging
        return metrics

    def local_loss(self, ctx, client, x, y, step):
        h, logits = client.model.forward_with_features(x)
        ce = F.cross_entropy(logits, y)
        if self.protos is None:
            return ce
        pc = prototype_contrastive_loss(h, y, self.protos, self.present, self.p.tau, self.p.similarity)
        return (1 - self._alpha) * ce + self._alpha * pc

    @torch.no_grad()
    def _update_prototypes(self, ctx) -> None:
        protos, counts = [], []
        for c in ctx.participants:
            x, y = c.data.get("private")
            was = c.model.training
            c.model.eval()
            b = ctx.eval_batch
            feats = torch.cat([c.model.features(normalize(x[s:s + b])) for s in range(0, len(y), b)])
            c.model.train(was)
            p, n = class_prototypes(feats.float(), y, ctx.num_classes)
            protos.append(p)
            counts.append(n)
        self.protos, self.present = aggregate_prototypes(torch.stack(protos), torch.stack(counts),
                                                         self.p.proto_weighting)

    def state_dict(self) -> Dict[str, Any]:
        if self.protos is None:
            return {}
        return {"protos": self.protos.detach().cpu().clone(), "present": self.present.cpu().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            self.protos = self.present = None
            return
        unknown = sorted(set(state) - {"protos", "present"})
        if unknown:
            raise ValueError(f"fedproc state has unknown keys {unknown}")
        dev = self._device
        self.protos, self.present = state["protos"].to(dev), state["present"].to(dev, torch.bool)
