"""The federation: participants (model + data), the public set, and one round of a method.

Knows nothing of MLflow, DVC or Snakemake: it returns per-round records, which the
runner reports through a tracker. A method never sees this object: it sees the
federation's :class:`~fedshift.engine.context.RoundContext` (``fed.ctx``, docs/extending.md
"The round context"), made by :meth:`Federation.setup`; :meth:`Federation.run_round` runs one
round (the method's part, its server step, the delivery the scoring protocol times).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..data.augment import augment
from ..data.loading import FederatedData, normalize
from ..errors import NonFiniteError
from ..models import FedModel
from .config import EngineConfig, ScoringConfig, recompute_on
from .context import RoundContext
from .participants import Client, LossFn, Participant, frozen_copy, steps_per_epoch  # noqa: F401  (the engine's names)
from .cpu import autocast, release_memory
from .evaluation import EvalSuite, evaluate_suite, inference_levers, intra_inter
from .levers import EngineLevers, drive, slot_device

log = logging.getLogger(__name__)


def resolve_device(spec: str) -> torch.device:
    spec = slot_device(spec)  # packed runs: FEDSHIFT_GPU_SLOT picks the GPU (docs/gpu.md)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def derive_seeds(seed: int, n: int) -> List[int]:
    """Independent child seeds (never typed twice): SeedSequence(seed).spawn(n)."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(n)]




@dataclass(frozen=True)
class OptimizerSettings:
    """The optimiser a phase of one round uses, computed once (:func:`optimizer_settings`): the one
    factory of the sequential path (:meth:`build`) and the fused one (``engine.fused.FusedOptimizer.of``)."""

    kind: str  # "adam" or "sgd" (engine.optimizer)
    lr: float  # the phase's learning rate at this round (engine.lr / public_lr under lr_decay, lr_gamma)
    momentum: float  # SGD's (engine.momentum); Adam ignores it
    weight_decay: float  # engine.weight_decay in local updating, 0 in the public phase

    def build(self, params):
        """``torch.optim.Adam`` / ``SGD`` over ``params`` with these settings."""
        if self.kind == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


def optimizer_settings(cfg: EngineConfig, round_: int, phase: str = "local") -> OptimizerSettings:
    """The optimiser of ``phase`` (``local`` or ``public``) in round ``round_`` (1-based; 0 = before the first)."""
    base = cfg.lr if phase == "local" else cfg.public_lr
    lr = cfg.lr_at(base, round_ - 1 if round_ > 0 else 0)
    return OptimizerSettings(cfg.optimizer, lr, cfg.momentum, cfg.weight_decay if phase == "local" else 0.0)




