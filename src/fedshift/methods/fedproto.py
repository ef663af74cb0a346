"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang & Zhang, "FedProto: Federated Prototype
Learning across Heterogeneous Clients", AAAI 2022).

The participants exchange class prototypes (mean representation per class), never
parameters, so their architectures may differ. Each round every (sampled) participant
trains on its private data with ``CE + lamda * R``, ``R`` pulling each sample's
representation toward the global prototype of its class
(:func:`~fedshift.methods.prototypes.proto_mse_loss`); it uploads its local prototypes;
the server averages them per class over the participants holding the class
(:func:`~fedshift.methods.prototypes.mean_prototypes`), and these global prototypes
regularise the next round. No public data.

Official code read (file:line at TsingZ0/HtFLlib e959261d, 2026-04-23; the FedProto
paper's own code, yuetan031/FedProto, is what HtFLlib's cites at
``clienttgp.py:52-53`` and ``clientproto.py:135``):

* the loss: ``CE + lamda * MSELoss(proto_new, rep)``, ``proto_new`` = ``rep`` with rows of
  classes that have a global prototype replaced by it (``system/flcore/clients/clientproto.py:43-53``);
  no regulariser while there are no global prototypes (the first round, ``:47``);
* ``lamda = 10``: the command HtFLlib gives for FedProto (``system/total.sh:2``, ``-lam 10``;
  the argparse default is 1, ``system/main.py:387``);
* local prototypes: the mean of the train-mode representations of every sample seen in
  every local epoch, collected during training (``clientproto.py:33, 55-57, 63``, ``agg_func``
  ``:136-150``) = ``local_protos: training``; ``eval`` collects them after training in eval
  mode over the private data, as HtFLlib's FedTGP client does (``clienttgp.py:60, 67-88``);
* server: uniform mean over the uploading clients holding the class (``serverproto.py:61-90``);
  a class no uploading client holds has no global prototype that round;
* client sampling: only the selected clients train and upload (``serverproto.py:29-44``,
  ``join_ratio``), so ``engine.clients_per_round`` / ``client_fraction`` are honoured;
  a client that sits out keeps its own model;
* representation: HtFLlib replaces each backbone's classifier by ``AdaptiveAvgPool1d(feature_dim)``
  and adds a new ``Linear(feature_dim, C)`` head (``system/flcore/trainmodel/models.py:26-50``,
  ``-fd 512`` in ``total.sh:2``).

Switches where the paper and the official codes part (defaults: the code):

