"""Method base class and the SOLO/BASE method.

A federated method overrides only the hooks that differ (Flower / FLGo style). Every hook receives the
round context ``ctx`` (:class:`fedshift.engine.context.RoundContext`, docs/extending.md "The round
context"), the one door from the engine to a method:

* ``Params``: a dataclass of hyper-parameters with commented defaults;
* ``setup(ctx)``: once, after models are built (and BASE checkpoints loaded);
* ``collaborate(ctx)``: the collaborative step of round ``ctx.round`` (public data...); nothing by default;
* ``local_loss(ctx, participant, x, y, step)``: the batch loss of local updating (CE);
* ``local_update(ctx)``: local training of ``ctx.trained``;
* ``server_step(ctx, start, trained)``: the server, after local training, under every scoring protocol:
  the states each trained participant started from and ended with in, the server's delivery out
  (participant name -> state, or None); the engine loads it now or at the next round's start, as the
  grid's scoring protocol says, so no method asks which models are scored;
* ``after_round(ctx)``: bookkeeping (teachers, figure data);
* declared capabilities (``supports_sampling``, ``supports_server_model``, ``per_client_state``,
  ``fused_auto_devices``, ``requires``) and optional hooks (``fused_objective``, ``prototype_scores``,
  ``run_summary``, ``artifacts``), each with its default on :class:`Method` (docs/extending.md);
* ``state_dict()`` / ``load_state_dict(state)``: every piece of per-method and per-client
  state that lives across rounds (teachers, previous-round models, snapshots, prototypes,
  anchors, control variates, EMA values...), so an interrupted run resumes bit-identically.
  Values are tensors, numbers, strings and nested dicts/lists of them (loadable with
  ``torch.load(weights_only=True)``); the participants' own weights (and the server's pending
  delivery) are saved by the engine. The default holds nothing: a stateless method overrides neither.

How a run is scored (which models, the server's weighting, the metrics, prediction by prototypes) is the
grid's ``scoring:`` block (:mod:`fedshift.scoring`), never a method's.

``base`` (SOLO/BASE, FCCL+ Tables VIII-IX first row) trains each participant on its
private data alone: no collaboration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, Literal, Mapping, Optional, Tuple, Type

import torch
import torch.nn.functional as F

from ..config import resolve
from ..engine.config import ScoringConfig
from ..registry import Registry

State = Dict[str, torch.Tensor]

METHODS: "Registry[Type[Method]]" = Registry(
    "method", group="fedshift.methods",
    check=lambda obj: "" if isinstance(obj, type) and issubclass(obj, Method) else "not a subclass of fedshift.methods.Method")


#: Keys a method's Params no longer take: how a run is scored is the grid's (issue 49); config.resolve
#: answers a grid that still sets one with one line naming the new place (``scoring.<key>``).
MOVED_TO_SCORING: Dict[str, str] = {
    key: f"the grid's scoring.{key} (scoring: is one protocol for every row of a report table)"
    for key in ScoringConfig.former_method_keys}


@dataclass(frozen=True)
class BaseParams:
    init: Literal["scratch", "base"] = "scratch"  # start from random weights or the BASE (SOLO) checkpoints

    moved_keys: ClassVar[Dict[str, str]] = MOVED_TO_SCORING


@dataclass(frozen=True)
class ServerParams(BaseParams):
    """What every server-averaging method (FedAvg and its family, plugins included) is configured by;
    a method's own Params extend it with their fields (``class FedAvgMParams(ServerParams): beta: ...``).
    Which models are scored and how the server weighs participants are the grid's ``scoring:``."""


@dataclass(frozen=True)
class Requirements:
    """What a method needs of the engine and the data, checked by ``fedshift validate`` (and the workflow's
    planning) before any job, one line naming the method and the requirement (:func:`check_requirements`)."""

    optimizer: Optional[str] = None  # the engine.optimizer its arithmetic is derived for ("sgd" / "adam")
    momentum: Optional[float] = None  # the engine.momentum it needs (SCAFFOLD's controls: 0, plain SGD)
    public: bool = False  # an unlabeled public set (the grid block's `public:`)
    base: bool = False  # the BASE (SOLO) checkpoints: a start or a teacher