def quiet_layout_warning() -> None:
    """Silence torch's "grad and param do not obey the gradient layout contract" UserWarning
    (issue 39 point 7): with ``engine.channels_last`` (the default) a method that steps a
    channels_last model on a gradient some kernel made contiguous (FedMD's digest step) meets it
    once per job; torch copies the gradient into the parameter's layout, which is correct, and
    the message reached the terminal through Snakemake."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*do not obey the gradient layout contract", category=UserWarning)


def set_training_levers(model: FedModel, arch: str, cfg: EngineConfig, device: torch.device, data) -> None:
    """engine.recompute / recompute_budget_mb / bf16_train resolved for one participant's model (issue 40):
    bf16 autocast of its training forwards (``model.train_bf16``) and the batch above which its blocks
    are checkpointed (``model.recompute_batch``, from its activations per sample counted on the live
    model, halved under bf16)."""
    from ..models.activations import model_activations
    from .cpu import recompute_batch, train_bf16_on

    model.train_bf16 = train_bf16_on(cfg.bf16_train, device, arch)
    model.recompute = recompute_on(cfg.recompute, device)  # engine.recompute (activation checkpointing)
    model.recompute_batch = 0
    if not model.recompute:
        return
    # Counted on the live model (eval mode, no_grad, two blank samples: no buffer or random state moves),
    # not on the meta device, whose first use imports torch's symbolic-shape machinery (~2 s a job).
    was_training = model.training
    model.eval()
    per_sample, checkpointed = model_activations(model, torch.zeros((2, *data.image_shape)))
    model.train(was_training)
    model.activation_mb = (per_sample, checkpointed)
    if checkpointed >= per_sample:
        model.recompute_batch = sys.maxsize  # no block to checkpoint (LeNet...): it never recomputes
    elif cfg.recompute == "auto" and cfg.recompute_budget_mb > 0:
        model.recompute_batch = recompute_batch(cfg.recompute_budget_mb, per_sample, model.train_bf16)


class Federation:
    def __init__(self, data: FederatedData, models: List[FedModel], archs: List[str], cfg: EngineConfig,
                 seed: int, device: torch.device, scoring: Optional[ScoringConfig] = None):
        self.data = data
        self.cfg = cfg
        self.scoring = scoring or ScoringConfig()  # the grid's scoring protocol (which models, weights, prediction)
        self.device = device
        self.seed = seed
        seeds = derive_seeds(seed, len(models) + 2)
        fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
        if cfg.channels_last:  # expected: a channels_last weight gets a contiguous gradient from some kernels
            quiet_layout_warning()
        for m, arch in zip(models, archs):
            if isinstance(m, FedModel):
                set_training_levers(m, arch, cfg, device, data)
        self.clients = [
            Client(i, cd.name, cd.domain, arch, m.to(device, memory_format=fmt), cd,
                   torch.Generator().manual_seed(s))
            for i, (cd, m, arch, s) in enumerate(zip(data.clients, models, archs, seeds))
        ]
        self.public_gen = torch.Generator().manual_seed(seeds[-2])
        self.aug_gen = torch.Generator().manual_seed(seeds[-1])
        # Client sampling (engine.sampling): its own child seed, so the streams above are unchanged.
        self.sample_gen = torch.Generator().manual_seed(derive_seeds(seed, len(models) + 3)[-1])
        self.sampled: Dict[int, List[int]] = {}  # round -> indices of the clients sampled in it
        self.num_classes = data.num_classes
        self.round = 0
        self.method_name = "?"  # set by the runner; named in non-finite-loss errors
        self.base_models: Optional[List[FedModel]] = None  # the BASE checkpoints' models, when the job has them
        self.skipped_batches = 0  # optimiser steps skipped for a non-finite loss (on_nonfinite: skip_batch)
        self.checked_batches = 0  # losses step_ok looked at (on_nonfinite: skip_batch): the fraction's denominator
        self.levers = EngineLevers(cfg, device)  # engine.compile / cuda_graphs / amp / ... (levers.py)
        self.levers.prepare([c.model for c in self.clients])
        self.round_steps: Dict[str, int] = {}  # participant -> optimiser steps of local training this round
        # The server's delivery waiting for the next round (scoring eval_models: local): participant -> state
        self.pending: Optional[Dict[str, Dict[str, torch.Tensor]]] = None
        self.ctx = RoundContext(self)  # what a method sees of this federation (setup() gives it the method)

    # ------------------------------------------------------------- the method
    def setup(self, method) -> None:
        """Give ``method`` this federation's :class:`~fedshift.engine.context.RoundContext` (``self.ctx``)
        and call its ``setup(ctx)``; the scoring's prediction hooks are installed first."""
        self.ctx.attach(method)
        install_prediction(self, method)
        method.setup(self.ctx)

    def run_round(self, r: Optional[int] = None) -> Dict[str, float]:
        """One round of the method :meth:`setup` was given (``r``: sets ``self.round`` first): the scoring's
        pending delivery, the method's ``run_round(ctx)`` (collaboration, local updating), its
        ``server_step(ctx, start, trained)`` and that delivery (now under ``eval_models: global``, at the start
        of the next round under ``local``), its ``after_round(ctx)``. Returns the round's training metrics."""
        if self.ctx.method is None:
            raise RuntimeError("Federation.run_round before Federation.setup(method)")
        if r is not None:
            self.round = r
        return self.ctx._run_round()

    # ------------------------------------------------------------ resumable RNG
    def rng_state(self) -> Dict[str, object]:
        """State of every torch/numpy generator the federation and its clients own (found by walking
        their attributes, so generators added later are included without listing them here)."""
        from .checkpoint import generator_states

        return generator_states(self)

    def set_rng_state(self, state: Dict[str, object]) -> None:
        from .checkpoint import set_generator_states

        set_generator_states(self, state)

    # ------------------------------------------------------- non-finite values
    def nonfinite(self, participant: str, term: str, what: str = "loss") -> NonFiniteError:
        return NonFiniteError(
            f"non-finite {what} in method {self.method_name}, participant {participant}, round {self.round}, "
            f"term {term} (engine.on_nonfinite: fail; lower the learning rate, or set on_nonfinite: skip_batch)")

    def step_ok(self, loss: torch.Tensor, participant: str, term: str) -> bool:
        """With ``on_nonfinite: skip_batch``: False (and counted) when ``loss`` is not finite, so the
        caller skips the optimiser step. With ``fail`` always True (no host sync per batch): the
        per-call totals are checked by :meth:`check_total`, the round's metrics and weights by the runner."""
        if self.cfg.on_nonfinite != "skip_batch":
            return True
        self.checked_batches += 1
        if bool(torch.isfinite(loss.detach()).all()):
            return True
        self.skipped_batches += 1
        return False

    def optimizer_step(self, opt, loss: torch.Tensor, participant: str, term: str) -> bool:
        """One optimiser step on ``loss`` unless :meth:`step_ok` skips it; True if it stepped."""
        if not self.step_ok(loss, participant, term):
            return False
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return True

    def check_total(self, value: float, participant: str, term: str) -> None:
        if not np.isfinite(value) and self.cfg.on_nonfinite == "fail":
            raise self.nonfinite(participant, term)

    def check_weights(self) -> None:
        """Fail when any participant's parameters or buffers hold NaN/inf (whatever on_nonfinite says)."""
        for c in self.clients:
            tensors = [t for t in c.model.state_dict().values() if torch.is_floating_point(t)]
            if tensors and not bool(torch.stack([t.isfinite().all() for t in tensors]).all()):
                bad = next(k for k, t in c.model.state_dict().items()
                           if torch.is_floating_point(t) and not bool(t.isfinite().all()))
                raise self.nonfinite(c.name, bad, "weight")

    # ------------------------------------------------------------------ data
    @property
    def homogeneous(self) -> bool:
        return len({c.arch for c in self.clients}) == 1

    def public_batches(self, batch: Optional[int] = None, epochs: Optional[int] = None,
                       aug: Optional[str] = None, drop_last: Optional[bool] = None) -> Iterator[torch.Tensor]:
        """Shuffled, normalised, augmented public batches for one collaborative step.

        ``drop_last`` (default ``engine.public_drop_last``) drops the last partial batch; a
        last batch of a single sample is dropped either way (BatchNorm cannot train on it).
        """
        if self.data.public is None:
            raise RuntimeError("this method needs a public set but the run has none")
        pub = self.data.public
        batch = batch or self.cfg.public_batch
        batch = min(batch, len(pub))
        aug = self.cfg.public_aug if aug is None else aug
        drop_last = self.cfg.public_drop_last if drop_last is None else drop_last
        rest = len(pub) % batch
        for _ in range(self.cfg.public_epochs if epochs is None else epochs):
            order = torch.randperm(len(pub), generator=self.public_gen).to(pub.device)
            stop = len(pub) - (rest if drop_last or rest == 1 else 0)
            for start in range(0, stop, batch):
                x = normalize(pub[order[start:start + batch]])
                yield augment(x, aug, self.aug_gen)

    def private_batches(self, client: Client, batch: Optional[int] = None, split: str = "private"):
        """One epoch of shuffled (normalised images, labels) batches of a client's split."""
        x, y = client.data.get(split)
        batch = batch or self.cfg.local_batch
        order = torch.randperm(len(y), generator=client.generator).to(y.device)
        for start in range(0, len(y), batch):
            idx = order[start:start + batch]
            if len(idx) < 2 and len(y) > 1:  # BatchNorm cannot train on a single sample
                continue
            yield normalize(x[idx]), y[idx]

    # ------------------------------------------------------------- training
    def optimizer_settings(self, phase: str = "local") -> OptimizerSettings:
        """This round's optimiser of ``phase`` (:func:`optimizer_settings`)."""
        return optimizer_settings(self.cfg, self.round, phase)

    def make_optimizer(self, model: torch.nn.Module, phase: str = "local", params=None):
        return self.optimizer_settings(phase).build(params if params is not None else model.parameters())

    def train_local(self, client: Client, loss_fn: Optional[LossFn] = None, epochs: Optional[int] = None,
                    optimizer=None, split: str = "private") -> float:
        """``epochs`` epochs of minibatch training on the client's private data; returns mean loss.

        ``loss_fn(client, x, y, step)`` gives the batch loss (default: cross-entropy).
        """
        mean = float(drive(self.local_steps(client, loss_fn, epochs, optimizer, split)))
        self.check_total(mean, client.name, "local_loss")
        return mean

    def local_steps(self, client: Client, loss_fn: Optional[LossFn] = None, epochs: Optional[int] = None,
                    optimizer=None, split: str = "private"):
        """:meth:`train_local` as a generator: yields after every optimiser step, returns the
        mean loss as a device tensor (no host sync), so participants can be interleaved."""
        model = client.model
        model.train()
        opt = optimizer or self.make_optimizer(model, "local")
        epochs = self.cfg.local_epochs if epochs is None else epochs
        total = torch.zeros((), device=self.device)
        steps = 0
        full = min(self.cfg.local_batch, len(client.data.get(split)[1]))
        for _ in range(epochs):
            for x, y in self.private_batches(client, split=split):
                with self.levers.local_step(model, client.arch, x, full):
                    loss = loss_fn(client, x, y, steps) if loss_fn else F.cross_entropy(model(x), y)
                if not self.optimizer_step(opt, loss, client.name, "local_loss"):
                    continue
                total += loss.detach()
                steps += 1
                yield
        release_memory()  # engine.malloc_trim
        self.round_steps[client.name] = self.round_steps.get(client.name, 0) + steps  # the round context's steps
        return total / max(steps, 1)

    def train_participants(self, clients: Optional[List[Client]] = None, loss_fn: Optional[LossFn] = None,
                           epochs: Optional[int] = None, optimizers: Optional[Dict[str, object]] = None,
                           split: str = "private") -> Dict[str, float]:
        """:meth:`train_local` for several participants: interleaved on CUDA streams under
        ``engine.overlap_participants``, else one after another; one host read for all
        losses. Returns ``{"<name>/train/local_loss": mean loss}``."""
        clients = self.clients if clients is None else clients
        optimizers = optimizers or {}
        steppers = [self.local_steps(c, loss_fn, epochs, optimizers.get(c.name), split) for c in clients]
        losses = torch.stack(self.levers.run_interleaved(steppers)).tolist()
        for c, v in zip(clients, losses):
            self.check_total(float(v), c.name, "local_loss")
        return {f"{c.name}/train/local_loss": float(v) for c, v in zip(clients, losses)}

    # ----------------------------------------------------------- evaluation
    def amp(self):
        """The inference phases' autocast context (``engine.bf16``; a no-op when off)."""
        return autocast(self.cfg.bf16, self.device)

    def eval_levers(self):
        """``(fold, channels_last)`` of the evaluation: engine.eval_fold_bn / eval_channels_last resolved."""
        return inference_levers(self.cfg, self.device)

    def test_sets(self):
        return {c.domain: c.data.get("test") for c in self.clients}

    def evaluate(self, tests: Optional[Dict[str, tuple]] = None) -> List[dict]:
        """Rows (participant, arch, evaluated domain, intra/inter, top1, top5) for every client.

        ``tests``: domain -> (images, labels); default every client's own test set.
        """
        rows = []
        suite = EvalSuite.of(self.test_sets() if tests is None else tests)  # concatenated once for all models
        ks = (1, 5)
        for c in self.clients:
            per_dom = evaluate_suite(c.model, suite, ks, self.cfg.eval_batch, self.amp(), *self.eval_levers())
            release_memory()
            for dom, acc in per_dom.items():
                rows.append({"participant": c.name, "arch": c.arch, "domain": dom,
                             "kind": "intra" if dom == c.domain else "inter",
                             "top1": acc[1], "top5": acc[5]})
        return rows


