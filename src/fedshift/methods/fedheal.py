"""FedHEAL (Chen, Huang & Ye, "Fair Federated Learning under Domain Skew with Local
Consistency and Domain Diversity", CVPR 2024), on top of FedAvg (the authors'
``fedavgheal``).

FedAvg whose server (1) masks each participant's update where its direction disagrees
with the participant's own history (*local consistency*,
:func:`consistency_mask`): an entry is kept when the fraction of the participant's past
rounds that moved it the same way exceeds ``threshold``; and (2) weights participants by
an EMA of their masked updates' size (*domain diversity*, :func:`fair_weights`), larger
updates gaining weight, so no domain dominates; the masked updates are averaged entry by
entry over the participants that kept the entry (:func:`masked_aggregate`).

Official code read (file:line at yuhangchen0/FedHEAL 770e094b, 2024-05-28):

* update ``global - local`` for every state entry (``models/fedavgheal.py:42-45``), masked
  (``:47-50``); mask = ones in a participant's first round, history = the indicator
  ``update >= 0`` (``models/utils/federated_model.py:191-199``); later rounds keep entries
  whose same-direction history exceeds ``threshold`` and update the history as a running mean
  (``:201-214``);
* size of a masked update: the *sum of the per-tensor L2 norms* over the parameters (not
  the buffers) (``federated_model.py:89-95``);
* weights: ``delta_i = (1 - beta) delta_i' + beta d_i / sum_j d_j`` (sum over every participant
  measured so far), ``w_i = w_i' + delta_i`` from ``w_i' = 1/m``, normalised over the round's
  participants (``federated_model.py:70-87``);
* aggregation, entry by entry: ``global - sum_i u_i * f_i m_i / sum_j f_j m_j``, or with the
  plain weights where no participant kept the entry (their masked updates are 0 there)
  (``federated_model.py:138-189``);
* ``threshold = 0.3``, ``beta = 0.4`` (``main.py:52-53``); the global model is scored
  (``utils/training.py:12-14``); the authors' engine settings (not method parameters): SGD lr 0.001,
  momentum 0.9, weight decay 1e-5 (``fedavgheal.py:62``, ``utils/best_args.py``), batch 64 Digits /
  16 Office-Caltech (``best_args.py``), 10 local epochs, 200 rounds, 20 participants
  (``main.py:35-37``).

Differs (and why):

* integer buffers (BatchNorm's ``num_batches_tracked``) are taken from the first
  participant, as FedAvg here; the official code runs them through the float arithmetic
  and truncates;
* client sampling: the history of a participant is a running mean over *its own*
  participations (the official code divides by the global round index,
  ``federated_model.py:212``, equal under full participation), and every sampled client
  starts from the global model (the official code reloads only the online clients,
  ``:188-189``, so a client that sat out trains on from its stale model);
* under the grid's local scoring protocol (the FCCL+ benchmark's) the HEAL aggregate of round r
  reaches the participants at the start of round r+1 and each is scored after local updating.

``fpl_heal`` (:class:`FPLHEAL`): FPL's clients under FedHEAL's server, the combination the paper
names ("generic and can be combined with other existing FL methods", its abstract); the official repository
ships only FedAvg + HEAL, so this pairing is fedshift's.

Fused clients are refused by name (a custom server). State across rounds: each
participant's direction history and participation count, the weights' EMA terms and the
last update sizes (:meth:`FedHEAL.state_dict`); the engine keeps a delivery waiting for the
next round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence

import torch

from .base import METHODS, ServerParams
from .common import cpu_copy
from .fedavg import ServerAveraging
from .fpl import FPL

State = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class FedHEALParams(ServerParams):
    # init scratch (the authors' runs); the authors score the global model (FedHEAL utils/training.py:12-14): the
    # grid's global scoring protocol; its weighting only averages the BASE models under init: base (the
    # round's weights are FedHEAL's own)
    threshold: float = 0.3  # consistency an entry needs to be kept (FedHEAL main.py:52, --threshold)
    beta: float = 0.4  # EMA rate of the fair weights (FedHEAL main.py:53, --beta)

    def __post_init__(self):
        if not 0.0 <= self.threshold < 1.0 or not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1) and beta in [0, 1], got threshold={self.threshold}, "
                             f"beta={self.beta}")


def consistency_mask(update: State, history: Optional[State], count: int, threshold: float):
    """(mask, new history) of one participant (``federated_model.py:191-214``).

    ``history`` holds, per entry, the fraction of the participant's ``count`` past updates that
    were ``>= 0``; ``None`` (first participation): mask of ones, history = ``update >= 0``.
    Otherwise an entry is kept when the fraction of past updates in its direction exceeds
    ``threshold``, and the history becomes ``(history * count + [update >= 0]) / (count + 1)``.
    """
    if history is None:
        return ({k: torch.ones_like(u) for k, u in update.items()},
                {k: (u >= 0).to(u.dtype) for k, u in update.items()})
    mask, new = {}, {}
    for k, u in update.items():
        up = (u >= 0).to(u.dtype)
        consistency = torch.where(u >= 0, history[k], 1 - history[k])
        mask[k] = (consistency > threshold).to(u.dtype)
        new[k] = (history[k] * count + up) / (count + 1)
    return mask, new


def update_size(masked: State, param_names: Sequence[str]) -> float:
    """Sum over the parameters (not the buffers) of each masked update's L2 norm (``federated_model.py:89-95``)."""
    return float(sum(torch.norm(masked[k]).item() for k in masked if k in param_names))


