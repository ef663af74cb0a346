"""Fused clients: a round's clients trained as ONE batched model (``torch.func``).

Why one file of ~470 lines: the stacked forward/backward, the optimiser arithmetic it must
reproduce exactly, and the refusals of what it cannot fuse are one contract (equal to the
sequential path); split apart, a change to one could not be read beside the others.

Many-client methods (FedAvg, FedProx, FedMMD/FedFusion on the FedAvg CNNs, FedH2L's
LeNet) train tens of small identical models on batches of 10. One at a time, each step
is a handful of tiny kernels and the device waits on Python. Here the clients'
parameters are stacked along a new leading dimension and one step of *all* of them is
one call: ``vmap`` over ``functional_call`` of the shared module, gradients from
``grad_and_value``, and the optimiser (SGD with momentum, or Adam, exactly as
``torch.optim`` computes them) applied to the stacked tensors.

Equal to training the clients one after another (:meth:`Federation.train_local`) within
float rounding, provided that

* the model has no BatchNorm (running statistics would have to be stacked as well;
  :func:`check_fusable` refuses such a model with one clear line);
* each client sees the same batches in the same order: :func:`federation_batches`
  draws them from the clients' own generators exactly as the sequential loop does;
* dropout draws differ: ``randomness="different"`` gives every client its own masks,
  but not the masks the sequential loop would have drawn (equal in distribution only).
  Tests compare with dropout off.

Clients with fewer samples, and the last partial batch of an epoch, are padded to the
round's batch size; the loss is a masked mean over the real samples (equal to the
unpadded mean), and a client with no real sample at a step keeps its parameters and
optimiser state untouched.

Measured (../notes: one H100, fedavg_cnn_mnist, batch 10, 2 epochs of 600 images):
3.3x at 10 clients, 18x at 100; none on a 2-core CPU. ``engine.fused_clients`` selects it.

How a method uses it: through its round context. ``ctx.train_participants(..., objective=...)``
(:class:`~fedshift.engine.context.RoundContext`) trains the participants fused when the run decided to
(:func:`decide_for_run`), else one after another; a method opts in with ``fused_objective(ctx)``
(its local loss written for stacked weights). :func:`fused_train` loads the trained weights into each
client's model and returns ``{"<client>/train/local_loss": float}`` like the sequential loop (one host read).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from ..losses import cross_entropy
from .averaging import weighted_average

Batch = Tuple[Tensor, Tensor]
# objective(call, params, x, y, mask) -> scalar loss of ONE client (vmapped over clients);
# call(params, x) runs the model functionally; mask (B,) marks the real samples.
Objective = Callable[[Callable, Dict[str, Tensor], Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class FusedOptimizer:
    """The optimiser each client would use, applied to stacked tensors (torch.optim's formulas)."""

    kind: str = "sgd"  # "sgd" or "adam"
    lr: float = 0.01
    momentum: float = 0.0  # SGD only (dampening 0, no Nesterov, as fedshift's make_optimizer)
    weight_decay: float = 0.0  # L2 added to the gradient (torch.optim's coupled weight decay)
    betas: Tuple[float, float] = (0.9, 0.999)  # Adam (torch defaults)
    eps: float = 1e-8  # Adam

    def __post_init__(self):
        if self.kind not in ("sgd", "adam"):
            raise ValueError(f"fused optimizer kind must be 'sgd' or 'adam', got {self.kind!r}")

    @classmethod
    def of(cls, settings) -> "FusedOptimizer":
        """The optimiser of :class:`~fedshift.engine.federation.OptimizerSettings` (the one factory), stacked."""
        return cls(kind=settings.kind, lr=settings.lr, momentum=settings.momentum if settings.kind == "sgd" else 0.0,
                   weight_decay=settings.weight_decay)


def check_fusable(model: nn.Module) -> None:
    """Raise ValueError if the model cannot be fused (BatchNorm running statistics)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise ValueError(f"fused clients need BN-free models, but {type(model).__name__} has BatchNorm at "
                             f"{name!r}: use engine.norm: group/none, or engine.fused_clients: off")


def masked_cross_entropy(call: Callable, params: Dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    """Mean cross-entropy over the real samples of a padded batch (0 when there is none)."""
    return cross_entropy(call(params, x), y, mask)


def stack_states(states: Sequence[Mapping[str, Tensor]], names: Sequence[str]) -> Dict[str, Tensor]:
    return {n: torch.stack([s[n].detach() for s in states]) for n in names}  # stack copies: no view of a state


def unstack(stacked: Mapping[str, Tensor], index: int) -> Dict[str, Tensor]:
    return {n: t[index] for n, t in stacked.items()}


def weighted_mean_stacked(stacked: Mapping[str, Tensor], weights: Sequence[float]) -> Dict[str, Tensor]:
    """FedAvg on the stack: :func:`~fedshift.engine.averaging.weighted_average` of the unstacked states
    (the one float64 arithmetic of the sequential round, so both paths average bit for bit alike)."""
    return weighted_average([unstack(stacked, i) for i in range(len(weights))], weights)


def _pad(batches: Sequence[Optional[Batch]], size: int, like: Batch) -> Tuple[Tensor, Tensor, Tensor]:
    """Stack per-client batches (None: the client is done) into (C, size, ...) with a real-sample mask."""
    x0, y0 = like
    xs, ys, ms = [], [], []
    for b in batches:
        n = 0 if b is None else len(b[1])
        x = x0.new_zeros((size, *x0.shape[1:]))
        y = y0.new_zeros((size,))
        if n:
            x[:n] = b[0]
            y[:n] = b[1]
        m = torch.zeros(size, dtype=torch.bool, device=y0.device)
        m[:n] = True
        xs.append(x)
        ys.append(y)
        ms.append(m)
    return torch.stack(xs), torch.stack(ys), torch.stack(ms)


class _StackedOptimizer:
    """torch.optim.SGD / Adam on stacked parameters, one step counter per client.

    Which clients step is known on the host (who had a batch), so the update needs no host
    sync: all clients active (the usual case) updates the stacks in place; otherwise the
    active rows are gathered, updated and written back.
    """

    def __init__(self, cfg: FusedOptimizer, params: Dict[str, Tensor], clients: int):
        self.cfg = cfg
        self.steps = [0] * clients
        self.state: Dict[str, Dict[str, Tensor]] = {n: {} for n in params}

    @torch.no_grad()
    def step(self, params: Dict[str, Tensor], grads: Dict[str, Tensor], active: Sequence[bool]) -> None:
        idx = [i for i, a in enumerate(active) if a]
        if not idx:
            return
        steps = [self.steps[i] + 1 for i in idx]
        for i in idx:
            self.steps[i] += 1
        full = len(idx) == len(active)
        for n, p in params.items():
            st = self.state[n]
            if not st:
                st.update({k: torch.zeros_like(p) for k in (("buf",) if self.cfg.kind == "sgd" else ("m", "v"))})
            if full:
                self._update(p, grads[n], st, steps)
            else:
                rows = torch.tensor(idx, device=p.device)
                sub_p, sub_st = p[rows], {k: v[rows] for k, v in st.items()}
                self._update(sub_p, grads[n][rows], sub_st, steps)
                p[rows] = sub_p
                for k, v in sub_st.items():
                    st[k][rows] = v

    def _per_client(self, values: List[float], like: Tensor) -> Tensor:
        return torch.tensor(values, dtype=like.dtype).to(like.device, non_blocking=True).view(
            -1, *([1] * (like.dim() - 1)))

    def _update(self, p: Tensor, g: Tensor, st: Dict[str, Tensor], steps: List[int]) -> None:
        """One torch.optim step of the rows in p (all of them active), in place."""
        cfg = self.cfg
        if cfg.weight_decay:
            g = g.add(p, alpha=cfg.weight_decay)
        if cfg.kind == "sgd":
            if cfg.momentum:
                buf = st["buf"]
                if all(t == 1 for t in steps):
                    buf.copy_(g)  # torch.optim.SGD: the first buffer is the gradient itself
                elif any(t == 1 for t in steps):
                    first = self._per_client([float(t == 1) for t in steps], p)
                    buf.mul_(cfg.momentum * (1 - first)).add_(g)
                else:
                    buf.mul_(cfg.momentum).add_(g)
                g = buf
            p.add_(g, alpha=-cfg.lr)
            return
        b1, b2 = cfg.betas
        m, v = st["m"], st["v"]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        if len(set(steps)) == 1:
            t = steps[0]
            denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(cfg.eps)
            p.addcdiv_(m, denom, value=-cfg.lr / (1 - b1 ** t))
        else:
            bc2 = self._per_client([math.sqrt(1 - b2 ** t) for t in steps], p)
            size = self._per_client([cfg.lr / (1 - b1 ** t) for t in steps], p)
            denom = (v.sqrt() / bc2).add_(cfg.eps)
            p.sub_(m / denom * size)


def train_clients_fused(model: nn.Module, client_batches: Sequence[Iterable[Batch]], opt: FusedOptimizer,
                        init: Optional[Sequence[Mapping[str, Tensor]]] = None,
                        objective: Optional[Objective] = None,
                        randomness: str = "different") -> Tuple[Dict[str, Tensor], Tensor]:
    """Train ``len(client_batches)`` copies of ``model`` at once, each on its own batch stream.

    ``client_batches[c]``: client c's batches ``(x, y)`` in order (all its local epochs).
    ``init``: per-client state dicts to start from (default: ``model``'s own weights for
    every client, the FedAvg case). Returns the stacked trained parameters
    ``{name: (C, ...)}`` and each client's mean training loss ``(C,)`` (device tensors: no
    host sync). Buffers (none in a fusable model but non-persistent constants) are shared.
    """
    check_fusable(model)
    names = [n for n, _ in model.named_parameters()]
    buffers = dict(model.named_buffers())
    clients = len(client_batches)
    if clients == 0:
        raise ValueError("train_clients_fused needs at least one client")
    states = init if init is not None else [dict(model.named_parameters())] * clients
    params = stack_states(states, names)
    objective = objective or masked_cross_entropy

    def call(p: Dict[str, Tensor], x: Tensor, *args) -> Tensor:  # args: extra forward inputs (FedFusion's map)
        return functional_call(model, (p, buffers), (x, *args))

    def one(p, x, y, m):
        return objective(call, p, x, y, m)

    step_fn = vmap(grad_and_value(one), randomness=randomness)
    optim = _StackedOptimizer(opt, params, clients)
    dev = next(iter(params.values())).device
    loss_sum = torch.zeros(clients, dtype=torch.float64, device=dev)
    steps = torch.zeros(clients, dtype=torch.int64, device=dev)
    was_training = model.training
    model.train()
    try:
        for group in itertools.zip_longest(*[iter(b) for b in client_batches]):
            like = next(b for b in group if b is not None)
            size = max(len(b[1]) for b in group if b is not None)
            x, y, m = _pad(group, size, like)
            active = [b is not None and len(b[1]) > 0 for b in group]
            grads, loss = step_fn(params, x, y, m)
            optim.step(params, grads, active)
            act = torch.tensor(active).to(dev, non_blocking=True)
            loss_sum += torch.where(act, loss.detach().double(), 0.0)
            steps += act.long()
    finally:
        model.train(was_training)
    return params, (loss_sum / steps.clamp(min=1)).to(torch.float32)


# ---------------------------------------------------------------- engine glue
def federation_batches(fed, client, epochs: int, split: str = "private") -> Iterable[Batch]:
    """The client's batches over ``epochs`` epochs, drawn as :meth:`Federation.train_local` draws them."""
    for _ in range(epochs):
        yield from fed.private_batches(client, split=split)


