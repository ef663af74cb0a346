"""A method against its references, paired by seed: the comparison section of a grid's report.

A grid asks for it in its ``report:`` block (workflow/schemas/experiments.schema.yaml):

* ``reference: fedavg``: every other method of the grid against FedAvg;
* ``compare: {method: fedavgm, against: [fedavg, fedprox]}``: one method (a new one) against each
  baseline (``against`` left out: every other method of the grid).

Per (scenario, public set, structure) group and headline metric (the AVG of the inter- and the
intra-domain accuracy at the scenario's top-k, and the server model's top-1 where the runs evaluated
one) and per pair (method, reference), :func:`paired_delta` takes Δ_s = method_s − reference_s for each
seed s both ran (seeds only one side ran are left out, and the row says which were used), and gives the
mean Δ, its two-sided 95 % Student t interval (n − 1 degrees of freedom) and n. The verdict
(:func:`delta_verdict`) is *higher* / *lower* only where n ≥ :data:`~fedshift.report.stats.MIN_N` and
the interval excludes 0; otherwise *inconclusive*, saying why (``n = 2``, ``interval contains 0``, a
half-width below the metric's resolution, 100 / the test images behind the number, as the paper delta's
verdicts require), or *no difference* when every seed gave Δ = 0 to that resolution (the two methods
computed the same numbers). Pairing removes what the two methods share on a seed (its data draw, its evaluation images,
and with one seed per initialisation its starting weights), so a paired interval is narrower than the
two per-method intervals side by side whenever the seeds move both methods alike.

:func:`separated_best` is the rule of the bold cells of the report's tables: the column's best mean,
and only where it is separated from every other row (the same paired interval above 0 with n ≥ 3 seeds
in common; rows without 3 seeds in common: both sides n ≥ 3 and their 95 % intervals apart).
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from .frames import topk
from .ours import ours_long
from .stats import MIN_N, mean_ci, resolution
from .tables import Table

HIGHER, LOWER = "higher (interval above 0)", "lower (interval below 0)"
SAME = "no difference: Δ = 0 in every seed (the same numbers)"
CONTAINS_ZERO = "inconclusive: interval contains 0"
GROUP = ["scenario", "public", "structure"]
COLUMNS = GROUP + ["method", "reference", "metric", "n", "seeds", "method_mean", "reference_mean", "delta",
                   "half_width", "ci_low", "ci_high", "verdict", "per_seed_delta", "covers"]


def paired_delta(a: Mapping[int, float], b: Mapping[int, float]) -> Tuple[float, float, int, List[int]]:
    """(mean of a_s − b_s over the seeds both have, 95 % t half-width (nan for n < 2), n, those seeds)."""
    seeds = sorted(s for s in set(a) & set(b) if not (pd.isna(a[s]) or pd.isna(b[s])))
    mean, half, n = mean_ci([a[s] - b[s] for s in seeds])
    return mean, half, n, seeds


def delta_verdict(mean: float, half: float, n: int, deltas: Sequence[float] = (), res: Optional[float] = None) -> str:
    """higher / lower where n ≥ MIN_N and the 95 % interval excludes 0; else why not (module docstring).
    ``res``: the metric's resolution (:func:`fedshift.report.stats.resolution`, None: its fallback): every
    seed's Δ within half of it is *no difference*; a half-width below it carries no verdict (every seed
    gave the same Δ: the spread is unmeasured, not zero)."""
    res = resolution(None) if res is None or pd.isna(res) else float(res)
    if n < MIN_N:
        return f"inconclusive: n = {n}"
    if deltas and all(abs(d) < res / 2 for d in deltas):
        return SAME
    if half < res:
        return "inconclusive: every seed gave the same Δ (half-width below the metric's resolution)"
    if mean - half > 0:
        return HIGHER
    if mean + half < 0:
        return LOWER
    return CONTAINS_ZERO


def separated_best(values: Mapping[str, Mapping[int, float]], res: Optional[float] = None) -> Optional[str]:
    """The row whose mean is the largest, when it is separated from every other row: n ≥ MIN_N seeds in
    common and the paired 95 % interval of the difference above 0, or (fewer seeds in common) both rows
    with n ≥ MIN_N, and the best's interval wholly above the other's; every interval at least the metric's
    resolution ``res`` wide (narrower: the seeds gave one number, the spread is unmeasured). None when no
    row is (a tie, a row with fewer seeds, overlapping intervals)."""
    res = resolution(None) if res is None or pd.isna(res) else float(res)
    stats = {m: mean_ci(list(v.values())) for m, v in values.items() if len(v)}
    if len(stats) < 2:
        return None
    best = max(stats, key=lambda m: stats[m][0])
    for other in stats:
        if other == best:
            continue
        mean, half, n, _ = paired_delta(values[best], values[other])
        if n >= MIN_N:
            if not (half >= res and mean - half > 0):
                return None
            continue
        (mb, hb, nb), (mo, ho, no) = stats[best], stats[other]
        if min(nb, no) < MIN_N or not (hb >= res and ho >= res) or mb - hb <= mo + ho:
            return None
    return best


def comparison_pairs(report_cfg: Mapping, methods: Sequence[str]) -> List[Tuple[str, str]]:
    """(method, reference) pairs the grid's ``reference:`` / ``compare:`` ask for, among ``methods``
    (the grid's methods in its order)."""
    pairs: List[Tuple[str, str]] = []
    ref = report_cfg.get("reference")
    if ref:
        pairs += [(m, ref) for m in methods if m != ref]
    cmp = report_cfg.get("compare") or {}
    if cmp:
        against = cmp.get("against") or [m for m in methods if m != cmp["method"]]
        pairs += [(cmp["method"], b) for b in against if b != cmp["method"]]
    return list(dict.fromkeys(pairs))


# what a paired interval covers, by the runs' engine.data_seed (the report's opening says it at length)
COVERS = {"fixed": "training noise for one data draw (`data_seed: fixed`: every seed of both methods read the same "
                   "partition and test images)",
          "run": "data draws and training noise (`data_seed: run`: seed k of both methods read draw k)"}


def covers(runs: pd.DataFrame) -> str:
    """What the paired intervals of one group's runs cover (:data:`COVERS`)."""
    ds = sorted(set(runs["data_seed"].dropna().astype(str))) if "data_seed" in runs.columns else ["fixed"]
    return COVERS.get(ds[0], "") if len(ds) == 1 else "mixed draws (runs.csv's data_seed column says which)"


def _metrics(long: pd.DataFrame, scenario: str) -> List[Tuple[str, str]]:
    """(participant, metric) rows compared in a group: the AVG of inter and intra at the scenario's top-k,
    and the server model's top-1 where evaluated."""
    k = topk(scenario)
    want = [("avg", f"inter/{k}"), ("avg", f"intra/{k}"), ("global", "global/top1")]
    have = set(zip(long["participant"], long["metric"]))
    return [w for w in want if w in have]


def compare_frame(runs: pd.DataFrame, pairs: Sequence[Tuple[str, str]], last_k: int = 3) -> pd.DataFrame:
    """One row per (group, pair, metric) present in the runs (columns :data:`COLUMNS`), from the per-seed
    headline numbers of :func:`fedshift.report.ours.ours_long` (the tables' AVG column, seed by seed)."""
    long = ours_long(runs, last_k)
    rows = []
    for key, g in long.groupby(GROUP, sort=False):
        covered = covers(runs[(runs["scenario"] == key[0]) & (runs["public"] == key[1])
                              & (runs["structure"] == key[2])])
        for part, metric in _metrics(g, key[0]):
            sel = g[(g["participant"] == part) & (g["metric"] == metric)]
            per = {m: dict(zip(s["seed"].astype(int), s["value"])) for m, s in sel.groupby("method")}
            res = sel["resolution"].max() if "resolution" in sel.columns else None  # the coarsest seed's
            for a, b in pairs:
                if a not in per or b not in per:
                    continue
                mean, half, n, seeds = paired_delta(per[a], per[b])
                deltas = [per[a][s] - per[b][s] for s in seeds]
                rows.append(dict(zip(GROUP, key), method=a, reference=b, metric=metric, n=n,
                                 seeds=" ".join(str(s) for s in seeds),
                                 method_mean=_mean([per[a][s] for s in seeds]),
                                 reference_mean=_mean([per[b][s] for s in seeds]), delta=mean, half_width=half,
                                 ci_low=mean - half, ci_high=mean + half,
                                 verdict=delta_verdict(mean, half, n, deltas, res),
                                 per_seed_delta="; ".join(f"s{s}: {d:+.4f}" for s, d in zip(seeds, deltas)),
                                 covers=covered))
    return pd.DataFrame(rows, columns=COLUMNS)


def _mean(v: Sequence[float]) -> float:
    return float(sum(v) / len(v)) if len(v) else math.nan


def _signed(x: float) -> str:
    """``+1.23`` / ``-0.41``; ``+0.00`` for what rounds to zero (never ``-0.00``)."""
    return f"{round(x, 2) or 0.0:+.2f}"


def _ci_text(r) -> str:
    return "–" if pd.isna(r["half_width"]) else f"[{_signed(r['ci_low'])}, {_signed(r['ci_high'])}]"


def comparison_section(runs: pd.DataFrame, report_cfg: Mapping, out, last_k: int = 3) -> List[str]:
    """The report's comparison section (``comparison.csv`` written to ``out``); [] when the grid asks for
    none."""
    order = list(report_cfg.get("method_order") or sorted(set(runs["method"])))
    pairs = comparison_pairs(report_cfg, order + sorted(set(runs["method"]) - set(order)))
    if not pairs:
        return []
    frame = compare_frame(runs, pairs, last_k)
    frame.to_csv(out / "comparison.csv", index=False)
    cmp = report_cfg.get("compare") or {}
    what = ([f"every method against `{report_cfg['reference']}`"] if report_cfg.get("reference") else []) + (
        [f"`{cmp['method']}` against " + ", ".join(f"`{b}`" for b in dict.fromkeys(b for a, b in pairs
                                                                                     if a == cmp["method"]))]
        if cmp else [])
    md = ["## Comparison: " + "; ".join(what), "",
          "Δ = method − reference on the same seed (its data and evaluation images, its initialisation), over the "
          "seeds both ran (n, listed); the mean Δ in percentage points with its 95 % Student t interval (n − 1 "
          f"degrees of freedom) from the per-seed differences. A verdict only where n ≥ {MIN_N} and the interval "
          "excludes 0: **higher** / **lower**; otherwise *inconclusive*, with the reason (`n = …`, `interval "
          "contains 0`); *no difference* when every seed gave Δ = 0. Each interval is at 95 % on its own: among k "
          "comparisons where nothing differs, about 5 % of k still exclude 0 by chance. `method` and `reference` "
          "are the two means over those seeds (the tables' AVG). Every seed's Δ: `comparison.csv`.", ""]
    if frame.empty:
        return md + ["No group ran both sides of any pair.", ""]
    for key, g in frame.groupby(GROUP, sort=False):
        rows = [[f"{r['method']} − {r['reference']}", r["metric"], r["n"], r["seeds"].replace(" ", ", "),
                 f"{r['method_mean']:.2f}", f"{r['reference_mean']:.2f}", _signed(r["delta"]), _ci_text(r),
                 r["verdict"]] for _, r in g.iterrows()]
        md += [Table(["comparison", "metric", "n", "seeds", "method", "reference", "Δ", "95% CI of Δ", "verdict"],
                     rows, f"Δ paired by seed: {key[0]} / public {key[1]} / {key[2]}", align="llrlrrrrl").text(),
               f"The intervals cover {g['covers'].iloc[0]}.", ""]
    missing = [f"{a} − {b}" for a, b in pairs if not ((frame["method"] == a) & (frame["reference"] == b)).any()]
    if missing:
        md += [f"Not compared (a side ran in no group with the other): {', '.join(missing)}.", ""]
    return md


def separated_cells(per_seed: pd.DataFrame, res: Optional[Mapping[str, float]] = None) -> Dict[str, Optional[str]]:
    """column -> the row :func:`separated_best` bolds (None: no bold), from a per-seed table (index
    (method, seed), one column per table column); ``res``: column -> its resolution (default the fallback)."""
    out: Dict[str, Optional[str]] = {}
    for col in per_seed.columns:
        values = {m: {int(s): float(v) for s, v in g.droplevel(0)[col].dropna().items()}
                  for m, g in per_seed.groupby(level=0, sort=False)}
        out[col] = separated_best(values, (res or {}).get(col))
    return out
