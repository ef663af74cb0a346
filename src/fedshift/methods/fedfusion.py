"""FedFusion (Yao et al. 2019, "Towards faster and better federated learning: a feature fusion
approach", § 3.2-3.3, Algorithm 2; papers/fedmmd-fedfusion.txt).

Each sampled client keeps the global model's feature extractor E_g frozen beside its local
model C o F o E_l (initialised from the global model) and trains on

    CE(C(F(E_l(x), E_g(x))), y)

where F is a fusion operator from (C, H, W) x (C, H, W) to (C, H, W) on the last feature
map (``FedModel.feature_map``):

* ``conv`` (Eq. 6): a 1x1 convolution of the channel concatenation [E_g(x) || E_l(x)],
  2C channels in, C out, no bias;
* ``multi`` (Eq. 7): lambda * E_g(x) + (1 - lambda) * E_l(x), lambda in R^C per channel;
* ``single`` (Eq. 8): the same with one scalar lambda.

The fusion module is part of the model (:class:`FusedModel`), so it is averaged with it
(Algorithm 2: "the local model combined with the feature fusion module will be sent to the
central server"). The server round is FedAvg's (:class:`~.fedavg.ServerAveraging`).

Choices where the paper is silent (REFERENCE.md): the conv weight starts at [I/2 | I/2]
and lambda at 1/2, so round 1 starts from the plain global model's features (a random 1x1
conv would scramble them); lambda is unconstrained (Eqs. 7-8 put no bound). The
"exponential moving average strategy to smooth the update" of multi/single (§ 3.3) is
applied by the server to lambda across rounds: lambda_G <- beta * lambda_G + (1 - beta) *
average of the clients' lambdas, beta = ``ema_decay`` = 0.9. Why 0.9: lambda is the one
weight each client specialises most (multi "allows the models on clients to select the
feature maps helpful to their local data"), so with C*K = 10 two-class clients per round
its average jumps from round to round; a window of 1/(1 - beta) = 10 rounds spans about
100 client updates, every client of the 100-client split once on average. The global
model used for evaluation fuses its extractor with itself, F(E_G(x), E_G(x)) (multi and
single: E_G(x) itself; conv: (W_g + W_l) E_G(x)). E_g runs in eval mode under no_grad,
once per batch.

Cross-round state: none (the EMA's previous value is the global model's lambda, which
every model holds between rounds and the engine saves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Literal, Optional, Tuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.federation import frozen_copy
from ..losses import cross_entropy, ema
from ..models.base import FedModel
from .base import METHODS, ServerParams
from .fedavg import ServerAveraging

Operator = Literal["conv", "multi", "single"]
OPERATORS: Tuple[Operator, ...] = ("conv", "multi", "single")


def fuse_conv(local: torch.Tensor, glob: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Eq. 6: 1x1 conv (``weight``: (C, 2C, 1, 1)) of the concatenation [global || local]."""
    return F.conv2d(torch.cat([glob, local], 1), weight)


