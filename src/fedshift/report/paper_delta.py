"""Paper-delta report: our numbers beside the published ones, the differences judged.

* Published numbers are data: ``params/papers/published/<paper>_<table>.csv``, one row per
  printed cell (columns in :data:`COLUMNS`, contract in that folder's README). A grid names the
  tables it reproduces under ``report.published``; ``report.published_scenarios`` maps an
  offline stand-in scenario to the published one (``{digits_offline: digits}``), and every
  comparison through that mapping is labelled *proxy* and compares the AVG only (a stand-in's
  domains are not the paper's, even where a name such as ``mnist`` agrees).
* Ours: per seed, the headline number of :func:`fedshift.report.report.headline_frame` (mean of
  the last ``last_k`` rounds) in percent; across seeds the mean ± the 95% confidence half-width
  of Student's t with n − 1 degrees of freedom (:func:`mean_ci`). FedH2L's WDP / CDP / ACC
  are the engine's pooled rows when the run wrote them (``kind`` wdp / cdp / acc, taken at the
  best validation ACC, :func:`pooled_selected`), else derived from the same frame: WDP = intra
  top-1, CDP = inter top-1 (mean over the other domains), ACC = (WDP + (n − 1) CDP) / n (all
  domains' test sets, equal sizes). Where a run
  table has ``kind == "global"`` rows (a server model evaluated on the test set), they give
  ``global/top1`` and ``rounds_to/<target>`` (first round reaching the target).
* Verdict per cell: *within CI* when |ours − published| ≤ the half-width, else *above* /
  *below*; with one seed there is no interval and the verdict is a point comparison (n = 1).
* Per table: cells compared, mean |Δ|, count within CI, and whether the methods' ranking on
  the AVG agrees with the paper's (Kendall τ and "same order").
* The printed averages are re-checked against the printed cells (:func:`check_printed`): an
  AVG that is not the mean of its row, a Δ that is not AVG − BASE AVG, a "reduction" that is
  not (ref − x) / ref. The CSVs carry these as ``flag`` (the printed value is kept).
* Claims: ``params/papers/claims.yaml`` lists each paper's qualitative conclusions as
  comparisons (:func:`evaluate_claims`), evaluated on the paper's own tables and on ours.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import yaml

from ..errors import ConfigError

COLUMNS = ["paper", "table", "scenario", "method", "participant", "metric", "value", "flag", "note"]
SPECIAL_PARTICIPANTS = ("avg", "delta_base", "global")  # not a domain: the printed AVG, Δ vs BASE, server model
ARITHMETIC_FLAGS = ("avg_mismatch", "delta_mismatch", "reduction_mismatch")  # re-checked by check_printed
TOLERANCE = 0.01  # two-decimal cells: half a unit of the cells' rounding + half of the average's
CONFIDENCE = 0.95


# ----------------------------------------------------------------------------- published data


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def published_dir(root: Optional[Path] = None) -> Path:
    """``params/papers/published`` of the working directory, else of the source checkout."""
    if root is not None:
        return Path(root)
    if os.environ.get("FEDSHIFT_PUBLISHED_DIR"):
        return Path(os.environ["FEDSHIFT_PUBLISHED_DIR"])
    here = Path("params/papers/published")
    return here if here.is_dir() else _repo_root() / "params/papers/published"


def claims_path() -> Path:
    here = Path("params/papers/claims.yaml")
    return here if here.is_file() else _repo_root() / "params/papers/claims.yaml"


def parse_value(text) -> float:
    """A printed cell as a number: ``"+ 16.00"`` -> 16.0, ``"13.0%"`` -> 13.0, ``"-"`` -> nan."""
    s = str(text).replace(" ", "").rstrip("%")
    try:
        return float(s)
    except ValueError:
        return math.nan


def load_published(name: str, root: Optional[Path] = None) -> pd.DataFrame:
    """One published table (``<root>/<name>.csv``) with a numeric ``value_num`` column added."""
    folder = published_dir(root)
    path = folder / f"{name}.csv"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.csv"))
        raise ConfigError(f"report.published: no published table {name!r} ({path}); known: {', '.join(known)}")
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    if list(df.columns) != COLUMNS:
        raise ConfigError(f"{path}: columns must be {','.join(COLUMNS)}, got {','.join(df.columns)}")
    df["value_num"] = df["value"].map(parse_value)
    bad = df[df["value_num"].isna()]
    if len(bad):
        raise ConfigError(f"{path}: value {bad['value'].iloc[0]!r} (row {bad.index[0] + 2}) is not a number")
    df["source"] = name
    return df


def all_published(root: Optional[Path] = None) -> Dict[str, pd.DataFrame]:
    return {p.stem: load_published(p.stem, root) for p in sorted(published_dir(root).glob("*.csv"))}


def check_printed(pub: pd.DataFrame) -> pd.Series:
    """The arithmetic flag each row should carry ("" when its printed value recomputes).

    AVG = mean of the printed cells of its row; Δ = AVG − BASE AVG of the same table block;
    ``reduction/<t>`` = (FedAvg rounds − rounds) / FedAvg rounds, in percent (one decimal).
    """
    flags = pd.Series("", index=pub.index, dtype=object)
    num = pub["value"].map(parse_value)
    block = ["paper", "table", "scenario", "metric"]
    for (_, _, _, metric), b in pub.groupby(block, sort=False):
        for method, rows in b.groupby("method", sort=False):
            cells = num[rows.index[~rows["participant"].isin(SPECIAL_PARTICIPANTS)]]
            for i in rows.index[rows["participant"] == "avg"]:
                if len(cells) >= 2 and abs(num[i] - cells.mean()) > TOLERANCE + 1e-9:
                    flags[i] = f"avg_mismatch: printed {pub.at[i, 'value']}, mean of the printed cells {cells.mean():.3f}"
        base_avg = b[(b["method"] == "base") & (b["participant"] == "avg")]
        for i in b.index[b["participant"] == "delta_base"]:
            avg = b[(b["method"] == b.at[i, "method"]) & (b["participant"] == "avg")]
            if len(base_avg) and len(avg):
                expect = num[avg.index[0]] - num[base_avg.index[0]]
                if abs(num[i] - expect) > TOLERANCE + 1e-9:
                    flags[i] = (f"delta_mismatch: printed {pub.at[i, 'value']}, AVG − BASE AVG = "
                                f"{num[avg.index[0]]:.2f} − {num[base_avg.index[0]]:.2f} = {expect:+.2f}")
        if metric.startswith("reduction/"):
            target = metric.split("/", 1)[1]
            ref = pub[(pub["paper"] == b["paper"].iloc[0]) & (pub["table"] == b["table"].iloc[0])
                      & (pub["scenario"] == b["scenario"].iloc[0]) & (pub["method"] == "fedavg")
                      & (pub["metric"] == f"rounds_to/{target}")]
            for i in b.index:
                own = pub[(pub["paper"] == b.at[i, "paper"]) & (pub["table"] == b.at[i, "table"])
                          & (pub["scenario"] == b.at[i, "scenario"]) & (pub["method"] == b.at[i, "method"])
                          & (pub["metric"] == f"rounds_to/{target}")]
                if len(ref) and len(own):
                    r0, r1 = num[ref.index[0]], num[own.index[0]]
                    expect = (r0 - r1) / r0 * 100
                    if abs(num[i] - expect) > 0.05 + 1e-9:  # printed with one decimal
                        flags[i] = (f"reduction_mismatch: printed {pub.at[i, 'value']}%, ({r0:g} − {r1:g}) / {r0:g} = "
                                    f"{expect:.1f}%")
    return flags


# ----------------------------------------------------------------------------- statistics


def t_critical(n: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student t quantile with n − 1 degrees of freedom (n = 3: 4.303)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1)) if n >= 2 else math.nan


def mean_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> Tuple[float, float, int]:
    """(mean, half-width of the confidence interval, n); the half-width is nan for n < 2."""
    v = np.asarray([x for x in values if not pd.isna(x)], dtype=float)
    n = len(v)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(v[0]), math.nan, 1
    return float(v.mean()), t_critical(n, confidence) * float(v.std(ddof=1)) / math.sqrt(n), n


def verdict(mean: float, half: float, published: float) -> str:
    """within CI / above / below (a point comparison when there is no interval)."""
    if pd.isna(mean):
        return "not run"
    h = 0.0 if pd.isna(half) else half
    if abs(mean - published) <= h:
        return "within CI"
    return "above" if mean > published else "below"


def ranking(ours: Mapping[str, float], published: Mapping[str, float]) -> Tuple[float, bool]:
    """Kendall τ between two scorings of the same methods, and whether the order is identical."""
    common = [m for m in published if m in ours and not pd.isna(ours[m])]
    if len(common) < 2:
        return math.nan, False
    from scipy import stats

    a = [ours[m] for m in common]
    b = [published[m] for m in common]
    tau = stats.kendalltau(a, b).statistic
    same = sorted(common, key=lambda m: -ours[m]) == sorted(common, key=lambda m: -published[m])
    return float(tau), bool(same)


# ----------------------------------------------------------------------------- our numbers


def _scenario_size(scenario: str) -> Optional[int]:
    try:
        from ..data import SCENARIOS

        spec = SCENARIOS.get(scenario)
        return len(spec.participants(spec.params()))
    except Exception:
        return None


POOLED = ("wdp", "cdp", "acc")  # FedH2L rows written by the engine (domain "pooled"), when present


def pooled_selected(runs: pd.DataFrame, last_k: int = 3) -> pd.DataFrame:
    """FedH2L's WDP / CDP / ACC rows of the engine, one value per (run, participant, metric): at the
    evaluation with the best validation ACC (``val_acc`` rows; earliest on ties: the paper keeps the
    model with the maximal ACC), else the mean of the last ``last_k`` evaluations. Fractions."""
    keys = ["scenario", "public", "structure", "method", "seed", "participant"]
    d = runs[runs["round"] > 0]
    val = d[d["kind"] == "val_acc"]
    pooled = d[d["kind"].isin(POOLED)]
    if len(val):
        v = val.sort_values("round")
        best = v.loc[v.groupby(keys)["top1"].idxmax(), keys + ["round"]]  # first maximum = earliest round
        sel = pooled.merge(best, on=keys + ["round"])
    else:
        last = pooled.groupby(keys)["round"].transform(lambda r: r.isin(sorted(r.unique())[-last_k:]))
        sel = pooled[last]
    out = sel.groupby(keys + ["kind"], as_index=False)["top1"].mean()
    return out.rename(columns={"kind": "metric", "top1": "value"})[keys + ["metric", "value"]]


def ours_long(runs: pd.DataFrame, last_k: int = 3, targets: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (scenario, public, structure, method, seed, participant, metric): value in %.

    ``participant == "avg"`` is the mean over participants of the same seed (the papers' AVG).
    """
    from .report import headline_frame

    keys = ["scenario", "public", "structure", "method", "seed"]
    out = []
    local = runs[runs["kind"].isin(["inter", "intra"])]
    if len(local):
        head = headline_frame(local, last_k)
        for k in ("top1", "top5"):
            for kind in ("inter", "intra"):
                h = head[head["kind"] == kind][keys + ["participant", k]].rename(columns={k: "value"})
                h = h.assign(metric=f"{kind}/{k}")
                out.append(h)
        wide = head.pivot_table(index=keys + ["participant"], columns="kind", values="top1").reset_index()
        if {"inter", "intra"} <= set(wide.columns) and not runs["kind"].isin(POOLED).any():
            n = wide.groupby(keys)["participant"].transform("nunique")
            wide["acc"] = (wide["intra"] + (n - 1) * wide["inter"]) / n
            for metric, col in (("wdp", "intra"), ("cdp", "inter"), ("acc", "acc")):
                out.append(wide[keys + ["participant", col]].rename(columns={col: "value"}).assign(metric=metric))
    if runs["kind"].isin(POOLED).any():
        out.append(pooled_selected(runs, last_k))
    glob = runs[runs["kind"] == "global"]
    if len(glob):
        per_round = glob.groupby(keys + ["round"], as_index=False)["top1"].mean()
        tail = per_round[per_round["round"] > 0]
        last = tail.groupby(keys)["round"].transform(lambda r: r.isin(sorted(r.unique())[-last_k:]))
        g = tail[last].groupby(keys, as_index=False)["top1"].mean().rename(columns={"top1": "value"})
        out.append(g.assign(participant="global", metric="global/top1"))
        for t in targets:
            reached = per_round[per_round["top1"] >= float(t)].groupby(keys, as_index=False)["round"].min()
            r = per_round[keys].drop_duplicates().merge(reached, how="left", on=keys)
            out.append(r.rename(columns={"round": "value"}).assign(participant="global", metric=f"rounds_to/{t}"))
    if not out:
        return pd.DataFrame(columns=keys + ["participant", "metric", "value"])
    long = pd.concat(out, ignore_index=True)
    cells = long[~long["participant"].isin(SPECIAL_PARTICIPANTS)]
    avg = cells.groupby(keys + ["metric"], as_index=False)["value"].mean().assign(participant="avg")
    long = pd.concat([long, avg], ignore_index=True)
    acc = ~long["metric"].str.startswith("rounds_to/")
    long.loc[acc, "value"] = long.loc[acc, "value"] * 100  # percent, like the papers; rounds stay counts
    return long[keys + ["participant", "metric", "value"]]


