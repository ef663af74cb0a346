"""FedH2L (Li et al., "FedH2L: Federated Learning with Model and Statistical Heterogeneity",
``papers/fedh2l.txt`` § III, Algorithm 1): decentralised mutual distillation on a shared
labeled seed set, with the peer gradient projected against the local one.

No server. A FedH2L *round* is one minibatch step (the paper trains 10,000 rounds of
batch 32), so this module also holds :class:`StepwiseMethod`, the one-step-per-round
schedule shared with the IND and AGG baselines (``ind.py``, ``agg.py``). Each round:

1. local optimisation (Eq. 1-2): every node takes one AMSGrad step of cross-entropy on a
   batch of its private data;
2. every ``E`` rounds, global mutual optimisation: every node i draws a batch from its
   own domain's public seed split (``public`` split of the partition) and broadcasts its
   posteriors on it and its accuracy on it (the teaching confidence, Eq. 3); then each
   node minimises ``1/(N-1) sum_j Acc_j KL(p_j || p_i) + 1/(N-1) sum_j CE(f_i(x_j), y_j)``
   over its peers' batches (Eq. 3-6); the resulting flat gradient ``g_pub`` is projected
   against the local gradient ``g_loc`` (Eq. 7-8, closed form of Eq. 14) and applied with
   a second AMSGrad optimiser (Algorithm 1's separate rates beta and eta).

Kept from the paper: AMSGrad lr 1e-3, weight decay 1e-4, batch 32 (§ IV-A, Rotated MNIST);
teachers' posteriors computed after the local step and before any global update (so the
nodes' order does not matter); accuracy weights as fractions, not normalised (Eq. 3).

Choices where the paper is silent (REFERENCE.md lists the readings):

* ``E > 1``: ``g_loc`` is the *sum* of the E local gradients since the last global step
  (``g_loc: grad_sum``, equal to Eq. 2 at E = 1), or the parameter change
  ``theta_0 - theta_E`` (``g_loc: param_change``; under AMSGrad a different direction).
* The KL is summed over classes and averaged over the batch, no temperature; teachers'
  posteriors are taken in eval mode; the CE term uses the peers' batches only (Eq. 5).
* Unlabeled public data (``public_labels: false``, § IV-E 2): KL only, and the teaching
  confidence is 1 (no labels to measure it).
* ``peers: random_pairs`` (the asynchronous row of Table II, § IV-D "Limitations"): each
  global round the nodes are paired at random and each learns from its partner only
  (normalised by its one peer); with an odd N one node sits the round out.
* ``projection: pcgrad`` (Table V): PCGrad's combined update (both gradients projected
  off each other when they conflict, then summed) replaces ``g~``.
* Batches: each node walks through a fresh permutation of its private data (last partial
  batch dropped); public batches are drawn without replacement each global round, of
  size ``min(batch, smallest public split)``.
* Communication counts posteriors (float32), the accuracy (float32) and the batch's
  indices into the shared seed set (int32) on every sender -> receiver edge; FedAvg's
  reference is every node uploading and downloading its float32 parameters each round.

Every node's gradients live in one flat buffer (``p.grad`` are views into it), so
``g_loc`` / ``g_pub`` and the projection are flat-vector operations with no Python loop
over parameters in the round.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping, Tuple

import torch
import torch.nn.functional as F

from ..data.loading import normalize
from ..engine.federation import derive_seeds
from ..errors import ConfigError
from ..losses import batch_accuracy, h2l_mutual_loss, project_gradient
from .base import METHODS, Method

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


@dataclass(frozen=True)
class FedH2LParams(StepParams):
    E: int = 1  # § IV-A: global step every E rounds, default 1 (Table VI: 1 / 5 / 10)
    g_loc: Literal["grad_sum", "param_change"] = "grad_sum"  # E > 1 reading of "(g_E - g_0)"; see docstring
    projection: Literal["closed_form", "none", "pcgrad"] = "closed_form"  # Eq. 8 / Table V ablations
    kl: bool = True  # Eq. 3 KL mimicry term (Table V "no KL": false)
    public_labels: bool = True  # CE on labeled public batches, Eq. 5 (false: unlabeled extension, Tables VII-VIII)
    peers: Literal["all", "random_pairs"] = "all"  # all N-1 peers (Eq. 3) or random pairs (Table II asynchronous)

    def __post_init__(self):
        super().__post_init__()
        if self.E < 1:
            raise ValueError(f"E must be >= 1, got {self.E}")
        if not self.kl and not self.public_labels:
            raise ValueError("kl: false with public_labels: false leaves no global loss; enable one of them")


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

    def __init__(self, model, x, y, lr, wd, two_optimizers: bool):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buf = bind_flat_grads(model)
        self.x, self.y = x, y
        self.opt_local = torch.optim.Adam(self.params, lr=lr, weight_decay=wd, amsgrad=True)
        self.opt_global = (torch.optim.Adam(self.params, lr=lr, weight_decay=wd, amsgrad=True)
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

    def train_data(self, fed, c) -> Tuple[torch.Tensor, torch.Tensor]:
        return c.data.get("private")

    def setup(self, fed) -> None:
        # A generator of the method's own (batches, public draws, peer pairs), derived from the run
        # seed beside the engine's children, so its state can be checkpointed with the method.
        self.gen = torch.Generator().manual_seed(derive_seeds(fed.seed, len(fed.clients) + 3)[-1])
        self.nodes = []
        for c in fed.clients:
            x, y = self.train_data(fed, c)
            if len(y) < self.p.batch:
                raise ConfigError(f"methods.{self.name}.batch: {self.p.batch} exceeds participant {c.name!r}'s "
                                  f"{len(y)} training samples")
            self.nodes.append(_Node(c.model, x, y, self.p.lr, self.p.weight_decay, self.two_optimizers))
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

    def global_step(self, fed, r: int) -> None:
        pass

    def run_round(self, fed, r: int) -> Dict[str, float]:
        losses = []
        for i, (c, node) in enumerate(zip(fed.clients, self.nodes)):
            x, y = self.next_batch(node)
            c.model.train()
            loss = F.cross_entropy(c.model(x), y)
            node.buf.zero_()
            loss.backward()
            self.after_local(i, node)
            node.opt_local.step()
            losses.append(loss.detach())
        self.accumulate("local_loss", torch.stack(losses))
        self.global_step(fed, r)
        self.count += 1
        return self.flush(fed) if r % self.p.log_every == 0 else {}

    def accumulate(self, key: str, per_node: torch.Tensor) -> None:
        self.sums[key] = self.sums[key] + per_node if key in self.sums else per_node.clone()

    def flush(self, fed) -> Dict[str, float]:
        """Mean of each accumulated quantity since the last flush, per participant (host syncs only here).

        Local quantities are averaged over rounds, global ones (``global_keys``) over global rounds.
        """
        out = {}
        for key, total in sorted(self.sums.items()):
            div = self.global_rounds_since if key in self.global_keys else self.count
            for c, v in zip(fed.clients, (total / max(div, 1)).tolist()):
                out[f"{c.name}/train/{key}"] = v
        self.sums, self.count, self.global_rounds_since = {}, 0, 0
        return out

    global_keys: Tuple[str, ...] = ()  # accumulated once per global round
    global_rounds_since = 0

    # -- communication ---------------------------------------------------------------
    def run_summary(self, fed) -> Dict[str, Any]:
        """Bytes exchanged, and FedAvg's for the same rounds (every node up- and downloads its parameters)."""
        rounds = max(fed.round, 1)
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