def check_requirements(name: str, req: Requirements, engine, public: str, norms: Tuple[str, str] = ("", "")) -> None:
    """Raise ConfigError (one line) when the job's engine settings or data miss what ``req`` asks."""
    from ..errors import ConfigError

    if req.optimizer is not None and engine.optimizer != req.optimizer:
        raise ConfigError(f"method {name!r} requires engine.optimizer: {req.optimizer} (its update rule is derived "
                          f"for it), the grid sets {engine.optimizer}")
    if req.momentum is not None and engine.momentum != req.momentum:
        raise ConfigError(f"method {name!r} requires engine.momentum: {req.momentum:g} (its update rule assumes "
                          f"plain SGD steps), the grid sets {engine.momentum:g}")
    if req.public and public == "none":
        raise ConfigError(f"method {name!r} requires an unlabeled public set: add `public:` to the grid block")
    if req.base and norms[0] != norms[1]:
        raise ConfigError(f"method {name!r} requires the BASE checkpoints, but engine.norm ({norms[0]!r}) differs "
                          f"from pretrain.norm ({norms[1]!r}), which trains them; make them equal")


class Method:
    name: ClassVar[str] = "base"
    Params: ClassVar[type] = BaseParams
    requires_homogeneous: ClassVar[bool] = False  # parameter averaging needs one shared architecture
    uses_public: bool = False  # needs the unlabeled public set (an instance may decide from its params: FedMD)
    # Memory profile, read by fedshift.resources (what SLURM is asked for): copies of each
    # participant's weights the method keeps beyond the model itself (teachers, the previous or
    # global model, EMA/intra copies); how many participants' public-step autograd graphs the
    # model counts at once ("one", "all", or "engine": engine.public_graphs decides); and whether
    # one training step runs a model on every peer's batch (FedH2L's mutual step).
    weight_copies: ClassVar[int] = 1
    public_graphs: ClassVar[str] = "one"
    steps_on_peer_batches: ClassVar[bool] = False
    # Per-scenario defaults that differ from the dataclass (paper or authors' code), applied
    # before the user's overrides; e.g. FCCL+ uses omega = 1 on Office-Home.
    scenario_defaults: ClassVar[Dict[str, Dict[str, Any]]] = {}

    # -- what the engine may do with the method (read by engine.sampling, engine.fused, resources) ----
    # Read-only properties here, so a subclass answers with a class attribute (``supports_sampling = True``)
    # or a property of the instance and a type checker accepts both.
    @property
    def supports_sampling(self) -> bool:
        """Honours engine.clients_per_round / client_fraction (only some participants train in a round)."""
        return False

    @property
    def supports_server_model(self) -> bool:
        """Runs with engine.server_model (one working model shared by every client: memory flat in K)."""
        return False

    @property
    def per_client_state(self) -> str:
        """Why sampling or a shared model is refused, in a few words ('' = the generic reason)."""
        return ""

    #: devices on which engine.fused_clients: auto fuses this method's clients (None: every device)
    fused_auto_devices: Optional[Tuple[str, ...]] = None
    #: what it needs of the engine beyond the defaults (an optimiser kind, a momentum); public data and the
    #: BASE checkpoints are read off ``uses_public`` and ``needs_base`` (:meth:`requirements`)
    requires: ClassVar[Requirements] = Requirements()

    def __init__(self, params):
        self.p = params

    @classmethod
    def needs_base(cls, params) -> bool:
        """Whether a job with these params needs the BASE (SOLO) checkpoints: to start from
        (``init: base``) or as a teacher (the runner then puts them in ``ctx.base_models``)."""
        return getattr(params, "init", "scratch") == "base"

    def requirements(self) -> Requirements:
        """Everything this method (with its params) needs, checked before any job (:func:`check_requirements`)."""
        r = self.requires
        return Requirements(r.optimizer, r.momentum, r.public or self.uses_public, r.base or self.needs_base(self.p))

    # -- hooks ---------------------------------------------------------------
    def setup(self, ctx) -> None:
        pass

    def collaborate(self, ctx) -> Dict[str, float]:
        return {}

    def local_loss(self, ctx, client, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        return F.cross_entropy(client.model(x), y)

    def local_update(self, ctx) -> Dict[str, float]:
        # One participant after another, or interleaved on CUDA streams (engine.overlap_participants).
        return ctx.train_participants(loss_fn=lambda cl, x, y, s: self.local_loss(ctx, cl, x, y, s))

    def server_step(self, ctx, start: Mapping[str, State], trained: Mapping[str, State]) -> Optional[Dict[str, State]]:
        """The server after local training, under every scoring protocol: ``start[name]`` / ``trained[name]``
        are the states each participant of ``ctx.trained`` started local training from and ended it with;
        returns participant name -> the state it receives (``ctx.to_all(state)``: one for everyone), or None
        (no server: every participant keeps its model). The default: no server."""
        return None

    def after_round(self, ctx) -> None:
        pass

    @property
    def init_from(self) -> str:
        """Where the participants' weights start: 'scratch' or 'base' (the BASE checkpoints), ``Params.init``."""
        return getattr(self.p, "init", "scratch")

    # -- optional hooks (the defaults do nothing) --------------------------------------------------
    #: ``fused_objective(ctx) -> engine.fused.Objective``: the local loss written for stacked weights, so
    #: engine.fused_clients can train every client in one vmapped call; None = cannot be fused.
    fused_objective: Optional[Callable[[Any], Any]] = None

    def prototype_scores(self, features: torch.Tensor) -> Optional[torch.Tensor]:
        """Class scores (B, C) of a participant's features under ``scoring.predict: prototype`` (the nearest of
        the method's prototypes scores highest), or None: the classifier predicts. Default: no prototypes."""
        return None

    def run_summary(self, ctx) -> Dict[str, Any]:
        """Extra numbers for the run's metrics.json at the end (e.g. FedH2L's communication bytes)."""
        return {}

    def artifacts(self, out_dir: Path) -> None:
        """Write extra files into the run folder being published (e.g. FCCL's figure data)."""

    # -- resumable state -----------------------------------------------------------
    #: attributes holding state across rounds (tensors, numbers, strings, dicts/lists of them): the default
    #: state_dict() / load_state_dict() save and restore exactly these (set them in setup)
    state_attrs: ClassVar[Tuple[str, ...]] = ()

    def state_dict(self) -> Dict[str, Any]:
        """State that must survive a checkpoint/resume (default: the ``state_attrs``; none)."""
        return {k: getattr(self, k) for k in self.state_attrs}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (called after ``setup``)."""
        unknown = sorted(set(state or {}) - set(self.state_attrs))
        if unknown:
            raise ValueError(f"method {self.name!r} keeps {list(self.state_attrs) or 'no state'} but the checkpoint "
                             f"holds {unknown}")
        for k in self.state_attrs:
            if k in state:
                setattr(self, k, state[k])

    def run_round(self, ctx) -> Dict[str, float]:
        """The participants' part of a round (``collaborate``, then ``local_update``); the engine then runs
        :meth:`server_step` and :meth:`after_round`. Returns training metrics (losses) for tracking."""
        metrics = dict(self.collaborate(ctx) or {})
        metrics.update(self.local_update(ctx) or {})
        return metrics

    @classmethod
    def has_prototypes(cls) -> bool:
        """Whether the class overrides :meth:`prototype_scores` (``scoring.predict: prototype`` needs it)."""
        return cls.prototype_scores is not Method.prototype_scores


@METHODS.register("base")
class Base(Method):
    """SOLO/BASE: every participant trains on its own private data only (no communication)."""

    name = "base"
    weight_copies = 0  # one model per participant, nothing else


def create_method(name: str, overrides: Optional[Mapping[str, Any]] = None, scenario: Optional[str] = None,
                  where: Optional[str] = None) -> Method:
    cls = METHODS.get(name, key="method")
    return cls(resolve_method_params(name, overrides, scenario, where))


def resolve_method_params(name: str, overrides: Optional[Mapping[str, Any]] = None,
                          scenario: Optional[str] = None, where: Optional[str] = None):
    """Dataclass defaults < the method's per-scenario defaults < the user's overrides."""
    cls = METHODS.get(name, key="method")
    merged = dict(cls.scenario_defaults.get(scenario or "", {}))
    merged.update(overrides or {})
    return resolve(cls.Params, merged, where or f"methods.{name}")