def fair_weights(names: Sequence[str], sizes: Mapping[str, float], prev_w: Mapping[str, float],
                 prev_delta: Mapping[str, float], beta: float):
    """(normalised weights of ``names``, new unnormalised weights, new deltas) (``federated_model.py:70-87``).

    ``delta_i = (1 - beta) prev_delta_i + beta * size_i / sum(sizes)`` (``sizes`` holds every participant
    measured so far), ``w_i = prev_w_i + delta_i`` with ``prev_w_i = 1/m`` at first.
    """
    total = sum(sizes.values())
    new_w, new_d = {}, {}
    for n in names:
        new_d[n] = (1 - beta) * prev_delta.get(n, 0.0) + beta * (sizes[n] / total if total > 0 else 0.0)
        new_w[n] = prev_w.get(n, 1.0 / len(names)) + new_d[n]
    s = sum(new_w.values())
    return [new_w[n] / s for n in names], new_w, new_d


def masked_aggregate(global_state: State, updates: List[State], masks: List[State], freq: Sequence[float]) -> State:
    """``global - sum_i u_i * w_i`` entry by entry, ``w_i = f_i m_i / sum_j f_j m_j``, or ``f_i`` where
    no participant kept the entry (``federated_model.py:138-189``). Keys of ``updates`` only
    (integer buffers are the caller's)."""
    out = dict(global_state)
    for k in updates[0]:
        adj = torch.stack([f * m[k] for f, m in zip(freq, masks)])
        total = adj.sum(0, keepdim=True)
        plain = torch.tensor(list(freq), dtype=adj.dtype, device=adj.device).view(-1, *[1] * (adj.dim() - 1)).expand_as(adj)
        w = torch.where(total == 0, plain, adj / torch.where(total == 0, torch.ones_like(total), total))
        new = global_state[k].clone()
        for u, wi in zip(updates, w):
            new = new - u[k] * wi
        out[k] = new
    return out