#: auto's choice per device type: the largest model (trainable parameters) auto fuses. CUDA: every
#: model (H100 prototype, notes/gpu-h100.md: 3.3x at 10 clients, 18x at 100). CPU, measured here
#: (benchmarks/results/clients_fused_cpu.md): LeNet (61,706 parameters) 1.2x at 10 sampled clients of
#: 400 images, 1.6x at 10 of 40, 5.9x at 100 of 4; fedavg_cnn_mnist (1.66 M) 0.87x at 10 clients of
#: 600 (docs/gpu.md). The CPU bound sits between the two measured sizes. A device type not listed: never.
AUTO_MAX_PARAMS = {"cuda": float("inf"), "cpu": 200_000}


def auto_fuses(device_type: str, model: nn.Module) -> bool:
    """Whether ``fused_clients: auto`` fuses this model on this device type (see AUTO_MAX_PARAMS)."""
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return n <= AUTO_MAX_PARAMS.get(device_type, -1)


def fusion_obstacle(method, archs: Sequence[str], models: Sequence[nn.Module]) -> Optional[str]:
    """Why the method's clients cannot be trained fused here (None: they can).

    A method opts in with ``fused_objective(fed)`` (its local loss as an :data:`Objective`);
    one without it (per-client Python state, or a loss not written for stacked weights) is
    refused by name; so are mixed architectures and BatchNorm models.
    """
    owner = next((k for k in type(method).__mro__ if callable(vars(k).get("fused_objective"))), None)
    if owner is None or not callable(method.fused_objective):
        return (f"method {method.name!r} has no fused local objective (per-client state or a loss "
                "not written for stacked weights)")
    for hook in ("local_loss", "local_update"):  # a subclass that changes the loss (MOON, FedRS) is not covered
        if getattr(type(method), hook) is not getattr(owner, hook):
            return (f"method {method.name!r} overrides {hook} of {owner.__name__}, whose fused objective "
                    "would then train a different loss")
    if len(set(archs)) != 1:
        return f"the participants' architectures differ ({', '.join(sorted(set(archs)))})"
    for m in models[:1]:
        try:
            check_fusable(m)
        except ValueError:
            bn = next(n for n, x in m.named_modules() if isinstance(x, nn.modules.batchnorm._BatchNorm))
            return f"{archs[0]} has BatchNorm at {bn!r} (running statistics are per client)"
    return None


