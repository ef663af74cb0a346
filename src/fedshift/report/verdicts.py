"""Each published cell beside ours, judged; per table the summary and the methods' ranking.

* Verdict per cell (:func:`fedshift.report.stats.verdict`): *agrees within margin* (TOST: the 90%
  interval of Δ inside ±margin, and the 95% half-width no wider), *differs (above / below)* (the 95%
  interval of Δ wholly beyond the margin), else *inconclusive* (always below 3 seeds or with an interval
  narrower than the metric's resolution); *no margin: descriptive only* where the cell's margin cannot be
  grounded (``margins``: :func:`fedshift.report.protocols.cell_margin`). Proxy cells (a stand-in scenario)
  get no verdict; a cell whose run differs from the table's protocol is set to "not comparable: ..." by
  the caller (:func:`fedshift.report.protocols.differences`); a row the paper did not print (a derived
  AVG, :func:`fedshift.report.published.is_derived`) gets none and counts nowhere.
* Our federated ``base`` (no communication, on the federated schedule) stays as an extra, unmatched
  row where ``base_pretrain`` took the published BASE cells (issue 21 item 3).
* Per table (:func:`summarize`): cells compared, mean |Δ|, the verdict counts, and (not for proxies)
  whether the methods' ranking on the AVG agrees with the paper's (Kendall τ and "same order"), over the
  comparable, printed AVG cells only.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Tuple

import pandas as pd

from .published import BASE, BASE_PRETRAIN, SPECIAL_PARTICIPANTS, PublishedSpec, is_derived, ours_method
from .stats import NO_VERDICT, verdict

NOT_COMPARABLE = "not comparable"
DERIVED_VERDICT = "no verdict (derived: the paper printed no such cell)"


def ranking(ours: Mapping[str, float], published: Mapping[str, float]) -> Tuple[float, bool]:
    """Kendall τ between two scorings of the same methods, and whether the order is identical."""
    common = [m for m in published if m in ours and not pd.isna(ours[m])]
    if len(common) < 2:
        return math.nan, False
    from scipy import stats  # here, not at the top: scipy takes a while to import, used by this function only

    a = [ours[m] for m in common]
    b = [published[m] for m in common]
    tau = stats.kendalltau(a, b).statistic
    same = sorted(common, key=lambda m: -ours[m]) == sorted(common, key=lambda m: -published[m])
    return float(tau), bool(same)


Margin = Callable[[Mapping, float], float]  # (published row, our resolution) -> margin (nan: none)


def compare(agg: pd.DataFrame, pub: pd.DataFrame, scenario_map: Mapping[str, str] = (),
            spec: Optional[PublishedSpec] = None, margins: Optional[Margin] = None) -> pd.DataFrame:
    """Every published cell that one of our (scenario, public, structure) groups has, judged against its
    margin (``margins``; none given: no margin, descriptive only); our federated ``base`` follows as an
    extra unmatched row where ``base_pretrain`` took the BASE cells."""
    scenario_map = dict(scenario_map or {})
    spec = spec or PublishedSpec(pub["source"].iloc[0] if len(pub) else "")
    rows = []
    cells = pub[pub["participant"] != "delta_base"]
    cells = cells.assign(derived=is_derived(cells))
    if "reached" not in agg.columns:
        agg = agg.assign(reached=agg["n"])
    if "resolution" not in agg.columns:
        agg = agg.assign(resolution=math.nan)
    for (scen, public, struct), ours in agg.groupby(["scenario", "public", "structure"], sort=False):
        if spec.structures and struct not in spec.structures or spec.scenarios and scen not in spec.scenarios:
            continue
        target = scenario_map.get(scen, scen)
        proxy = target != scen
        p = cells[cells["scenario"] == target]
        if p.empty:
            continue
        ours_parts = set(ours["participant"]) if not proxy else set(SPECIAL_PARTICIPANTS)
        idx = ours.set_index(["method", "participant", "metric"])
        methods = set(ours["method"])
        label = None
        for _, r in p.iterrows():
            if r["participant"] not in ours_parts:
                continue  # a proxy's domains are not the paper's: only AVG (and global) compare
            method = ours_method(methods, r["method"])
            key = (method, r["participant"], r["metric"])
            if key not in idx.index:
                continue
            o = idx.loc[key]
            o = o.iloc[0] if isinstance(o, pd.DataFrame) else o
            label = r["table"] if r["table"].startswith(("Fig", "text")) else f"Table {r['table']}"
            censored = int(o["reached"]) < int(o["n"])
            margin = math.nan if proxy or margins is None else margins(r, o["resolution"])
            if proxy:
                v = NO_VERDICT
            elif r["derived"]:
                v = DERIVED_VERDICT
            elif censored:
                v = "inconclusive (censored: a seed never reached the target, the mean is a lower bound)"
            else:
                v = verdict(o["mean"], o["ci"], r["value_num"], int(o["n"]), margin, o["resolution"])
            rows.append(dict(table=f"{r['paper']} {label}", source=r["source"], scenario=target, our_scenario=scen,
                             public=public, structure=struct, method=r["method"], ours_method=method,
                             participant=r["participant"], metric=r["metric"], n=int(o["n"]),
                             reached=int(o["reached"]), ours=o["mean"], ci=o["ci"], published=r["value_num"],
                             delta=o["mean"] - r["value_num"], verdict=v, proxy=proxy, flag=r["flag"],
                             note=r["note"], margin=margin, resolution=o["resolution"], derived=bool(r["derived"])))
        if label is not None and BASE_PRETRAIN in methods and BASE in methods:
            matched = {(r["participant"], r["metric"]) for r in rows if r["ours_method"] == BASE_PRETRAIN
                       and r["our_scenario"] == scen and r["public"] == public and r["structure"] == struct}
            for (part, metric) in sorted(matched):
                if (BASE, part, metric) not in idx.index:
                    continue
                o = idx.loc[(BASE, part, metric)]
                o = o.iloc[0] if isinstance(o, pd.DataFrame) else o
                rows.append(dict(table=rows[-1]["table"], source=spec.name, scenario=target, our_scenario=scen,
                                 public=public, structure=struct, method=f"{BASE} (federated schedule)",
                                 ours_method=BASE, participant=part, metric=metric, n=int(o["n"]),
                                 reached=int(o["reached"]), ours=o["mean"], ci=o["ci"], published=math.nan,
                                 delta=math.nan, verdict="extra: not matched (published BASE = base_pretrain)",
                                 proxy=proxy, flag="", note="", margin=math.nan, resolution=o["resolution"],
                                 derived=False))
    cols = ["table", "source", "scenario", "our_scenario", "public", "structure", "method", "ours_method",
            "participant", "metric", "n", "reached", "ours", "ci", "published", "delta", "verdict", "proxy", "flag",
            "note", "margin", "resolution", "derived"]
    return pd.DataFrame(rows, columns=cols)


VERDICT_COUNTS = (("agree", "agrees within margin"), ("inconclusive", "inconclusive"), ("differ", "differs"),
                  ("not_comparable", NOT_COMPARABLE), ("descriptive", "no margin"))


def summarize(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (table, our scenario, public, structure, metric): cells, mean |Δ|, verdict counts, ranking on
    AVG (none for proxies: their schedules differ, an order between two stand-in runs is no verdict). A
    derived row (not printed by the paper) counts nowhere; the ranking reads the comparable AVG cells only
    (none where every one is not comparable)."""
    rows = []
    keys = ["table", "scenario", "our_scenario", "public", "structure", "metric"]
    cells = cells[cells["published"].notna()]  # extra rows (our federated base) are not comparisons
    if "derived" in cells.columns:
        cells = cells[~cells["derived"].fillna(False).astype(bool)]
    for key, g in cells.groupby(keys, sort=False):
        avg = g[g["participant"].isin(["avg", "global"]) & ~g["verdict"].str.startswith(NOT_COMPARABLE)]
        proxy = bool(g["proxy"].any())
        tau, same = ranking(dict(zip(avg["method"], avg["ours"])), dict(zip(avg["method"], avg["published"])))
        counts = {name: int(g["verdict"].str.startswith(word).sum()) for name, word in VERDICT_COUNTS}
        rows.append(dict(zip(keys, key), cells=len(g), mean_abs_delta=g["delta"].abs().mean(), **counts,
                         min_n=int(g["n"].min()), methods=avg["method"].nunique(),
                         kendall_tau=math.nan if proxy else tau,
                         same_order=None if proxy or avg["method"].nunique() < 2 else same, proxy=proxy))
    return pd.DataFrame(rows, columns=keys + ["cells", "mean_abs_delta", "agree", "inconclusive", "differ",
                                              "not_comparable", "descriptive", "min_n", "methods", "kendall_tau",
                                              "same_order", "proxy"])

