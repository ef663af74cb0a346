"""FedTGP (Zhang, Hua, Wang, Guan, Cao & Yang, "FedTGP: Trainable Global Prototypes with
Adaptive-Margin-Enhanced Contrastive Learning for Data and Model Heterogeneity in
Federated Learning", AAAI 2024).

FedProto's client side (:mod:`fedshift.methods.fedproto`: ``CE + lamda * MSE`` toward the
global prototypes, heterogeneous models, no public data) with a trained server: the
global prototypes are the output of a small server model (Trainable Global Prototypes,
:class:`~fedshift.methods.prototypes.TrainableGlobalPrototypes`: a class embedding through
Linear-ReLU-Linear) trained each round on the uploaded client prototypes with the
adaptive-margin contrastive loss
(:func:`~fedshift.methods.prototypes.tgp_contrastive_loss`): cross-entropy over negative
L2 distances to every global prototype, the true class's distance enlarged by the margin
``min(max_c gap_c, margin_threshold)``, ``gap_c`` the distance from class c's averaged
client prototype to the nearest other class's (:func:`~fedshift.methods.prototypes.class_gaps`).

Official code read (file:line at TsingZ0/FedTGP c77cbbb3, 2024-12-27; identical files in
TsingZ0/HtFLlib e959261d ``system/flcore/{clients/clienttgp.py,servers/servertgp.py}``):

* client loss: ``CE + lamda * MSELoss(proto_new, rep)`` as FedProto (``clienttgp.py:42-54``);
* local prototypes: after training, eval mode, over the private data (``clienttgp.py:60, 67-88``)
  = ``local_protos: eval``;
* ``lamda = 10``, ``server_epochs = 100``, ``margin_threshold = 100``, client lr 0.01 and batch 10:
  the command the authors ship (``system/run_me.sh:1``: ``-lam 10 -se 100 -mart 100 -lr 0.01 -lbs 10``;
  the argparse defaults are 1, 1000, 100, 0.005, 10: ``system/main.py:199-201, 164, 163``);
* server optimiser: plain SGD at the *client* learning rate (``servertgp.py:28, 122``) over the
  uploaded (prototype, class) pairs in shuffled batches of the *client* batch size
  (``servertgp.py:29, 124-127``), ``server_epochs`` passes per round, one fresh optimiser per round;
  here ``server_lr: 0.01`` and ``server_batch: 10`` (those values of run_me.sh:1, stated apart because
  fedshift's engine lr/batch are the local optimiser's, Adam by default);
* server model width: hidden = feature_dim (``servertgp.py:33-34``) = ``hidden_dim: 0``;
* margin: classes' gaps from the uniform per-class mean of the uploads (``servertgp.py:102-115,
  158-168``), ``margin = min(max_gap, margin_threshold)`` (``:139``);
* global prototypes: the TGP's output for every class after training (``servertgp.py:151-155``),
  so every class has one once the server has trained (see below for a class nobody holds); none
  before the first upload (no regulariser in round 1, ``clienttgp.py:46``).
* client sampling: the selected clients train and upload (``servertgp.py:56-72``).

* scoring: the nearest global prototype by MSE (``clienttgp.py:90-120``, as FedProto's client)
  = ``scoring: prototype``; ``head`` scores each participant's classifier instead.

Differs (and why): as FedProto (:mod:`fedshift.methods.fedproto`: representation pooled to
``proto_dim`` beside the model's own classifier, the classifier's scores before any global
prototype exists, the engine's local optimiser). The distance's square root is taken of the
expanded form clamped at 0 (the official code takes it unclamped: a rounding error below
zero there gives NaN). The TGP's initialisation and the server's shuffling draw from their
own seeded stream (a child of the run's seed), so runs and resumes repeat exactly. A class no
participant has uploaded yet keeps its TGP prototype (trained only as the other classes' negative, as
the official code trains it) but is left out of nearest-prototype scoring, with a warning naming it
(the official code scores it: a class nobody holds can only be a wrong answer, issue 51 R31);
``present`` = the classes some participant has uploaded in any round so far.

State across rounds: the TGP's weights, its random stream, the global prototypes
(:meth:`FedTGP.state_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal, Mapping

import torch

from ..engine.federation import derive_seeds
from .base import METHODS
from .fedproto import FedProto
from .prototypes import TrainableGlobalPrototypes, adaptive_margin, mean_prototypes, tgp_contrastive_loss


@dataclass(frozen=True)
class FedTGPParams:
    init: Literal["scratch", "base"] = "scratch"  # FedTGP trains every client from scratch
    lamda: float = 10.0  # weight of the prototype regulariser (FedTGP system/run_me.sh:1, -lam 10)
    proto_dim: int = 0  # prototype width; 0 = the narrowest participant's feature_dim (FedTGP: -fd 512)
    local_protos: Literal["training", "eval"] = "eval"  # after training, eval mode (clienttgp.py:60, 67-88)
    server_epochs: int = 100  # TGP passes over the uploads per round (run_me.sh:1, -se 100)
    margin_threshold: float = 100.0  # cap of the adaptive margin (run_me.sh:1, -mart 100)
    server_lr: float = 0.01  # TGP's SGD lr = the clients' lr in the official code (servertgp.py:28; run_me.sh:1 -lr 0.01)
    server_batch: int = 10  # TGP batch = the clients' batch in the official code (servertgp.py:29; run_me.sh:1 -lbs 10)
    hidden_dim: int = 0  # TGP hidden width; 0 = proto_dim (servertgp.py:33-34)
    # prototype: evaluation scores the nearest global prototype by MSE (clienttgp.py:90-120); head: the classifier
    scoring: Literal["prototype", "head"] = "prototype"

    def __post_init__(self):
        bad = {k: v for k, v in (("lamda", self.lamda), ("proto_dim", self.proto_dim), ("hidden_dim", self.hidden_dim),
                                 ("margin_threshold", self.margin_threshold)) if v < 0}
        bad.update({k: v for k, v in (("server_epochs", self.server_epochs), ("server_batch", self.server_batch))
                    if v < 1})
        if self.server_lr <= 0:
            bad["server_lr"] = self.server_lr
        if bad:
            raise ValueError(f"invalid values {bad}: lamda, proto_dim, hidden_dim, margin_threshold must be >= 0, "
                             "server_epochs and server_batch >= 1, server_lr > 0")


@METHODS.register("fedtgp")
class FedTGP(FedProto):
    """FedTGP: FedProto's clients; the server trains global prototypes with an adaptive-margin contrastive loss."""

    name = "fedtgp"
    Params = FedTGPParams
    absent_effect = ("the server model still makes it a prototype, trained only as the other classes' negative; "
                     "nearest-prototype scoring leaves it out until a participant uploads it")

    def setup(self, fed) -> None:
        super().setup(fed)
        # The TGP's own stream: a child of the run's seed the federation does not use (it takes
        # children 0..K+2: clients, public, augmentation, sampling).
        self._gen = torch.Generator().manual_seed(derive_seeds(fed.seed, len(fed.clients) + 4)[-1])
        self.tgp = TrainableGlobalPrototypes(fed.num_classes, self.dim, self.p.hidden_dim or self.dim,
                                             self._gen).to(fed.device)
        self.margin = float("nan")
        self.server_loss = float("nan")

    def aggregate(self, fed, r: int, uploads) -> None:
        protos = torch.stack([p for p, _ in uploads])  # (K, C, d)
        has = torch.stack([n > 0 for _, n in uploads])  # (K, C)
        avg, present = mean_prototypes(protos, has)
        self.margin = adaptive_margin(avg, present, self.p.margin_threshold)
        # The uploaded (prototype, class) pairs, client by client as servertgp.py:95-99 lists them.
        k_idx, c_idx = torch.nonzero(has, as_tuple=True)
        data, labels = protos[k_idx, c_idx].to(self.tgp.fc.weight.dtype), c_idx.to(fed.device)
        opt = torch.optim.SGD(self.tgp.parameters(), lr=self.p.server_lr)
        self.tgp.train()
        loss = torch.zeros(())
        for _ in range(self.p.server_epochs):
            order = torch.randperm(len(labels), generator=self._gen).to(labels.device)
            for s in range(0, len(labels), self.p.server_batch):
                sel = order[s:s + self.p.server_batch]
                loss = tgp_contrastive_loss(data[sel], labels[sel], self.tgp(), self.margin)
                opt.zero_grad()
                loss.backward()
                opt.step()
        self.server_loss = float(loss.detach())
        fed.check_total(self.server_loss, "server", "tgp_loss")
        self.tgp.eval()
        with torch.no_grad():
            self.protos = self.tgp().detach().clone()
        # the TGP makes a prototype for every class (servertgp.py:153-156); one no participant has ever uploaded
        # was trained only as a negative and is left out of scoring (issue 51 R31; a class nobody holds can only
        # be a wrong answer)
        seen = has.any(0)
        self.present = seen if self.present is None else seen | self.present.to(seen.device)

    def local_update(self, fed, r: int) -> Dict[str, float]:
        metrics = super().local_update(fed, r)
        metrics["server/train/tgp_loss"] = self.server_loss
        metrics["server/train/margin"] = self.margin
        return metrics

    def state_dict(self) -> Dict[str, Any]:
        state = super().state_dict()
        state["tgp"] = {k: v.detach().cpu().clone() for k, v in self.tgp.state_dict().items()}
        state["generator"] = self._gen.get_state()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        state = dict(state)
        tgp, gen = state.pop("tgp", None), state.pop("generator", None)
        if tgp is None or gen is None:
            raise ValueError(f"fedtgp state lacks {'tgp' if tgp is None else 'generator'}; it has {sorted(state)}")
        super().load_state_dict(state)
        self.tgp.load_state_dict(tgp)
        self._gen.set_state(gen)
