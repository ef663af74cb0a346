"""Model selection inside a run: every participant's validation metrics and the best-validation headline
(``engine.select: best_val``: FedH2L § IV-A "We evaluate using the validation data every 50 rounds and keep
the model with the maximal ACC for the final test"; FLGo-Bench's optimal_gtest_by_gval), early stopping on
a validation metric and a tuning candidate's score (issue 36; the tune block's planning and selection live
in :mod:`fedshift.tune`)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np


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


def validation_acc(fed) -> Tuple[List[dict], Dict[str, float]]:
    """Under ``engine.select: best_val``: Every model's ACC on all nodes' validation data pooled: rows (``kind: val_acc``) and
    ``<participant>/val/acc`` metrics."""
    from .evaluation import evaluate_domains

    vals = {c.domain: c.data.get("val") for c in fed.clients}
    sizes = {d: len(y) for d, (_, y) in vals.items()}
    total = sum(sizes.values())
    rows, out = [], {}
    for c in fed.clients:
        per = evaluate_domains(c.model, vals, (1, 5), fed.cfg.eval_batch)
        acc = {k: sum(per[d][k] * sizes[d] for d in per) / total for k in (1, 5)}
        rows.append({"participant": c.name, "arch": c.arch, "domain": "val", "kind": "val_acc",
                     "top1": acc[1], "top5": acc[5]})
        out[f"{c.name}/val/acc"] = acc[1]
        # FCCL+ Eq. 21-22 on validation data (tuning's selection metrics, issue 36): own domain, the
        # mean over the other domains, and their mean; free: the per-domain accuracies are at hand.
        others = [per[d][1] for d in per if d != c.domain]
        intra = per[c.domain][1] if c.domain in per else float("nan")
        inter = float(np.mean(others)) if others else float("nan")
        out.update({f"{c.name}/val/intra/top1": intra, f"{c.name}/val/inter/top1": inter,
                    f"{c.name}/val/mean/top1": (intra + inter) / 2 if others else intra})
    for key in ("acc", "intra/top1", "inter/top1", "mean/top1"):
        out[f"avg/val/{key}"] = float(np.mean([out[f"{c.name}/val/{key}"] for c in fed.clients]))
    return rows, out


def best_val_headline(history: Sequence[Mapping[str, float]], rounds: Sequence[int]
                      ) -> Tuple[Dict[str, float], Dict[str, int]]:
    """Per participant, its metrics at the evaluation with the highest ``<p>/val/acc``
    (earliest on ties); ``avg/<metric>`` = mean over participants of the selected values.
    Returns (headline, participant -> selected round)."""
    if not history:
        return {}, {}
    parts = sorted(k[: -len("/val/acc")] for k in history[0] if k.endswith("/val/acc") and not k.startswith("avg/"))
    if not parts:
        raise ValueError("best_val selection needs <participant>/val/acc in every evaluation (engine.select)")
    head: Dict[str, float] = {}
    chosen: Dict[str, int] = {}
    for p in parts:
        accs = [h[f"{p}/val/acc"] for h in history]
        t = int(np.argmax(accs))  # first maximum
        chosen[p] = int(rounds[t])
        head.update({k: float(v) for k, v in history[t].items() if k.startswith(f"{p}/")})
    suffixes = {k.split("/", 1)[1] for k in head}
    for s in sorted(suffixes):
        vals = [head[f"{p}/{s}"] for p in parts if f"{p}/{s}" in head]
        if len(vals) == len(parts):
            head[f"avg/{s}"] = float(np.mean(vals))
    return head, chosen
