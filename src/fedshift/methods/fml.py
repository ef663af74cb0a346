"""FML (Shen, Zhang, Jia, Zhang, Huang, Zhou, Kuang, Wu & Wu, "Federated Mutual
Learning", arXiv 2006.16765, 2020), a model-heterogeneous counterpart.

Every participant keeps its own private model (any architecture: the structure's)
and a local copy of a shared "meme" model (one architecture for everyone). Each
round every participant starts its meme from the global meme, then trains both
models together on its private data by deep mutual learning (FML Eq. 3-4,
:func:`fedshift.losses.mutual_learning_losses`):

    L_local = alpha * CE(local) + (1 - alpha) * KL(p_meme || p_local)
    L_meme  = beta  * CE(meme)  + (1 - beta)  * KL(p_local || p_meme)

and the server averages the memes (FedAvg, weighted by private-sample counts) into
the next global meme. The participants' private models are the ones evaluated.

Kept: the two models, the mutual KL terms with detached teachers, FedAvg on the
memes. Defaults alpha = beta = 0.5 (the FML paper), so both KL terms are active:
public FML code (HtFLlib) defaults to alpha = beta = 1, which zeroes both KL terms
and trains the private models alone. The REFERENCE description writes the additive
form ``CE + alpha KL``; the paper's convex form with 0.5 equals it with weight 1, up
to a factor 1/2 on the whole loss. Both models take one optimiser step per batch
from one optimiser over both (the same updates as two optimisers, since Adam is
per parameter). The meme's architecture is ``meme_arch`` (default: participant 0's
architecture); it starts from its own seeded initialisation (``init: base`` loads
the BASE checkpoints into the private models only).

Homogeneous mode (FCCL+ § 4.4, CVPR § 4.1: "the model parameter averaging operation
between collaborative updating and local updating" for every method of the table): on
one shared architecture the private models too are averaged, uniformly, at the start
of the round, before local updating (``homogeneous_averaging: auto``,
:class:`~fedshift.methods.homogeneous.ParameterAveraging`; FML has no collaborative
step before it, the memes are averaged after local updating as always).

State across rounds: the global meme's weights and buffers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Dict, Literal, Mapping

from ..engine.averaging import weighted_average
from ..engine.federation import derive_seeds
from ..losses import mutual_learning_losses
from .base import METHODS, Method
from .common import model_state
from .homogeneous import ParameterAveraging


@dataclass(frozen=True)
class FMLParams:
    init: Literal["scratch", "base"] = "scratch"  # authors' baselines start from scratch (private models)
    alpha: float = 0.5  # CE weight of the private model; 1 - alpha on KL(meme || local) (FML paper: 0.5)
    beta: float = 0.5  # CE weight of the meme model; 1 - beta on KL(local || meme) (FML paper: 0.5)
    meme_arch: str = ""  # the shared meme model's architecture ("": participant 0's)
    weighting: Literal["samples", "uniform"] = "samples"  # FedAvg of the memes: weight by n_k
    # Homogeneous mode (FCCL+ § 4.4 / CVPR § 4.1: "the model parameter averaging operation between
    # collaborative updating and local updating"): auto = before local updating on one shared architecture
    homogeneous_averaging: Literal["auto", "none", "before_local", "after_local"] = "auto"
    averaging_weights: Literal["uniform", "samples"] = "uniform"  # authors' aggregate_nets(None): uniform

    def __post_init__(self):
        for key in ("alpha", "beta"):
            v = getattr(self, key)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{key} must lie in [0, 1], got {v}")


@METHODS.register("fml")
class FML(ParameterAveraging, Method):
    """FML: private model + FedAvg-shared meme model, trained together by deep mutual learning."""

    name = "fml"
    weight_copies = 2  # the meme model beside each private model
    Params = FMLParams

    def setup(self, ctx) -> None:
        self.resolve_averaging(ctx)
        arch = self.p.meme_arch or ctx.participants[0].arch
        meme = ctx.build_model(arch, derive_seeds(ctx.seed + 1, 1)[0])  # its own stream: private inits unchanged
        self.memes = {c.name: copy.deepcopy(meme) for c in ctx.participants}
        self.global_meme = model_state(meme)

    def local_update(self, ctx) -> Dict[str, float]:
        metrics = {}
        for c in ctx.participants:
            meme = self.memes[c.name]
            meme.load_state_dict(self.global_meme)
            meme.train()
            opt = ctx.make_optimizer(c.model, "local", params=list(c.model.parameters()) + list(meme.parameters()))

            def loss_fn(cl, x, y, step, meme=meme):
                loss_local, loss_meme = mutual_learning_losses(cl.model(x), meme(x), y, self.p.alpha, self.p.beta)
                return loss_local + loss_meme

            metrics[f"{c.name}/train/local_loss"] = ctx.train_local(c, loss_fn, optimizer=opt)
        return metrics

    def after_round(self, ctx) -> None:
        states = [self.memes[c.name].state_dict() for c in ctx.participants]
        weights = [c.num_private if self.p.weighting == "samples" else 1.0 for c in ctx.participants]
        self.global_meme = {k: v.detach().cpu() for k, v in weighted_average(states, weights).items()}

    def state_dict(self) -> Dict[str, Any]:
        return {"meme": {k: v.clone() for k, v in self.global_meme.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != {"meme"}:
            raise ValueError(f"fml state must hold exactly 'meme', got {sorted(state)}")
        ref = next(iter(self.memes.values()))
        ref.load_state_dict(state["meme"])  # fails early on a different meme architecture
        self.global_meme = {k: v.detach().cpu().clone() for k, v in state["meme"].items()}