def fusion_decision(mode: str, method, archs: Sequence[str], models: Sequence[nn.Module],
                    device_type: str, on_nonfinite: str = "fail") -> Tuple[bool, str]:
    """(fuse?, why) for ``engine.fused_clients``; ``on`` with an obstacle raises ConfigError (one line)."""
    from ..errors import ConfigError

    if mode == "off":
        return False, "engine.fused_clients: off"
    obstacle = fusion_obstacle(method, archs, models)
    if not obstacle and on_nonfinite != "fail":  # the fused step cannot skip one client's batch
        obstacle = f"engine.on_nonfinite: {on_nonfinite} skips single batches, which a fused step cannot"
    if obstacle:
        if mode == "on":
            raise ConfigError(f"engine.fused_clients: on cannot fuse: {obstacle}; use fused_clients: auto or off")
        return False, f"auto fell back: {obstacle}"
    only = method.fused_auto_devices  # a method measured slower fused on some devices
    if mode == "auto" and only is not None and device_type not in only:
        return False, (f"auto fell back: method {method.name!r} fuses by auto only on {', '.join(only)} "
                       f"(measured slower fused on {device_type})")
    if mode == "auto" and not auto_fuses(device_type, models[0]):
        return False, (f"auto fell back: on {device_type} fusion pays off only up to "
                       f"{AUTO_MAX_PARAMS.get(device_type, 0):,} parameters (benchmarks/results/clients_fused_cpu.md)")
    return True, f"engine.fused_clients: {mode}"


