"""Pure arithmetic of the prototype-exchanging methods (FedProto, FedTGP).

Each function takes tensors, returns tensors, keeps the input dtype (float64 works end
to end) and holds no state; the methods in :mod:`fedshift.methods.fedproto` and
:mod:`fedshift.methods.fedtgp` call them. Official code cited as ``repo/path:line`` at
the commits the docstrings of those modules name.
"""

from __future__ import annotations

from typing import Tuple

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


def class_sums(rep: Tensor, labels: Tensor, num_classes: int) -> Tuple[Tensor, Tensor]:
    """Per-class sums of ``rep`` rows (C, d) and counts (C,), to accumulate prototypes over batches."""
    sums = torch.zeros(num_classes, rep.shape[1], dtype=rep.dtype, device=rep.device)
    sums.index_add_(0, labels, rep)
    counts = torch.bincount(labels, minlength=num_classes).to(rep.dtype)
    return sums, counts


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
