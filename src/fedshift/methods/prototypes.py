"""Pure arithmetic of the prototype methods (FedProto, FedTGP, FPL).

Each function takes tensors, returns tensors, keeps the input dtype (float64 works end
to end) and holds no state; :mod:`fedshift.methods.fedproto`, :mod:`fedshift.methods.fedtgp`
and :mod:`fedshift.methods.fpl` call them. Official code cited as ``repo/path:line`` at the
commits the docstrings of those modules name.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Set, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def pool_to(h: Tensor, dim: int) -> Tensor:
    """(B, d) features -> (B, dim) representation in the shared prototype space.

    HtFLlib puts ``nn.AdaptiveAvgPool1d(feature_dim)`` in place of every backbone's
    classifier (``HtFLlib system/flcore/trainmodel/models.py:26-37``), so models of
    different widths meet in one ``feature_dim``-wide space; the same pooling here.
    Identity when ``d == dim``.
    """
    if h.shape[1] == dim:
        return h
    return F.adaptive_avg_pool1d(h.unsqueeze(1), dim).squeeze(1)


def proto_mse_loss(rep: Tensor, labels: Tensor, protos: Tensor, present: Tensor) -> Tensor:
    """FedProto's regulariser as the official code computes it: ``MSELoss(proto_new, rep)``
    where ``proto_new`` is ``rep`` with each row whose class has a global prototype replaced
    by that prototype (``HtFLlib system/flcore/clients/clientproto.py:47-53``).

    So the mean over all ``B * d`` entries of ``(rep - p_y)^2`` on rows with a prototype,
    the other rows contributing 0 to the sum but counting in the mean (their target is
    ``rep.detach()``).
    """
    has = present.to(torch.bool)[labels]
    target = torch.where(has.unsqueeze(1), protos[labels].to(rep.dtype), rep.detach())
    return F.mse_loss(rep, target)


def proto_paper_loss(rep: Tensor, labels: Tensor, protos: Tensor, present: Tensor) -> Tensor:
    """FedProto's regulariser as the paper writes it: a distance between the participant's local
    prototypes and the global ones, ``sum_j ||C_i^(j) - C^(j)||_2``, over the classes ``j`` that
    have a global prototype (Tan et al., AAAI 2022; not the authors' code, which computes
    :func:`proto_mse_loss`: ``yuetan031/FedProto lib/update.py:161-171``).

    Per batch (the only place a gradient can reach): ``C_i^(j)`` = the mean of the batch's ``rep``
    rows of class ``j``; classes absent from the batch or without a global prototype add 0; the L2
    norm is not squared and not averaged over classes. A batch with no such class gives 0.
    """
    sums, counts = class_sums(rep, labels, protos.shape[0])
    keep = (counts > 0) & present.to(torch.bool)
    local = sums[keep] / counts[keep].unsqueeze(1)
    return (local - protos[keep].to(rep.dtype)).norm(dim=1).sum()


def nearest_prototype_scores(rep: Tensor, protos: Tensor, present: Tensor) -> Tensor:
    """Scores for nearest-prototype classification (``HtFLlib system/flcore/clients/clientproto.py:87-95``,
    ``clienttgp.py:107-115``: ``output[i, j] = MSELoss(rep_i, g_j)``, prediction ``argmin``): (B, C) of
    ``-mean_d (rep_i - g_j)^2``, ``-inf`` for classes without a global prototype (the official
    ``inf`` start value). The largest score is the nearest prototype, so top-k reads them as logits.
    Computed in at least float32 (the prototypes' dtype or wider)."""
    dt = torch.promote_types(torch.promote_types(rep.dtype, protos.dtype), torch.float32)
    d = (rep.to(dt).unsqueeze(1) - protos.to(dt).unsqueeze(0)).pow(2).mean(2)
    return (-d).masked_fill(~present.to(torch.bool, copy=False).unsqueeze(0), float("-inf"))


class PrototypeScoring:
    """Forward hook on a participant's classifier ``head`` for ``scoring: prototype``: in eval mode
    (every evaluation the engine runs) the head's output is replaced by
    :func:`nearest_prototype_scores` of the method's current global prototypes, computed from the
    head's input (the features ``h``, pooled by ``method.rep``); in train mode, and before any
    global prototype exists, the head's own logits pass through. So the engine scores the nearest
    prototype without a change of its own; the weights and ``state_dict`` are untouched.

    A deep copy of the model (frozen copies) keeps this same hook, which reads the method's prototypes."""

    def __init__(self, method):
        self.method = method

    def __call__(self, module, args, output):
        m = self.method
        if module.training or m.protos is None:
            return None
        return nearest_prototype_scores(m.rep(args[0]), m.protos, m.present)

    def __deepcopy__(self, memo):
        return self

    @staticmethod
    def install(model: nn.Module, method) -> None:
        """Put one such hook on ``model.head``, removing any earlier one (of an earlier method object);
        ``method=None`` only removes."""
        head = model.head
        if not isinstance(head, nn.Module):
            raise TypeError(f"nearest-prototype scoring needs the model's classifier `head` as a module, got {type(head).__name__}")
        hooks = head._forward_hooks
        for k in [k for k, h in hooks.items() if isinstance(h, PrototypeScoring)]:
            del hooks[k]
        if method is not None:
            head.register_forward_hook(PrototypeScoring(method))


def class_sums(rep: Tensor, labels: Tensor, num_classes: int) -> Tuple[Tensor, Tensor]:
    """Per-class sums of ``rep`` rows (C, d) and counts (C,), to accumulate prototypes over batches."""
    sums = torch.zeros(num_classes, rep.shape[1], dtype=rep.dtype, device=rep.device)
    sums.index_add_(0, labels, rep)
    counts = torch.bincount(labels, minlength=num_classes).to(rep.dtype)
    return sums, counts


class AbsentClasses:
    """One warning per class that has no global prototype because no participant that uploaded holds it
    (issue 51 R31): named once, the first round it is missing (a class missing only from a sampled
    round's uploads is named too; later rounds stay quiet). ``effect``: what that means for the method."""

    def __init__(self, method: str, effect: str):
        self.method, self.effect = method, effect
        self.named: Set[int] = set()

    def __call__(self, present: Tensor, r: int) -> None:
        new = [c for c, p in enumerate(present.tolist()) if not p and c not in self.named]
        if new:
            self.named.update(new)
            which = f"class {new[0]}" if len(new) == 1 else f"classes {', '.join(map(str, new))}"
            logging.getLogger("fedshift.methods").warning(
                "%s round %d: %s held by no participant that uploaded prototypes: %s", self.method, r, which,
                self.effect)


def mean_prototypes(protos: Tensor, has: Tensor) -> Tuple[Tensor, Tensor]:
    """Server step of FedProto: (K, C, d) client prototypes + (K, C) bool "client holds the
    class" -> (C, d) global prototypes, (C,) present. Uniform mean over the clients holding
    the class (``HtFLlib system/flcore/servers/serverproto.py:75-90``; FedTGP's
    ``proto_cluster``, ``servertgp.py:158-168``); zero rows for classes nobody holds."""
    w = has.to(protos.dtype)
    n = w.sum(0)
    glob = (protos * w.unsqueeze(2)).sum(0) / n.clamp(min=1).unsqueeze(1)
    return glob, n > 0


def class_gaps(avg: Tensor, present: Tensor) -> Tensor:
    """FedTGP's class-wise minimum distance (``HtFLlib system/flcore/servers/servertgp.py:102-115``):
    for each class present, the smallest L2 distance from its averaged client prototype to
    another present class's; classes left at the 1e9 start value (absent, or no other class
    present) take the minimum over all classes. Returns (C,)."""
    c = avg.shape[0]
    big = torch.full((c,), 1e9, dtype=avg.dtype, device=avg.device)
    idx = torch.nonzero(present.to(torch.bool)).flatten()
    if len(idx) > 1:
        a = avg[idx]
        d = (a.unsqueeze(1) - a.unsqueeze(0)).norm(dim=2)  # torch.norm(p_k1 - p_k2) as the official loop
        d = d + torch.diag(torch.full((len(idx),), float("inf"), dtype=avg.dtype, device=avg.device))
        big[idx] = torch.minimum(big[idx], d.min(1).values)
    min_gap = big.min()
    return torch.where(big > 1e8, min_gap, big)


def adaptive_margin(avg: Tensor, present: Tensor, threshold: float) -> float:
    """FedTGP's adaptive margin ``min(max_c gap_c, threshold)`` (``servertgp.py:115, 139``)."""
    return min(float(class_gaps(avg, present).max()), float(threshold))


def tgp_contrastive_loss(protos: Tensor, labels: Tensor, global_protos: Tensor, margin: float) -> Tensor:
    """FedTGP's adaptive-margin contrastive loss on the server (``servertgp.py:130-141``):
    ``CE(-(dist + margin * onehot(y)), y)`` with ``dist[i, k] = ||p_i - g_k||_2`` written as the
    official code writes it, ``sqrt(|p|^2 - 2 p.g + |g|^2)`` (clamped at 0 before the root, so a
    rounding error below zero cannot give NaN)."""
    sq = (protos.pow(2).sum(1, keepdim=True) - 2 * protos @ global_protos.T
          + global_protos.pow(2).sum(1, keepdim=True).T)
    dist = sq.clamp(min=0).sqrt()
    one_hot = F.one_hot(labels, global_protos.shape[0]).to(dist.dtype)
    return F.cross_entropy(-(dist + margin * one_hot), labels)


class TrainableGlobalPrototypes(nn.Module):
    """FedTGP's server model (``servertgp.py:171-192``): a class embedding (C x d) through
    Linear(d, hidden) - ReLU - Linear(hidden, d). ``forward()`` gives all C prototypes."""

    def __init__(self, num_classes: int, dim: int, hidden: int, generator: torch.Generator):
        super().__init__()
        self.embeddings = nn.Embedding(num_classes, dim)
        self.middle = nn.Linear(dim, hidden)
        self.fc = nn.Linear(hidden, dim)
        # PyTorch's default initialisations (Embedding: N(0, 1); Linear: U(+-1/sqrt(fan_in)) for the
        # weight and the bias), drawn from the run's own stream so a run is reproducible.
        with torch.no_grad():
            self.embeddings.weight.normal_(generator=generator)
            for lin in (self.middle, self.fc):
                b = 1.0 / lin.in_features ** 0.5
                lin.weight.uniform_(-b, b, generator=generator)
                lin.bias.uniform_(-b, b, generator=generator)

    def forward(self) -> Tensor:
        return self.fc(torch.relu(self.middle(self.embeddings.weight)))


# ------------------------------------------------------------------ FPL


def first_neighbour_partition(x: Tensor) -> Tensor:
    """One FINCH step (Sarfraz et al., CVPR 2019), cosine distance: link every row to its first
    (nearest) neighbour; clusters are the connected components. The FINCH code
    (``RethinkFL utils/finch.py:20-59``) links i and j when j is i's neighbour, i is j's, or they
    share one (``A = (N + I)(N + I)^T``), whose components are those of the i - neighbour(i) edges.
    Returns (n,) labels 0..k-1 numbered by each cluster's first row."""
    n = x.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=torch.long)
    xn = x / x.norm(dim=1, keepdim=True).clamp(min=1e-12)
    dist = 1 - xn @ xn.T
    dist.fill_diagonal_(float("inf"))  # finch.py:26 fills 1e12
    nearest = dist.argmin(1).tolist()  # ties: the lowest index, as np.argmin
    parent = list(range(n))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in enumerate(nearest):
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)
    labels: Dict[int, int] = {}
    out: List[int] = []
    for i in range(n):
        out.append(labels.setdefault(root(i), len(labels)))
    return torch.tensor(out, dtype=torch.long)


