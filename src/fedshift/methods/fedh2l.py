"""FedH2L (Li et al., "FedH2L: Federated Learning with Model and Statistical Heterogeneity",
``papers/fedh2l.txt`` § III, Algorithm 1): decentralised mutual distillation on a shared
labeled seed set, with the peer gradient projected against the local one.

No server. A FedH2L *round* is one minibatch step (the paper trains 10,000 rounds of
batch 32): :class:`~.stepwise.StepwiseMethod` (``stepwise.py``), the schedule shared with
the IND and AGG baselines (``ind.py``, ``agg.py``). Each round:

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
* Readings of § IV the paper leaves open (issue 21 item 6), each a switch:

  - ``local_data``: § IV-E 2 says that with *unlabeled* public data "only node's own data
    is available for local optimization without the use of public data from other
    domains", which implies that with labeled seed data the local step also uses the other
    domains' seed data: ``private+seed`` (private + every domain's seed split). Default
    ``private`` (the step as Eq. 1-2 write it); Table II's grid states its reading.
  - ``mutual_forward``: Algorithm 1 computes the student's outputs on each peer's batch;
    ``per_peer`` (default) does so, ``concat`` runs the peers' batches as one batch. Equal
    without BatchNorm (LeNet: every layer acts per sample); with BatchNorm (PACS,
    Office-Home ResNets) the batch statistics differ, so ``concat`` is refused there.
  - ``global_weight_decay``: both AMSGrads (the local one and the global one, Algorithm 1's
    separate rates) apply § IV-A's weight decay, so a round with a global step decays the
    weights twice. ``true`` keeps that (our earlier runs); ``false`` decays in the local
    optimiser only. The paper names one weight decay and two optimisers, not which applies it.
* Communication counts posteriors (float32), the accuracy (float32) and the batch's
  indices into the shared seed set (int32) on every sender -> receiver edge; FedAvg's
  reference is every node uploading and downloading its float32 parameters each round.

``g_loc`` / ``g_pub`` and the projection are flat-vector operations on each node's flat
gradient buffer (``stepwise.bind_flat_grads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping

import torch
import torch.nn.functional as F

from ..data.loading import normalize
from ..engine.fused import stack_parameters, stacked_forward, stacked_grads_aux
from ..errors import ConfigError
from ..losses import batch_accuracy, h2l_mutual_loss, project_gradient
from .base import METHODS
from .stepwise import FLOAT_BYTES, INDEX_BYTES, StepParams, StepwiseMethod, _Node, flat_params

@dataclass(frozen=True)
class FedH2LParams(StepParams):
    E: int = 1  # § IV-A: global step every E rounds, default 1 (Table VI: 1 / 5 / 10)
    g_loc: Literal["grad_sum", "param_change"] = "grad_sum"  # E > 1 reading of "(g_E - g_0)"; see docstring
    projection: Literal["closed_form", "none", "pcgrad"] = "closed_form"  # Eq. 8 / Table V ablations
    kl: bool = True  # Eq. 3 KL mimicry term (Table V "no KL": false)
    public_labels: bool = True  # CE on labeled public batches, Eq. 5 (false: unlabeled extension, Tables VII-VIII)
    peers: Literal["all", "random_pairs"] = "all"  # all N-1 peers (Eq. 3) or random pairs (Table II asynchronous)
    # Local step's data (module doc "Readings"): own private data only, or plus every domain's labeled seed
    # split (§ IV-E 2 (i), read a contrario: only the unlabeled case excludes "public data from other domains").
    local_data: Literal["private", "private+seed"] = "private"
    # Mutual step: one forward pass per peer batch (Algorithm 1) or one pass on the peers' batches
    # concatenated (identical only without BatchNorm: refused for a BatchNorm model).
    mutual_forward: Literal["per_peer", "concat"] = "per_peer"
    # Weight decay in the global AMSGrad too (true: decay applied twice per round, by both optimisers).
    global_weight_decay: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.E < 1:
            raise ValueError(f"E must be >= 1, got {self.E}")
        if not self.kl and not self.public_labels:
            raise ValueError("kl: false with public_labels: false leaves no global loss; enable one of them")
        if self.local_data == "private+seed" and not self.public_labels:
            raise ValueError("local_data: private+seed trains on the seed labels, but public_labels is false "
                             "(§ IV-E 2: unlabeled seed data leaves only the node's own data); use local_data: private")


@METHODS.register("fedh2l")
class FedH2L(StepwiseMethod):
    """FedH2L: local CE step, then confidence-weighted mutual distillation projected against g_loc."""

    name = "fedh2l"
    steps_on_peer_batches = True  # the mutual step: each node on all its peers' batches
    Params = FedH2LParams
    two_optimizers = True
    global_keys = ("kl", "ce", "conflict")

    def global_weight_decay(self) -> float:
        return self.p.weight_decay if self.p.global_weight_decay else 0.0

    def train_data(self, ctx, c):
        """Private data, plus every domain's labeled seed split under ``local_data: private+seed``."""
        if self.p.local_data == "private":
            return c.data.get("private")
        parts = [c.data.get("private")] + [o.data.get("public") for o in ctx.participants]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

    def setup(self, ctx) -> None:
        if self.p.mutual_forward == "concat":
            for c in ctx.participants:
                bn = next((n for n, m in c.model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)),
                          None)
                if bn is not None:
                    raise ConfigError(f"methods.{self.name}.mutual_forward: concat equals per_peer only without "
                                      f"BatchNorm, but {c.name}'s {c.arch} has BatchNorm at {bn!r}; use per_peer")
        super().setup(ctx)
        self.publics = [c.data.get("public") for c in ctx.participants]
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

    def global_step(self, ctx) -> None:
        if ctx.round % self.p.E != 0:
            return
        clients = ctx.participants
        n, b = len(clients), self.pub_batch
        # engine.fused_clients: the teaching forwards and the mutual steps of all nodes as one vmapped call
        # each, on the nodes' parameters stacked once (nothing steps between the two).
        stacked = stack_parameters(clients[0].model, [c.model for c in clients]) if ctx.use_fused(clients) else None
        # Teaching signals: each node's posteriors and accuracy on a batch of its own domain's seed data.
        xs, ys, probs, accs = [], [], [], []
        with torch.no_grad():
            for xp, yp in self.publics:
                idx = torch.randperm(len(yp), generator=self.gen)[:b].to(yp.device)
                xs.append(normalize(xp[idx]))
                ys.append(yp[idx])
            for c in clients:
                c.model.eval()
            if stacked is not None:
                all_logits = list(stacked_forward(clients[0].model, stacked, torch.stack(xs)))
            else:
                all_logits = [c.model(x) for c, x in zip(clients, xs)]
            for c, logits, y in zip(clients, all_logits, ys):
                c.model.train()
                probs.append(F.softmax(logits, dim=-1))
                accs.append(batch_accuracy(logits, y) if self.p.public_labels else logits.new_ones(()))
        peers = self.peers(n)
        edges = sum(len(m) for m in peers)
        if stacked is not None and peers[0] and len({len(m) for m in peers}) == 1:
            kl_v, ce_v, conflict = self.fused_mutual_step(ctx, stacked, peers, xs, ys, probs, accs)
        else:  # sequential (or random pairs of an odd node count: a node without a partner this round)
            kl_v, ce_v, conflict = self.mutual_steps(ctx, peers, xs, ys, probs, accs)
        self.accumulate("kl", kl_v)
        self.accumulate("ce", ce_v)
        self.accumulate("conflict", conflict)
        self.global_rounds += 1
        self.global_rounds_since += 1
        self.comm_bytes += edges * (b * ctx.num_classes * FLOAT_BYTES + FLOAT_BYTES + b * INDEX_BYTES)

    def mutual_steps(self, ctx, peers, xs, ys, probs, accs):
        """Each node's mutual step in turn: Eq. 3 + 5 on its peers' batches, projected against g_loc."""
        n, b = len(ctx.participants), self.pub_batch
        kl_v, ce_v, conflict = (torch.zeros(n, device=ctx.device) for _ in range(3))
        for i, (c, node) in enumerate(zip(ctx.participants, self.nodes)):
            self.open_gloc(node)
            mine = peers[i]
            if mine:
                if self.p.mutual_forward == "concat":  # one pass: equal to per_peer without BatchNorm
                    logits = c.model(torch.cat([xs[j] for j in mine])).view(len(mine), b, -1)
                else:  # Algorithm 1: each peer's batch through the student on its own (BatchNorm batch statistics)
                    logits = torch.stack([c.model(xs[j]) for j in mine])
                labels = torch.stack([ys[j] for j in mine]) if self.p.public_labels else None
                total, kl, ce = h2l_mutual_loss(logits, torch.stack([probs[j] for j in mine]),
                                                torch.stack([accs[j] for j in mine]), labels, kl=self.p.kl)
                node.buf.zero_()
                total.backward()
                conflict[i] = (torch.dot(node.buf, node.gloc) < 0).float()
                self.global_update(node, node.buf)
                kl_v[i], ce_v[i] = kl.detach(), ce.detach()
            self.close_gloc(node)
        return kl_v, ce_v, conflict

    def fused_mutual_step(self, ctx, stacked, peers, xs, ys, probs, accs):
        """Every node's mutual step as one vmapped forward/backward (engine.fused_clients; every node has
        the same number of peers). Each node's peer batches go through it in one pass, which equals
        ``per_peer`` because fused models have no BatchNorm; the projection against each node's g_loc
        and its global AMSGrad step then run per node on its row of the stacked flat gradients."""
        ctx.record("fused_mutual_rounds")  # evidence that this path ran
        n_peers, b = len(peers[0]), self.pub_batch
        labelled, use_kl = self.p.public_labels, self.p.kl
        inputs = (torch.stack([torch.cat([xs[j] for j in mine]) for mine in peers]),
                  torch.stack([torch.stack([probs[j] for j in mine]) for mine in peers]),
                  torch.stack([torch.stack([accs[j] for j in mine]) for mine in peers]),
                  torch.stack([torch.stack([ys[j] for j in mine]) for mine in peers]))

        def objective(call, p, x, teacher, acc, labels):
            total, kl, ce = h2l_mutual_loss(call(p, x).view(n_peers, b, -1), teacher, acc,
                                            labels if labelled else None, kl=use_kl)
            return total, (kl, ce)

        grads, _, (kl_v, ce_v) = stacked_grads_aux(ctx.participants[0].model, stacked, inputs, objective)
        for node in self.nodes:
            self.open_gloc(node)
        conflict = ((grads * torch.stack([node.gloc for node in self.nodes])).sum(1) < 0).float()
        for node, grad in zip(self.nodes, grads):
            self.global_update(node, grad)
            self.close_gloc(node)
        return kl_v.detach(), ce_v.detach(), conflict

    # -- g_loc and the global step, shared by both paths ------------------------------------
    def open_gloc(self, node: _Node) -> None:
        """``g_loc: param_change``: the parameter change since the node's last global step."""
        if self.p.g_loc == "param_change":
            node.gloc = node.start - flat_params(node.params)

    def close_gloc(self, node: _Node) -> None:
        """After the global step: g_loc accumulates afresh, from the parameters as they are now."""
        node.gloc.zero_()
        if self.p.g_loc == "param_change":
            node.start = flat_params(node.params)

    def global_update(self, node: _Node, grad: torch.Tensor) -> None:
        """The global AMSGrad step on ``grad`` projected against g_loc (Eq. 8 or the Table V variant)."""
        node.buf.copy_(project_gradient(grad, node.gloc, self.p.projection))
        assert node.opt_global is not None  # FedH2L's nodes are built with both optimisers
        node.opt_global.step()

    def node_state(self, node: _Node) -> Dict[str, Any]:
        return {**super().node_state(node), "gloc": node.gloc.clone(), "start": node.start.clone()}

    def load_node_state(self, node: _Node, s: Mapping[str, Any]) -> None:
        super().load_node_state(node, s)
        node.gloc, node.start = s["gloc"].clone(), s["start"].clone()