@METHODS.register("fedheal")
class FedHEAL(ServerAveraging):
    """FedHEAL: FedAvg with consistency-masked updates and fair, update-size-driven aggregation weights."""

    name = "fedheal"
    Params: ClassVar[type] = FedHEALParams  # ClassVar[type]: FPL+HEAL names its own
    weight_copies = 3  # per participant: its direction history; per round: its masked update and mask

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self._device = ctx.device
        self.history: Dict[str, State] = {}
        self.count: Dict[str, int] = {}
        self.sizes: Dict[str, float] = {}
        self.prev_w: Dict[str, float] = {}
        self.prev_delta: Dict[str, float] = {}

    def server_step(self, ctx, start: Mapping[str, State], trained: Mapping[str, State]) -> Dict[str, State]:
        """Each trained client's update ``global - local`` masked by its consistency, the fair weights, the
        entry-wise masked aggregate (``models/fedavgheal.py:33-75``), for every participant."""
        names = list(trained)
        global_state = start[names[0]]  # every trained client started from the global model
        param_names = [n for n, _ in ctx.participants[0].model.named_parameters()]
        updates, masks = [], []
        for n in names:
            local = trained[n]
            update = {k: global_state[k] - local[k] for k in local if torch.is_floating_point(local[k])}
            mask, self.history[n] = consistency_mask(update, self.history.get(n), self.count.get(n, 0),
                                                     self.p.threshold)
            self.count[n] = self.count.get(n, 0) + 1
            masked = {k: u * mask[k] for k, u in update.items()}
            self.sizes[n] = update_size(masked, param_names)
            updates.append(masked)
            masks.append(mask)
        freq, w, d = fair_weights(names, self.sizes, self.prev_w, self.prev_delta, self.p.beta)
        self.prev_w.update(w)
        self.prev_delta.update(d)
        new = masked_aggregate(global_state, updates, masks, freq)
        first = trained[names[0]]
        new = {k: (new[k] if k in updates[0] else first[k].clone()) for k in global_state}
        ctx.log({f"{n}/train/heal_weight": float(f) for n, f in zip(names, freq)})
        return ctx.to_all(new)

    # -- resumable state ------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"history": {n: cpu_copy(h) for n, h in self.history.items()}, "count": dict(self.count),
                "sizes": dict(self.sizes), "prev_w": dict(self.prev_w), "prev_delta": dict(self.prev_delta)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        known = {"history", "count", "sizes", "prev_w", "prev_delta"}
        unknown = sorted(set(state) - known)
        if unknown:
            raise ValueError(f"fedheal state has unknown keys {unknown}; expected {sorted(known)}")
        dev = self._device
        self.history = {n: {k: v.to(dev) for k, v in h.items()} for n, h in state.get("history", {}).items()}
        self.count = {n: int(v) for n, v in state.get("count", {}).items()}
        self.sizes = {n: float(v) for n, v in state.get("sizes", {}).items()}
        self.prev_w = {n: float(v) for n, v in state.get("prev_w", {}).items()}
        self.prev_delta = {n: float(v) for n, v in state.get("prev_delta", {}).items()}


@dataclass(frozen=True)
class FPLHEALParams(ServerParams):
    # init: as fedheal
    tau: float = 0.02  # FPL's contrast temperature (RethinkFL main.py:55)
    threshold: float = 0.3  # FedHEAL main.py:52
    beta: float = 0.4  # FedHEAL main.py:53

    def __post_init__(self):
        FedHEALParams(threshold=self.threshold, beta=self.beta)
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")


@METHODS.register("fpl_heal")
class FPLHEAL(FPL, FedHEAL):
    """FPL's clients (prototype terms, FINCH prototypes) with FedHEAL's server (masked, fairly weighted updates).

    FedHEAL is "generic and can be combined with other existing FL methods" (the abstract in its
    README); the official repository ships only FedAvg + HEAL (``models/fedavgheal.py``), so this
    combination is fedshift's: FPL's ``local_update`` and ``local_loss`` (the prototype terms, FINCH
    prototypes of the round's clients), FedHEAL's ``server_step`` (the method resolution order finds it
    before FedAvg's).
    """

    name = "fpl_heal"
    Params = FPLHEALParams

    def state_dict(self) -> Dict[str, Any]:
        return {"fpl": FPL.state_dict(self), "heal": FedHEAL.state_dict(self)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = sorted(set(state) - {"fpl", "heal"})
        if unknown:
            raise ValueError(f"fpl_heal state has unknown keys {unknown}; expected ['fpl', 'heal']")
        FPL.load_state_dict(self, state.get("fpl", {}))
        FedHEAL.load_state_dict(self, state.get("heal", {}))