def finch_partition(x: Tensor) -> Tensor:
    """FINCH's last partition with more than one cluster, as FPL takes it (``c[:, -1]`` with
    ``req_clust=None, ensure_early_exit=False``: ``RethinkFL models/fpl.py:66-72``): partition the
    rows, then repeatedly partition the clusters' means (means of the member rows,
    ``finch.py:78-93``) until a step leaves one cluster or merges nothing (``finch.py:162-174``);
    a first partition of one cluster is kept. Returns (n,) labels 0..k-1."""
    c = first_neighbour_partition(x)
    while True:
        k = int(c.max()) + 1
        means = torch.zeros(k, x.shape[1], dtype=x.dtype).index_add_(0, c, x) / torch.bincount(c, minlength=k).to(
            x.dtype).unsqueeze(1)
        u = first_neighbour_partition(means)
        merged = u[c]
        now = int(merged.max()) + 1
        if now == 1 or now >= k:
            return c
        c = merged


def fpl_server_prototypes(protos: Tensor, has: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """FPL's server step (``RethinkFL models/fpl.py:52-88, 140-150``): per class, the uploaded
    prototypes (a class of one uploader: that one) clustered by :func:`finch_partition`, each
    cluster's mean a *cluster prototype*; the *unbiased prototype* is the mean of the class's
    cluster prototypes.

    ``protos`` (K, C, d), ``has`` (K, C) bool. Returns ``clusters`` (M, d), ``owner`` (M,) the class
    of each, ``unbiased`` (C, d) and ``present`` (C,) bool.
    """
    clusters, owner = [], []
    unbiased = torch.zeros(protos.shape[1:], dtype=protos.dtype, device=protos.device)
    for c in range(protos.shape[1]):
        rows = protos[has[:, c], c]
        if len(rows) == 0:
            continue
        labels = finch_partition(rows.detach().cpu()).to(rows.device)
        k = int(labels.max()) + 1
        centres = torch.stack([rows[labels == j].mean(0) for j in range(k)])
        clusters.append(centres)
        owner += [c] * k
        unbiased[c] = centres.mean(0)
    present = has.any(0)
    return torch.cat(clusters), torch.tensor(owner, dtype=torch.long, device=protos.device), unbiased, present


def fpl_prototype_loss(f: Tensor, labels: Tensor, clusters: Tensor, owner: Tensor, unbiased: Tensor,
                       present: Tensor, tau: float) -> Tensor:
    """FPL's two prototype terms (``RethinkFL models/fpl.py:90-121, 165-184``), summed over the samples
    whose class has prototypes and divided by the batch size (every sample counts, ``:180-181``):

    * cluster-prototype contrast: ``-log( sum_{p of class y} e^{cos(f, p)/tau} / sum_{all p} e^{cos(f, p)/tau} )``
      over every class's cluster prototypes;
    * unbiased-prototype consistency: ``MSELoss(f, u_y)``, the mean over the d entries.

    0 (still differentiable) when no sample's class has prototypes (the official code would fail there).
    """
    has = present.to(torch.bool)[labels]
    cos = F.normalize(f, dim=1, eps=1e-8) @ F.normalize(clusters.to(f.dtype), dim=1, eps=1e-8).T / tau  # (B, M)
    # rows of classes without prototypes take every column as positive (a finite 0 they then drop), so no
    # -inf reaches logsumexp's backward
    pos = (owner.unsqueeze(0) == labels.unsqueeze(1)) | ~has.unsqueeze(1)
    info = torch.logsumexp(cos, 1) - torch.logsumexp(cos.masked_fill(~pos, float("-inf")), 1)
    mse = (f - unbiased[labels].to(f.dtype)).pow(2).mean(1)
    per = torch.where(has, info + mse, torch.zeros_like(mse))
    return per.sum() / len(labels)
