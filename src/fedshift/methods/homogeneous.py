"""Homogeneous mode of the heterogeneous methods: optional parameter averaging in the round.

FCCL+ (TPAMI § 4.4, Table XV) and FCCL (CVPR § 4.1, Table 3) run their heterogeneous
methods on one shared architecture too, adding "the model parameter averaging
operation between collaborative updating and local updating" to *every* method of
the table (FedMD, RCFL and FML included: :class:`ParameterAveraging`). The authors'
code puts it at different places: FCCL+ (and its FedDF baseline) average *before*
local updating (``fccl+/models/fcclplus.py:132-134``, ``feddf.py:71-73``); FCCL's
``fccl+/models/fccl.py:106-113`` averages *after* local updating (having first saved
the local models as next round's teachers). Both average with uniform weights
(``aggregate_nets(None)``, ``fccl+/models/utils/federated_model.py:56-57``). The
participants are scored right after local updating (``fccl+/utils/training.py:139-144``),
so FCCL's code position would score one shared model, yet the printed FCCL row of
Table XV is per-participant (Digits M->: inter 77.18 where one shared model gives the
others' intra mean, 88.31): FCCL's default is therefore ``before_local`` too and the
code's position is the named variant ``fccl_avg_after`` (docs/fccl.md).

:class:`AveragingMethod` is the base of such methods. Its ``run_round`` is

    collaborate -> [average: before_local] -> local_update -> [average: after_local] -> after_round

and the key ``homogeneous_averaging`` of the method's Params chooses the position:

* ``auto`` (default): average only when every participant has the same architecture
  (``ctx.homogeneous``), at the position of the method's paper (``paper_averaging``);
  heterogeneous runs are untouched;
* ``none``: never average (heterogeneous behaviour on a shared architecture);
* ``before_local`` / ``after_local``: force a position; asking for it on a
  heterogeneous federation is a :class:`~fedshift.errors.ConfigError`.

When averaging, every participant starts from participant 0's weights (the authors'
code, for a random or a BASE start alike). The method's Params must also have
``averaging_weights`` (``uniform`` as the authors' code, or ``samples`` as FedAvg)
and ``fresh_optimizer`` (used by
:meth:`AveragingMethod.public_optimizer`, shared by the public-data methods).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional

import torch
from torch import Tensor

from ..engine.cpu import release_memory
from ..errors import ConfigError
from .base import Method
from .common import average_models

AVERAGING = ("auto", "none", "before_local", "after_local")


def averaging_position(setting: str, homogeneous: bool, paper_position: str, method: str) -> Optional[str]:
    """Resolve ``homogeneous_averaging`` to ``"before_local"``, ``"after_local"`` or None (no averaging)."""
    if setting not in AVERAGING:
        raise ConfigError(f"methods.{method}.homogeneous_averaging: invalid value {setting!r}; "
                          f"valid: {', '.join(AVERAGING)}")
    if setting == "none":
        return None
    if setting == "auto":
        return paper_position if homogeneous else None
    if not homogeneous:
        raise ConfigError(f"methods.{method}.homogeneous_averaging: {setting!r} averages parameters, which needs "
                          "one shared architecture, but the participants' architectures differ; use a "
                          "homo_<model> structure or homogeneous_averaging: auto|none")
    return setting


def sync_start(ctx) -> None:
    """Give every participant participant 0's weights (one global start, as FedAvg and the authors' code)."""
    state = ctx.participants[0].model.state_dict()
    for c in ctx.participants[1:]:
        c.model.load_state_dict(state)


class ParameterAveraging(Method):
    """A :class:`~fedshift.methods.base.Method` whose round may average the
    participants' parameters before or after local updating. Needs the Params keys
    ``homogeneous_averaging`` and ``averaging_weights``; call :meth:`resolve_averaging` in ``setup``.
    FedMD, RCFL and FML use it alone (they keep no public optimisers); :class:`AveragingMethod` adds those."""

    #: where the method's paper / authors' code averages in homogeneous mode
    paper_averaging: ClassVar[str] = "before_local"

    averaging: Optional[str] = None  # resolved position (None: no averaging)

    def resolve_averaging(self, ctx) -> None:
        """Resolve the position; when averaging, every participant starts from participant 0's weights.

        The authors' code does so in homogeneous mode whatever the start (random or
        BASE); averaging independent initialisations would shrink the weights.
        """
        self.averaging = averaging_position(self.p.homogeneous_averaging, ctx.homogeneous, self.paper_averaging,
                                            self.name)
        if self.averaging:
            sync_start(ctx)

    def average(self, ctx) -> None:
        average_models(ctx.participants, self.p.averaging_weights)

    def run_round(self, ctx) -> Dict[str, float]:
        metrics = dict(self.collaborate(ctx) or {})
        if self.averaging == "before_local":
            self.average(ctx)
        metrics.update(self.local_update(ctx) or {})
        if self.averaging == "after_local":
            self.average(ctx)
        return metrics  # the engine then runs after_round


class AveragingMethod(ParameterAveraging, Method):
    """A public-data method whose round may average parameters before or after local updating."""

    def setup_averaging(self, ctx) -> None:
        """:meth:`ParameterAveraging.resolve_averaging`, and the public-phase optimisers' table."""
        self._ctx = ctx
        self._public_opts: Dict[str, torch.optim.Optimizer] = {}
        self.resolve_averaging(ctx)

    def setup(self, ctx) -> None:
        self.setup_averaging(ctx)

    def state_dict(self) -> Dict[str, Any]:
        """The public-phase optimisers' states when they persist (``fresh_optimizer: false``); a fresh
        optimiser per batch carries nothing across rounds (a new one equals a cleared one)."""
        if self.p.fresh_optimizer:
            return {"public_opts": {}}
        return {"public_opts": {name: opt.state_dict() for name, opt in self._public_opts.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        by_name = {c.name: c for c in self._ctx.participants}
        self._public_opts = {}
        for name, sd in state["public_opts"].items():
            opt = self._public_opts[name] = self._ctx.make_optimizer(by_name[name].model, "public")
            opt.load_state_dict(sd)

    def public_optimizer(self, ctx, c):
        """Participant ``c``'s public-phase optimiser at this round's learning rate.

        One optimiser object per participant, made on first use. With the Params key
        ``fresh_optimizer`` (the authors' code builds a new Adam for every public
        batch) its state is cleared on every call, which is exactly a new optimiser
        (Adam's moments and step counter restart at zero) without rebuilding it; the
        learning rate follows ``engine.lr_decay`` round by round either way.
        """
        opt = self._public_opts.get(c.name)
        if opt is None:
            opt = self._public_opts[c.name] = ctx.make_optimizer(c.model, "public")
            return opt
        if self.p.fresh_optimizer:
            opt.state.clear()
        lr = ctx.public_lr  # this round's, as ctx.make_optimizer(model, "public")
        for g in opt.param_groups:
            g["lr"] = lr
        return opt

    def public_step(self, ctx, batch_losses: Callable[[Tensor], List[Tensor]], key: str,
                    aug: Optional[str] = None) -> Dict[str, float]:
        """One collaborative pass over the public set.

        For every public batch ``xb``, ``batch_losses(xb)`` returns one loss per participant,
        all computed from outputs taken before any update (the authors' order: every
        participant's logits first, then the updates one after another); each participant
        then steps on its own loss. Returns the mean loss per participant as
        ``<participant>/train/<key>`` (one host sync per round). ``aug`` overrides
        ``engine.public_aug`` (``"none"``: raw batches, for methods that augment themselves).
        """
        clients = ctx.participants
        totals = torch.zeros(len(clients), device=ctx.device)
        steps = 0
        for xb in ctx.public_batches(aug=aug):
            for i, (c, loss) in enumerate(zip(clients, batch_losses(xb))):
                if not ctx.step_ok(loss, c.name, key):
                    continue
                opt = self.public_optimizer(ctx, c)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                totals[i] += loss.detach()
            steps += 1
        release_memory()  # engine.malloc_trim
        means = (totals / max(steps, 1)).tolist()
        for c, v in zip(clients, means):
            ctx.check_total(v, c.name, key)
        return {f"{c.name}/train/{key}": v for c, v in zip(clients, means)}

    def public_step_one_graph(self, ctx, forward: Callable, losses: Callable, key: str) -> Dict[str, float]:
        """:meth:`public_step` with at most one participant's autograd graph alive (``engine.public_graphs: one``).

        ``forward(c, xb)`` gives participant ``c``'s outputs (tensors or tuples of them)
        and ``losses(outs)`` every participant's loss from the list of outputs, as
        :meth:`public_step`'s ``batch_losses`` would. Per public batch, participants
        0..K-2 first run without a graph (their outputs only feed the detached
        targets), the last one with its graph, as does each participant whose blocks
        are checkpointed at this batch (``engine.recompute``: its graph keeps only the
        blocks' inputs) while the kept graphs fit ``engine.recompute_budget_mb``; those step; then each other participant runs again with its
        graph and steps. The second pass sees the random state
        (dropout) and the BatchNorm running statistics its first pass saw and leaves
        the running statistics as one pass would, so the losses, gradients and updates
        are those of :meth:`public_step`, at the price of (at most) K-1 more forward passes.
        """
        clients = ctx.participants
        cuda = ctx.device.type == "cuda"
        totals = torch.zeros(len(clients), device=ctx.device)
        steps = 0

        def rng_state():
            return torch.get_rng_state(), (torch.cuda.get_rng_state(ctx.device) if cuda else None)

        def set_rng_state(state):
            torch.set_rng_state(state[0])
            if cuda:
                torch.cuda.set_rng_state(state[1], ctx.device)

        def step(i: int, outs: List) -> None:
            opt = self.public_optimizer(ctx, clients[i])
            loss = losses(outs)[i]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            totals[i] += loss.detach()

        for xb in ctx.public_batches():
            last = len(clients) - 1
            # Kept from the first pass: the last participant's graph, and that of each participant whose
            # blocks are checkpointed at this batch (engine.recompute) while the kept graphs fit the budget:
            # its graph holds only the blocks' inputs, so running it once with the graph replaces the
            # graph-free pass and the rerun.
            keep = _kept_graphs(clients, len(xb), ctx.recompute_budget_mb)
            states: List[Any] = []
            buffers: List[Optional[List[torch.Tensor]]] = []
            outs: List[Any] = []
            for i, c in enumerate(clients):
                states.append(rng_state())
                if keep[i]:
                    buffers.append(None)
                    outs.append(forward(c, xb))
                else:
                    buffers.append([b.detach().clone() for b in c.model.buffers()])
                    with torch.no_grad():
                        outs.append(forward(c, xb))
            after = rng_state()
            detached = [_detach(o) for o in outs]
            for i in (i for i in range(len(clients)) if keep[i]):
                step(i, detached[:i] + [outs[i]] + detached[i + 1:])
                outs[i] = None  # its graph is freed once it has stepped
            del outs
            for i in (i for i in range(last) if not keep[i]):
                c = clients[i]
                with torch.no_grad():
                    for b, saved in zip(c.model.buffers(), buffers[i] or []):
                        b.copy_(saved)
                set_rng_state(states[i])
                step(i, detached[:i] + [forward(c, xb)] + detached[i + 1:])
            set_rng_state(after)
            steps += 1
        release_memory()  # engine.malloc_trim
        means = (totals / max(steps, 1)).tolist()
        return {f"{c.name}/train/{key}": v for c, v in zip(clients, means)}

def _kept_graphs(clients, batch: int, budget_mb: int) -> List[bool]:
    """Which participants keep their graph from the first pass of the one-graph step: the last one, and
    each checkpointed one (in order) while the kept graphs' counted activations stay within ``budget_mb``
    (``engine.recompute_budget_mb``; 0: no cap)."""
    last = len(clients) - 1
    keep = [i == last for i in range(len(clients))]
    held = _graph_mb(clients[last].model, batch)
    for i in range(last):
        model = clients[i].model
        if _checkpointed(model, batch):
            mb = _graph_mb(model, batch)
            if budget_mb <= 0 or held + mb <= budget_mb:
                keep[i], held = True, held + mb
    return keep


def _graph_mb(model, batch: int) -> float:
    graph_mb = getattr(model, "graph_mb", None)
    return float(graph_mb(batch)) if callable(graph_mb) else 0.0


def _checkpointed(model, batch: int) -> bool:
    """Whether ``model``'s training forward at ``batch`` runs its blocks checkpointed (engine.recompute)."""
    recomputes = getattr(model, "recomputes", None)
    return bool(recomputes(batch)) if callable(recomputes) and model.training and torch.is_grad_enabled() else False


def _detach(out):
    """Detach a tensor or a tuple/list of tensors."""
    if isinstance(out, (tuple, list)):
        return type(out)(_detach(o) for o in out)
    return out.detach()
