"""Each published cell beside ours, judged; per table the summary and the methods' ranking.

* Verdict per cell (:func:`fedshift.report.stats.verdict`): *agrees within margin* (TOST: the 90%
  interval of Δ inside ±margin, and the 95% half-width no wider), *differs (above / below)* (the 95%
  interval of Δ wholly beyond the margin), else *inconclusive* (always with n = 1). Proxy cells (a
  stand-in scenario) get no verdict, and neither does a section whose runs are not on the paper's
  number of rounds (:func:`schedule_differs`).
* Our federated ``base`` (no communication, on the federated schedule) stays as an extra, unmatched
  row where ``base_pretrain`` took the published BASE cells (issue 21 item 3).
* Per table (:func:`summarize`): cells compared, mean |Δ|, the verdict counts, and (not for proxies)
  whether the methods' ranking on the AVG agrees with the paper's (Kendall τ and "same order").
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Tuple

import pandas as pd

from .published import BASE, BASE_PRETRAIN, SPECIAL_PARTICIPANTS, PublishedSpec, ours_method
from .stats import DEFAULT_MARGIN, NO_VERDICT, verdict


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


def compare(agg: pd.DataFrame, pub: pd.DataFrame, scenario_map: Mapping[str, str] = (),
            spec: Optional[PublishedSpec] = None, margin: float = DEFAULT_MARGIN) -> pd.DataFrame:
    """Every published cell that one of our (scenario, public, structure) groups has, judged; our
    federated ``base`` follows as an extra unmatched row where ``base_pretrain`` took the BASE cells."""
    scenario_map = dict(scenario_map or {})
    spec = spec or PublishedSpec(pub["source"].iloc[0] if len(pub) else "")
    rows = []
    cells = pub[pub["participant"] != "delta_base"]
    if "reached" not in agg.columns:
        agg = agg.assign(reached=agg["n"])
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
            v = NO_VERDICT if proxy else ("inconclusive (censored)" if censored else
                                          verdict(o["mean"], o["ci"], r["value_num"], int(o["n"]), margin))
            rows.append(dict(table=f"{r['paper']} {label}", source=r["source"], scenario=target, our_scenario=scen,
                             public=public, structure=struct, method=r["method"], ours_method=method,
                             participant=r["participant"], metric=r["metric"], n=int(o["n"]),
                             reached=int(o["reached"]), ours=o["mean"], ci=o["ci"], published=r["value_num"],
                             delta=o["mean"] - r["value_num"], verdict=v, proxy=proxy, flag=r["flag"],
                             note=r["note"]))
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
                                 proxy=proxy, flag="", note=""))
    cols = ["table", "source", "scenario", "our_scenario", "public", "structure", "method", "ours_method",
            "participant", "metric", "n", "reached", "ours", "ci", "published", "delta", "verdict", "proxy", "flag",
            "note"]
    return pd.DataFrame(rows, columns=cols)


VERDICT_COUNTS = (("agree", "agrees within margin"), ("inconclusive", "inconclusive"), ("differ", "differs"))


def summarize(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (table, our scenario, public, structure, metric): cells, mean |Δ|, verdict counts, ranking on
    AVG (none for proxies: their schedules differ, an order between two stand-in runs is no verdict)."""
    rows = []
    keys = ["table", "scenario", "our_scenario", "public", "structure", "metric"]
    cells = cells[cells["published"].notna()]  # extra rows (our federated base) are not comparisons
    for key, g in cells.groupby(keys, sort=False):
        avg = g[g["participant"].isin(["avg", "global"])]
        proxy = bool(g["proxy"].any())
        tau, same = ranking(dict(zip(avg["method"], avg["ours"])), dict(zip(avg["method"], avg["published"])))
        counts = {name: int(g["verdict"].str.startswith(word).sum()) for name, word in VERDICT_COUNTS}
        rows.append(dict(zip(keys, key), cells=len(g), mean_abs_delta=g["delta"].abs().mean(), **counts,
                         min_n=int(g["n"].min()), methods=avg["method"].nunique(),
                         kendall_tau=math.nan if proxy else tau,
                         same_order=None if proxy or avg["method"].nunique() < 2 else same, proxy=proxy))
    return pd.DataFrame(rows, columns=keys + ["cells", "mean_abs_delta", "agree", "inconclusive", "differ", "min_n",
                                              "methods", "kendall_tau", "same_order", "proxy"])


def schedule_differs(runs: pd.DataFrame, source: str, paper: str, our_scenario: str, public: str, structure: str,
                     schedules: Mapping) -> str:
    """'' when our runs of the group ran the paper's number of rounds (or the paper states none as a
    number), else why not ("ours ran 500 of the paper's 10,000 rounds")."""
    theirs = schedules.get(source) or schedules.get(f"default_{paper}") or {}
    per_method = dict(theirs.get("rounds_by_method") or {})
    g = runs[(runs["scenario"] == our_scenario) & (runs["public"] == public) & (runs["structure"] == structure)
             & (runs["method"] != BASE_PRETRAIN)]
    if not len(g):
        return ""
    ran = g.groupby(["method", "seed"])["round"].max().groupby(level="method").min()
    for method, ours in ran.items():
        names = [method] + (list(g.loc[g["method"] == method, "base_method"].iloc[:1]) if "base_method" in g else [])
        key = next((k for k in names if k in per_method), None)  # a variant falls back on its base method's entry
        want = per_method[key] if key is not None else theirs.get("rounds")
        if isinstance(want, bool) or not isinstance(want, int):
            continue  # the paper states no number for this row
        if int(ours) != want:
            return f"ours ran {int(ours):,} of the paper's {want:,} rounds ({method})"
    return ""


def table_protocol(schedules: Mapping, source: str, paper: str) -> str:
    """The test protocol a published table was scored under (params/papers/schedules.yaml ``test_protocol``:
    the table's entry, else its paper's default's; absent = clean; issue 47)."""
    own = schedules.get(source) or {}
    if "test_protocol" in own:
        return str(own["test_protocol"])
    return str((schedules.get(f"default_{paper}") or {}).get("test_protocol", "clean"))


def run_protocols(runs: pd.DataFrame) -> list:
    """The test protocols of ``runs`` (runs.csv's ``test_protocol``; absent = clean)."""
    if "test_protocol" not in runs.columns:
        return ["clean"]
    return sorted(set(runs["test_protocol"].fillna("clean").astype(str))) or ["clean"]


def protocol_differs(runs: pd.DataFrame, source: str, paper: str, our_scenario: str, public: str, structure: str,
                     schedules: Mapping) -> str:
    """'' when our runs of the group were scored on the table's test set, else the one-line refusal
    ("not comparable: test protocol clean vs authors"). A scenario that builds no partition of its own
    under ``authors`` (its authors' code tests on the clean split, or no authors' code is known) tests
    on the same images under both names."""
    from ..data import SCENARIOS

    if our_scenario not in SCENARIOS or not SCENARIOS.get(our_scenario).builds_authors():
        return ""
    g = runs[(runs["scenario"] == our_scenario) & (runs["public"] == public) & (runs["structure"] == structure)]
    ours, theirs = run_protocols(g), table_protocol(schedules, source, paper)
    if ours != [theirs]:
        return f"not comparable: test protocol {' / '.join(ours)} vs {theirs}"
    return ""