* the regulariser, ``reg_form``. The FedProto paper writes it on prototypes,
  ``sum_j ||C_i^(j) - C^(j)||_2`` (local prototype of class j against the global one); both
  official codes compute the per-sample ``MSELoss(proto_new, rep)`` instead: the paper's own code
  (yuetan031/FedProto 97e42e27, ``lib/update.py:161-173``, ``loss = loss1 + loss2 * args.ld``) and
  HtFLlib's (``clientproto.py:47-53``). ``reg_form: code`` (default) is that MSE
  (:func:`~fedshift.methods.prototypes.proto_mse_loss`): the authors' code, the one
  their published numbers come from. ``reg_form: paper`` is the equation as printed, per batch
  (:func:`~fedshift.methods.prototypes.proto_paper_loss`: the batch's class means against the
  global prototypes, unsquared L2, summed over the batch's classes that have one); no published
  number was produced with it. Its scale differs (a sum of norms, not a mean of squares), so
  ``lamda`` does not carry over between the two.
* scoring, ``scoring``. HtFLlib's ``test_metrics`` scores the nearest global prototype by MSE
  (``clientproto.py:70-100``: ``argmin_j MSELoss(rep, g_j)``, classes without a global prototype
  never chosen) = ``scoring: prototype`` (default): a forward hook on each participant's ``head``
  (:class:`~fedshift.methods.prototypes.PrototypeScoring`) makes its eval-mode output
  ``-MSE(rep, g_j)`` over the classes, so the engine's evaluation (top-1, top-5, intra/inter) reads
  the nearest prototype with no change of its own. Before the first global prototypes (the round-0
  evaluation) the classifier scores (HtFLlib reports accuracy 0 there, ``:99-100``).
  ``scoring: head`` scores each participant's classifier: the other methods' protocol, and the
  "w/o protos" number the paper's code prints beside its "with protos" one
  (yuetan031/FedProto ``lib/update.py:470-488`` and ``:490-526``; the latter restricts the nearest
  prototype to the client's own classes and is not reproduced). ``fedshift evaluate`` on a
  published ``models.pt`` re-scores with the classifier: the global prototypes are not in that file.

Differs (and why):

* the representation: fedshift keeps each registered model's own classifier on its
  features ``h`` (the benchmark's architectures are fixed, docs/models); prototypes live
  in ``rep = AdaptiveAvgPool1d(proto_dim)(h)``, ``proto_dim: 0`` = the narrowest
  participant's ``feature_dim`` (identity when all are equal). With one architecture this is
  the official computation; across widths the classifier sees ``h``, not the pooled ``rep``.
* the local optimiser is the engine's (Adam by default; HtFLlib: SGD, ``clientproto.py:23``;
  set ``engine.optimizer: sgd``, ``momentum: 0`` for theirs).

Fused clients (``engine.fused_clients``) are refused by name (no fused objective: the
regulariser reads per-client prototype state), as are ``engine.server_model`` and
``global_eval_every`` (no shared model).

State across rounds: the global prototypes (C x d) and which classes have one
(:meth:`FedProto.state_dict`); the participants' weights are the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Literal, Mapping, Optional

import torch
import torch.nn.functional as F

from ..data.loading import normalize
from ..engine.sampling import round_clients, write_sampled
from .base import METHODS, Method
from .common import holding_data
from .prototypes import AbsentClasses, PrototypeScoring, class_sums, mean_prototypes, pool_to, proto_mse_loss, proto_paper_loss


@dataclass(frozen=True)
class FedProtoParams:
    init: Literal["scratch", "base"] = "scratch"  # HtFLlib trains every client from scratch
    lamda: float = 10.0  # weight of the prototype regulariser (HtFLlib system/total.sh:2, -lam 10)
    # width of the prototype space; 0 = the narrowest participant's feature_dim (HtFLlib: -fd 512, total.sh:2)
    proto_dim: int = 0
    # training: mean of the train-mode reps of every local step (clientproto.py:55-57);
    # eval: after local training, eval mode, over the private data (HtFLlib FedTGP, clienttgp.py:67-88)
    local_protos: Literal["training", "eval"] = "training"
    # code: per-sample MSE(rep, p_y) as both official codes (yuetan031/FedProto lib/update.py:161-171,
    # HtFLlib clientproto.py:47-53); paper: sum_j ||C_i^(j) - C^(j)||_2 on the batch's class means
    reg_form: Literal["code", "paper"] = "code"
    # prototype: evaluation scores the nearest global prototype by MSE (HtFLlib clientproto.py:70-100);
    # head: each participant's own classifier (the other methods' protocol)
    scoring: Literal["prototype", "head"] = "prototype"

    def __post_init__(self):
        if self.lamda < 0 or self.proto_dim < 0:
            raise ValueError(f"lamda and proto_dim must be >= 0, got lamda={self.lamda}, proto_dim={self.proto_dim}")


def global_prototypes_step(uploads, num_classes: int):
    """Uploads ``[(protos (C, d), counts (C,))]`` of one round -> (global (C, d), present (C,)) by
    :func:`mean_prototypes` (kept as a hook: FedTGP trains its server model instead)."""
    protos = torch.stack([p for p, _ in uploads])
    has = torch.stack([n > 0 for _, n in uploads])
    return mean_prototypes(protos, has)


@METHODS.register("fedproto")
class FedProto(Method):
    """FedProto: class prototypes exchanged instead of parameters; CE + lamda * MSE to the global prototypes."""

    name = "fedproto"
    Params: ClassVar[type] = FedProtoParams  # ClassVar[type]: FedTGP names its own
    weight_copies = 0  # one model per participant; the prototypes are C x d
    supports_sampling = True  # only the round's sampled clients train and upload (serverproto.py:29-44)
    supports_server_model = False
    per_client_state = "keeps every participant's own model (prototype exchange, no parameter averaging)"
    # what a class held by no uploading participant means here (the warning of issue 51 R31 says it)
    absent_effect = ("it has no global prototype this round, so nearest-prototype scoring never predicts it and "
                     "its samples add no regulariser term (as HtFLlib's serverproto.py / clientproto.py)")

    def setup(self, fed) -> None:
        self._fed = fed
        self._device = fed.device
        self.num_classes = fed.num_classes
        dims = [c.model.feature_dim for c in fed.clients]
        self.dim = self.p.proto_dim or min(dims)
        self.protos: Optional[torch.Tensor] = None  # (C, d) global prototypes; None before the first upload
        self.present: Optional[torch.Tensor] = None  # (C,) bool
        self._acc: Dict[str, tuple] = {}  # participant -> (sums, counts) of this round's training reps
        self._absent = AbsentClasses(self.name, self.absent_effect)
        for c in fed.clients:  # scoring: head still removes an earlier method object's hook from these models
            PrototypeScoring.install(c.model, self if self.p.scoring == "prototype" else None)

    # -- local updating --------------------------------------------------------------
    def rep(self, h: torch.Tensor) -> torch.Tensor:
        return pool_to(h, self.dim)

    def local_loss(self, fed, client, x, y, step):
        h, logits = client.model.forward_with_features(x)
        rep = self.rep(h)
        loss = F.cross_entropy(logits, y)
        if self.protos is not None and self.present is not None and self.p.lamda > 0:
            reg = proto_paper_loss if getattr(self.p, "reg_form", "code") == "paper" else proto_mse_loss
            loss = loss + self.p.lamda * reg(rep, y, self.protos, self.present)
        if self.p.local_protos == "training":
            s, n = class_sums(rep.detach().to(torch.promote_types(rep.dtype, torch.float32)), y, self.num_classes)
            acc = self._acc.get(client.name)
            self._acc[client.name] = (s, n) if acc is None else (acc[0] + s, acc[1] + n)
        return loss

    @torch.no_grad()
    def eval_prototypes(self, fed, client):
        """(C, d) per-class mean of ``rep`` over the private data, eval mode, and (C,) counts."""
        x, y = client.data.get("private")
        was = client.model.training
        client.model.eval()
        b = fed.cfg.eval_batch
        s: Optional[torch.Tensor] = None
        n: Optional[torch.Tensor] = None
        for i in range(0, len(y), b):
            rep = self.rep(client.model.features(normalize(x[i:i + b])))
            ds, dn = class_sums(rep.to(torch.promote_types(rep.dtype, torch.float32)), y[i:i + b], self.num_classes)
            s, n = (ds, dn) if s is None or n is None else (s + ds, n + dn)
        client.model.train(was)
        if s is None or n is None:
            raise ValueError(f"{client.name} has no private data to build prototypes from")
        return s / n.clamp(min=1).unsqueeze(1), n

    def local_update(self, fed, r: int) -> Dict[str, float]:
        clients = round_clients(fed, r)
        self._acc = {}
        metrics = fed.train_participants(clients, loss_fn=lambda cl, x, y, s: self.local_loss(fed, cl, x, y, s))
        uploads = []
        for c in holding_data(clients, self.name, r, "they upload no prototypes"):  # no images: nothing to upload
            if self.p.local_protos == "eval":
                uploads.append(self.eval_prototypes(fed, c))
            elif c.name in self._acc:  # every step of the participant skipped (skip_batch): no training reps
                s, n = self._acc.pop(c.name)
                uploads.append((s / n.clamp(min=1).unsqueeze(1), n))
        self._acc = {}
        if uploads:  # none: the global prototypes stay those of the last round with uploads
            self.aggregate(fed, r, uploads)
            if self.present is not None:
                self._absent(self.present, r)
        return metrics

    def aggregate(self, fed, r: int, uploads) -> None:
        """Server: the global prototypes of the next round from this round's uploads."""
        self.protos, self.present = global_prototypes_step(uploads, self.num_classes)

    # -- resumable state ------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        if self.protos is None or self.present is None:  # both None before the first upload
            return {}
        return {"protos": self.protos.detach().cpu().clone(), "present": self.present.cpu().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = sorted(set(state) - {"protos", "present"})
        if unknown:
            raise ValueError(f"{self.name} state has unknown keys {unknown}")
        if not state:
            self.protos = self.present = None
            return
        self.protos = state["protos"].to(self._device)
        self.present = state["present"].to(self._device, torch.bool)

    def artifacts(self, out_dir) -> None:
        """``sampled.csv``: the clients sampled in each round (absent when every client trains)."""
        write_sampled(getattr(self, "_fed", None), out_dir)
