"""Model selection inside a run: early stopping on a validation metric and a tuning candidate's score
(issue 36; the tune block's planning and selection live in :mod:`fedshift.tune`)."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Sequence


def should_stop(history: Sequence[Mapping[str, float]], metric: str, patience: int) -> bool:
    """Early stopping: ``patience`` evaluations in a row without a better ``metric`` (0: never)."""
    if not patience or not history:
        return False
    vals = [h.get(metric, float("nan")) for h in history]
    finite = [i for i, v in enumerate(vals) if math.isfinite(v)]
    if not finite:
        return False
    best = max(finite, key=lambda i: (vals[i], -i))  # first maximum
    return len(vals) - 1 - best >= patience


def global_metric(cfg: Mapping[str, Any]) -> bool:
    """A tuning candidate scored by the global model on pooled validation data (``global/val/top1``)."""
    return "tune" in cfg and str(cfg["tune"]["metric"]).startswith("global/")


def global_validation(fed, method, eng) -> Dict[str, float]:
    """``global/val/top1``: the global model on every client's validation split pooled (the server-side
    metric of FedMMD/FedFusion, on the holdout instead of the test set)."""
    import torch

    from .evaluation import correct_topk
    from .sampling import global_model

    xs, ys = zip(*(c.data.get("val") for c in fed.clients))
    hits = correct_topk(global_model(fed, method), torch.cat(xs), torch.cat(ys), ks=(1,), batch=eng.eval_batch)
    return {"global/val/top1": float(hits[1].float().mean())}


def score(history: Sequence[Mapping[str, float]], rounds: Sequence[int], metric: str) -> Dict[str, Any]:
    """A candidate run's validation score: the best ``metric`` over its evaluations (the round of the
    model FLGo-Bench keeps), with that round's test headline for the record (never used to choose)."""
    vals = [h.get(metric, float("nan")) for h in history]
    finite = [i for i, v in enumerate(vals) if math.isfinite(v)]
    if not finite:
        return {"score": None, "best_round": None, "rounds_run": int(rounds[-1]) if rounds else 0}
    best = max(finite, key=lambda i: (vals[i], -i))
    h = history[best]
    return {"score": float(vals[best]), "best_round": int(rounds[best]), "rounds_run": int(rounds[-1]),
            "test_at_best": {k: float(h[k]) for k in ("avg/inter/top1", "avg/intra/top1") if k in h}}
