"""Helpers several methods share, so no method file borrows from a sibling method's file.

* :func:`average_models` - the server average loaded into every participant (FedAvg, the
  averaging family of ``homogeneous.py``);
* :func:`refresh_copy`, :func:`model_state`, :func:`frozen_from_state` - frozen teacher copies
  reused across rounds and their checkpointed form (FCCL, MOON, FML);
* :class:`PublicOptimizerState` - persistent public-data optimisers as method state (RHFL, FedMatch);
* :func:`digest` - train one participant toward per-image targets on the public set (FedMD's
  digest, RCFL's distillation);
* :func:`holding_data` - the participants of a round that hold private images (the others named in a warning).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from ..data.loading import normalize
from ..engine.averaging import weighted_average
from ..engine.federation import frozen_copy
from .base import Method


def average_models(clients, weighting: str = "samples") -> Dict[str, torch.Tensor]:
    """Average the clients' models into one state dict and load it into every client."""
    states = [c.model.state_dict() for c in clients]
    weights: List[float] = [c.num_private if weighting == "samples" else 1.0 for c in clients]
    avg = weighted_average(states, weights)
    for c in clients:
        c.model.load_state_dict(avg)
    return avg


def holding_data(clients: Sequence, method: str, r: int, what: str) -> List:
    """The ``clients`` that hold private images. The others train nothing and so have nothing to send (``what``);
    one warning per round names them (issue 51 R28/R32: FedProto stopped with a KeyError, FDSE's fair
    aggregation took their zero update as the min-norm direction and never moved)."""
    empty = [c.name for c in clients if not c.num_private]
    if empty:
        logging.getLogger("fedshift.methods").warning(
            "%s round %d: participant(s) %s hold no private images: %s; rebuild the partition so every "
            "participant holds data", method, r, ", ".join(empty), what)
    return [c for c in clients if c.num_private]


def refresh_copy(dst: Optional[torch.nn.Module], src: torch.nn.Module) -> torch.nn.Module:
    """Copy ``src``'s weights and buffers into the frozen copy ``dst`` (made on first use).

    Reusing the copy avoids a ``deepcopy`` per round; the copy keeps its eval mode
    and ``requires_grad=False``.
    """
    if dst is None:
        return frozen_copy(src)
    with torch.no_grad():
        for d, s in zip(dst.state_dict().values(), src.state_dict().values()):
            d.copy_(s)
    return dst


def cpu_copy(tensors: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Detached CPU copies of named tensors (for a method's state_dict: checkpoints are read on the CPU)."""
    return {k: v.detach().cpu().clone() for k, v in tensors.items()}


def model_state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Detached CPU copies of a model's weights and buffers (for a method's state_dict)."""
    return cpu_copy(model.state_dict())


def frozen_from_state(like: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """A frozen copy of ``like``'s architecture holding ``state``."""
    m = frozen_copy(like)
    m.load_state_dict(state)
    return m


class PublicOptimizerState(Method):
    """Mixin for :class:`AveragingMethod` subclasses (first in the bases): the persistent public
    optimisers as state.

    With ``fresh_optimizer`` the optimisers hold nothing across batches; without it
    their Adam moments live across rounds and go into the method's state.
    """

    _public_opts: Dict[str, Any]  # participant name -> its public optimiser

    def optimizer_state(self) -> Dict[str, Any]:
        if self.p.fresh_optimizer:
            return {}
        return {name: opt.state_dict() for name, opt in self._public_opts.items()}

    def load_optimizer_state(self, ctx, state: Mapping[str, Any]) -> None:
        self._public_opts = {}
        by_name = {c.name: c for c in ctx.participants}
        for name, s in state.items():
            if name not in by_name:
                raise ValueError(f"{self.name} state: unknown participant {name!r}; valid: {sorted(by_name)}")
            opt = self._public_opts[name] = ctx.make_optimizer(by_name[name].model, "public")
            opt.load_state_dict(s)


def digest(ctx, c, x_all: torch.Tensor, targets: torch.Tensor, loss_fn, epochs: int, key: str) -> float:
    """Train participant ``c`` for ``epochs`` passes over ``x_all`` (public images) toward
    ``targets`` (one row per image) with ``loss_fn(logits, target_rows)``, batches of
    ``engine.public_batch`` in a fresh order per pass (``c.generator``), on a fresh public
    optimiser; non-finite losses follow ``engine.on_nonfinite``. Returns the mean loss.
    FedMD's digest and RCFL's distillation share it."""
    opt = ctx.make_optimizer(c.model, "public")
    c.model.train()
    batch = ctx.public_batch
    total, steps = torch.zeros((), device=ctx.device), 0
    for _ in range(epochs):
        order = torch.randperm(len(x_all), generator=c.generator).to(x_all.device)
        for s in range(0, len(x_all), batch):
            sel = order[s:s + batch]
            if len(sel) < 2:  # BatchNorm cannot train on one sample
                continue
            loss = loss_fn(c.model(normalize(x_all[sel])), targets[sel.to(targets.device)])
            if not ctx.optimizer_step(opt, loss, c.name, key):
                continue
            total += loss.detach()
            steps += 1
    mean = float(total / max(steps, 1))
    ctx.check_total(mean, c.name, key)
    return mean
