"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning", ICML 2020, arXiv:1910.06378), Algorithm 1 with option II.

Every client keeps a control variate ``c_i`` and the server a global one ``c`` (both start at 0, one
tensor per trainable parameter). A client's local step corrects its gradient by ``c - c_i``
(Algorithm 1 line 10, ``y_i <- y_i - eta_l (g_i(y_i) - c_i + c)``): here the local loss adds the linear
term ``<c - c_i, w>`` (:func:`control_term`), whose gradient is exactly that correction. After local
training (line 12, option II) ``c_i+ = c_i - c + (x - y_i) / (K_i eta_l)``, with ``K_i`` the client's
optimiser steps this round and ``eta_l`` this round's local learning rate (``ctx.steps``, ``ctx.lr``);
the server (lines 16-17) moves ``x <- x + eta_g (avg_i y_i - x)`` and ``c <- c + (1/N) sum_i (c_i+ - c_i)``
over the round's clients (:func:`scaffold_server`).

Kept: option II, ``eta_g`` (``server_lr``, 1 in the paper's experiments), the control update of the
global variate over all N clients (``|S| / N`` times the mean), client sampling (only the sampled
clients update their variates). Differs: the model average ``avg_i y_i`` is weighted by the grid's
scoring weighting (``uniform`` = the paper's ``1 / |S|``; ``samples`` = McMahan's ``n_i / n``), so
SCAFFOLD is averaged like every server-averaging row of its table; buffers (BatchNorm running
statistics) are averaged as FedAvg's and moved by ``eta_g`` like the parameters. Option I (``c_i+`` as the
client's full gradient at ``x``, an extra pass) is not implemented.

Requirements (checked by ``fedshift validate``): ``engine.optimizer: sgd`` with ``momentum: 0``: the
correction and option II are derived for plain SGD steps (weight decay is part of the gradient there and
keeps the derivation). State across rounds: ``c`` and every client's ``c_i`` (:meth:`SCAFFOLD.state_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

import torch
import torch.nn.functional as F

from .base import METHODS, Requirements, ServerParams, State
from .common import cpu_copy
from .fedavg import ServerAveraging


@dataclass(frozen=True)
class SCAFFOLDParams(ServerParams):
    server_lr: float = 1.0  # eta_g of Algorithm 1 line 17 (the paper's experiments: 1)

    def __post_init__(self):
        if self.server_lr <= 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")


def control_term(params: Sequence[torch.Tensor], correction: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_k <correction_k, params_k>``: added to the local loss, it adds ``correction`` (= ``c - c_i``) to
    every gradient, Algorithm 1 line 10's corrected step."""
    return torch.stack([(p * d).sum() for p, d in zip(params, correction)]).sum()


def client_control(c_i: Mapping[str, torch.Tensor], c: Mapping[str, torch.Tensor], x: Mapping[str, torch.Tensor],
                   y: Mapping[str, torch.Tensor], steps: int, lr: float) -> Dict[str, torch.Tensor]:
    """Option II (Algorithm 1 line 12): ``c_i+ = c_i - c + (x - y_i) / (K eta_l)``; unchanged without a step."""
    if steps <= 0:
        return {k: v.clone() for k, v in c_i.items()}
    return {k: c_i[k] - c[k] + (x[k] - y[k]) / (steps * lr) for k in c_i}


def scaffold_server(x: Mapping[str, torch.Tensor], average: Mapping[str, torch.Tensor], c: Mapping[str, torch.Tensor],
                    deltas: Sequence[Mapping[str, torch.Tensor]], server_lr: float, num_clients: int
                    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """Lines 16-17: ``x + eta_g (average - x)`` (floating tensors; integer buffers: the average's) and
    ``c + (1 / N) sum_i delta_i`` (``delta_i = c_i+ - c_i`` of the round's clients)."""
    new_x = {k: (x[k] + server_lr * (average[k] - x[k]) if torch.is_floating_point(x[k]) else average[k])
             for k in x}
    new_c = {k: c[k] + sum(d[k] for d in deltas) / num_clients for k in c}
    return new_x, new_c


@METHODS.register("scaffold")
class SCAFFOLD(ServerAveraging):
    """SCAFFOLD: control variates correct every local step for the client's drift; the server moves them."""

    name = "scaffold"
    Params = SCAFFOLDParams
    requires = Requirements(optimizer="sgd", momentum=0.0)
    weight_copies = 2  # per participant its control variate; the global one
    supports_server_model = False
    per_client_state = ""  # client sampling is honoured; a shared model would mix the clients' variates

    def setup(self, ctx) -> None:
        super().setup(ctx)
        model = ctx.participants[0].model
        self._names = [n for n, q in model.named_parameters() if q.requires_grad]
        zeros = {n: torch.zeros_like(q, memory_format=torch.contiguous_format)
                 for n, q in model.named_parameters() if q.requires_grad}
        self.c: Dict[str, torch.Tensor] = {n: z.clone() for n, z in zeros.items()}
        self.c_i: Dict[str, Dict[str, torch.Tensor]] = {p.name: {n: z.clone() for n, z in zeros.items()}
                                                        for p in ctx.participants}
        self._correction: Dict[str, List[torch.Tensor]] = {}

    def begin_round(self, ctx, global_state: Dict[str, torch.Tensor]) -> None:
        # c - c_i of each client of the round, fixed for its local steps (line 10)
        self._correction = {p.name: [self.c[n] - self.c_i[p.name][n] for n in self._names] for p in ctx.trained}

    def local_loss(self, ctx, client, x, y, step):
        params = dict(client.model.named_parameters())
        return F.cross_entropy(client.model(x), y) + control_term([params[n] for n in self._names],
                                                                  self._correction[client.name])

    def server_step(self, ctx, start: Mapping[str, State], trained: Mapping[str, State]) -> Dict[str, State]:
        names = list(trained)
        x = start[names[0]]  # every client of the round started from the global model
        deltas = []
        for n in names:
            new = client_control(self.c_i[n], self.c, x, trained[n], ctx.steps.get(n, 0), ctx.lr)
            deltas.append({k: new[k] - self.c_i[n][k] for k in new})
            self.c_i[n] = new
        new_x, self.c = scaffold_server(x, ctx.average(trained), self.c, deltas, self.p.server_lr,
                                        len(ctx.participants))
        return ctx.to_all(new_x)

    # -- resumable state ------------------------------------------------------------
    def state_dict(self) -> Dict[str, object]:
        return {"c": cpu_copy(self.c), "c_i": {n: cpu_copy(s) for n, s in self.c_i.items()}}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        unknown = sorted(set(state) - {"c", "c_i"})
        if unknown:
            raise ValueError(f"scaffold state has unknown keys {unknown}; expected ['c', 'c_i']")
        dev = next(iter(self.c.values())).device
        c, c_i = state["c"], state["c_i"]
        assert isinstance(c, Mapping) and isinstance(c_i, Mapping)
        missing = sorted(set(self.c_i) - set(c_i))
        if missing:
            raise ValueError(f"scaffold state lacks the control variates of {missing}")
        self.c = {k: v.to(dev) for k, v in c.items()}
        self.c_i = {n: {k: v.to(dev) for k, v in s.items()} for n, s in c_i.items()}