@METHODS.register("fedh2l")
class FedH2L(StepwiseMethod):
    """FedH2L: local CE step, then confidence-weighted mutual distillation projected against g_loc."""

    name = "fedh2l"
    Params = FedH2LParams
    two_optimizers = True
    global_keys = ("kl", "ce", "conflict")

    def setup(self, fed) -> None:
        super().setup(fed)
        self.publics = [c.data.get("public") for c in fed.clients]
        if self.p.public_labels and any(bool((y < 0).any()) for _, y in self.publics):
            raise ConfigError(f"methods.{self.name}.public_labels: true, but a participant's public split is "
                              "unlabeled; set public_labels: false")
        self.pub_batch = min([self.p.batch] + [len(y) for _, y in self.publics])
        if self.pub_batch < 1:
            raise ConfigError(f"methods.{self.name}: a participant has an empty public split (scenario alpha = 0?)")
        for node in self.nodes:
            node.gloc = torch.zeros_like(node.buf)
            node.start = flat_params(node.params)

    def after_local(self, i: int, node: _Node) -> None:
        if self.p.g_loc == "grad_sum":
            node.gloc += node.buf

    def peers(self, n: int) -> List[List[int]]:
        if self.p.peers == "all":
            return [[j for j in range(n) if j != i] for i in range(n)]
        perm = torch.randperm(n, generator=self.gen).tolist()
        out: List[List[int]] = [[] for _ in range(n)]
        for a, b in zip(perm[0::2], perm[1::2]):
            out[a], out[b] = [b], [a]
        return out

    def global_step(self, fed, r: int) -> None:
        if r % self.p.E != 0:
            return
        clients = fed.clients
        n, b = len(clients), self.pub_batch
        # Teaching signals: each node's posteriors and accuracy on a batch of its own domain's seed data.
        xs, ys, probs, accs = [], [], [], []
        with torch.no_grad():
            for c, (xp, yp) in zip(clients, self.publics):
                idx = torch.randperm(len(yp), generator=self.gen)[:b].to(yp.device)
                x, y = normalize(xp[idx]), yp[idx]
                c.model.eval()
                logits = c.model(x)
                c.model.train()
                xs.append(x)
                ys.append(y)
                probs.append(F.softmax(logits, dim=-1))
                accs.append(batch_accuracy(logits, y) if self.p.public_labels else logits.new_ones(()))
        peers = self.peers(n)
        kl_v, ce_v, conflict = (torch.zeros(n, device=fed.device) for _ in range(3))
        edges = 0
        for i, (c, node) in enumerate(zip(clients, self.nodes)):
            if self.p.g_loc == "param_change":
                node.gloc = node.start - flat_params(node.params)
            mine = peers[i]
            if mine:
                edges += len(mine)
                logits = c.model(torch.cat([xs[j] for j in mine])).view(len(mine), b, -1)
                labels = torch.stack([ys[j] for j in mine]) if self.p.public_labels else None
                total, kl, ce = h2l_mutual_loss(logits, torch.stack([probs[j] for j in mine]),
                                                torch.stack([accs[j] for j in mine]), labels, kl=self.p.kl)
                node.buf.zero_()
                total.backward()
                conflict[i] = (torch.dot(node.buf, node.gloc) < 0).float()
                node.buf.copy_(project_gradient(node.buf, node.gloc, self.p.projection))
                node.opt_global.step()
                kl_v[i], ce_v[i] = kl.detach(), ce.detach()
            node.gloc.zero_()
            if self.p.g_loc == "param_change":
                node.start = flat_params(node.params)
        self.accumulate("kl", kl_v)
        self.accumulate("ce", ce_v)
        self.accumulate("conflict", conflict)
        self.global_rounds += 1
        self.global_rounds_since += 1
        self.comm_bytes += edges * (b * fed.num_classes * FLOAT_BYTES + FLOAT_BYTES + b * INDEX_BYTES)

    def node_state(self, node: _Node) -> Dict[str, Any]:
        return {**super().node_state(node), "gloc": node.gloc.clone(), "start": node.start.clone()}

    def load_node_state(self, node: _Node, s: Mapping[str, Any]) -> None:
        super().load_node_state(node, s)
        node.gloc, node.start = s["gloc"].clone(), s["start"].clone()
