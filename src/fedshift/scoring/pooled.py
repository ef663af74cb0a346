"""FedH2L's pooled metrics (``papers/fedh2l.txt`` § IV "Metrics"), the scoring registry's ``pooled``:
what every method of a FedH2L grid is scored by when its grid asks (``scoring: {metrics: [pooled]}``).

* ``WDP_i``: accuracy of node i's model on its own test data;
* ``CDP_i``: accuracy on all *other* nodes' test data pooled (sample-weighted: the union
  of the test sets, not the mean of per-domain accuracies as FCCL+ Eq. 22);
* ``ACC_i``: accuracy on all nodes' test data pooled.

Keys: ``<participant>/wdp``, ``<participant>/cdp``, ``<participant>/acc`` and their
means over participants ``avg/...`` (top-1 fractions, like ``<participant>/inter/top1``).
They are computed from the evaluation's per-domain rows and the test-set sizes, so no
extra forward pass is needed; the rows (``domain: pooled``) go to rounds.csv for the report.

Model selection on validation data (FedH2L § IV-A, ``engine.select: best_val``) is the engine's
(:mod:`fedshift.engine.selection`): it scores any grid's runs, tuning candidates included.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from .registry import SCORERS, Scorer

POOLED = ("wdp", "cdp", "acc")


def is_pooled_key(key: str) -> bool:
    """A FedH2L metric key (``<p>/wdp|cdp|acc``, ``<p>/val/acc``, their ``avg/``)."""
    parts = key.split("/")
    if parts[0] in ("train", "global", "time", "table", "headline"):  # other families' prefixes
        return False
    return parts[-1] in POOLED and (len(parts) == 2 or len(parts) == 3 and parts[1] == "val")


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


@SCORERS.register("pooled")
class Pooled(Scorer):
    """FedH2L's WDP / CDP / ACC rows and metrics (rounds.csv rows ``domain: pooled``)."""

    name = "pooled"
    rows = True

    def extras(self, rows: Sequence[Mapping], sizes: Mapping[str, int]) -> Tuple[List[dict], Dict[str, float]]:
        prows = pooled_rows(rows, sizes)
        return prows, pooled_summary(prows)
