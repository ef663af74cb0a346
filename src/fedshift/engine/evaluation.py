"""Vectorised evaluation: every model on every domain's test set in large batches.

FCCL+ Eq. 21 (intra-domain accuracy: own test set) and Eq. 22 (inter-domain accuracy:
the mean over the other K-1 domains' test accuracies), top-1 and top-5.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from ..data.loading import normalize


@torch.no_grad()
def correct_topk(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                 ks: Sequence[int] = (1, 5), batch: int = 2048) -> Dict[int, torch.Tensor]:
    """Per-sample correctness (bool, N) at each k, in eval mode; the model's mode is restored."""
    was_training = model.training
    model.eval()
    out = {k: [] for k in ks}
    for start in range(0, len(images), batch):
        logits = model(normalize(images[start:start + batch]))
        kmax = min(max(ks), logits.shape[1])
        top = logits.topk(kmax, dim=1).indices
        hit = top == labels[start:start + batch, None]
        for k in ks:
            out[k].append(hit[:, : min(k, kmax)].any(1))
    model.train(was_training)
    return {k: torch.cat(v) if v else torch.zeros(0, dtype=torch.bool) for k, v in out.items()}


def evaluate_domains(model, test_sets: Dict[str, tuple], ks=(1, 5), batch: int = 2048) -> Dict[str, Dict[int, float]]:
    """Accuracy of one model on each domain: {domain: {k: acc}} (one pass over the concatenation)."""
    names = list(test_sets)
    xs = [test_sets[n][0] for n in names]
    ys = [test_sets[n][1] for n in names]
    hits = correct_topk(model, torch.cat(xs), torch.cat(ys), ks, batch)
    sizes = [len(y) for y in ys]
    res: Dict[str, Dict[int, float]] = {}
    for k, h in hits.items():
        # Per-domain means from one segmented sum (single host sync per k).
        seg = torch.repeat_interleave(torch.arange(len(names), device=h.device), torch.tensor(sizes, device=h.device))
        sums = torch.zeros(len(names), device=h.device).index_add_(0, seg, h.float())
        accs = (sums / torch.tensor(sizes, device=h.device).clamp(min=1)).tolist()
        for n, a in zip(names, accs):
            res.setdefault(n, {})[k] = a
    return res


def intra_inter(per_domain: Dict[str, Dict[int, float]], own: str) -> Dict[str, float]:
    """Eq. 21-22 from one model's per-domain accuracies: intra = own domain, inter = mean of others."""
    out: Dict[str, float] = {}
    others: List[str] = [d for d in per_domain if d != own]
    for k in per_domain[own]:
        out[f"intra/top{k}"] = per_domain[own][k]
        out[f"inter/top{k}"] = sum(per_domain[d][k] for d in others) / len(others) if others else float("nan")
    return out
