"""The round context: the one door from the engine to a method (issue 49; docs/extending.md "The round context").

Every hook of a method receives a :class:`RoundContext`, ``ctx``, and nothing else of the engine: the
participants (:class:`~fedshift.engine.federation.Client`: ``name``, ``domain``, ``arch``, ``model``,
``data``, ``state``, ``num_private``), the round and who trains in it, how many optimiser steps each took,
the round's optimiser settings computed once, the run's data and devices, and the training helpers. A
test (tests/test_method_contract.py) reads every ``ctx.<name>`` the methods of ``fedshift/methods`` and
``examples/`` use and fails on one that :data:`FIELDS` does not document.

The round (:meth:`RoundContext._run_round`, called by :meth:`Federation.run_round`):

1. the scoring protocol's pending delivery (``eval_models: local``) is loaded into the participants;
   ``ctx.trained`` is drawn (client sampling) and the round's optimiser settings are computed;
2. ``method.run_round(ctx)``: by default ``collaborate(ctx)`` then ``local_update(ctx)``; local training
   goes through :meth:`train_participants` / :meth:`train_local`, which record each trained participant's
   starting weights (only for a method with a server step) and its optimiser steps (``ctx.steps``);
3. ``method.server_step(ctx, start, trained)`` under *every* scoring protocol: ``start[name]`` and
   ``trained[name]`` are the states each participant of ``ctx.trained`` started local training from and
   ended it with; it returns the server's delivery (participant name -> state, :meth:`to_all` for one
   state for everyone) or None;
4. the delivery is loaded now (``eval_models: global``) or kept for the next round's start (``local``),
   so a method never asks which models will be scored;
5. ``method.after_round(ctx)``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from .averaging import weighted_average
from .participants import LossFn, Participant, frozen_copy, steps_per_epoch
from .fused import Objective, fused_train, use_fused
from .sampling import round_clients, unique_models

State = Dict[str, torch.Tensor]

#: Every name a method may read on ``ctx``: (kind, what it is). docs/extending.md prints this table; the
#: contract test holds the methods of fedshift/methods and examples/ to it.
FIELDS: Dict[str, Tuple[str, str]] = {
    # -- the participants and the round ------------------------------------------------------------------
    "participants": ("list of Participant", "every participant, in the scenario's order"),
    "round": ("int", "the current round, 1..rounds (0 during setup)"),
    "rounds": ("int", "engine.rounds"),
    "trained": ("list of Participant", "who trains this round: every participant, or the round's sampled "
                                       "clients (engine.clients_per_round / client_fraction)"),
    "steps": ("dict name -> int", "optimiser steps each participant took in this round's local training so far"),
    # -- the round's optimiser settings, computed once ---------------------------------------------------
    "optimizer": ("str", "engine.optimizer: 'adam' or 'sgd'"),
    "lr": ("float", "the local learning rate of this round (engine.lr under lr_decay / lr_gamma)"),
    "public_lr": ("float", "the public phase's learning rate of this round (engine.public_lr, decayed alike)"),
    "momentum": ("float", "engine.momentum (SGD's; Adam ignores it)"),
    "weight_decay": ("float", "engine.weight_decay of local updating (the public phase uses none)"),
    "local_epochs": ("int", "engine.local_epochs"),
    "local_batch": ("int", "engine.local_batch"),
    "public_batch": ("int", "engine.public_batch"),
    "public_aug": ("str", "engine.public_aug: the public batches' augmentation"),
    "eval_batch": ("int", "engine.eval_batch: the batch of inference passes"),
    "public_graphs": ("str", "engine.public_graphs: 'one' or 'all' autograd graphs of a public step"),
    "recompute_budget_mb": ("int", "engine.recompute_budget_mb (graphs a one-graph public step keeps)"),
    # -- the run ------------------------------------------------------------------------------------------
    "device": ("torch.device", "where models and data live"),
    "seed": ("int", "the run's seed (derive your own streams from it)"),
    "num_classes": ("int", "the scenario's classes"),
    "image_shape": ("tuple", "(channels, height, width) of the scenario's images"),
    "homogeneous": ("bool", "every participant has the same architecture"),
    "public": ("Tensor or None", "the unlabeled public set (uint8 images), None without one"),
    "public_gen": ("torch.Generator", "the public data's stream (checkpointed with the run)"),
    "aug_gen": ("torch.Generator", "the augmentations' stream (checkpointed with the run)"),
    "base_models": ("list of models or None", "the BASE checkpoints' models when the job loaded them"),
    "weighting": ("str", "the scoring protocol's server weighting: 'samples' or 'uniform'"),
    # -- helpers ------------------------------------------------------------------------------------------
    "weights": ("method", "weights(participants) -> the server weight of each (n_k or 1, by ctx.weighting)"),
    "average": ("method", "average(states: name -> state) -> their weighted mean (ctx.weights, float64)"),
    "to_all": ("method", "to_all(state) -> a server delivery of one state to every participant"),
    "broadcast": ("method", "broadcast(state): load one state into every participant's model now"),
    "make_optimizer": ("method", "make_optimizer(model, phase='local'|'public', params=None): this round's"
                                 " optimiser (the one factory)"),
    "train_participants": ("method", "train_participants(participants=None, loss_fn=None, *, start=None, "
                                     "objective=None, epochs=None, optimizers=None, split='private') -> "
                                     "{'<name>/train/local_loss': mean}: local training (fused, interleaved or "
                                     "one after another, as the engine decided)"),
    "train_local": ("method", "train_local(participant, loss_fn=None, epochs=None, optimizer=None, "
                              "split='private') -> mean loss: one participant's local training"),
    "steps_per_epoch": ("method", "steps_per_epoch(participant, split='private') -> optimiser steps of one epoch"),
    "public_batches": ("method", "public_batches(batch=None, epochs=None, aug=None, drop_last=None): shuffled, "
                                 "normalised, augmented public batches"),
    "private_batches": ("method", "private_batches(participant, batch=None, split='private'): one shuffled "
                                  "epoch of (images, labels)"),
    "optimizer_step": ("method", "optimizer_step(opt, loss, name, term) -> bool: one step unless the loss is "
                                 "skipped (engine.on_nonfinite)"),
    "step_ok": ("method", "step_ok(loss, name, term) -> bool: False when on_nonfinite: skip_batch skips it"),
    "check_total": ("method", "check_total(value, name, term): a non-finite mean stops the job (on_nonfinite: fail)"),
    "amp": ("method", "amp(): the inference phases' autocast context (engine.bf16)"),
    "build_model": ("method", "build_model(arch, seed) -> a new model of the run's classes, norm and memory "
                              "format on ctx.device, initialised from seed"),
    "frozen_copy": ("method", "frozen_copy(model) -> a detached eval-mode copy (teachers, global models)"),
    "use_fused": ("method", "use_fused(participants) -> bool: this run trains them as one batched model"),
    "record": ("method", "record(counter): count a path taken (the fused paths' evidence, read by tests)"),
    "log": ("method", "log(metrics): training metrics of the server step, logged with the round's"),
}


class RoundContext:
    """What a method sees of the engine during a job; every name is in :data:`FIELDS` (docs/extending.md)."""

    def __init__(self, fed: Any, method: Any = None):  # fed: the engine.federation.Federation that made it
        self._fed = fed
        self.attach(method)
        self._begin(fed.round, draw=False)

    def attach(self, method: Any) -> None:
        """The method whose rounds this context runs (the engine's; not a field a method reads)."""
        self.method = method
        # a method with a server step gets the states its trained participants started from
        self._server = method is not None and has_server_step(method)

    # ------------------------------------------------------------ the participants and the round
    @property
    def participants(self) -> List[Participant]:
        return self._fed.clients

    @property
    def round(self) -> int:
        return self._fed.round

    @property
    def rounds(self) -> int:
        return self._fed.cfg.rounds

    @property
    def steps(self) -> Dict[str, int]:
        return dict(self._fed.round_steps)

    # ------------------------------------------------------------ the round's optimisers (one factory)
    @property
    def optimizer(self) -> str:
        return self._fed.cfg.optimizer

    @property
    def lr(self) -> float:
        return self._fed.optimizer_settings("local").lr

    @property
    def public_lr(self) -> float:
        return self._fed.optimizer_settings("public").lr

    @property
    def momentum(self) -> float:
        return self._fed.cfg.momentum

    @property
    def weight_decay(self) -> float:
        return self._fed.optimizer_settings("local").weight_decay

    # ------------------------------------------------------------ engine settings
    @property
    def local_epochs(self) -> int:
        return self._fed.cfg.local_epochs

    @property
    def local_batch(self) -> int:
        return self._fed.cfg.local_batch

    @property
    def public_batch(self) -> int:
        return self._fed.cfg.public_batch

    @property
    def public_aug(self) -> str:
        return self._fed.cfg.public_aug

    @property
    def eval_batch(self) -> int:
        return self._fed.cfg.eval_batch

    @property
    def public_graphs(self) -> str:
        return self._fed.cfg.public_graphs

    @property
    def recompute_budget_mb(self) -> int:
        return self._fed.cfg.recompute_budget_mb

    @property
    def device(self) -> torch.device:
        return self._fed.device

    @property
    def seed(self) -> int:
        return self._fed.seed

    @property
    def num_classes(self) -> int:
        return self._fed.num_classes

    @property
    def image_shape(self) -> Tuple[int, ...]:
        return tuple(self._fed.data.image_shape)

    @property
    def homogeneous(self) -> bool:
        return self._fed.homogeneous

    @property
    def public(self) -> Optional[torch.Tensor]:
        return self._fed.data.public

    @property
    def public_gen(self) -> torch.Generator:
        return self._fed.public_gen

    @property
    def aug_gen(self) -> torch.Generator:
        return self._fed.aug_gen

    @property
    def base_models(self):
        return self._fed.base_models

    @property
    def weighting(self) -> str:
        return self._fed.scoring.weighting

    # ------------------------------------------------------------ the round
    def _begin(self, r: int, draw: bool = True) -> None:
        """The round begins: who trains (``draw``: the round's client sample), no steps yet."""
        fed = self._fed
        self.trained: List[Participant] = round_clients(fed, r) if draw and r >= 1 else list(fed.clients)
        fed.round_steps = {}
        self._start: Dict[str, State] = {}
        self._copies: Dict[str, State] = {}
        self._logged: Dict[str, float] = {}

    def _run_round(self) -> Dict[str, float]:
        fed, method = self._fed, self.method
        if fed.pending is not None:  # eval_models: local: the last round's delivery is this round's start
            self._deliver(fed.pending)
            fed.pending = None
        self._begin(fed.round)
        metrics = dict(method.run_round(self) or {})
        if self._server:
            trained = {p.name: self._copies.get(p.name) or p.model.state_dict() for p in self.trained}
            start = {p.name: self._start[p.name] for p in self.trained if p.name in self._start}
            delivery = method.server_step(self, start, trained)
            if delivery:
                if fed.scoring.eval_models == "local":
                    fed.pending = dict(delivery)
                else:
                    self._deliver(delivery)
            self._start, self._copies = {}, {}
        method.after_round(self)
        metrics.update(self._logged)
        return metrics

    def _deliver(self, delivery: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Load each participant's delivered state (a state may leave out keys the participant keeps:
        missing keys stay as they are, unknown ones are an error); one shared model is loaded once."""
        done: Dict[int, int] = {}
        for p in self._fed.clients:
            if p.name not in delivery:
                continue
            state = delivery[p.name]
            if id(p.model) in done:
                if done[id(p.model)] != id(state):
                    raise ValueError(f"the server step delivered different states to participants sharing one "
                                     f"model ({p.name}: engine.server_model)")
                continue
            done[id(p.model)] = id(state)
            unexpected = p.model.load_state_dict(state, strict=False).unexpected_keys
            if unexpected:
                raise ValueError(f"the server step delivered {p.name} keys its model lacks: {unexpected[:3]}")

    # ------------------------------------------------------------ helpers
    def weights(self, participants: Sequence[Participant]) -> List[float]:
        return [float(p.num_private) if self.weighting == "samples" else 1.0 for p in participants]

    def average(self, states: Mapping[str, Mapping[str, torch.Tensor]]) -> State:
        by_name = {p.name: p for p in self._fed.clients}
        names = list(states)
        return weighted_average([states[n] for n in names], self.weights([by_name[n] for n in names]))

    def to_all(self, state: State) -> Dict[str, State]:
        return {p.name: state for p in self._fed.clients}

    def broadcast(self, state: Mapping[str, torch.Tensor]) -> None:
        for m in unique_models(self._fed):
            m.load_state_dict(state)

    def make_optimizer(self, model: torch.nn.Module, phase: str = "local", params=None):
        return self._fed.make_optimizer(model, phase, params)

    def _record_start(self, p: Participant, start: Optional[Mapping[str, torch.Tensor]] = None) -> None:
        if self._server and p.name not in self._start:
            self._start[p.name] = dict(start) if start is not None else {
                k: v.detach().clone() for k, v in p.model.state_dict().items()}

    def _keep_trained(self, p: Participant, shared: bool) -> None:
        if self._server and shared:  # the next participant overwrites the shared model
            self._copies[p.name] = {k: v.detach().clone() for k, v in p.model.state_dict().items()}

    def train_participants(self, participants: Optional[Sequence[Participant]] = None,
                           loss_fn: Optional[LossFn] = None, *, start: Optional[Mapping[str, torch.Tensor]] = None,
                           objective: Optional[Objective] = None, epochs: Optional[int] = None,
                           optimizers: Optional[Dict[str, Any]] = None, split: str = "private") -> Dict[str, float]:
        """Local training of ``participants`` (default ``ctx.trained``), each from ``start`` when given (one
        state for all: the participants sharing one model under engine.server_model are reloaded in turn)
        else from its own weights; ``loss_fn(participant, x, y, step)`` per batch (default cross-entropy).
        With ``objective`` (the loss written for stacked weights) the engine trains them fused where the run
        decided so (engine.fused_clients). Returns ``{"<name>/train/local_loss": mean}``."""
        fed = self._fed
        ps = list(self.trained if participants is None else participants)
        if not ps:
            return {}
        shared = len({id(p.model) for p in ps}) < len(ps)
        if objective is not None and optimizers is None and use_fused(fed, ps):
            for p in ps:
                self._record_start(p, start)
            losses, params = fused_train(fed, ps, objective, start, epochs, split)
            for p in ps:  # every batch of a fused round steps (it requires engine.on_nonfinite: fail)
                fed.round_steps[p.name] = fed.round_steps.get(p.name, 0) + (
                    self.local_epochs if epochs is None else epochs) * self.steps_per_epoch(p, split)
            if self._server and shared:
                base = start if start is not None else ps[0].model.state_dict()
                for i, p in enumerate(ps):
                    self._copies[p.name] = {k: (params[k][i] if k in params else v) for k, v in base.items()}
            return losses
        if shared:  # one working model: one participant after another, reloaded from start
            out: Dict[str, float] = {}
            for i, p in enumerate(ps):
                if i and start is not None:
                    p.model.load_state_dict(start)
                self._record_start(p, start)
                opt = (optimizers or {}).get(p.name)
                out[f"{p.name}/train/local_loss"] = fed.train_local(p, loss_fn, epochs, opt, split)
                self._keep_trained(p, shared)
            return out
        for i, p in enumerate(ps):  # distinct models: every start in place first (the first holds it already)
            if i and start is not None:
                p.model.load_state_dict(start)
            self._record_start(p, start)
        return fed.train_participants(ps, loss_fn, epochs, optimizers, split)

    def train_local(self, participant: Participant, loss_fn: Optional[LossFn] = None, epochs: Optional[int] = None,
                    optimizer=None, split: str = "private") -> float:
        """One participant's local training (``epochs`` of its ``split``), from its current weights."""
        self._record_start(participant)
        out = self._fed.train_local(participant, loss_fn, epochs, optimizer, split)
        self._keep_trained(participant, sum(p.model is participant.model for p in self._fed.clients) > 1)
        return out

    def steps_per_epoch(self, participant: Participant, split: str = "private") -> int:
        return steps_per_epoch(len(participant.data.get(split)[1]), self._fed.cfg.local_batch)

    def public_batches(self, batch: Optional[int] = None, epochs: Optional[int] = None, aug: Optional[str] = None,
                       drop_last: Optional[bool] = None) -> Iterator[torch.Tensor]:
        return self._fed.public_batches(batch, epochs, aug, drop_last)

    def private_batches(self, participant: Participant, batch: Optional[int] = None, split: str = "private"):
        return self._fed.private_batches(participant, batch, split)

    def optimizer_step(self, opt, loss: torch.Tensor, name: str, term: str) -> bool:
        return self._fed.optimizer_step(opt, loss, name, term)

    def step_ok(self, loss: torch.Tensor, name: str, term: str) -> bool:
        return self._fed.step_ok(loss, name, term)

    def check_total(self, value: float, name: str, term: str) -> None:
        self._fed.check_total(value, name, term)

    def amp(self) -> contextlib.AbstractContextManager:
        return self._fed.amp()

    def build_model(self, arch: str, seed: int) -> torch.nn.Module:
        from ..models import create_model

        cfg = self._fed.cfg
        kwargs = {} if cfg.norm == "default" else {"norm": cfg.norm}
        with torch.random.fork_rng(devices=[]):  # its own stream: every other initialisation unchanged
            torch.manual_seed(seed)
            model = create_model(arch, num_classes=self.num_classes, in_channels=self.image_shape[0], **kwargs)
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        return model.to(self.device, memory_format=fmt)  # type: ignore[call-overload]  # Module.to takes it

    def frozen_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        return frozen_copy(model)

    def use_fused(self, participants: Sequence[Participant]) -> bool:
        return use_fused(self._fed, participants)

    def record(self, counter: str) -> None:
        setattr(self._fed, counter, getattr(self._fed, counter, 0) + 1)

    def log(self, metrics: Mapping[str, float]) -> None:
        self._logged.update(metrics)


def has_server_step(method: Any) -> bool:
    """Whether ``method``'s class overrides the default (no-op) ``server_step`` of its base (the last class of
    its MRO that defines one)."""
    owners = [k for k in type(method).__mro__ if "server_step" in vars(k)]
    return len(owners) > 1 and vars(owners[0])["server_step"] is not vars(owners[-1])["server_step"]

