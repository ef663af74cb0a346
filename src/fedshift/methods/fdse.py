"""FDSE (Wang, Wang, Wang, Fan & Wang, "Federated Learning with Domain Shift Eraser", CVPR 2025,
arXiv:2503.13063), on fedshift's homogeneous models.

Why one file of ~480 lines: a method is one file (docs/extending.md); the layer decomposition,
the min-norm QP and the two aggregations are FDSE's own and nothing else uses them.

Every convolution and every hidden linear layer is decomposed (:func:`decompose`) into a
*domain-agnostic feature extractor* (DFE: a convolution to ``ceil(out / ratio)`` channels and a
bias) and a *domain-specific skew eraser* (DSE: a BatchNorm and a depthwise convolution making the
remaining channels from the DFE's, concatenated with them) (the paper's abstract). The server

* aggregates the DFE parameters (and everything else that is not DSE: the host's BatchNorm
  affine parameters, the classifier) *fairly*: per tensor, the participants' updates are
  normalised to unit length, the min-norm point of their convex hull is found by a QP over the
  simplex (:func:`min_norm_weights`), and the global tensor moves along it by the mean update
  length (:func:`fair_aggregate`); running statistics are averaged, batch counters summed;
* personalises the DSE parameters by similarity (:func:`similarity_aggregate`): per tensor,
  participant i gets ``sum_j softmax_j(cos(p_i, p_j) / tau) p_j``;
* keeps the DSE BatchNorms' running statistics local (never sent).

Locally, cross-entropy plus ``lmbd`` times a consistency regulariser (:func:`consistency_loss`)
pulling the statistics of the inputs of the DFE-side BatchNorms towards the global running
statistics received at the round's start, from the second round on.

Official code read (file:line at WwZzz/FDSE_CVPR25 01f7bd7, ``algorithm/fdse.py``):

* layer decomposition: ``DSEConv`` ``:14-50`` (``init = ceil(oup/ratio)``, ``new = init*(ratio-1)``
  with the shortcut ``:23-25``; DFE conv with bias ``:29``; DSE BatchNorm ``:30``; ``dfe_bias`` ``:31``;
  DSE depthwise conv, ``dw_size`` 3, no bias ``:32``; concatenation, truncation to ``oup`` and the
  bias ``:41-47``; the DFE BatchNorm and ReLU ``:48-49``); ``DSELinear`` ``:52-91`` (1x1 convs,
  ``dw_size`` 1, ``BatchNorm1d`` DFE norm ``:74``); ``ratio = 2``, ``use_dse_bn = True``,
  ``use_dse_activate = False``, ``shortcut = True`` (``:15``, ``:53``);
* key split: shared = keys holding ``dfe`` or ``head``; local = ``dse_bn.running_``; the rest
  personalised (``:98-104``); the personalised state of every client starts as the server model's
  (``:105-106``);
* shared aggregation (``:120-146``): running statistics averaged uniformly (``:131``), batch counters
  summed (``:128``); other tensors: ``d_i = w_i - w``, ``d_i / (|d_i| + 1e-8)`` (``:134-137``), the QP
  ``min lambda' (2 J J') lambda`` over ``lambda >= 0, lambda <= 1, sum lambda = 1`` (``optim_lambda``
  ``:163-189``, cvxopt ``:191-203``), ``w + mean_i |d_i| * sum_i lambda_i d_i`` (``:143-144``);
* personalised aggregation (``:148-160``): cosine similarities of the flattened tensors (no epsilon,
  ``:154-156``), ``softmax(sim / tau)`` (``:159``), weighted average of the raw tensors (``:160``), batch
  counters skipped (``:152``), only the round's selected clients updated (``:158``);
* regulariser (``Client.train`` ``:222-273``): forward hooks on the DFE BatchNorms record the batch
  mean of their input per channel (``:236-238``); global statistics = those BatchNorms' running
  statistics at the start of local training (``:231-232``); layer weights ``softmax(beta * i)``
  (``:233-234``); from the second round on (``:253``) per layer, in order, ``mf = mean(f)``,
  ``vf = var(f)`` (over the channels: ``f`` is already a per-channel vector), carried as an EMA with the
  BatchNorm's momentum across layers and steps (``fn``/``vn``, ``:259-260``, detached after each step
  ``:269-270``), ``w * mean((g^2 - fn^2) / (2 vn))`` (``:261``) and
  ``w * 0.5 * mean(log(vn / (v + 1e-8)) + v / (vn + 1e-8))`` (``:262``), times ``lmbd`` (``:264``);
* defaults ``lmbd = 0.01``, ``tau = 0.5``, ``beta = 0.1`` (``:96``); the tuned values the authors run
  (``algo_para`` = [lmbd, tau, beta], in ``init_algo_para``'s order ``:96``): Office-Caltech10
  ``[0.05, 0.5, 0.05]`` (``config/office/fdse.yml:1-4``), PACS ``[0.5, 0.5, 0.001]``
  (``config/pacs/fdse.yml:1-4``), as the ``scenario_defaults`` of ``office_caltech`` / ``pacs``;
  their engine settings (not method parameters): SGD lr 0.1 (Office) / 0.05 (PACS), batch 50,
  weight decay 1e-3, lr decay 0.9998 per round, gradient clipping 10, 1 (Office) / 5 (PACS) local
  epochs, 500 rounds, every client each round (the two yml files);
* the scored model is each client's own after local training (``logger/__init__.py:197-201``,
  ``c.test(c.model, ...)``; the client trains the model it holds in place, ``:212-214``, ``:222``):
  the grid's local scoring protocol (docs/methods.md; the server's packages reach the clients at the
  next round's start, as the official ``iterate``'s communication does).

Differs from the official code (and why):

* the official code ships its own decomposed AlexNet (``:276-346``); here any fedshift model is
  decomposed in place (:func:`decompose`): every ``nn.Conv2d`` with ``groups == 1`` and every
  ``nn.Linear`` but the classifier ``head``. The official layer ends with its own DFE BatchNorm and
  ReLU; here the host model's own normalisation and activation follow, and a DFE BatchNorm is
  added inside the layer (``dfe_bn``) only where the host does not follow the layer by a BatchNorm
  (``dfe_bn: auto``; ``always`` / ``never`` force it). The regulariser runs on the DFE BatchNorms
  (added ones and the host's BatchNorms that follow a decomposed layer);
* the concatenated channels are truncated to ``out`` whether or not the layer has a bias (the
  official code truncates only in its bias branch, ``:46-47``; its models always have the bias);
* the DSE BatchNorms' batch counters stay local (official: personalised but never aggregated, so
  every round resets them to the server's initial value; unused with a momentum);
* the QP is solved exactly by an active-set method in float64 (:func:`min_norm_weights`) instead of
  cvxopt's interior point (not a dependency here); the min-norm point is unique, so the aggregate is
  the same up to the solver's tolerance;
* under the global scoring protocol every client holds (and is scored with) the round's aggregate,
  shared + its personalised part, right after the server step;
* a personalised tensor that is zero for a participant (e.g. a DSE BatchNorm bias after a zero update)
  has cosine 0 with every other (the official code divides by its zero norm: NaN weights, issue 51 R27);
  a participant holding no private images is left out of both aggregations, with a warning each round
  (its zero update would be the min-norm point of the fair aggregation: the shared part would never move);
* the paper's regulariser was not compared line by line with the code (the paper text is not in
  the reference material): the code's form is implemented.

Client sampling: under the global scoring protocol (as FedAvg); ``engine.server_model`` and fused
clients are refused (per-participant DSE layers; a custom round). ``init: base`` is refused: the
decomposed layers have no BASE checkpoint. State across rounds (:meth:`FDSE.state_dict`): the
global shared tensors and every client's personalised tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Literal, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .base import METHODS, Method, ServerParams
from .common import cpu_copy, holding_data

State = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class FDSEParams(ServerParams):
    # the scoring's weighting is unused (FDSE's aggregation weights are its own); the official logger scores
    # each client's own model after local training (logger/__init__.py:197-201): the grid's local protocol
    lmbd: float = 0.01  # weight of the consistency regulariser (algorithm/fdse.py:96)
    tau: float = 0.5  # temperature of the DSE similarity softmax (algorithm/fdse.py:96, :159)
    beta: float = 0.1  # layer weights softmax(beta * i) of the regulariser (algorithm/fdse.py:96, :233)
    ratio: int = 2  # out channels / DFE channels (algorithm/fdse.py:15, :53)
    dw_size: int = 3  # DSE depthwise kernel of convolutions (algorithm/fdse.py:15); linear layers: 1 (:53)
    dfe_bn: Literal["auto", "always", "never"] = "auto"  # add a DFE BatchNorm where the host has none after the layer

    def __post_init__(self) -> None:
        if self.init != "scratch":
            raise ValueError("fdse decomposes every layer: it starts from scratch only (init: base has no "
                             "checkpoint of the decomposed layers)")
        if self.lmbd < 0 or self.tau <= 0 or self.ratio < 1 or self.dw_size < 1 or self.dw_size % 2 == 0:
            raise ValueError(f"fdse needs lmbd >= 0, tau > 0, ratio >= 1 and an odd dw_size >= 1, "
                             f"got lmbd={self.lmbd}, "
                             f"tau={self.tau}, ratio={self.ratio}, dw_size={self.dw_size}")


# ------------------------------------------------------------------ decomposed layers


def _split_channels(out: int, ratio: int) -> Tuple[int, int]:
    """(DFE channels, DSE channels) (algorithm/fdse.py:23-25)."""
    init = math.ceil(out / ratio) if ratio > 1 else out
    return init, (init * (ratio - 1) if ratio > 1 else out)


def _pair(t: Tuple[int, ...]) -> Tuple[int, int]:
    """A ``Conv2d``'s ``kernel_size`` / ``stride`` / ``padding`` / ``dilation``: always two ints once built (the
    module stores them through ``_pair``); torch types the attributes ``tuple[int, ...]`` (shared with the
    1d/3d convolutions), the ``Conv2d`` constructor ``int | tuple[int, int]``."""
    assert len(t) == 2, t
    return t[0], t[1]


class DSEConv2d(nn.Module):
    """A convolution ``in -> out`` as DFE conv (``in -> ceil(out/ratio)``, bias) -> DSE BatchNorm -> DSE
    depthwise conv, concatenated with its input, truncated to ``out`` channels, plus ``dfe_bias``
    (algorithm/fdse.py:14-47); optionally the DFE BatchNorm ``dfe_bn`` (:48)."""

    def __init__(self, conv: nn.Conv2d, ratio: int = 2, dw_size: int = 3, dfe_bn: bool = False):
        super().__init__()
        self.oup, self.ratio = conv.out_channels, ratio
        init, new = _split_channels(conv.out_channels, ratio)
        dtype = conv.weight.dtype  # built on the CPU (its RNG), moved by decompose()
        padding = conv.padding if isinstance(conv.padding, str) else _pair(conv.padding)
        self.dfe_conv = nn.Conv2d(conv.in_channels, init, _pair(conv.kernel_size), _pair(conv.stride), padding,
                                  _pair(conv.dilation), bias=True, dtype=dtype)
        self.dse_bn = nn.BatchNorm2d(init, dtype=dtype)
        self.dse_conv = nn.Conv2d(init, new, dw_size, 1, dw_size // 2, groups=init, bias=False, dtype=dtype)
        self.dfe_bias = nn.Parameter(torch.zeros(conv.out_channels, dtype=dtype))
        self.dfe_bn = nn.BatchNorm2d(conv.out_channels, dtype=dtype) if dfe_bn else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.dse_bn(self.dfe_conv(x))
        x2 = self.dse_conv(x1)
        x = torch.cat([x1, x2], 1) if self.ratio > 1 else x1 + x2
        x = x[:, :self.oup] + self.dfe_bias.view(1, -1, 1, 1)
        return self.dfe_bn(x) if self.dfe_bn is not None else x


class DSELinear(nn.Module):
    """A linear layer as :class:`DSEConv2d` on a 1x1 map with 1x1 convolutions (algorithm/fdse.py:52-91)."""

    def __init__(self, lin: nn.Linear, ratio: int = 2, dw_size: int = 1, dfe_bn: bool = False):
        super().__init__()
        self.oup, self.ratio = lin.out_features, ratio
        init, new = _split_channels(lin.out_features, ratio)
        dtype = lin.weight.dtype
        self.dfe_conv = nn.Conv2d(lin.in_features, init, 1, bias=True, dtype=dtype)
        self.dse_bn = nn.BatchNorm2d(init, dtype=dtype)
        self.dse_conv = nn.Conv2d(init, new, dw_size, 1, dw_size // 2, groups=init, bias=False, dtype=dtype)
        self.dfe_bias = nn.Parameter(torch.zeros(lin.out_features, dtype=dtype))
        self.dfe_bn = nn.BatchNorm1d(lin.out_features, dtype=dtype) if dfe_bn else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.dse_bn(self.dfe_conv(x[:, :, None, None]))
        x2 = self.dse_conv(x1)
        x = torch.cat([x1, x2], 1) if self.ratio > 1 else x1 + x2
        x = x[:, :self.oup, 0, 0] + self.dfe_bias
        return self.dfe_bn(x) if self.dfe_bn is not None else x


def decompose(model: nn.Module, ratio: int = 2, dw_size: int = 3, dfe_bn: str = "auto") -> List[_BatchNorm]:
    """Replace, in place, every ``nn.Conv2d`` (``groups == 1``) and every ``nn.Linear`` but the top-level
    ``head`` by its DFE/DSE decomposition; return the DFE BatchNorms (the regulariser's layers) in the
    order of ``model.modules()``. ``dfe_bn``: ``auto`` adds a BatchNorm inside a layer unless the host
    module's next child after it is a BatchNorm (which then serves as its DFE BatchNorm)."""
    host_bns: Set[int] = set()

    def visit(parent: nn.Module, prefix: str) -> None:
        children = list(parent.named_children())
        for i, (name, child) in enumerate(children):
            full = f"{prefix}{name}"
            nxt = children[i + 1][1] if i + 1 < len(children) else None
            followed = isinstance(nxt, _BatchNorm)
            add = dfe_bn == "always" or (dfe_bn == "auto" and not followed)
            if isinstance(child, nn.Conv2d) and child.groups == 1:
                setattr(parent, name, DSEConv2d(child, ratio, dw_size, add).to(child.weight.device))
            elif isinstance(child, nn.Linear) and full != "head":
                setattr(parent, name, DSELinear(child, ratio, 1, add).to(child.weight.device))
            else:
                visit(child, full + ".")
                continue
            if followed and not add:
                host_bns.add(id(nxt))

    visit(model, "")
    return [m for name, m in model.named_modules()
            if isinstance(m, _BatchNorm)
            and (name.endswith("dfe_bn") or id(m) in host_bns)]


def key_kind(key: str) -> str:
    """``local`` (DSE running statistics and batch counter), ``personal`` (other DSE tensors) or ``shared``
    (algorithm/fdse.py:98-104; the DSE batch counter kept local here, see the module docstring)."""
    *mods, leaf = key.split(".")
    if mods and mods[-1] == "dse_bn" and (leaf.startswith("running_") or leaf == "num_batches_tracked"):
        return "local"
    return "personal" if any(m.startswith("dse_") for m in mods) else "shared"


# ------------------------------------------------------------------ server


def min_norm_weights(vecs: torch.Tensor, tol: float = 1e-12, max_iter: int = 1000) -> np.ndarray:
    """The simplex weights ``lambda`` minimising ``|sum_i lambda_i v_i|^2`` (``vecs``: n x d), as the
    official QP (algorithm/fdse.py:163-203: ``P = 2 J J'``, ``0 <= lambda <= 1``, ``sum lambda = 1``), solved
    in float64 by a primal active-set method on the Gram matrix."""
    J = vecs.detach().double().cpu().numpy()
    G = J @ J.T
    n = len(G)
    lam = np.zeros(n)
    j0 = int(np.argmin(np.diag(G)))
    lam[j0] = 1.0
    free = {j0}
    scale = max(float(np.abs(G).max()), 1e-300)
    for _ in range(max_iter):
        F_ = sorted(free)
        k = len(F_)
        kkt = np.zeros((k + 1, k + 1))
        kkt[:k, :k] = G[np.ix_(F_, F_)]
        kkt[:k, k] = 1.0
        kkt[k, :k] = 1.0
        rhs = np.zeros(k + 1)
        rhs[k] = 1.0
        sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
        target = np.zeros(n)
        target[F_] = sol[:k]
        if (target[F_] >= -tol).all():
            lam = np.clip(target, 0.0, None)
            lam /= lam.sum()
            g = G @ lam
            nu = float(lam @ g)  # the common gradient value on the support
            out = [i for i in range(n) if i not in free]
            if not out:
                return lam
            i = min(out, key=lambda i: g[i])
            if g[i] >= nu - tol * scale:
                return lam
            free.add(i)
        else:  # step towards the target until a free weight reaches 0, and fix that one at 0
            d = target - lam
            ratios = [(lam[i] / -d[i], i) for i in F_ if d[i] < 0]
            alpha, i = min(ratios)
            lam = lam + min(alpha, 1.0) * d
            lam[i] = 0.0
            lam = np.clip(lam, 0.0, None)
            lam /= lam.sum()
            free.discard(i)
    return lam


def fair_aggregate(current: torch.Tensor, locals_: Sequence[torch.Tensor]) -> torch.Tensor:
    """``w + mean_i |d_i| * sum_i lambda_i d_i / (|d_i| + 1e-8)``, ``d_i = w_i - w``, ``lambda`` the min-norm
    weights (algorithm/fdse.py:133-144)."""
    crt = current.reshape(-1)
    d = [t.reshape(-1) - crt for t in locals_]
    norms = torch.stack([t.norm() for t in d])
    unit = torch.stack([t / (n + 1e-8) for t, n in zip(d, norms)])
    lam = torch.as_tensor(min_norm_weights(unit), dtype=unit.dtype, device=unit.device)
    return (norms.mean() * (lam @ unit) + crt).reshape(current.shape)


def similarity_aggregate(tensors: Sequence[torch.Tensor], tau: float) -> List[torch.Tensor]:
    """Per participant i: ``sum_j softmax_j(cos(t_i, t_j) / tau) t_j`` (algorithm/fdse.py:153-160)."""
    flat = torch.stack([t.reshape(-1) for t in tensors])
    norm = flat.norm(dim=1, keepdim=True)
    unit = torch.where(norm > 0, flat / norm, torch.zeros_like(flat))  # a zero tensor: cosine 0 (official: NaN)
    w = torch.softmax(unit @ unit.T / tau, dim=1)
    return [(wi @ flat).reshape(tensors[0].shape) for wi in w]


# ------------------------------------------------------------------ regulariser


def consistency_loss(feats: Sequence[torch.Tensor], g_means: Sequence[torch.Tensor], g_vars: Sequence[torch.Tensor],
                     weights: Sequence[float], momenta: Sequence[float], fn: Optional[torch.Tensor] = None,
                     vn: Optional[torch.Tensor] = None
                     ) -> Tuple[Union[torch.Tensor, float], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(loss, fn, vn): algorithm/fdse.py:254-263. ``feats[i]``: layer i's per-channel batch mean of its input;
    ``fn``/``vn``: the EMA carried from the previous step (None at the first). With no layers: (0.0, fn, vn)."""
    loss_mean: Union[torch.Tensor, float] = 0.0
    loss_var: Union[torch.Tensor, float] = 0.0
    for f, g, v, w, m in zip(feats, g_means, g_vars, weights, momenta):
        mf, vf = f.mean(dim=0), f.var(dim=0)
        fn = (1.0 - m) * fn + m * mf if fn is not None else mf
        vn = (1.0 - m) * vn + m * vf if vn is not None else vf
        loss_mean = loss_mean + w * ((g.pow(2) - fn.pow(2)) / (2 * vn)).mean()
        loss_var = loss_var + w * 0.5 * (torch.log(vn / (v + 1e-8)) + v / (vn + 1e-8)).mean()
    return loss_mean + loss_var, fn, vn


def _channel_mean(x: torch.Tensor) -> torch.Tensor:
    """algorithm/fdse.py:238: batch mean, then spatial mean for maps."""
    return x.mean(dim=0).mean(dim=-1).mean(dim=-1) if x.dim() > 3 else x.mean(dim=0)


def _tracked_stats(layer: _BatchNorm) -> Tuple[torch.Tensor, torch.Tensor]:
    """A DFE BatchNorm's running mean and variance (the regulariser's global statistics, :231-232)."""
    if layer.running_mean is None or layer.running_var is None:
        raise ValueError(f"fdse's regulariser reads the running statistics of the DFE BatchNorms; {layer} tracks "
                         f"none (track_running_stats=False)")
    return layer.running_mean, layer.running_var


def _ema_momentum(layer: _BatchNorm) -> float:
    """A DFE BatchNorm's momentum, the regulariser's EMA rate across layers and steps (:259-260)."""
    if layer.momentum is None:
        raise ValueError(f"fdse's regulariser carries its statistics with the DFE BatchNorms' momentum; {layer} has "
                         f"momentum=None (a cumulative average)")
    return layer.momentum


@dataclass
class _TrainContext:
    """One client's local training (:meth:`FDSE._train`): what the regulariser reads and carries."""

    g_means: List[torch.Tensor]  # global statistics at the start of local training (:231-232)
    g_vars: List[torch.Tensor]
    weights: List[float]  # softmax(beta * i) (:233-234)
    momenta: List[float]  # the DFE BatchNorms' momenta (filled only when the regulariser runs)
    reg: bool  # from the second round on, lmbd > 0 (:253)
    feats: Dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> per-channel batch mean of its input
    fn: Optional[torch.Tensor] = None  # the EMA carried across steps (:259-260)
    vn: Optional[torch.Tensor] = None


# ------------------------------------------------------------------ the method


@METHODS.register("fdse")
class FDSE(Method):
    """FDSE: decomposed layers; DFE fairly aggregated (min-norm QP), DSE personalised by similarity."""

    name = "fdse"
    Params: ClassVar[type] = FDSEParams
    requires_homogeneous = True
    weight_copies = 2  # per participant: its personalised DSE tensors; the global shared tensors
    supports_sampling = True  # only the round's sampled clients train (under the global scoring protocol)
    supports_server_model = False
    per_client_state = "keeps each participant's domain-skew erasers and their BatchNorm statistics"
    scenario_defaults = {
        "office_caltech": {"lmbd": 0.05, "tau": 0.5, "beta": 0.05},  # config/office/fdse.yml:1-4
        "pacs": {"lmbd": 0.5, "tau": 0.5, "beta": 0.001},  # config/pacs/fdse.yml:1-4
    }

    _tc: Optional[_TrainContext] = None  # set by _train for the duration of one client's local training

    def setup(self, ctx) -> None:
        self._device = ctx.device
        self.layers: Dict[str, List[_BatchNorm]] = {}
        # the new layers' initialisation draws from the CPU generator only (whatever the device), from
        # the run's seed, and leaves every generator of the engine where it was
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(ctx.seed)
            for c in ctx.participants:
                self.layers[c.name] = decompose(c.model, self.p.ratio, self.p.dw_size, self.p.dfe_bn)
        state = ctx.participants[0].model.state_dict()
        for c in ctx.participants[1:]:
            c.model.load_state_dict(state)
        self.kinds = {k: key_kind(k) for k in state}
        self.shared: State = {k: v.detach().clone() for k, v in state.items() if self.kinds[k] == "shared"}
        per = {k: v.detach().clone() for k, v in state.items() if self.kinds[k] == "personal"}
        self.personal: Dict[str, State] = {c.name: {k: v.clone() for k, v in per.items()} for c in ctx.participants}

    def local_update(self, ctx) -> Dict[str, float]:
        """Each client of the round trains the package it holds (algorithm/fdse.py:212-214, :222): the
        server's shared + its personalised tensors, delivered by the engine (:meth:`server_step`)."""
        return {f"{c.name}/train/local_loss": self._train(ctx, c) for c in ctx.trained}

    def _train(self, ctx, c) -> float:
        layers = self.layers[c.name]
        stats = [_tracked_stats(l) for l in layers]
        reg = ctx.round > 1 and self.p.lmbd > 0
        tc = _TrainContext(g_means=[m.detach().clone() for m, _ in stats],
                           g_vars=[v.detach().clone() for _, v in stats],
                           weights=torch.softmax(torch.tensor([self.p.beta * i for i in range(len(layers))],
                                                              dtype=torch.float64), 0).tolist(),
                           momenta=[_ema_momentum(l) for l in layers] if reg else [], reg=reg)
        hooks = [l.register_forward_hook(lambda mod, inp, out, i=i: tc.feats.__setitem__(i, _channel_mean(inp[0])))
                 for i, l in enumerate(layers)]
        self._tc = tc
        try:
            return ctx.train_local(c, lambda cl, x, y, s: self.local_loss(ctx, cl, x, y, s))
        finally:
            for h in hooks:
                h.remove()
            self._tc = None

    def local_loss(self, ctx, client, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        tc = self._tc
        if tc is not None:
            tc.feats.clear()
        loss = F.cross_entropy(client.model(x), y)
        if tc is None or not tc.reg or not tc.g_means:
            return loss
        fn, vn = (None if t is None else t.detach() for t in (tc.fn, tc.vn))  # :269-270
        feats = [tc.feats[i] for i in range(len(tc.g_means))]
        reg, tc.fn, tc.vn = consistency_loss(feats, tc.g_means, tc.g_vars, tc.weights, tc.momenta, fn, vn)
        return loss + self.p.lmbd * reg

    def server_step(self, ctx, start: Mapping[str, State], trained: Mapping[str, State]) -> Dict[str, State]:
        """The shared tensors fairly (min-norm QP), the trained clients' personalised ones by similarity; every
        client receives shared + its personalised tensors (algorithm/fdse.py:110-113); its local DSE
        running statistics stay its own."""
        by_name = {c.name: c for c in ctx.participants}
        # a participant without images has no update: its zero step would be the min-norm direction (issue 51 R28)
        sent = holding_data([by_name[n] for n in trained], self.name, ctx.round,
                            "they have no update and are left out of the aggregation")
        if not sent:
            return {c.name: {**self.shared, **self.personal[c.name]} for c in ctx.participants}
        names = [c.name for c in sent]
        states = [trained[n] for n in names]
        new_shared: State = {}
        for k, cur in self.shared.items():
            if "num_batches_tracked" in k:  # algorithm/fdse.py:127-128
                new_shared[k] = torch.stack([s[k] for s in states]).sum(0)
            elif "running_" in k:  # :131
                new_shared[k] = torch.stack([s[k] for s in states]).mean(0)
            else:
                new_shared[k] = fair_aggregate(cur, [s[k] for s in states])
        self.shared = new_shared
        for k in self.personal[names[0]]:
            if "num_batches_tracked" in k:  # :152
                continue
            for n, t in zip(names, similarity_aggregate([s[k] for s in states], self.p.tau)):
                self.personal[n][k] = t.detach().clone()
        return {c.name: {**self.shared, **self.personal[c.name]} for c in ctx.participants}

    # -- resumable state ------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"shared": cpu_copy(self.shared), "personal": {n: cpu_copy(s) for n, s in self.personal.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = sorted(set(state) - {"shared", "personal"})
        if unknown:
            raise ValueError(f"fdse state has unknown keys {unknown}; expected ['personal', 'shared']")
        dev = self._device
        self.shared = {k: v.to(dev) for k, v in state["shared"].items()}
        self.personal = {n: {k: v.to(dev) for k, v in s.items()} for n, s in state["personal"].items()}
