"""Method base class and the SOLO/BASE method.

A federated method overrides only the hooks that differ (Flower / FLGo style):

* ``Params``: a dataclass of hyper-parameters with commented defaults;
* ``setup(fed)``: once, after models are built (and BASE checkpoints loaded);
* ``collaborate(fed, r)``: the collaborative step of round ``r`` (public data,
  parameter averaging...); the base class does nothing;
* ``local_loss(fed, client, x, y, step)``: the batch loss of local updating (CE);
* ``local_update(fed, r)``: runs local updating for every client;
* ``after_round(fed, r)``: bookkeeping (teachers, global models);
* declared capabilities (``supports_sampling``, ``supports_server_model``, ``per_client_state``,
  ``fused_auto_devices``) and optional hooks (``fused_objective``, ``run_summary``, ``artifacts``),
  each with its default on :class:`Method` (docs/extending.md);
* ``state_dict()`` / ``load_state_dict(state)``: every piece of per-method and per-client
  state that lives across rounds (teachers, previous-round models, snapshots, prototypes,
  anchors, server models, EMA values...), so an interrupted run resumes bit-identically.
  Values are tensors, numbers, strings and nested dicts/lists of them (loadable with
  ``torch.load(weights_only=True)``); the participants' own weights are saved by the
  engine. The default holds nothing: a stateless method overrides neither.

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
from ..registry import Registry

METHODS: "Registry[Type[Method]]" = Registry(
    "method", group="fedshift.methods",
    check=lambda obj: "" if isinstance(obj, type) and issubclass(obj, Method) else "not a subclass of fedshift.methods.Method")


@dataclass(frozen=True)
class BaseParams:
    init: Literal["scratch", "base"] = "scratch"  # start from random weights or the BASE (SOLO) checkpoints


@dataclass(frozen=True)
class ServerParams(BaseParams):
    """What every server-averaging method (FedAvg and its family, plugins included) is configured by;
    a method's own Params extend it with their fields (``class FedAvgMParams(ServerParams): beta: ...``)."""

    weighting: Literal["samples", "uniform"] = "samples"  # McMahan 2017: weight client k by n_k
    # global: score the round-end average (McMahan); local: average at the round's start, score each
    # participant after local updating (FCCL+ authors' code, Table XV / CVPR Table 3; methods.fedavg docstring)
    eval_models: Literal["global", "local"] = "global"


#: The keys of ServerParams that make a protocol: a table compares server-averaging rows fairly only
#: when they agree on these (params/experiments.yaml's scenario_overrides set them per scenario).
PROTOCOL_KEYS: Tuple[str, ...] = ("eval_models", "weighting")


def server_family(cls: Type["Method"]) -> bool:
    """Whether a method class belongs to the server-averaging (FedAvg) family: its Params extend
    :class:`ServerParams` (plugins included). A scenario's protocol override reaches the whole family."""
    return issubclass(cls.Params, ServerParams)


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
    # or a property of the instance (FedAvg's depend on eval_models) and a type checker accepts both.
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

    def __init__(self, params):
        self.p = params

    @classmethod
    def needs_base(cls, params) -> bool:
        """Whether a job with these params needs the BASE (SOLO) checkpoints: to start from
        (``init: base``) or as a teacher (the runner then puts them in ``fed.base_models``)."""
        return getattr(params, "init", "scratch") == "base"

    # -- hooks ---------------------------------------------------------------
    def setup(self, fed) -> None:
        pass

    def collaborate(self, fed, r: int) -> Dict[str, float]:
        return {}

    def local_loss(self, fed, client, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        return F.cross_entropy(client.model(x), y)

    def local_update(self, fed, r: int) -> Dict[str, float]:
        # One participant after another, or interleaved on CUDA streams (engine.overlap_participants).
        return fed.train_participants(loss_fn=lambda cl, x, y, s: self.local_loss(fed, cl, x, y, s))

    def after_round(self, fed, r: int) -> None:
        pass

    @property
    def init_from(self) -> str:
        """Where the participants' weights start: 'scratch' or 'base' (the BASE checkpoints), ``Params.init``."""
        return getattr(self.p, "init", "scratch")

    @property
    def eval_protocol(self) -> str:
        """Which model an evaluation scores: 'global' (the server's average) or 'local' (each participant's
        own, after local updating), ``Params.eval_models``; 'global' for a method without that key."""
        return getattr(self.p, "eval_models", "global")

    # -- optional hooks (the defaults do nothing) --------------------------------------------------
    #: ``fused_objective(fed) -> engine.fused.Objective``: the local loss written for stacked weights, so
    #: engine.fused_clients can train every client in one vmapped call; None = cannot be fused.
    fused_objective: Optional[Callable[[Any], Any]] = None

    def run_summary(self, fed) -> Dict[str, Any]:
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

    def run_round(self, fed, r: int) -> Dict[str, float]:
        """One communication round; returns training metrics (losses) for tracking."""
        metrics = dict(self.collaborate(fed, r) or {})
        metrics.update(self.local_update(fed, r) or {})
        self.after_round(fed, r)
        return metrics


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