def aggregate(long: pd.DataFrame) -> pd.DataFrame:
    """Mean ± CI over seeds per (scenario, public, structure, method, participant, metric)."""
    keys = ["scenario", "public", "structure", "method", "participant", "metric"]
    rows = []
    for key, g in long.groupby(keys, sort=False):
        m, h, n = mean_ci(g["value"])
        rows.append(dict(zip(keys, key), mean=m, ci=h, n=n))
    return pd.DataFrame(rows, columns=keys + ["mean", "ci", "n"])


# ----------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class PublishedSpec:
    """One ``report.published`` entry: a table name, optionally limited to structures / scenarios."""

    name: str
    structures: Tuple[str, ...] = ()
    scenarios: Tuple[str, ...] = ()

    @classmethod
    def parse(cls, entry) -> "PublishedSpec":
        if isinstance(entry, str):
            return cls(entry)
        if isinstance(entry, Mapping) and "name" in entry:
            return cls(entry["name"], tuple(entry.get("structures", ())), tuple(entry.get("scenarios", ())))
        raise ConfigError(f"report.published: entry {entry!r} must be a table name or {{name, structures, scenarios}}")


def compare(agg: pd.DataFrame, pub: pd.DataFrame, scenario_map: Mapping[str, str] = (),
            spec: Optional[PublishedSpec] = None) -> pd.DataFrame:
    """Every published cell that one of our (scenario, public, structure) groups has, judged."""
    scenario_map = dict(scenario_map or {})
    spec = spec or PublishedSpec(pub["source"].iloc[0] if len(pub) else "")
    rows = []
    cells = pub[pub["participant"] != "delta_base"]
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
        for _, r in p.iterrows():
            if r["participant"] not in ours_parts:
                continue  # a proxy's domains are not the paper's: only AVG (and global) compare
            key = (r["method"], r["participant"], r["metric"])
            if key not in idx.index:
                continue
            o = idx.loc[key]
            o = o.iloc[0] if isinstance(o, pd.DataFrame) else o
            label = r["table"] if r["table"].startswith(("Fig", "text")) else f"Table {r['table']}"
            rows.append(dict(table=f"{r['paper']} {label}", source=r["source"], scenario=target, our_scenario=scen,
                             public=public, structure=struct, method=r["method"], participant=r["participant"],
                             metric=r["metric"], n=int(o["n"]), ours=o["mean"], ci=o["ci"],
                             published=r["value_num"], delta=o["mean"] - r["value_num"],
                             verdict=verdict(o["mean"], o["ci"], r["value_num"]), proxy=proxy, flag=r["flag"],
                             note=r["note"]))
    cols = ["table", "source", "scenario", "our_scenario", "public", "structure", "method", "participant", "metric",
            "n", "ours", "ci", "published", "delta", "verdict", "proxy", "flag", "note"]
    return pd.DataFrame(rows, columns=cols)


