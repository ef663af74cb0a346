"""Vectorised evaluation: every model on every domain's test set in one pass per model.

FCCL+ Eq. 21 (intra-domain accuracy: own test set) and Eq. 22 (inter-domain accuracy:
the mean over the other K-1 domains' test accuracies), top-1 and top-5.

Speed (measured on CPU with ``benchmarks/bench_vs_reference.py``): the test sets are
concatenated once per evaluation (:class:`EvalSuite`) and each model runs over the
concatenation under ``torch.inference_mode`` in batches of ``engine.eval_batch``
(256: larger batches only allocate larger activation buffers, 2048 spent more time
in the kernel's page faults than in the convolutions); the normalised input batch is
written into one reused buffer; ``engine.bf16`` adds bf16 autocast.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, Dict, List, Optional, Sequence

import torch

from ..data.loading import MEAN, STD


@dataclass
class EvalSuite:
    """The test sets of an evaluation, concatenated once: images, labels, domain names and sizes."""

    names: List[str]
    images: torch.Tensor
    labels: torch.Tensor
    sizes: List[int]

    @classmethod
    def of(cls, test_sets: Dict[str, tuple]) -> "EvalSuite":
        names = list(test_sets)
        xs = [test_sets[n][0] for n in names]
        ys = [test_sets[n][1] for n in names]
        one = len(names) == 1
        return cls(names, xs[0] if one else torch.cat(xs), ys[0] if one else torch.cat(ys), [len(y) for y in ys])


def correct_topk(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                 ks: Sequence[int] = (1, 5), batch: int = 256,
                 amp: Optional[ContextManager] = None) -> Dict[int, torch.Tensor]:
    """Per-sample correctness (bool, N) at each k, in eval mode; the model's mode is restored.

    ``images`` are uint8; each batch is normalised as :func:`fedshift.data.loading.normalize`
    does (same arithmetic, same values) into one reused float buffer. ``amp``: a context
    entered around the forward passes (bf16 autocast), or None.
    """
    was_training = model.training
    model.eval()
    out: Dict[int, List[torch.Tensor]] = {k: [] for k in ks}
    buf = torch.empty((min(batch, len(images)), *images.shape[1:]), dtype=torch.float32, device=images.device)
    try:
        with torch.inference_mode(), (amp or contextlib.nullcontext()):
            for start in range(0, len(images), batch):
                xb = images[start:start + batch]
                x = buf[: len(xb)]
                x.copy_(xb)
                x.div_(255.0).sub_(MEAN).div_(STD)
                logits = model(x)
                kmax = min(max(ks), logits.shape[1])
                top = logits.topk(kmax, dim=1).indices
                hit = top == labels[start:start + batch, None]
                for k in ks:
                    out[k].append(hit[:, : min(k, kmax)].any(1))
    finally:
        model.train(was_training)
    return {k: torch.cat(v) if v else torch.zeros(0, dtype=torch.bool) for k, v in out.items()}


def evaluate_suite(model, suite: EvalSuite, ks=(1, 5), batch: int = 256,
                   amp: Optional[ContextManager] = None) -> Dict[str, Dict[int, float]]:
    """Accuracy of one model on each domain of ``suite``: {domain: {k: acc}} (one pass)."""
    hits = correct_topk(model, suite.images, suite.labels, ks, batch, amp)
    res: Dict[str, Dict[int, float]] = {}
    for k, h in hits.items():
        # Per-domain means from one segmented sum (single host sync per k).
        seg = torch.repeat_interleave(torch.arange(len(suite.names), device=h.device),
                                      torch.tensor(suite.sizes, device=h.device))
        sums = torch.zeros(len(suite.names), device=h.device).index_add_(0, seg, h.float())
        accs = (sums / torch.tensor(suite.sizes, device=h.device).clamp(min=1)).tolist()
        for n, a in zip(suite.names, accs):
            res.setdefault(n, {})[k] = a
    return res


def evaluate_domains(model, test_sets: Dict[str, tuple], ks=(1, 5), batch: int = 256,
                     amp: Optional[ContextManager] = None) -> Dict[str, Dict[int, float]]:
    """Accuracy of one model on each domain: {domain: {k: acc}} (one pass over the concatenation)."""
    return evaluate_suite(model, EvalSuite.of(test_sets), ks, batch, amp)


def intra_inter(per_domain: Dict[str, Dict[int, float]], own: str) -> Dict[str, float]:
    """Eq. 21-22 from one model's per-domain accuracies: intra = own domain, inter = mean of others."""
    out: Dict[str, float] = {}
    others: List[str] = [d for d in per_domain if d != own]
    for k in per_domain[own]:
        out[f"intra/top{k}"] = per_domain[own][k]
        out[f"inter/top{k}"] = sum(per_domain[d][k] for d in others) / len(others) if others else float("nan")
    return out
