"""The one-step-per-round schedule of FedH2L and its baselines (``papers/fedh2l.txt`` § IV-A).

A FedH2L *round* is one minibatch step (the paper trains 10,000 rounds of batch 32 with
AMSGrad, lr 1e-3, weight decay 1e-4). :class:`StepwiseMethod` is that schedule, shared by
FedH2L (``fedh2l.py``) and the IND and AGG baselines (``ind.py``, ``agg.py``): every node
keeps its own model, its own AMSGrad and its own walk through its training data.

Every node's gradients live in one flat buffer (``p.grad`` are views into it), so the
methods' gradient arithmetic (FedH2L's projection) is flat-vector work with no Python
loop over parameters in the round.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Dict, Literal, Mapping, Tuple

import torch
import torch.nn.functional as F

from ..data.loading import normalize
from ..data.scenarios.fedh2l import H2L_OPTIMISER
from ..engine.federation import derive_seeds
from ..engine.fused import masked_cross_entropy, stacked_flat_grads
from ..errors import ConfigError
from .base import Method

FLOAT_BYTES, INDEX_BYTES = 4, 4  # float32 posteriors/accuracies/parameters, int32 batch indices


@dataclass(frozen=True)
class StepParams:
    init: Literal["scratch", "base"] = "scratch"  # FedH2L § IV: every node trains from scratch
    lr: float = 1e-3  # § IV-A: AMSGrad lr 1e-3 on Rotated MNIST (PACS/Office-Home: 1e-4)
    weight_decay: float = 1e-4  # § IV-A: weight decay 1e-4 (PACS/Office-Home: 1e-5)
    batch: int = 32  # § IV-A: batch_size = 32 (private and public batches)
    log_every: int = 100  # rounds between logged training losses: tracking cost does not grow per round

    def __post_init__(self):
        if self.batch < 2:
            raise ValueError(f"batch must be >= 2, got {self.batch}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")


def flat_params(params) -> torch.Tensor:
    """The parameters as one flat vector in their logical (NCHW) element order, the order of
    :func:`bind_flat_grads`' buffer. Unlike ``parameters_to_vector`` (``view(-1)``), this also
    takes channels_last weights (``engine.channels_last``, the default)."""
    return torch.cat([p.detach().reshape(-1) for p in params])


def bind_flat_grads(model: torch.nn.Module) -> torch.Tensor:
    """Point every trainable parameter's ``.grad`` at a slice of one flat zero buffer and return it.

    Backward then accumulates in place into the buffer, which is the flat gradient;
    never call ``zero_grad(set_to_none=True)`` on such a model (zero the buffer instead).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    buf = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:  # once, at setup
        p.grad = buf[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return buf


class _Node:
    """Per-participant step state: flat gradient buffer, optimisers, data order."""

    # FedH2L's, set in its setup: the g_loc accumulator and the flat parameters at the last global step
    gloc: torch.Tensor
    start: torch.Tensor

    def __init__(self, model, x, y, lr, wd, two_optimizers: bool, global_wd: float):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buf = bind_flat_grads(model)
        self.x, self.y = x, y
        self.opt_local = torch.optim.Adam(self.params, lr=lr, weight_decay=wd, amsgrad=True)
        self.opt_global = (torch.optim.Adam(self.params, lr=lr, weight_decay=global_wd, amsgrad=True)
                           if two_optimizers else None)
        self.order = torch.zeros(0, dtype=torch.long)
        self.cursor = 0


class StepwiseMethod(Method):
    """One minibatch step per participant per round, each participant with its own AMSGrad.

    Subclasses choose the training data of the local step (:meth:`train_data`) and add
    work after it (:meth:`after_local`, :meth:`global_step`). Training losses are summed
    on the device and returned only every ``log_every`` rounds (no per-round host sync).
    """

    two_optimizers = False
    # PACS / Office-Home (Tables III-IV): § IV-B "We use AMSGrad (lr=1e-4, weight decay=1e-5)", § IV-C
    # "the same hyperparameters as in the PACS experiment" (the dataclass defaults are § IV-A's Rotated MNIST)
    scenario_defaults = {"pacs": dict(H2L_OPTIMISER), "office_home_h2l": dict(H2L_OPTIMISER)}

    def global_weight_decay(self) -> float:
        """Weight decay of the second (global) optimiser, where there is one."""
        return self.p.weight_decay

    def train_data(self, ctx, c) -> Tuple[torch.Tensor, torch.Tensor]:
        return c.data.get("private")

    def setup(self, ctx) -> None:
        # A generator of the method's own (batches, public draws, peer pairs), derived from the run
        # seed beside the engine's children, so its state can be checkpointed with the method.
        self.gen = torch.Generator().manual_seed(derive_seeds(ctx.seed, len(ctx.participants) + 3)[-1])
        self.nodes = []
        for c in ctx.participants:
            x, y = self.train_data(ctx, c)
            if len(y) < self.p.batch:
                raise ConfigError(f"methods.{self.name}.batch: {self.p.batch} exceeds participant {c.name!r}'s "
                                  f"{len(y)} training samples")
            self.nodes.append(_Node(c.model, x, y, self.p.lr, self.p.weight_decay, self.two_optimizers,
                                    self.global_weight_decay()))
        self.sums: Dict[str, torch.Tensor] = {}
        self.count = 0
        self.comm_bytes = 0
        self.global_rounds = 0

    # -- batches ---------------------------------------------------------------
    def next_batch(self, node: _Node) -> Tuple[torch.Tensor, torch.Tensor]:
        n, b = len(node.y), self.p.batch
        if node.cursor + b > len(node.order):
            node.order, node.cursor = torch.randperm(n, generator=self.gen), 0
        idx = node.order[node.cursor:node.cursor + b].to(node.y.device)
        node.cursor += b
        return normalize(node.x[idx]), node.y[idx]

    # -- the round -------------------------------------------------------------
    def after_local(self, i: int, node: _Node) -> None:
        """Called with node ``i``'s local gradient in ``node.buf``, before its optimiser step."""

    def global_step(self, ctx) -> None:
        pass

    # fused_clients: auto fuses the nodes on CUDA only: on 2 CPU cores a 1,000-round FedH2L Table II run
    # took 145.1 s CPU fused (local, teaching and mutual steps) vs 130.3 s sequential, side by side
    # (benchmarks/results/fedh2l_fused_cpu.md); `on` still fuses anywhere.
    fused_auto_devices: Tuple[str, ...] = ("cuda",)

    def fused_objective(self, ctx):
        """The local step's loss for engine.fused_clients: cross-entropy (every stepwise method's)."""
        return masked_cross_entropy

    def fused_local_step(self, ctx) -> torch.Tensor:
        """The local step of every node as one vmapped forward/backward (engine.fused_clients);
        each node's own optimiser then steps on its row of the stacked flat gradients."""
        ctx.record("fused_rounds")  # evidence that this path ran
        batches = [self.next_batch(node) for node in self.nodes]  # same draws, same order as sequential
        for c in ctx.participants:
            c.model.train()
        grads, losses = stacked_flat_grads(ctx.participants[0].model, [c.model for c in ctx.participants], batches)
        for i, node in enumerate(self.nodes):
            node.buf.copy_(grads[i])
            self.after_local(i, node)
            node.opt_local.step()
        return losses

    def run_round(self, ctx) -> Dict[str, float]:
        if ctx.use_fused(ctx.participants):
            self.accumulate("local_loss", self.fused_local_step(ctx))
            self.global_step(ctx)
            self.count += 1
            return self.flush(ctx) if ctx.round % self.p.log_every == 0 else {}
        losses = []
        for i, (c, node) in enumerate(zip(ctx.participants, self.nodes)):
            x, y = self.next_batch(node)
            c.model.train()
            loss = F.cross_entropy(c.model(x), y)
            node.buf.zero_()
            loss.backward()
            self.after_local(i, node)
            node.opt_local.step()
            losses.append(loss.detach())
        self.accumulate("local_loss", torch.stack(losses))
        self.global_step(ctx)
        self.count += 1
        return self.flush(ctx) if ctx.round % self.p.log_every == 0 else {}

    def accumulate(self, key: str, per_node: torch.Tensor) -> None:
        self.sums[key] = self.sums[key] + per_node if key in self.sums else per_node.clone()

    def flush(self, ctx) -> Dict[str, float]:
        """Mean of each accumulated quantity since the last flush, per participant (host syncs only here).

        Local quantities are averaged over rounds, global ones (``global_keys``) over global rounds.
        """
        out = {}
        for key, total in sorted(self.sums.items()):
            div = self.global_rounds_since if key in self.global_keys else self.count
            for c, v in zip(ctx.participants, (total / max(div, 1)).tolist()):
                out[f"{c.name}/train/{key}"] = v
        self.sums, self.count, self.global_rounds_since = {}, 0, 0
        return out

    global_keys: Tuple[str, ...] = ()  # accumulated once per global round
    global_rounds_since = 0

    # -- communication ---------------------------------------------------------------
    def run_summary(self, ctx) -> Dict[str, Any]:
        """Bytes exchanged, and FedAvg's for the same rounds (every node up- and downloads its parameters)."""
        rounds = max(ctx.round, 1)
        n_params = sum(n.buf.numel() for n in self.nodes)  # all nodes' models
        fedavg_round = 2 * n_params * FLOAT_BYTES
        return {"communication": {
            "bytes_total": int(self.comm_bytes),
            "bytes_per_round": self.comm_bytes / rounds,
            "global_rounds": int(self.global_rounds),
            "fedavg_bytes_per_round": fedavg_round,
            "fedavg_bytes_total": fedavg_round * rounds,
            "fedavg_over_method": (fedavg_round * rounds / self.comm_bytes) if self.comm_bytes else None,
        }}

    # -- resumable state ---------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {
            "gen": self.gen.get_state(),
            "nodes": [self.node_state(n) for n in self.nodes],
            "sums": {k: v.clone() for k, v in self.sums.items()}, "count": self.count,
            "global_rounds_since": self.global_rounds_since,
            "comm_bytes": int(self.comm_bytes), "global_rounds": int(self.global_rounds),
        }

    def node_state(self, node: _Node) -> Dict[str, Any]:
        # Copies: an optimiser's state_dict shares its live tensors, which the next step updates in place.
        s = {"opt_local": copy.deepcopy(node.opt_local.state_dict()), "order": node.order.clone(),
             "cursor": node.cursor}
        if node.opt_global is not None:
            s["opt_global"] = copy.deepcopy(node.opt_global.state_dict())
        return s

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.gen.set_state(state["gen"])
        if len(state["nodes"]) != len(self.nodes):
            raise ValueError(f"checkpoint holds {len(state['nodes'])} nodes, the run has {len(self.nodes)}")
        for node, s in zip(self.nodes, state["nodes"]):
            self.load_node_state(node, s)
        self.sums = {k: v.clone() for k, v in state["sums"].items()}
        self.count = int(state["count"])
        self.global_rounds_since = int(state["global_rounds_since"])
        self.comm_bytes = int(state["comm_bytes"])
        self.global_rounds = int(state["global_rounds"])

    def load_node_state(self, node: _Node, s: Mapping[str, Any]) -> None:
        node.opt_local.load_state_dict(s["opt_local"])
        if node.opt_global is not None:
            node.opt_global.load_state_dict(s["opt_global"])
        node.order, node.cursor = s["order"].clone(), int(s["cursor"])