def plan_check(method, archs: Sequence[str], norm: str, mode: str, device: str, on_nonfinite: str = "fail") -> None:
    """:func:`fusion_decision` at planning time (before any job): builds one model to look for BatchNorm."""
    if mode == "off":
        return
    from ..models import create_model

    with torch.random.fork_rng(devices=[]):  # planning leaves the global RNG as it found it
        models = [create_model(archs[0], num_classes=10, in_channels=3, **({} if norm == "default" else {"norm": norm}))]
    fusion_decision(mode, method, archs, models, device.split(":")[0], on_nonfinite)


def decide_for_run(fed, method, log=None) -> bool:
    """Decide once per run, store it on ``fed`` (``fed.fused``) and log which path trains the clients."""
    import logging

    fuse, why = fusion_decision(fed.cfg.fused_clients, method, [c.arch for c in fed.clients],
                                [c.model for c in fed.clients], fed.device.type, fed.cfg.on_nonfinite)
    fed.fused, fed.fused_reason = fuse, why
    (log or logging.getLogger("fedshift")).info("clients train %s (%s)", "fused" if fuse else "sequentially", why)
    return fuse


def use_fused(fed, clients) -> bool:
    """Whether this run trains its clients fused (decided once by :func:`decide_for_run`)."""
    if len(clients) < 2:
        return False
    if not hasattr(fed, "fused"):  # a federation driven without the runner (tests, benchmarks)
        mode = getattr(fed.cfg, "fused_clients", "off")
        if mode == "off":
            return False
        if len({c.arch for c in clients}) != 1:
            return False
        try:
            check_fusable(clients[0].model)
        except ValueError:
            if mode == "on":
                raise
            return False
        return mode == "on" or auto_fuses(fed.device.type, clients[0].model)
    return fed.fused


