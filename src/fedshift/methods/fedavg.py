"""FedAvg (McMahan et al. 2017): local epochs, then the server averages parameters
weighted by private-sample counts. Homogeneous architectures only (FCCL+ Table XV).

Kept from the paper: weighted averaging of all parameters and buffers (BatchNorm
running statistics included; integer buffers such as ``num_batches_tracked`` are
taken from the first client). Every participant starts each round from the global
model; after averaging, every participant holds the global model, so intra/inter
accuracies are those of the global model on each domain.

Client sampling (``engine.clients_per_round`` / ``client_fraction``, McMahan's C):
only the round's sampled clients (``ctx.trained``) train, and the average is weighted by
their sample counts (Algorithm 2 line 7 of FedFusion). Without sampling every client trains,
which is the domain-shift scenarios' protocol. Under ``engine.server_model`` (one working
model shared by all clients) each sampled client trains in turn from the global model and
the engine keeps its trained state for the server step (memory: the working model, the
global weights and the round's sampled states, whatever the number of clients).
:class:`ServerAveraging` is that round; FedMMD, FedFusion, SCAFFOLD and FedNova override its hooks.

Which models are scored is the grid's (its ``scoring:`` block, docs/fccl.md "Which models each
table scores"): the server step below runs after local training under every protocol and the engine
delivers its average right away (``global``: McMahan 2017, FedMMD/FedFusion, FedH2L's FedAvg rows;
every participant holds and is scored as the average) or at the start of the next round
(``local``: the FCCL+ benchmark, Table XV and CVPR Table 3; each participant is scored with its own
model after local updating, then starts the next round from the average). That is the authors'
code: ``fccl+/models/fedavg.py:31-35`` (also ``fedprox.py:32-36``, ``moon.py:37-43``) calls
``aggregate_nets(None)`` at the start of ``loc_update``, ``None`` meaning uniform 1/K weights
(``fccl+/models/utils/federated_model.py:56-57``: the grids pair ``local`` with
``scoring.weighting: uniform``), and ``fccl+/utils/training.py:139-144`` evaluates every
participant right after ``loc_update``. The published table carries the mark: with one shared
model participant i's inter-domain accuracy would be the mean of the others' intra-domain
accuracies, and Table XV's differ by 5-30 points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Mapping, Optional

import torch

from ..engine.fused import masked_cross_entropy
from .base import METHODS, Method, ServerParams, State
from .common import average_models


@dataclass(frozen=True)
class FedAvgParams(ServerParams):
    """FedAvg: the server-averaging fields alone (init from scratch, as the authors' baselines)."""


class ServerAveraging(Method):
    """The FedAvg round: the sampled clients train from the global model, the server averages them.

    Hooks for its family: :meth:`begin_round` (gets the global weights before anyone trains),
    :meth:`local_loss`, :meth:`aggregate` (the server's next global weights from the clients'
    weighted average), :meth:`fused_objective` (the local loss for engine.fused_clients).
    """

    requires_homogeneous = True
    supports_sampling = True  # only the round's sampled clients train (under the global scoring protocol)
    supports_server_model = True  # stateless clients: one shared working model is enough

    def setup(self, ctx) -> None:
        # One global model to start from: the first participant's random initialisation
        # (averaging random inits would shrink the weights), or the average of BASE models.
        if self.p.init == "scratch":
            ctx.broadcast(ctx.participants[0].model.state_dict())
        else:
            average_models(ctx.participants, ctx.weighting)

    def global_model(self, ctx) -> torch.nn.Module:
        return ctx.participants[0].model

    def begin_round(self, ctx, global_state: Dict[str, torch.Tensor]) -> None:
        """Before anyone trains: ``global_state`` is the model every trained participant starts from."""

    def aggregate(self, ctx, average: Dict[str, torch.Tensor], global_state: Dict[str, torch.Tensor]):
        """The next global weights from the clients' weighted average (FedAvg: the average)."""
        return average

    def local_update(self, ctx) -> Dict[str, float]:
        """The round's clients (``ctx.trained``) train from the global model (fused where the run decided)."""
        global_state = {k: v.detach().clone() for k, v in ctx.participants[0].model.state_dict().items()}
        self.begin_round(ctx, global_state)
        objective = self.fused_objective(ctx) if self.fused_objective is not None else None
        return ctx.train_participants(ctx.trained, lambda cl, x, y, s: self.local_loss(ctx, cl, x, y, s),
                                      start=global_state, objective=objective)

    def server_step(self, ctx, start: Mapping[str, State], trained: Mapping[str, State]) -> Optional[Dict[str, State]]:
        """The clients' weighted average (``ctx.weights``) through :meth:`aggregate`, for every participant."""
        global_state = start[next(iter(trained))]  # every trained client started from it
        return ctx.to_all(self.aggregate(ctx, ctx.average(trained), global_state))


@METHODS.register("fedavg")
class FedAvg(ServerAveraging):
    """FedAvg: local training from the global model, then sample-weighted parameter averaging."""

    name = "fedavg"
    Params: ClassVar[type] = FedAvgParams  # ClassVar[type]: subclasses name their own

    def fused_objective(self, ctx):
        """The local loss for engine.fused_clients (engine/fused.py): cross-entropy."""
        return masked_cross_entropy
