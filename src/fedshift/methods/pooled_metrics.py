"""Pooled within-/cross-domain metrics and best-validation model selection: the evaluation protocol
FedH2L defines (``papers/fedh2l.txt`` § IV "Metrics", § IV-A), which scores every method of a FedH2L
grid and every tuning candidate, so it lives beside ``Method`` rather than in FedH2L's file.

* ``WDP_i``: accuracy of node i's model on its own test data;
* ``CDP_i``: accuracy on all *other* nodes' test data pooled (sample-weighted: the union
  of the test sets, not the mean of per-domain accuracies as FCCL+ Eq. 22);
* ``ACC_i``: accuracy on all nodes' test data pooled.

Keys: ``<participant>/wdp``, ``<participant>/cdp``, ``<participant>/acc`` and their
means over participants ``avg/...`` (top-1 fractions, like ``<participant>/inter/top1``).
They are computed from :meth:`Federation.evaluate`'s per-domain rows and the test-set
sizes, so no extra forward pass is needed.

These are the defaults of :class:`fedshift.methods.Method`'s ``evaluation_extras``,
``select_headline`` and ``tracked_metrics`` hooks: every method of a FedH2L grid is scored by them.

Model selection (engine ``select: best_val``): "We evaluate using the validation data
every 50 rounds and keep the model with the maximal ACC for the final test". Each
node's validation ACC (all nodes' validation data pooled) is measured at every
evaluation; the headline takes, for each participant, its test metrics at the
evaluation where its validation ACC was highest (earliest on ties), which is exactly
testing the kept model; ``avg/...`` keys are the means of the selected values.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from ..engine.evaluation import evaluate_domains

POOLED = ("wdp", "cdp", "acc")


def is_h2l_key(key: str) -> bool:
    """A FedH2L metric key (``<p>/wdp|cdp|acc``, ``<p>/val/acc``, their ``avg/``)."""
    parts = key.split("/")
    if parts[0] in ("train", "global", "time", "table", "headline"):  # other families' prefixes
        return False
    return parts[-1] in POOLED and (len(parts) == 2 or len(parts) == 3 and parts[1] == "val")


def tracked(engine) -> bool:
    """Whether a run's MLflow metrics carry FedH2L's metrics: only when its grid asks for them
    (``engine.pooled_rows`` or ``engine.select: best_val`` of its EngineConfig, as the FedH2L grids do),
    so other runs' charts lead with their own headline (issue 22 point 7). metrics.json keeps them."""
    return bool(engine.pooled_rows) or engine.select == "best_val"


def without_h2l(metrics: Mapping[str, float]) -> Dict[str, float]:
    return {k: v for k, v in metrics.items() if not is_h2l_key(k)}


def pooled_rows(rows: Sequence[Mapping], sizes: Mapping[str, int]) -> List[dict]:
    """WDP / CDP / ACC rows (``domain: "pooled"``, top-1 and top-5) from per-domain rows.

    ``rows``: (participant, arch, domain, kind, top1, top5) rows of one evaluation;
    ``sizes``: evaluated domain -> number of test samples (the pooling weights).
    """
    by_part: Dict[str, List[Mapping]] = {}
    for r in rows:
        by_part.setdefault(r["participant"], []).append(r)
    out = []
    for p, prs in by_part.items():
        own = [r for r in prs if r["kind"] == "intra"]
        if len(own) != 1:
            raise ValueError(f"participant {p!r}: expected one own-domain row, got {len(own)}")
        others = [r for r in prs if r["kind"] != "intra"]
        for kind, group in (("wdp", own), ("cdp", others), ("acc", prs)):
            n = sum(sizes[r["domain"]] for r in group)
            vals = {k: (sum(r[k] * sizes[r["domain"]] for r in group) / n) if n else float("nan")
                    for k in ("top1", "top5")}
            out.append({"participant": p, "arch": own[0]["arch"], "domain": "pooled", "kind": kind, **vals})
    return out


def pooled_summary(prows: Sequence[Mapping]) -> Dict[str, float]:
    """``<participant>/<wdp|cdp|acc>`` (top-1) and ``avg/<...>`` from :func:`pooled_rows`."""
    out = {f"{r['participant']}/{r['kind']}": float(r["top1"]) for r in prows if r["kind"] in POOLED}
    parts = sorted({r["participant"] for r in prows})
    for kind in POOLED:
        vals = [out[f"{p}/{kind}"] for p in parts if f"{p}/{kind}" in out]
        out[f"avg/{kind}"] = float(np.mean(vals)) if vals else float("nan")
    return out


def validation_acc(fed) -> Tuple[List[dict], Dict[str, float]]:
    """Every model's ACC on all nodes' validation data pooled: rows (``kind: val_acc``) and
    ``<participant>/val/acc`` metrics."""
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


def extra_evaluation(fed, rows: Sequence[Mapping]) -> Tuple[List[dict], Dict[str, float]]:
    """What the runner adds to one evaluation: pooled WDP/CDP/ACC always; validation ACC
    when ``engine.select`` is ``best_val``. Returns (rows for rounds.csv, flat metrics);
    the rows are meant for rounds.csv only when ``engine.pooled_rows`` is set."""
    sizes = {d: len(y) for d, (_, y) in fed.test_sets().items()}
    prows = pooled_rows(rows, sizes)
    metrics = pooled_summary(prows)
    if fed.cfg.select == "best_val":
        vrows, vm = validation_acc(fed)
        prows += vrows
        metrics.update(vm)
    return prows, metrics


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
