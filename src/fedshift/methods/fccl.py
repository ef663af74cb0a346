"""FCCL (Huang, Ye & Du, "Learn from Others and Be Yourself in Heterogeneous Federated
Learning", CVPR 2022; ``papers/fccl-cvpr2022.txt``), and the machinery FCCL+ builds on.

Collaborative updating (§ 3.1, Alg. 1): on every unlabeled public batch each
participant computes its logits Z_i; the target Z̄ is an average of detached logits
and each participant minimises the cross-correlation loss of Eq. 1-2 (``lam`` =
lambda_Col = 0.0051), with one Adam step per batch.

Local updating (§ 3.2, Eq. 3-7): ``CE + lambda_loc * (KL(theta^{t-1}) + KL(theta^*))``
on the private data: the inter-domain teacher is the participant's model at the end
of the previous round's local updating, the intra-domain teacher its pretrained
(SOLO/BASE) model, both at temperature 1 and without T² (the authors' code).

What was kept, and where the authors' code and the paper differ (switches):

* ``target``: the CVPR code's FCCM target for participant i is the mean of the
  *other* participants' current logits and of i's own logits from its
  previous-round model (eval mode, no gradient): ``others_prev``, the default here.
  The paper's Eq. 1 text and the FCCL+ code use the mean of all participants'
  current logits including i (``all``); ``others`` drops i altogether.
* ``init``: FCCL starts from the BASE models (the CVPR code loads them; they are also
  the intra-domain teachers), while the authors' baselines start from scratch. The
  runner loads the checkpoints before :meth:`FCCL.setup`, which snapshots them as
  theta^*.
* ``fresh_optimizer``: the authors build a new Adam for every participant and
  public batch (its moments restart at zero each step); ``False`` keeps one per
  participant for the whole run.
* Homogeneous mode (CVPR Table 3, FCCL+ Table XV): everyone starts from participant
  0's weights and parameters are averaged uniformly *before* local updating, so each
  participant is scored with its own model after local updating, as the printed row
  is (Digits M->: inter 77.18 against 88.31, the mean of the others' intra, which one
  shared model would give). The authors' ``fccl+/models/fccl.py:106-113`` averages
  *after* local updating, having saved the local models as next round's teachers
  first: ``homogeneous_averaging: after_local`` (variant ``fccl_avg_after``) keeps that
  position; see :mod:`fedshift.methods.homogeneous` and docs/fccl.md.
* One forward pass per participant and batch serves both the target (detached) and
  the participant's loss: the targets are fixed before any update, so this equals
  the authors' compute-all-then-update-one-by-one loop (only BatchNorm's running
  statistics see the batch once instead of twice).
* ``corr_every``: the cross-correlation matrices of CVPR Fig. 5 / FCCL+ Fig. 8 (each
  participant against the mean of the others, on public and on its private data)
  are recorded every k rounds, or (``sparse``, the default) at the rounds the figure
  draws: the first, the last and three evenly spaced between (:func:`fedshift.methods.fccl_figures.sparse_rounds`);
  saved as ``cross_correlation.npz`` + ``.png``. Recording and saving the matrices is
  FCCL's figure data (:mod:`fedshift.methods.fccl_figures`, written by the ``artifacts`` hook), the drawing the
  report's (:func:`fedshift.report.figures.draw_correlations`). The authors' runs pay for no such
  figure data: every round it cost a tenth of a CPU round.

:class:`FCCL` is also the base class of FCCL+ (:mod:`fedshift.methods.fccl_plus`),
which overrides the collaborative loss and the local distillation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..engine.federation import frozen_copy
from ..losses import fccl_dual_distillation_loss, fccm_loss
from .base import METHODS
from .common import refresh_copy
from .fccl_figures import check_corr, corr_due, correlation_matrices, save_correlations
from .homogeneous import AveragingMethod

TARGETS = ("all", "others", "others_prev")


def collaborative_targets(outputs: Sequence[Tensor], mode: str,
                          prev_outputs: Optional[Sequence[Tensor]] = None) -> List[Tensor]:
    """Participant i's collaborative target from the K participants' detached outputs.

    ``outputs``: K tensors of one shape (logits Z_j, or similarity matrices S_j).

    * ``all``: ``mean_j outputs[j]`` for everyone (FCCL+ Eq. 1 and code, FCCL Eq. 1);
    * ``others``: ``mean_{j != i} outputs[j]`` (needs K >= 2);
    * ``others_prev``: ``(sum_{j != i} outputs[j] + prev_outputs[i]) / K``: the others'
      current outputs and i's own from its previous-round model (the FCCL CVPR code).
    """
    k = len(outputs)
    if mode == "all":
        mean = torch.stack(list(outputs)).mean(0)
        return [mean] * k
    total = torch.stack(list(outputs)).sum(0)
    if mode == "others":
        if k < 2:
            raise ValueError("target 'others' needs at least two participants")
        return [(total - o) / (k - 1) for o in outputs]
    if mode == "others_prev":
        if prev_outputs is None or len(prev_outputs) != k:
            raise ValueError("target 'others_prev' needs every participant's previous-round outputs")
        return [(total - o + p) / k for o, p in zip(outputs, prev_outputs)]
    raise ValueError(f"unknown collaborative target {mode!r}; valid: {', '.join(TARGETS)}")


def _runs(modes: Sequence[str]) -> List[Tuple[str, int]]:
    """['kd', 'kd', 'fntd'] -> [('kd', 2), ('fntd', 1)]."""
    out: List[Tuple[str, int]] = []
    for m in modes:
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + 1)
        else:
            out.append((m, 1))
    return out


@dataclass(frozen=True)
class FCCLParams:
    init: Literal["scratch", "base"] = "base"  # CVPR § 4: federated learning starts from the SOLO models
    lam: float = 0.0051  # FCCM off-diagonal weight lambda_Col (CVPR § 4, after Barlow Twins; FCCL+ Table VII)
    target: Literal["all", "others", "others_prev"] = "others_prev"  # CVPR code; "all" = Eq. 1 text / FCCL+ code
    lambda_loc: float = 1.0  # weight of the dual distillation in Eq. 7 (CVPR § 4: 1); 0 = Fig. 8's "w/o CON"
    tau: float = 1.0  # distillation temperature of Eq. 4-5 (CVPR code: 1, no T² factor)
    teacher: Literal["previous", "collaborated"] = "previous"  # inter-domain teacher: theta^{t-1} (paper) or after colla.
    teacher_bn: Literal["eval", "train"] = "eval"  # teachers' BatchNorm: eval (CVPR code) or batch stats (FCCL+ code)
    fresh_optimizer: bool = True  # authors' code: a new Adam for every public batch (state reset each step)
    homogeneous_averaging: Literal["auto", "none", "before_local", "after_local"] = "auto"  # auto: before local (printed Table 3 / XV); code: after_local
    averaging_weights: Literal["uniform", "samples"] = "uniform"  # authors' code averages uniformly
    corr_every: Union[int, Literal["sparse"]] = "sparse"  # Fig. 5 matrices: "sparse" = the figure's 5 rounds; k = every k rounds and the last; 0 = off
    corr_samples: int = 256  # public (and at most as many private) samples per matrix; the authors draw theirs from one public batch of 256

    def __post_init__(self):
        if self.lam < 0 or self.lambda_loc < 0:
            raise ValueError("lam and lambda_loc must be >= 0")
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        check_corr(self.corr_every, self.corr_samples)


@METHODS.register("fccl")
class FCCL(AveragingMethod):
    """FCCL: FCCM on public logits, then CE + KL(previous-round model) + KL(pretrained model)."""

    name = "fccl"
    public_graphs = "engine"  # engine.public_graphs: all keeps every participant's graph, one keeps one
    weight_copies = 2  # the round's starting model (inter-domain teacher) + the pretrained (intra) one
    Params: ClassVar[type] = FCCLParams  # ClassVar[type]: FCCL+ names its own
    uses_public = True
    paper_averaging = "before_local"  # the printed Table XV / CVPR Table 3 rows (per participant); code: after_local (docs/fccl.md)

    # ---------------------------------------------------------------- set-up
    def needs_pretrained(self) -> bool:
        """Whether a snapshot of the starting model (the intra-domain teacher theta^*) is kept."""
        return True

    def setup(self, ctx) -> None:
        self._mode = "none"
        self._corr: Dict[int, Dict[str, np.ndarray]] = {}
        self._corr_names: List[str] = [c.name for c in ctx.participants]
        base = ctx.base_models
        for i, c in enumerate(ctx.participants):
            # theta^{t-1} of round 1 is the participant's own starting model, theta^* its pretrained
            # (BASE) model, which the runner provides in ctx.base_models (the starting model itself
            # when the run starts from BASE, or when no checkpoint is given, e.g. in unit tests);
            # both are taken before a homogeneous run gives everyone participant 0's weights
            # (the authors' order).
            c.state["prev"] = frozen_copy(c.model)
            c.state["teacher"] = c.state["prev"]
            if self.needs_pretrained():
                c.state["pretrained"] = frozen_copy(base[i] if base else c.model)
        self.init_state(ctx)
        self.setup_averaging(ctx)

    def init_state(self, ctx) -> None:
        """Per-participant state taken from the starting models (subclasses; before any averaging)."""

    # ---------------------------------------------------------- collaboration
    def collaborates(self) -> bool:
        return True

    def colla_losses(self, outs: List[Tuple[Tensor, Tensor]],
                     prev: Optional[List[Tuple[Tensor, Tensor]]]) -> List[Tensor]:
        """Per-participant collaborative losses from (features, logits) of this batch."""
        with torch.no_grad():
            targets = collaborative_targets([z.detach() for _, z in outs], self.p.target,
                                            [z for _, z in prev] if prev else None)
        return [fccm_loss(z, t, self.p.lam) for (_, z), t in zip(outs, targets)]

    def collaborate(self, ctx) -> Dict[str, float]:
        if not self.collaborates():
            return {}
        clients = ctx.participants

        def previous(xb):
            if self.p.target != "others_prev":
                return None
            with torch.no_grad():
                return [c.state["prev"].forward_with_features(xb) for c in clients]

        if ctx.public_graphs == "one":  # same maths, one participant's graph alive at a time
            cache: Dict[str, Any] = {}

            def losses(outs):
                return self.colla_losses(outs, cache["prev"])

            def forward(c, xb):
                if cache.get("xb") is not xb:  # once per public batch
                    cache["xb"], cache["prev"] = xb, previous(xb)
                return c.model.forward_with_features(xb)

            return self.public_step_one_graph(ctx, forward, losses, "colla_loss")

        def batch_losses(xb):
            outs = [c.model.forward_with_features(xb) for c in clients]
            return self.colla_losses(outs, previous(xb))

        return self.public_step(ctx, batch_losses, "colla_loss")

    # ---------------------------------------------------------- local updating
    def epoch_modes(self, epochs: int) -> List[str]:
        """The local distillation used in each local epoch of a round."""
        return ["dual" if self.p.lambda_loc > 0 else "none"] * epochs

    def local_update(self, ctx) -> Dict[str, float]:
        runs = _runs(self.epoch_modes(ctx.local_epochs))
        metrics = {}
        for c in ctx.participants:
            teacher = c.state["prev"]
            if self.p.teacher == "collaborated":
                # theta^e of FCCL+ Fig. 9: the model entering local updating (after colla. and averaging)
                teacher = c.state["collaborated"] = refresh_copy(c.state.get("collaborated"), c.model)
            c.state["teacher"] = teacher
            for t in (c.state["teacher"], c.state.get("pretrained")):
                if t is not None:
                    t.train(self.p.teacher_bn == "train")
            opt = ctx.make_optimizer(c.model, "local")  # one optimiser per round, as the authors' code
            total, epochs = 0.0, 0
            for mode, n in runs:
                self._mode = mode
                total += n * ctx.train_local(c, lambda cl, x, y, s: self.local_loss(ctx, cl, x, y, s),
                                             epochs=n, optimizer=opt)
                epochs += n
            metrics[f"{c.name}/train/local_loss"] = total / max(epochs, 1)
        self.end_local(ctx)
        return metrics

    def end_local(self, ctx) -> None:
        """After local updating (before any after_local averaging): save theta^{t-1} for next round."""
        for c in ctx.participants:
            for key in ("prev", "collaborated", "pretrained"):
                if c.state.get(key) is not None:
                    c.state[key].eval()  # the previous-round logits of target "others_prev" are eval-mode
            c.state["prev"] = refresh_copy(c.state["prev"], c.model)

    def local_loss(self, ctx, client, x, y, step):
        logits = client.model(x)
        loss = F.cross_entropy(logits, y)
        if self._mode == "dual":
            with torch.no_grad():
                prev = client.state["teacher"](x)
                pre = client.state["pretrained"](x)
            loss = loss + self.p.lambda_loc * fccl_dual_distillation_loss(logits, prev, pre, self.p.tau)
        return loss

    # ---------------------------------------------------------- resumable state
    SNAPSHOTS = ("prev", "pretrained", "collaborated")  # frozen per-participant copies kept across rounds

    def state_dict(self) -> Dict[str, Any]:
        """Teachers (theta^{t-1}, theta^*, theta^e), EWC Fisher, the recorded Fig. 5 matrices and
        the public optimisers (see :class:`AveragingMethod`)."""
        clients = {}
        for c in self._ctx.participants:
            st: Dict[str, Any] = {k: c.state[k].state_dict() for k in self.SNAPSHOTS if c.state.get(k) is not None}
            if "ewc" in c.state:
                st["ewc_fisher"] = list(c.state["ewc"][1])
            clients[c.name] = st
        corr = {str(r): {k: torch.from_numpy(v) for k, v in m.items()} for r, m in self._corr.items()}
        return {**super().state_dict(), "clients": clients, "corr": corr}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        for c in self._ctx.participants:
            st = state["clients"][c.name]
            for k in self.SNAPSHOTS:
                if k in st:
                    if c.state.get(k) is None:
                        c.state[k] = frozen_copy(c.model)
                    c.state[k].load_state_dict(st[k])
            c.state["teacher"] = c.state["prev"]  # reassigned by local_update each round
            if "ewc_fisher" in st:
                # The EWC anchor is theta^{e-1} itself (its parameters, as _update_ewc takes them).
                names = [n for n, q in c.model.named_parameters() if q.requires_grad]
                prev = dict(c.state["prev"].named_parameters())
                c.state["ewc"] = ([prev[n] for n in names], [f.to(fed_device(c)) for f in st["ewc_fisher"]])
        self._corr = {int(r): {k: v.numpy() for k, v in m.items()} for r, m in state["corr"].items()}

    # ------------------------------------------------ cross-correlation figure
    def after_round(self, ctx) -> None:
        if len(ctx.participants) > 1 and corr_due(self.p.corr_every, ctx.round, ctx.rounds):
            self._corr[ctx.round] = correlation_matrices(ctx, self.p.corr_samples)

    def artifacts(self, out_dir: Path) -> None:
        """``cross_correlation.npz`` (rounds, participants, public/private: R x K x C x C) and a PNG."""
        if save_correlations(self._corr, self._corr_names, out_dir):
            from ..report.figures import draw_correlations  # matplotlib only when there is a figure

            draw_correlations(self._corr, self._corr_names, Path(out_dir) / "cross_correlation.png",
                              f"{self.name}: cross-correlation with the others' mean (FCCL+ Fig. 8)")


def fed_device(c) -> torch.device:
    return next(c.model.parameters()).device