def fused_train(fed, clients, objective: Optional[Objective], start: Optional[Mapping[str, Tensor]] = None,
                epochs: Optional[int] = None, split: str = "private") -> Tuple[Dict[str, float], Dict[str, Tensor]]:
    """Local updating of ``clients`` as one fused model, each from ``start`` (one state for all: the
    server-averaging round) or from its own current weights, with a fresh optimiser of the engine's
    kind (:meth:`Federation.optimizer_settings`, as the sequential loop). Where the clients hold distinct
    model objects each gets its trained weights back. Returns ``{"<client>/train/local_loss": float}``
    (one host read) and the stacked trained parameters ``{name: (C, ...)}``.

    Memory: the stacked weights of these clients (plus optimiser state). Buffers (none trainable in a
    BN-free model) are not trained."""
    epochs = fed.cfg.local_epochs if epochs is None else epochs
    model = clients[0].model
    fed.fused_rounds = getattr(fed, "fused_rounds", 0) + 1  # evidence that this path ran (tests, logs)
    init = [start] * len(clients) if start is not None else [dict(c.model.named_parameters()) for c in clients]
    params, losses = train_clients_fused(model, [federation_batches(fed, c, epochs, split) for c in clients],
                                         FusedOptimizer.of(fed.optimizer_settings("local")), init=init,
                                         objective=objective)
    if len({id(c.model) for c in clients}) == len(clients):
        with torch.no_grad():
            for i, c in enumerate(clients):
                for n, p in c.model.named_parameters():
                    p.copy_(params[n][i])
    values = losses.tolist()  # one host read for all clients
    out = {}
    for c, v in zip(clients, values):
        fed.check_total(float(v), c.name, "local_loss")
        out[f"{c.name}/train/local_loss"] = float(v)
    return out, params


def stack_parameters(model: nn.Module, models: Sequence[nn.Module]) -> Dict[str, Tensor]:
    """The trainable parameters of ``len(models)`` identical models, stacked on a new leading dimension."""
    return stack_states([dict(m.named_parameters()) for m in models],
                        [n for n, p in model.named_parameters() if p.requires_grad])


def stacked_forward(model: nn.Module, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
    """Each stacked model on its own input: ``x`` is ``(C, B, ...)``, the result ``(C, B, classes)``."""
    buffers = dict(model.named_buffers())
    return vmap(lambda p, xb: functional_call(model, (p, buffers), (xb,)), randomness="different")(dict(params), x)


def stacked_grads_aux(model: nn.Module, params: Mapping[str, Tensor], inputs: Sequence[Tensor],
                      objective: Callable) -> Tuple[Tensor, Tensor, Any]:
    """One vmapped forward/backward of the stacked models: ``objective(call, p, *inputs_c)`` returns
    ``(loss, aux)`` for one model; every tensor of ``inputs`` has the models on its first dimension.

    Returns the flat gradients ``(C, P)`` (parameters in ``parameters()`` order, each in logical
    element order, as ``methods.stepwise.bind_flat_grads``' buffer), the losses ``(C,)`` and the
    stacked aux values.
    """
    check_fusable(model)
    buffers = dict(model.named_buffers())

    def call(p, x, *args):
        return functional_call(model, (p, buffers), (x, *args))

    grads, (loss, aux) = vmap(grad_and_value(lambda p, *xs: objective(call, p, *xs), has_aux=True),
                              randomness="different")(dict(params), *inputs)
    n = next(iter(params.values())).shape[0]
    flat = torch.cat([grads[k].reshape(n, -1) for k in params], 1)
    return flat, loss.detach(), aux


def stacked_flat_grads(model: nn.Module, models: Sequence[nn.Module], batches: Sequence[Batch],
                       objective: Optional[Objective] = None) -> Tuple[Tensor, Tensor]:
    """One vmapped forward/backward of ``len(models)`` identical BN-free models, each on its own
    equal-sized batch: returns the flat gradients ``(C, P)`` and the losses ``(C,)``
    (:func:`stacked_grads_aux` with a per-batch :data:`Objective`).

    The stepwise nodes of FedH2L / IND / AGG use it for their local step; their own optimisers
    then step on the rows (so optimiser state and checkpoints are those of the sequential path).
    """
    check_fusable(model)
    objective = objective or masked_cross_entropy
    x = torch.stack([b[0] for b in batches])
    y = torch.stack([b[1] for b in batches])
    mask = torch.ones(y.shape, dtype=torch.bool, device=y.device)
    flat, loss, _ = stacked_grads_aux(model, stack_parameters(model, models), (x, y, mask),
                                      lambda call, p, xb, yb, mb: (objective(call, p, xb, yb, mb), ()))
    return flat, loss
