"""FedAvg (McMahan et al. 2017): local epochs, then the server averages parameters
weighted by private-sample counts. Homogeneous architectures only (FCCL+ Table XV).

Kept from the paper: weighted averaging of all parameters and buffers (BatchNorm
running statistics included; integer buffers such as ``num_batches_tracked`` are
taken from the first client). Every participant starts each round from the global
model; after averaging, every participant holds the global model, so intra/inter
accuracies are those of the global model on each domain.

Client sampling (``engine.clients_per_round`` / ``client_fraction``, McMahan's C):
only the round's sampled clients train, and the average is weighted by their sample
counts (Algorithm 2 line 7 of FedFusion). Without sampling every client trains, which
is the domain-shift scenarios' protocol and gives the same numbers as before sampling
existed. The average is accumulated client by client (:class:`~fedshift.engine.averaging.RunningAverage`), so with
``engine.server_model`` (one working model shared by all clients) a round holds the
working model, the global weights and one accumulator whatever the number of clients.
:class:`ServerAveraging` is that round; FedMMD and FedFusion override its hooks.

Which models are scored (``eval_models``, docs/fccl.md "Which models each table scores"):

* ``global`` (default; McMahan 2017, FedMMD/FedFusion, FedH2L's FedAvg rows): the
  server averages *after* local updating and every participant holds (and is scored
  as) the averaged model.
* ``local`` (the FCCL+ benchmark, Table XV and CVPR Table 3): the participants'
  models are averaged at the *start* of the round (:meth:`ServerAveraging.collaborate`),
  then every participant trains locally and keeps its model, and each participant is
  scored with its own model after local updating. This is the authors' code:
  ``fccl+/models/fedavg.py:31-35`` (also ``fedprox.py:32-36``, ``moon.py:37-43``) calls
  ``aggregate_nets(None)`` at the start of ``loc_update``, ``None`` meaning uniform
  1/K weights (``fccl+/models/utils/federated_model.py:56-57``), and
  ``fccl+/utils/training.py:139-144`` evaluates every participant right after
  ``loc_update``. The grids pair it with ``weighting: uniform``. The published table
  carries the mark: with one shared model participant i's inter-domain accuracy would
  be the mean of the others' intra-domain accuracies, and Table XV's differ by 5-30
  points. ``local`` keeps one model per participant, so it refuses client sampling,
  ``engine.server_model`` and ``engine.global_eval_every`` (no round-end global model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional

import torch

from ..engine.averaging import RunningAverage
from ..engine.fused import fused_local_update, fused_round, masked_cross_entropy, use_fused
from ..engine.sampling import round_clients, unique_models, write_sampled
from .base import METHODS, Method, ServerParams
from .common import average_models


@dataclass(frozen=True)
class FedAvgParams(ServerParams):
    """FedAvg: the server-averaging fields alone (init from scratch, as the authors' baselines)."""


def eval_models(params) -> str:
    """The ``eval_models`` protocol of a server-averaging method's params (``global`` when it has no such key)."""
    return getattr(params, "eval_models", "global")


class ServerAveraging(Method):
    """The FedAvg round: the sampled clients train from the global model, the server averages them.

    Between rounds every model object holds the global model (so the engine's saved
    weights are the server state, and nothing else crosses rounds). Hooks for two-stream
    methods: :meth:`begin_round` (gets the global weights before anyone trains),
    :meth:`local_loss`, :meth:`aggregate` (the server's update from the average).
    """

    requires_homogeneous = True
    _next_global: Optional[Dict[str, torch.Tensor]] = None  # the round's new global weights, set by local_update

    def _fused(self, fed):
        """The fused local objective (engine.fused decides to fuse only a method that has one)."""
        if self.fused_objective is None:
            raise TypeError(f"method {self.name!r} has no fused_objective")
        return self.fused_objective(fed)

    @property
    def supports_sampling(self) -> bool:
        """Honours engine.clients_per_round / client_fraction (``global`` only: ``local`` scores every
        participant's own model, which a client that sat out would not have trained)."""
        return eval_models(self.p) == "global"

    @property
    def supports_server_model(self) -> bool:
        """Stateless clients: one shared working model is enough (``global`` only)."""
        return eval_models(self.p) == "global"

    @property
    def per_client_state(self) -> str:
        """Why sampling / a shared model is refused (engine.sampling.check_engine); empty under ``global``."""
        return "keeps and scores each participant's own model (eval_models: local)" if self.local_protocol else ""

    @property
    def local_protocol(self) -> bool:
        return eval_models(self.p) == "local"

    def setup(self, fed) -> None:
        # One global model to start from: the first participant's random initialisation
        # (averaging random inits would shrink the weights), or the average of BASE models.
        self._fed = fed
        if self.p.init == "scratch":
            state = fed.clients[0].model.state_dict()
            for m in unique_models(fed)[1:]:
                m.load_state_dict(state)
        else:
            average_models(fed.clients, self.p.weighting)

    def global_model(self, fed) -> torch.nn.Module:
        return fed.clients[0].model

    def collaborate(self, fed, r: int) -> Dict[str, float]:
        """``eval_models: local``: average every participant's model into each (the authors'
        ``aggregate_nets(None)`` at the start of ``loc_update``); ``global``: nothing here."""
        if self.local_protocol:
            average_models(fed.clients, self.p.weighting)
        return {}

    def begin_round(self, fed, r: int, global_state: Dict[str, torch.Tensor]) -> None:
        pass

    def aggregate(self, fed, average: Dict[str, torch.Tensor], global_state: Dict[str, torch.Tensor]):
        """The next global weights from the clients' weighted average (FedAvg: the average)."""
        return average

    def local_update(self, fed, r: int) -> Dict[str, float]:
        """The sampled clients train from the global model; their weighted average is accumulated
        as they go (each client's model keeps its trained weights until :meth:`after_round`).
        ``eval_models: local``: every participant trains from the average :meth:`collaborate` gave it
        and keeps its trained model."""
        if self.local_protocol:
            global_state = {k: v.detach().clone() for k, v in fed.clients[0].model.state_dict().items()}
            self.begin_round(fed, r, global_state)
            self._next_global = None
            if use_fused(fed, fed.clients):  # each participant from its own weights, one vmapped step
                fed.fused_rounds = getattr(fed, "fused_rounds", 0) + 1
                return fused_local_update(fed, fed.clients, objective=self._fused(fed))
            return fed.train_participants(loss_fn=lambda cl, x, y, s: self.local_loss(fed, cl, x, y, s))
        clients = round_clients(fed, r)
        global_state = {k: v.detach().clone() for k, v in fed.clients[0].model.state_dict().items()}
        self.begin_round(fed, r, global_state)
        weights = [c.num_private if self.p.weighting == "samples" else 1.0 for c in clients]
        if use_fused(fed, clients):  # engine.fused_clients: one vmapped step for all sampled clients
            losses, average = fused_round(fed, clients, weights, self._fused(fed), global_state)
            self._next_global = self.aggregate(fed, average, global_state)
            return losses
        avg = RunningAverage(sum(weights))
        losses = {}
        for i, (c, w) in enumerate(zip(clients, weights)):
            if i:  # the first client starts from the global model already
                c.model.load_state_dict(global_state)
            losses[f"{c.name}/train/local_loss"] = fed.train_local(
                c, lambda cl, x, y, s: self.local_loss(fed, cl, x, y, s))
            avg.add(c.model.state_dict(), w)
        self._next_global = self.aggregate(fed, avg.result(global_state), global_state)
        return losses

    def after_round(self, fed, r: int) -> None:
        """Every model holds the new global model (``eval_models: local``: each keeps its own)."""
        if self.local_protocol:
            return
        new, self._next_global = self._next_global, None
        assert new is not None, "after_round before local_update"
        for m in unique_models(fed):
            m.load_state_dict(new)

    def artifacts(self, out_dir) -> None:
        """``sampled.csv``: the clients sampled in each round (absent when every client trains)."""
        write_sampled(getattr(self, "_fed", None), out_dir)


@METHODS.register("fedavg")
class FedAvg(ServerAveraging):
    """FedAvg: local training from the global model, then sample-weighted parameter averaging."""

    name = "fedavg"
    Params: ClassVar[type] = FedAvgParams  # ClassVar[type]: subclasses name their own Params

    def fused_objective(self, fed):
        """The local loss for engine.fused_clients (engine/fused.py): cross-entropy."""
        return masked_cross_entropy