def summarise(rows: List[dict]) -> Dict[str, float]:
    """Per-participant intra/inter (Eq. 21-22) and their averages over participants, as flat metrics."""
    by_part: Dict[str, Dict[str, Dict[int, float]]] = {}
    own: Dict[str, str] = {}
    for r in rows:
        by_part.setdefault(r["participant"], {})[r["domain"]] = {1: r["top1"], 5: r["top5"]}
        if r["kind"] == "intra":
            own[r["participant"]] = r["domain"]
    out: Dict[str, float] = {}
    for p, dom in by_part.items():
        for key, val in intra_inter(dom, own[p]).items():
            out[f"{p}/{key}"] = val
    for key in ("intra/top1", "intra/top5", "inter/top1", "inter/top5"):
        vals = [out[f"{p}/{key}"] for p in by_part]
        out[f"avg/{key}"] = float(np.mean(vals)) if vals else float("nan")
    return out


class PredictionHook:
    """Forward hook on a participant's classifier ``head`` under ``scoring.predict: prototype``: in eval
    mode (every evaluation) the head's output is replaced by ``method.prototype_scores(features)`` (the
    nearest of the method's prototypes, scored like logits), computed from the head's input; in train mode,
    and while the method has no prototypes (``None``), the head's own logits pass through. Weights and
    ``state_dict`` are untouched; a deep copy of the model (frozen copies, inference copies) keeps the hook."""

    def __init__(self, method):
        self.method = method

    def __call__(self, module, args, output):
        if module.training:
            return None
        return self.method.prototype_scores(args[0])

    def __deepcopy__(self, memo):
        return self


def install_prediction(fed: "Federation", method) -> None:
    """Put one :class:`PredictionHook` of ``method`` on every participant's ``head`` when the scoring
    predicts by prototypes, removing any earlier one (of an earlier method object on the same models)."""
    for c in fed.clients:
        head = getattr(c.model, "head", None)
        if not isinstance(head, torch.nn.Module):
            if fed.scoring.predict == "prototype":
                raise TypeError(f"scoring.predict: prototype needs {c.arch}'s classifier `head` as a module, got "
                                f"{type(head).__name__}")
            continue
        hooks = head._forward_hooks
        for k in [k for k, h in hooks.items() if isinstance(h, PredictionHook)]:
            del hooks[k]
        if fed.scoring.predict == "prototype":
            head.register_forward_hook(PredictionHook(method))