def summarize(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (table, our scenario, public, structure, metric): cells, mean |Δ|, within CI, ranking on AVG."""
    rows = []
    keys = ["table", "scenario", "our_scenario", "public", "structure", "metric"]
    for key, g in cells.groupby(keys, sort=False):
        avg = g[g["participant"].isin(["avg", "global"])]
        tau, same = ranking(dict(zip(avg["method"], avg["ours"])), dict(zip(avg["method"], avg["published"])))
        rows.append(dict(zip(keys, key), cells=len(g), mean_abs_delta=g["delta"].abs().mean(),
                         within_ci=int((g["verdict"] == "within CI").sum()), min_n=int(g["n"].min()),
                         methods=avg["method"].nunique(), kendall_tau=tau,
                         same_order=same if avg["method"].nunique() >= 2 else None, proxy=bool(g["proxy"].any())))
    return pd.DataFrame(rows, columns=keys + ["cells", "mean_abs_delta", "within_ci", "min_n", "methods",
                                              "kendall_tau", "same_order", "proxy"])


# ----------------------------------------------------------------------------- claims


def load_claims(path: Optional[Path] = None) -> List[dict]:
    path = Path(path or claims_path())
    doc = yaml.safe_load(path.read_text()) or {}
    claims = doc.get("claims", [])
    for c in claims:
        for key in ("id", "paper", "text", "metric", "compare"):
            if key not in c:
                raise ConfigError(f"{path}: claim {c.get('id', '?')!r} lacks {key!r}")
    return claims


def _term(term: str) -> Tuple[str, Optional[str]]:
    method, _, scen = str(term).partition("@")
    return method, scen or None


def _resolve_metric(metric: str, scenario: str) -> str:
    if metric in ("inter", "intra"):
        from .report import _topk

        return f"{metric}/{_topk(scenario)}"
    return metric


def _check(claim: dict, lookup, scenario: str) -> Optional[dict]:
    """Evaluate a claim's comparisons in one group; None when none of its pairs is present."""
    lower = bool(claim.get("lower_is_better", False))
    metric = _resolve_metric(claim["metric"], scenario)
    part = claim.get("participant", "avg")
    done, lines, held, separated = 0, [], True, True
    for a, b in claim["compare"]:
        va, vb = lookup(*_term(a), metric, part), lookup(*_term(b), metric, part)
        if va is None or vb is None or pd.isna(va[0]) or pd.isna(vb[0]):  # absent, or never reached (rounds_to)
            continue
        done += 1
        ok = va[0] < vb[0] if lower else va[0] > vb[0]
        held &= ok
        ha, hb = (0 if pd.isna(x[1]) else x[1] for x in (va, vb))
        separated &= ok and (va[0] + ha < vb[0] - hb if lower else va[0] - ha > vb[0] + hb)
        fmt = lambda name, v: f"{name} {v[0]:.2f}" + (f" ± {v[1]:.2f} (n={v[2]})" if v[2] > 1 else f" (n={v[2]})")
        lines.append(f"{fmt(a, va)} {'<' if lower else '>'} {fmt(b, vb)}: {'yes' if ok else 'NO'}")
    if not done:
        return None
    return dict(held=held, separated=separated and done > 0, pairs=f"{done}/{len(claim['compare'])}",
                numbers="; ".join(lines), metric=metric)


def evaluate_claims(claims: List[dict], agg: Optional[pd.DataFrame], published: Dict[str, pd.DataFrame],
                    scenario_map: Mapping[str, str] = (), paper_tables: Optional[Iterable[str]] = None) -> pd.DataFrame:
    """held / not held per claim, on the paper's own tables (those in ``paper_tables``, default all)
    and, per (scenario, public, structure) group where its methods ran, on ours."""
    scenario_map = dict(scenario_map or {})
    rows = []
    for c in claims:
        scope = set(c.get("scenarios", []))
        # the paper's own numbers
        names = [t for t in c.get("published", []) if t in published and (paper_tables is None or t in paper_tables)]
        for name in names:  # each published table on its own (the same method can differ between tables)
            p = published[name][published[name]["participant"] != "delta_base"]
            for scen in sorted(set(p["scenario"])):
                if scope and scen not in scope:
                    continue

                def look(method, at, metric, part, scen=scen, p=p):
                    hit = p[(p["scenario"] == (at or scen)) & (p["method"] == method) & (p["metric"] == metric)
                            & (p["participant"] == part)]
                    return (hit["value_num"].iloc[0], math.nan, 1) if len(hit) else None

                r = _check(c, look, scen)
                if r:
                    rows.append(dict(id=c["id"], paper=c["paper"], claim=c["text"], source=c.get("source", ""),
                                     who=f"paper ({name})", scenario=scen, our_scenario="", public="", structure="",
                                     proxy=False, **r))
        if agg is None or agg.empty:
            continue
        for (scen, public, struct), g in agg.groupby(["scenario", "public", "structure"], sort=False):
            target = scenario_map.get(scen, scen)
            if scope and target not in scope:
                continue
            sub = agg[(agg["public"] == public) & (agg["structure"] == struct)]

            def look(method, at, metric, part, scen=scen, sub=sub):
                want = scen
                if at:
                    want = next((s for s in sub["scenario"].unique() if scenario_map.get(s, s) == at), None)
                hit = sub[(sub["scenario"] == want) & (sub["method"] == method) & (sub["metric"] == metric)
                          & (sub["participant"] == part)]
                return (hit["mean"].iloc[0], hit["ci"].iloc[0], int(hit["n"].iloc[0])) if len(hit) else None

            r = _check(c, look, target)
            if r:
                rows.append(dict(id=c["id"], paper=c["paper"], claim=c["text"], source=c.get("source", ""),
                                 who="ours", scenario=target, our_scenario=scen, public=public, structure=struct,
                                 proxy=target != scen, **r))
    cols = ["id", "paper", "claim", "source", "who", "scenario", "our_scenario", "public", "structure", "proxy",
            "metric", "held", "separated", "pairs", "numbers"]
    out = pd.DataFrame(rows, columns=cols)
    return out.drop_duplicates(subset=["id", "who", "scenario", "our_scenario", "public", "structure", "numbers"])


# ----------------------------------------------------------------------------- rendering


def _fmt_ours(r) -> str:
    if r["n"] > 1:
        return f"{r['ours']:.2f} ± {r['ci']:.2f}"
    return f"{r['ours']:.2f}"


def cells_markdown(cells: pd.DataFrame, title: str) -> str:
    lines = [f"### {title}", "",
             "| method | participant | metric | n | ours (mean ± 95% CI) | published | Δ | verdict |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for _, r in cells.iterrows():
        pub = f"{r['published']:.2f}" + (" ⚑" if r["flag"] else "")
        lines.append(f"| {r['method']} | {r['participant']} | {r['metric']} | {r['n']} | {_fmt_ours(r)} | {pub} | "
                     f"{r['delta']:+.2f} | {r['verdict']}{' (n=1, no CI)' if r['n'] == 1 else ''} |")
    flagged = cells[cells["flag"] != ""]
    for _, r in flagged.drop_duplicates("flag").iterrows():
        lines.append(f"\n⚑ {r['method']} / {r['participant']}: {r['flag']}")
    reused = cells[cells["note"].str.contains("same numbers as", na=False)]
    for method, g in reused.groupby("method", sort=False):
        src = g["note"].iloc[0].split("same numbers as", 1)[1].split(";")[0].strip()
        lines.append(f"\n↺ {method}: the paper reprints the same numbers as {src}")
    return "\n".join(lines) + "\n"


def summary_markdown(summary: pd.DataFrame) -> str:
    lines = ["| table | scenario (ours) | public / structure | metric | cells | mean \\|Δ\\| | within CI | "
             "ranking τ | same order |", "|---|---|---|---|---:|---:|---:|---:|---|"]
    for _, r in summary.iterrows():
        scen = r["scenario"] + (f" (proxy: {r['our_scenario']})" if r["proxy"] else "")
        tau = "" if pd.isna(r["kendall_tau"]) else f"{r['kendall_tau']:+.2f}"
        same = "" if r["same_order"] is None or pd.isna(r["same_order"]) else ("yes" if r["same_order"] else "no")
        lines.append(f"| {r['table']} | {scen} | {r['public']} / {r['structure']} | {r['metric']} | {r['cells']} | "
                     f"{r['mean_abs_delta']:.2f} | {r['within_ci']}/{r['cells']} (min n={r['min_n']}) | {tau} | {same} |")
    return "\n".join(lines) + "\n"


def claims_markdown(claims: pd.DataFrame) -> str:
    lines = ["| claim | paper | where | held | numbers |", "|---|---|---|---|---|"]
    for _, r in claims.iterrows():
        where = (f"{r['who']}: {r['scenario']}" if r["who"].startswith("paper") else
                 f"ours: {r['our_scenario']} / {r['public']} / {r['structure']}" + (f" (proxy for {r['scenario']})" if r["proxy"] else ""))
        held = ("held" + (" (CI-separated)" if r["separated"] and r["who"] == "ours" else "")) if r["held"] else "NOT held"
        lines.append(f"| {r['id']}: {r['claim']} | {r['paper']} | {where} | {held} | {r['pairs']} pairs: {r['numbers']} |")
    return "\n".join(lines) + "\n"


def delta_figure(cells: pd.DataFrame, path: Path, title: str) -> None:
    """Ours (mean ± 95% CI) against the published value, one panel per metric, one point per cell
    (square = AVG / server model, circle = a participant); the diagonal is agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(dict.fromkeys(cells["metric"]))
    methods = list(dict.fromkeys(cells["method"]))
    cmap = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    colour = {m: cmap(i % cmap.N) for i, m in enumerate(methods)}
    cols = min(len(metrics), 3)
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.8 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        c = cells[cells["metric"] == metric]
        for m in methods:
            g = c[c["method"] == m]
            for summary in (False, True):
                gg = g[g["participant"].isin(["avg", "global"]) == summary]
                if len(gg):
                    ax.errorbar(gg["published"], gg["ours"], yerr=gg["ci"].fillna(0), fmt="s" if summary else "o",
                                ms=8 if summary else 4, color=colour[m], capsize=3, alpha=0.9,
                                markeredgecolor="black" if summary else "none")
        err = c["ci"].fillna(0)
        lo = float(min(c["published"].min(), (c["ours"] - err).min()))
        hi = float(max(c["published"].max(), (c["ours"] + err).max()))
        pad = (hi - lo) * 0.08 + 1
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", lw=1, ls="--")
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("published")
        ax.set_ylabel("ours: mean ± 95% CI over seeds")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    handles = [plt.Line2D([], [], marker="s", ls="", color=colour[m], markeredgecolor="black", label=m) for m in methods]
    handles.append(plt.Line2D([], [], ls="--", color="grey", label="ours = published"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle(title + "  (square = AVG, circle = a participant)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * (len(handles) > 4), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def published_inconsistencies(published: Dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every flagged published row (arithmetic and cross-table), for the closing note."""
    flagged = [p[p["flag"] != ""] for p in published.values()]
    cols = ["source", "paper", "table", "scenario", "method", "participant", "metric", "value", "flag"]
    return pd.concat(flagged, ignore_index=True)[cols] if flagged else pd.DataFrame(columns=cols)


def delta_report(runs: pd.DataFrame, report_cfg: Mapping, out_dir: Path, last_k: int = 3,
                 published_root: Optional[Path] = None, claims_file: Optional[Path] = None) -> List[str]:
    """Write ``delta__<table>.csv/.png``, ``delta_summary.csv``, ``claims.csv``,
    ``published_flags.csv`` into ``out_dir``; return the Markdown section."""
    out_dir = Path(out_dir)
    specs = [PublishedSpec.parse(e) for e in report_cfg.get("published", []) or []]
    scenario_map = dict(report_cfg.get("published_scenarios") or {})
    published = all_published(published_root)
    tables = {s.name: load_published(s.name, published_root) for s in specs}
    targets = sorted({m.split("/", 1)[1] for t in tables.values() for m in t["metric"] if m.startswith("rounds_to/")})
    agg = aggregate(ours_long(runs, last_k, targets))
    md = ["## Paper delta", "",
          "Ours: mean over seeds ± the 95% confidence half-width (Student t, n − 1 degrees of freedom; n shown) of "
          f"the mean of the last {last_k} rounds. Verdict: *within CI* when |Δ| ≤ half-width, else above / below "
          "(with n = 1 a point comparison). *proxy*: our scenario stands in for the published one (AVG cells only: "
          "its domains are not the paper's). ⚑ = the printed value does not recompute (kept as printed).", ""]
    all_cells = []
    for spec in specs:
        cells = compare(agg, tables[spec.name], scenario_map, spec)
        if cells.empty:
            md.append(f"*{spec.name}: no run of this grid matches the published table's scenarios/methods.*\n")
            continue
        all_cells.append(cells)
        cells.to_csv(out_dir / f"delta__{spec.name}.csv", index=False)
        for (scen, our, pubset, struct), g in cells.groupby(["scenario", "our_scenario", "public", "structure"], sort=False):
            label = f"{g['table'].iloc[0]}: {scen}" + (f" — PROXY: ours on {our}" if our != scen else "") + f" / {pubset} / {struct}"
            md.append(cells_markdown(g, label))
        title = f"{cells['table'].iloc[0]}: ours vs published" + (" (proxy)" if cells["proxy"].any() else "")
        delta_figure(cells, out_dir / f"delta__{spec.name}.png", title)
        md.append(f"![delta](delta__{spec.name}.png)\n")
    if all_cells:
        summary = summarize(pd.concat(all_cells, ignore_index=True))
        summary.to_csv(out_dir / "delta_summary.csv", index=False)
        md += ["### Per-table summary", "", summary_markdown(summary)]
    claims = load_claims(claims_file) if (claims_file or claims_path().is_file()) else []
    wanted = {s.name for s in specs}
    verdicts = evaluate_claims(claims, agg, published, scenario_map, paper_tables=wanted)
    verdicts.to_csv(out_dir / "claims.csv", index=False)
    if len(verdicts):
        md += ["### Claims", "", claims_markdown(verdicts)]
        ours = verdicts[verdicts["who"] == "ours"]
        paper = verdicts[verdicts["who"] != "ours"]
        md.append(f"Claims on our runs: {int(ours['held'].sum())} held, {int((~ours['held'].astype(bool)).sum())} not "
                  f"held ({int(ours['proxy'].sum())} of these {len(ours)} evaluations on proxy scenarios); on the "
                  f"papers' own tables: {int(paper['held'].sum())} held, {int((~paper['held'].astype(bool)).sum())} "
                  "not held.\n")
    flags = published_inconsistencies({k: v for k, v in published.items() if k in wanted})
    if len(flags):
        flags.to_csv(out_dir / "published_flags.csv", index=False)
        md += ["### Flagged published values (the paper's own arithmetic or cross-table conflicts)", ""]
        for (paper, table, flag), g in flags.groupby(["paper", "table", "flag"], sort=False):
            where = ", ".join(f"{r['scenario']} {r['method']} {r['participant']} {r['metric']} = {r['value']}"
                              for _, r in g.iterrows())
            md.append(f"- {paper} {table}: {where}: {flag}")
        md.append("")
    return md