def fuse_weighted(local: torch.Tensor, glob: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Eqs. 7-8: lambda * global + (1 - lambda) * local; ``lam`` a scalar or a (C,) vector."""
    lam = lam.view(1, -1, 1, 1) if lam.dim() == 1 else lam
    return lam * glob + (1 - lam) * local


class Fusion(nn.Module):
    """A fusion operator F: (local, global) feature maps (B, C, H, W) -> (B, C, H, W)."""

    def __init__(self, op: str, channels: int):
        super().__init__()
        if op not in OPERATORS:
            raise ValueError(f"fusion operator {op!r}; valid: {', '.join(OPERATORS)}")
        self.op = op
        if op == "conv":
            eye = torch.eye(channels).view(channels, channels, 1, 1)
            self.weight = nn.Parameter(torch.cat([eye, eye], 1) * 0.5)  # [I/2 | I/2]: the mean of the two maps
        else:
            self.lam = nn.Parameter(torch.full((channels,) if op == "multi" else (), 0.5))

    def forward(self, local: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
        if self.op == "conv":
            return fuse_conv(local, glob, self.weight)
        return fuse_weighted(local, glob, self.lam)


class FusedModel(FedModel):
    """``base`` with a fusion module on its last feature map: C(pool(F(E_l(x), E_g(x))))."""

    def __init__(self, base: FedModel, op: str, channels: int):
        super().__init__()
        self.base = base
        self.fusion = Fusion(op, channels)
        self.num_classes = base.num_classes
        self.feature_dim = base.feature_dim
        self.input_sizes = base.input_sizes
        self.arch = getattr(base, "arch", None)

    def feature_map(self, x: torch.Tensor, global_map: Optional[torch.Tensor] = None) -> torch.Tensor:
        local = self.base.feature_map(x)
        return self.fusion(local, local if global_map is None else global_map)

    def pool(self, fmap: torch.Tensor) -> torch.Tensor:
        return self.base.pool(fmap)

    def classifier(self, h: torch.Tensor) -> torch.Tensor:
        return self.base.classifier(h)

    def fused_logits(self, x: torch.Tensor, global_map: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.feature_map(x, global_map)))

    def forward(self, x: torch.Tensor, global_map: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The plain model's forward, or :meth:`fused_logits` given the global map (functional calls)."""
        return super().forward(x) if global_map is None else self.fused_logits(x, global_map)


def feature_channels(model: FedModel, image_shape: Tuple[int, int, int], device) -> int:
    if not getattr(model, "has_feature_map", True):
        raise ValueError(f"model {getattr(model, 'arch', type(model).__name__)!r} exposes no feature map to fuse")
    was = model.training
    model.eval()
    with torch.no_grad():
        c = model.feature_map(torch.zeros((1, *image_shape), device=device)).shape[1]
    model.train(was)
    return int(c)


@dataclass(frozen=True)
class FedFusionParams(ServerParams):
    # init scratch: Algorithm 2 line 1, a fresh global model; Algorithm 2 line 7 weighs clients by n_k
    # (sum_t n_t L_t / n): the grid's scoring {weighting: samples}
    operator: Literal["conv", "multi", "single"] = "conv"  # § 3.2; the registered names fix it
    ema_decay: float = 0.9  # § 3.3 EMA of multi/single lambda, decay unstated: ~10-round window (module doc)

    def __post_init__(self):
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")


@METHODS.register("fedfusion")
class FedFusion(ServerAveraging):
    """Local training on the fusion of the frozen global and the local feature maps."""

    name = "fedfusion"
    Params = FedFusionParams
    operator: ClassVar[Optional[str]] = None  # fixed by the registered variants

    def setup(self, ctx) -> None:
        op = self.p.operator
        wrapped: Dict[int, FusedModel] = {}
        for m in {id(c.model): c.model for c in ctx.participants}.values():  # server_model: one
            base = cast(FedModel, m)  # the registry's models are FedModels
            channels = feature_channels(base, ctx.image_shape, ctx.device)
            wrapped[id(m)] = FusedModel(base, op, channels).to(ctx.device)
        for c in ctx.participants:  # server-model mode: every client keeps sharing one module
            c.model = wrapped[id(c.model)]
        super().setup(ctx)
        self.global_net = cast(FusedModel, frozen_copy(ctx.participants[0].model))  # E_g: refilled every round

    def begin_round(self, ctx, global_state: Dict[str, torch.Tensor]) -> None:
        self.global_net.load_state_dict(global_state)

    def objective(self, call, params, x: torch.Tensor, y: torch.Tensor,
                  mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The one loss of both paths: CE of the fused logits ``call(params, x, E_g(x))``, the frozen
        global encoder's map computed once per batch; over the real samples of a padded batch when
        ``mask`` (engine.fused_clients) is given."""
        with torch.no_grad():
            g = self.global_net.base.feature_map(x)
        return cross_entropy(call(params, x, g), y, mask)

    def local_loss(self, ctx, client, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        return self.objective(lambda _, inputs, g: client.model.fused_logits(inputs, g), None, x, y)

    def fused_objective(self, ctx):
        """:meth:`objective` on stacked weights (engine.fused_clients)."""
        return self.objective

    def aggregate(self, ctx, average: Dict[str, torch.Tensor], global_state: Dict[str, torch.Tensor]):
        if self.p.operator in ("multi", "single"):
            average["fusion.lam"] = ema(global_state["fusion.lam"], average["fusion.lam"], self.p.ema_decay)
        return average


def _variant(op: Operator):
    @dataclass(frozen=True)
    class Params(FedFusionParams):
        operator: Literal["conv", "multi", "single"] = op  # fixed by the method name

        def __post_init__(self):
            super().__post_init__()
            if self.operator != op:
                raise ValueError(f"fedfusion_{op} fixes operator: {op}; use method fedfusion to choose it")

    Params.__name__ = Params.__qualname__ = f"FedFusion{op.capitalize()}Params"
    cls = type(f"FedFusion{op.capitalize()}", (FedFusion,), {"name": f"fedfusion_{op}", "Params": Params,
                                                            "__doc__": f"FedFusion with the {op} operator."})
    return METHODS.register(f"fedfusion_{op}")(cls)


FedFusionConv, FedFusionMulti, FedFusionSingle = (_variant(op) for op in OPERATORS)
