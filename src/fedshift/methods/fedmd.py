"""FedMD (Li & Wang 2019): consensus on public class scores, then digest and revisit.

Each round the participants score a public subset, the server averages the scores
(the consensus), every participant trains toward the consensus ("digest": mean
absolute error on logits, as the FedMD code) and then on its private data
("revisit").

Transfer learning, FedMD's first phase (FedMD § 2, Algorithm 1: before any communication, each
party first trains to convergence on the labelled public data, then on its private data):
``transfer_epochs`` epochs of cross-entropy on the *labelled* public data, then
``transfer_private_epochs`` epochs on the participant's private data, once, at the start of the
first round. Off by default (0 / 0): the benchmark's public sets (CIFAR-100, photo_patches) are
used unlabeled (FCCL+ § 4.1) and the participants start from scratch like the authors' baselines
(``init: base`` starts from the SOLO models, trained on private data only): only the consensus
loop is kept. With ``public_data: seed`` the labelled data is every participant's public seed
split (FedH2L Table II's D_pub, labels included). The FedMD code (diogenes0319/FedMD_clean)
pretrains on the public set for at most 20 epochs (``pre_train_params.epochs`` in
conf/CIFAR_balance_conf.json and conf/EMNIST_balance_conf.json, passed by CIFAR_Balanced.py:127-133
to ``train_models``, Neural_Networks.py:103-122) and then on the private data for at most 25 epochs (FedMD.py:44-48),
each with Adam 1e-3 and early stopping on the accuracy of held-out data (patience 3 and 10); here
the epochs are fixed (no early stopping: the authors' "validation" data is their test set), the
public phase uses FedMD's public optimiser and ``engine.public_batch``, the private phase a fresh
local optimiser and ``engine.local_batch``. The phase runs once: ``state_dict`` records that it
ran, so a resumed run does not repeat it.

Homogeneous mode (FCCL+ § 4.4, CVPR § 4.1: the table adds "the model parameter
averaging operation between collaborative updating and local updating" to every
method): on one shared architecture the participants' models are averaged,
uniformly, after the digest and before the revisit (``homogeneous_averaging: auto``,
:class:`~fedshift.methods.homogeneous.ParameterAveraging`); Table XV's FedMD inter AVG
(76.70 on Digits, against 26.38 heterogeneous in Table VIII) needs it.

``public_data: seed`` scores the scenario's public seed splits instead (their images, not
their labels): FedH2L's Table II compares FedMD on the same shared seed set D_pub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Literal

import torch
import torch.nn.functional as F

from ..data.loading import normalize
from ..losses import fedmd_digest_loss
from .base import METHODS, Method
from .common import digest
from .homogeneous import ParameterAveraging


@dataclass(frozen=True)
class FedMDParams:
    init: Literal["scratch", "base"] = "scratch"  # authors' baselines start from scratch
    public_subset: int = 5000  # public samples scored per round (FedMD: 5,000)
    digest_epochs: int = 1  # passes toward the consensus per round (FedMD code: 1)
    digest_loss: Literal["l1", "l2"] = "l1"  # FedMD code: mean absolute error on logits
    # "unlabeled": the run's unlabeled public set (FCCL+ benchmark); "seed": the scenario's public seed
    # splits of every participant, images only (FedH2L Table II, where FedMD shares FedH2L's D_pub)
    public_data: Literal["unlabeled", "seed"] = "unlabeled"
    # Homogeneous mode (FCCL+ § 4.4 / CVPR § 4.1: "the model parameter averaging operation between
    # collaborative updating and local updating"): auto = before local updating on one shared architecture
    homogeneous_averaging: Literal["auto", "none", "before_local", "after_local"] = "auto"
    averaging_weights: Literal["uniform", "samples"] = "uniform"  # authors' aggregate_nets(None): uniform
    # Transfer learning before round 1 (FedMD Algorithm 1); 0 = off (the benchmark's unlabeled public sets).
    # FedMD code: at most 20 public epochs (conf/*_conf.json pre_train_params.epochs) and 25 private
    # epochs (FedMD.py:45), both with early stopping; here fixed epoch counts.
    transfer_epochs: int = 0  # epochs of CE on the labelled public data (needs public_data: seed)
    transfer_private_epochs: int = 0  # then epochs of CE on the private data

    def __post_init__(self):
        if self.transfer_epochs < 0 or self.transfer_private_epochs < 0:
            raise ValueError("transfer_epochs and transfer_private_epochs must be >= 0, got "
                             f"{self.transfer_epochs} and {self.transfer_private_epochs}")
        if self.transfer_epochs and self.public_data != "seed":
            raise ValueError(f"transfer_epochs: {self.transfer_epochs} trains on labelled public data, but "
                             "public_data: unlabeled has no labels; set public_data: seed or transfer_epochs: 0")


@METHODS.register("fedmd")
class FedMD(ParameterAveraging, Method):
    """FedMD: average public logits into a consensus, digest it, then revisit private data."""

    name = "fedmd"
    Params = FedMDParams
    uses_public = True

    def __init__(self, params):
        super().__init__(params)
        self.uses_public = params.public_data == "unlabeled"

    def setup(self, ctx) -> None:
        self.resolve_averaging(ctx)
        self.transferred = False  # set once the transfer phase has run (saved in the checkpoint)

    @property
    def transfers(self) -> bool:
        return bool(self.p.transfer_epochs or self.p.transfer_private_epochs)

    def transfer(self, ctx) -> Dict[str, float]:
        """FedMD's transfer learning: every participant trains ``transfer_epochs`` epochs on every
        participant's labelled public seed split (one shared D_0), then ``transfer_private_epochs``
        epochs on its own private data. Returns the mean loss of each phase per participant."""
        metrics = {}
        if self.p.transfer_epochs:
            x_pub, y_pub = (torch.cat(t) for t in zip(*(c.data.get("public") for c in ctx.participants)))
            for c in ctx.participants:
                metrics[f"{c.name}/train/transfer_public_loss"] = digest(
                    ctx, c, x_pub, y_pub, F.cross_entropy, self.p.transfer_epochs, "transfer_public_loss")
        if self.p.transfer_private_epochs:
            losses = ctx.train_participants(epochs=self.p.transfer_private_epochs)
            metrics.update({k.replace("/local_loss", "/transfer_private_loss"): v for k, v in losses.items()})
        return metrics

    def run_round(self, ctx) -> Dict[str, float]:
        metrics = {}
        if self.transfers and not self.transferred:
            metrics.update(self.transfer(ctx))
            self.transferred = True
        metrics.update(super().run_round(ctx))
        return metrics

    def state_dict(self):
        # Only a run with a transfer phase keeps state (a run without one checkpoints as before).
        return {"transferred": self.transferred} if self.transfers else {}

    def load_state_dict(self, state) -> None:
        if set(state) - {"transferred"} or (bool(state) != self.transfers):
            raise ValueError(f"method 'fedmd' (transfer phase {'on' if self.transfers else 'off'}) cannot load "
                             f"a checkpoint holding {sorted(state)}")
        self.transferred = bool(state.get("transferred", False))

    def collaborate(self, ctx) -> Dict[str, float]:
        pub = ctx.public if self.p.public_data == "unlabeled" else torch.cat(
            [c.data.get("public")[0] for c in ctx.participants])
        idx = torch.randperm(len(pub), generator=ctx.public_gen)[: self.p.public_subset].to(pub.device)
        x_all = pub[idx]
        # Consensus: the mean of all participants' logits, in eval mode, in large batches.
        with torch.no_grad():
            scores = []
            for c in ctx.participants:
                c.model.eval()
                scores.append(torch.cat([c.model(normalize(x_all[s:s + ctx.eval_batch]))
                                         for s in range(0, len(x_all), ctx.eval_batch)]))
                c.model.train()
            consensus = torch.stack(scores).mean(0)
        metrics = {}
        for c in ctx.participants:
            metrics[f"{c.name}/train/digest_loss"] = digest(
                ctx, c, x_all, consensus, lambda z, t: fedmd_digest_loss(z, t, self.p.digest_loss),
                self.p.digest_epochs, "digest_loss")
        return metrics
