"""Paper-delta report: our numbers beside the published ones, the differences judged.

* Published numbers are data: ``params/papers/published/<paper>_<table>.csv``, one row per
  printed cell (columns in :data:`COLUMNS`, contract in that folder's README). A grid names the
  tables it reproduces under ``report.published``; ``report.published_scenarios`` maps an
  offline stand-in scenario to the published one (``{digits_offline: digits}``), and every
  comparison through that mapping is labelled *proxy* and compares the AVG only (a stand-in's
  domains are not the paper's, even where a name such as ``mnist`` agrees).
* Ours: per seed, the headline number of :func:`fedshift.report.frames.headline_frame` (mean of
  the last ``last_k`` rounds) in percent; across seeds the mean ± the 95% confidence half-width
  of Student's t with n − 1 degrees of freedom (:func:`fedshift.report.stats.mean_ci`), rounded
  once when printed, printed clipped to [0, 100]. FedH2L's WDP / CDP / ACC
  are the engine's pooled rows when the run wrote them (``kind`` wdp / cdp / acc, taken at the
  best validation ACC, :func:`pooled_selected`), else derived from the same frame: WDP = intra
  top-1, CDP = inter top-1 (mean over the other domains), ACC = (WDP + (n − 1) CDP) / n (all
  domains' test sets, equal sizes). Where a run
  table has ``kind == "global"`` rows (a server model evaluated on the test set), they give
  ``global/top1`` and ``rounds_to/<target>`` (first round reaching the target). A seed that never
  reaches the target stays in the mean, censored at its last round + 1 (the mean is then a lower
  bound, printed ``≥``, without an interval), and every such cell carries ``reached/n``.
* The published ``base`` row (the papers' SOLO/BASE: 50 epochs alone) is matched with our
  ``base_pretrain`` wherever a group has it; our federated ``base`` (no communication, on the
  federated schedule) then stays as an extra, unmatched row (issue 21 item 3).
* Verdict per cell (:func:`fedshift.report.stats.verdict`): *agrees within margin* (TOST: the
  90% interval of Δ inside ±``report.margin`` points, default 3, and the 95% half-width no wider),
  *differs (above / below)* (the 95% interval of Δ wholly beyond the margin), else
  *inconclusive* (always with n = 1). Proxy cells (a stand-in scenario) get no verdict: their
  section states both schedules (``params/papers/schedules.yaml``) and gives the numbers and Δ.
* Per table: cells compared, mean |Δ|, the verdict counts, and (not for proxies) whether the
  methods' ranking on the AVG agrees with the paper's (Kendall τ and "same order").
* The printed averages are re-checked against the printed cells (:func:`check_printed`): an
  AVG that is not the mean of its row, a Δ that is not AVG − BASE AVG, a "reduction" that is
  not (ref − x) / ref. The CSVs carry these as ``flag`` (the printed value is kept).
* Claims: ``params/papers/claims.yaml`` lists each paper's qualitative conclusions as
  comparisons (:func:`evaluate_claims`), evaluated on the paper's own tables and on ours: a claim
  holds only when every pair it names was evaluated and holds ("partly evaluable: k of n"
  otherwise, "NOT held" as soon as one evaluated pair fails); ``structure: homogeneous |
  heterogeneous`` limits it to our runs of that kind (participants' architectures all equal or
  not); ``kind: ratio`` compares rounds-to-target ratios (challenger / reference < ``below``,
  default 1) at every target the runs have when ``metric: rounds_to/*``; a challenger that never
  reaches the target does NOT hold the claim; ``ratio_vs: <method>`` (rounds claims) prints each
  side's rounds as a ratio to that method and, on our runs, evaluates the claim at every target they
  have (an unstated optimiser choice scales every method's rounds, so only ratios compare across
  schedules); "CI-separated" only when both sides have n ≥ 2.
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
from .frames import headline_frame, is_homogeneous, participant_archs, published_method_names, rename_published
from .frames import topk as _topk
from .stats import (CONFIDENCE, DEFAULT_MARGIN, MIN_N, NO_VERDICT, NOT_RUN, fmt_interval, mean_ci,  # noqa: F401
                    no_verdict_reason, t_critical, verdict)

COLUMNS = ["paper", "table", "scenario", "method", "participant", "metric", "value", "flag", "note"]
SPECIAL_PARTICIPANTS = ("avg", "delta_base", "global")  # not a domain: the printed AVG, Δ vs BASE, server model
ARITHMETIC_FLAGS = ("avg_mismatch", "delta_mismatch", "reduction_mismatch")  # re-checked by check_printed
TOLERANCE = 0.01  # two-decimal cells: half a unit of the cells' rounding + half of the average's
BASE, BASE_PRETRAIN = "base", "base_pretrain"  # the published SOLO/BASE row is our base_pretrain


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


def value_source(runs: pd.DataFrame, last_k: int = 3) -> str:
    """What one run's value is, as the report's text says it: the mean of the last ``last_k`` rounds,
    or, for the FedH2L ACC / WDP / CDP rows when the runs carry validation rows, the best-validation
    evaluation (:func:`pooled_selected`)."""
    text = f"the mean of the last {last_k} rounds"
    kinds = set(runs["kind"].unique()) if len(runs) else set()
    if kinds & set(POOLED) and "val_acc" in kinds:
        text += (" (ACC / WDP / CDP: the evaluation with the best validation ACC, the earliest on ties; the "
                 "paper keeps the model with the maximal ACC)")
    return text


def ours_long(runs: pd.DataFrame, last_k: int = 3, targets: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (scenario, public, structure, method, seed, participant, metric): value in %.

    ``participant == "avg"`` is the mean over participants of the same seed (the papers' AVG).
    ``reached`` is False for a ``rounds_to/<t>`` seed that never reached the target: its value is
    then the run's last evaluated round + 1 (a lower bound, never dropped).
    """
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
            r = per_round.groupby(keys, as_index=False)["round"].max().rename(columns={"round": "last"})
            r = r.merge(reached, how="left", on=keys)
            r["reached"] = r["round"].notna()
            r["value"] = r["round"].where(r["reached"], r["last"] + 1)  # censored: not reached within the run
            out.append(r[keys + ["value", "reached"]].assign(participant="global", metric=f"rounds_to/{t}"))
    cols = keys + ["participant", "metric", "value", "reached"]
    if not out:
        return pd.DataFrame(columns=cols)
    long = pd.concat(out, ignore_index=True)
    long["reached"] = long["reached"].fillna(True).astype(bool) if "reached" in long else True
    cells = long[~long["participant"].isin(SPECIAL_PARTICIPANTS)]
    avg = cells.groupby(keys + ["metric"], as_index=False)["value"].mean().assign(participant="avg", reached=True)
    long = pd.concat([long, avg], ignore_index=True)
    acc = ~long["metric"].str.startswith("rounds_to/")
    long.loc[acc, "value"] = long.loc[acc, "value"] * 100  # percent, like the papers; rounds stay counts
    return long[cols]


def aggregate(long: pd.DataFrame) -> pd.DataFrame:
    """Mean ± CI over seeds per (scenario, public, structure, method, participant, metric); ``reached``
    = seeds that reached a rounds-to target (= n elsewhere); a censored mean has no interval."""
    keys = ["scenario", "public", "structure", "method", "participant", "metric"]
    rows = []
    if "reached" not in long.columns:
        long = long.assign(reached=True)
    for key, g in long.groupby(keys, sort=False):
        m, h, n = mean_ci(g["value"])
        reached = int(g.loc[g["value"].notna(), "reached"].sum())
        if reached < n:
            h = float("nan")  # a lower bound: no symmetric interval
        rows.append(dict(zip(keys, key), mean=m, ci=h, n=n, reached=reached))
    return pd.DataFrame(rows, columns=keys + ["mean", "ci", "n", "reached"])


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


def _ours_method(methods: Iterable[str], published_method: str) -> str:
    """Our method a published row is matched with: ``base`` -> ``base_pretrain`` where the group has it."""
    return BASE_PRETRAIN if published_method == BASE and BASE_PRETRAIN in set(methods) else published_method


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
            method = _ours_method(methods, r["method"])
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


# ----------------------------------------------------------------------------- claims


STRUCTURES = ("homogeneous", "heterogeneous")
CLAIM_KINDS = ("order", "ratio")


def load_claims(path: Optional[Path] = None) -> List[dict]:
    path = Path(path or claims_path())
    doc = yaml.safe_load(path.read_text()) or {}
    claims = doc.get("claims", [])
    for c in claims:
        for key in ("id", "paper", "text", "metric", "compare"):
            if key not in c:
                raise ConfigError(f"{path}: claim {c.get('id', '?')!r} lacks {key!r}")
        if c.get("structure") is not None and c["structure"] not in STRUCTURES:
            raise ConfigError(f"{path}: claim {c['id']!r}: structure {c['structure']!r} must be one of "
                              f"{', '.join(STRUCTURES)}")
        if c.get("kind", "order") not in CLAIM_KINDS:
            raise ConfigError(f"{path}: claim {c['id']!r}: kind {c['kind']!r} must be one of {', '.join(CLAIM_KINDS)}")
        if c.get("paired") not in (None, "seeds") or (c.get("paired") and c.get("kind") == "ratio"):
            raise ConfigError(f"{path}: claim {c['id']!r}: paired {c['paired']!r} must be 'seeds' (or absent), "
                              "and a ratio claim cannot be paired")
        metrics = c["metric"] if isinstance(c["metric"], dict) else {"default": c["metric"]}
        if not metrics or not all(isinstance(k, str) and isinstance(v, str) for k, v in metrics.items()):
            raise ConfigError(f"{path}: claim {c['id']!r}: metric must be a metric key or a mapping "
                              f"{{scenario: metric key}}, got {c['metric']!r}")
        rounds = {str(v).startswith("rounds_to/") for v in metrics.values()}
        if (c.get("kind") == "ratio" or c.get("ratio_vs")) and rounds != {True}:
            raise ConfigError(f"{path}: claim {c['id']!r}: kind ratio needs metric rounds_to/<target> or rounds_to/*, "
                              f"got {c['metric']!r}")
    return claims


def _term(term: str) -> Tuple[str, Optional[str]]:
    method, _, scen = str(term).partition("@")
    return method, scen or None


def _resolve_metric(metric: str, scenario: str) -> str:
    if metric in ("inter", "intra"):
        return f"{metric}/{_topk(scenario)}"
    return metric


def _pair(a, b, lower: bool, factor: float) -> Optional[bool]:
    """Does a beat b (a < factor·b when ``lower``, else a > factor·b)? a, b = (mean, ci, n, reached).
    True / False, or None when censored rounds leave it open. A challenger that never reached its target
    (reached = 0) does not beat a reference that did (the caller has already set aside a reference that
    never reached it: that pair is not evaluable)."""
    (ma, na, ra), (mb, nb, rb) = (a[0], a[2], a[3]), (b[0], b[2], b[3])
    if not lower:
        return ma > factor * mb
    if na > 0 and ra == 0:  # ours, never reached (a printed value has n = 0)
        return False
    a_exact, b_exact = ra == na, rb == nb
    if a_exact and b_exact:
        return ma < factor * mb
    if not a_exact and b_exact:  # a's mean is a lower bound
        return False if ma >= factor * mb else None
    if a_exact and not b_exact:  # b's mean is a lower bound
        return True if ma < factor * mb else None
    return None


def _never_reached(v) -> bool:
    """Our side (n > 0) whose every seed missed the rounds target."""
    return v[2] > 0 and v[3] == 0


def _interval(v, factor: float = 1.0) -> Optional[Tuple[float, float]]:
    """The side's 95% interval (scaled by ``factor``) if it can carry a verdict, else None: at least
    :data:`MIN_N` seeds and a non-zero width. A censored side (some seeds never reached the target) is
    [its mean, ∞): the mean counts those seeds at their last round + 1, a lower bound."""
    mean, ci, n, reached = v[:4]
    if n < MIN_N:
        return None
    if reached < n:
        return factor * mean, math.inf
    if no_verdict_reason(ci, n):
        return None
    return factor * (mean - ci), factor * (mean + ci)


def _separation(va, vb, lower: bool, factor: float) -> Tuple[bool, bool]:
    """(a beats b with the 95% intervals apart, b beats a with the intervals apart); both False when
    either side has no interval that can carry a verdict (n < MIN_N, zero width)."""
    ia, ib = _interval(va), _interval(vb, factor)
    if ia is None or ib is None:
        return False, False
    if lower:
        return ia[1] < ib[0], ia[0] > ib[1]
    return ia[0] > ib[1], ia[1] < ib[0]


def _fmt_term(name: str, v) -> str:
    mean, ci, n, reached = v[:4]
    if n == 0:  # a printed value of the paper: no seeds of ours behind it
        return f"{name} {mean:.2f}"
    if reached < n:
        return f"{name} ≥ {mean:.2f} (reached {reached}/{n})"
    return f"{name} {fmt_interval(mean, ci, n, bounded=False)} (n={n})"


def _ratio_text(v, vr) -> str:
    """v / reference, with ≥ / ≤ where a censored side makes the ratio a bound, '?' where both are."""
    r = v[0] / vr[0]
    v_low, r_low = v[2] > 0 and v[3] < v[2], vr[2] > 0 and vr[3] < vr[2]  # a censored mean is a lower bound
    if v_low and r_low:
        return f"? ({r:.2f} from two lower bounds)"
    return ("≥ " if v_low else "≤ " if r_low else "") + f"{r:.2f}"


def _target_text(metric: str) -> str:
    t = metric.split("/", 1)[1]
    try:
        return f"{float(t) * 100:g} %"
    except ValueError:
        return t


def _check(claim: dict, lookup, scenario: str, metric: Optional[str] = None) -> Optional[dict]:
    """Evaluate a claim's pairs in one group; None when none of its pairs is present there. A rounds pair
    whose reference never reached the target in any seed is *not evaluable* (nothing to be fewer than);
    a challenger that never reached a target its reference reached fails."""
    lower = bool(claim.get("lower_is_better", False)) or claim.get("kind") == "ratio"
    ratio = claim.get("kind") == "ratio"
    factor = float(claim.get("below", 1.0)) if ratio else 1.0
    metric = metric or _resolve_metric(_claim_metric(claim, scenario) or "", scenario)
    part = claim.get("participant", "avg")
    paired = claim.get("paired") == "seeds" and not ratio
    rounds = metric.startswith("rounds_to/")
    total = len(claim["compare"])
    done, lines, failed, open_, separated, against, unreached = 0, [], False, 0, True, False, []
    for a, b in claim["compare"]:
        va, vb = lookup(*_term(a), metric, part), lookup(*_term(b), metric, part)
        if va is None or vb is None or pd.isna(va[0]) or pd.isna(vb[0]):
            lines.append(f"{a} vs {b}: not evaluated ({a if va is None or pd.isna(va[0]) else b} absent)")
            continue
        if rounds and _never_reached(vb):
            unreached.append(b)
            lines.append(f"{a} vs {b}: not evaluable ({b} never reached {_target_text(metric)} in {vb[2]} "
                         f"seed{'s' if vb[2] != 1 else ''}; {_fmt_term(a, va)})")
            continue
        done += 1
        seeds = sorted(set(va[4]) & set(vb[4])) if paired and len(va) > 4 and va[4] and vb[4] else []
        if len(seeds) >= 2:  # paired over seeds: the interval of the per-seed differences
            d, dh, dn = mean_ci([(vb[4][s] - va[4][s]) if lower else (va[4][s] - vb[4][s]) for s in seeds])
            ok = bool(d > 0)
            failed |= not ok
            can = not no_verdict_reason(dh, dn)
            separated &= ok and can and d - dh > 0
            against |= (not ok) and can and d + dh < 0
            lines.append(f"{a} − {b} paired over seeds {', '.join(str(s) for s in seeds)}: "
                         f"Δ = {d:+.2f}{' (lower is better)' if lower else ''}, 95% CI [{d - dh:+.2f}, {d + dh:+.2f}] (n={dn}): "
                         f"{'yes' if ok else 'NO'}")
            continue
        ok = _pair(va, vb, lower, factor)
        ok = None if ok is None else bool(ok)  # numpy bools are not the singletons `is` compares
        if ok is None:
            open_ += 1
        failed |= ok is False
        sep_for, sep_against = _separation(va, vb, lower, factor) if not ratio else (False, False)
        if ratio:  # a ratio claim compares two rounds counts against `below`: CI-separated when both
            sep_for, sep_against = _separation(va, vb, True, factor)  # intervals clear it (b scaled by it)
        separated &= bool(ok) and sep_for
        against |= ok is False and sep_against
        word = {True: "yes", False: "NO", None: "open (censored)"}[ok]
        ref = claim.get("ratio_vs")
        vr = lookup(ref, None, metric, part) if ref else None
        if ref and vr is not None and not pd.isna(vr[0]) and vr[0]:
            lines.append(f"{_fmt_term(a, va)}, {_fmt_term(b, vb)}; {a} / {ref} = {_ratio_text(va, vr)}, "
                         f"{b} / {ref} = {_ratio_text(vb, vr)}: {a} {'<' if lower else '>'} {b}: {word}")
        elif ratio:
            r = va[0] / vb[0] if vb[0] else math.nan
            bound = "≤ " if va[3] == va[2] and vb[3] < vb[2] else ("≥ " if va[3] < va[2] and vb[3] == vb[2] else "")
            lines.append(f"{_fmt_term(a, va)} / {_fmt_term(b, vb)} = {bound}{r:.2f} < {factor:g}: {word}")
        else:
            lines.append(f"{_fmt_term(a, va)} {'<' if lower else '>'} {_fmt_term(b, vb)}: {word}")
    if not done and not unreached:
        return None
    if not done:
        status = f"not evaluable: {', '.join(dict.fromkeys(unreached))} never reached {_target_text(metric)}"
    elif failed:
        status = "NOT held"
    elif done < total or open_:
        status = f"partly evaluable: {done - open_} of {total}"
    else:
        status = "held"
    return dict(status=status, held=status == "held", separated=status == "held" and separated,
                against=status == "NOT held" and against, pairs=f"{done - open_}/{total}",
                numbers="; ".join(lines), metric=metric)


def _claim_metric(claim: dict, scenario: str, our_scenario: Optional[str] = None) -> Optional[str]:
    """The claim's metric in a scenario: a mapping ``{scenario: metric}`` (published or our scenario name,
    ``default`` for the rest) gives each scenario its own target; None where the mapping names none."""
    m = claim["metric"]
    if not isinstance(m, dict):
        return m
    for key in (our_scenario, scenario, "default"):
        if key and key in m:
            return m[key]
    return None


def _metrics(claim: dict, available: Iterable[str], scenario: str, our_scenario: Optional[str] = None) -> List[str]:
    """The concrete metrics a claim is evaluated on: its own (per scenario, where it maps them), or, for
    ``rounds_to/*``, every rounds target present. A rounds claim is judged at its target only: a
    target the paper never names says nothing about its claim."""
    m = _claim_metric(claim, scenario, our_scenario)
    if m is None:
        return []
    if m == "rounds_to/*":
        return sorted({x for x in available if str(x).startswith("rounds_to/")})
    return [_resolve_metric(m, scenario)]


def group_kinds(runs: pd.DataFrame) -> Dict[Tuple[str, str, str], str]:
    """(scenario, public, structure) -> homogeneous / heterogeneous, from the participants' architectures."""
    if "arch" not in runs.columns:
        return {}
    fed = runs[runs["method"] != BASE_PRETRAIN]
    return {key: STRUCTURES[0] if is_homogeneous(g) else STRUCTURES[1]
            for key, g in fed.groupby(["scenario", "public", "structure"], sort=False)}


def evaluate_claims(claims: List[dict], agg: Optional[pd.DataFrame], published: Dict[str, pd.DataFrame],
                    scenario_map: Mapping[str, str] = (), paper_tables: Optional[Iterable[str]] = None,
                    kinds: Optional[Mapping[Tuple[str, str, str], str]] = None,
                    per_seed: Optional[pd.DataFrame] = None,
                    method_names: Optional[Mapping[str, str]] = None) -> pd.DataFrame:
    """held / NOT held / partly evaluable per claim, on the paper's own tables (those in ``paper_tables``,
    default all) and, per (scenario, public, structure) group where its methods ran, on ours. ``kinds``
    (:func:`group_kinds`) limits a claim with ``structure`` to our groups of that kind; a group of unknown
    kind is skipped for such a claim. ``per_seed`` (:func:`ours_long`): a claim with ``paired: seeds``
    compares our two sides seed by seed (the interval of the per-seed differences), where both have
    at least two seeds in common. ``method_names``: a claim's (published) method -> our method that
    stands for it on our runs (``report.published_methods``)."""
    scenario_map = dict(scenario_map or {})
    kinds = dict(kinds or {})
    rows = []
    for c in claims:
        scope = set(c.get("scenarios", []))
        want_kind = c.get("structure")
        base = dict(id=c["id"], paper=c["paper"], claim=c["text"], source=c.get("source", ""),
                    claim_structure=want_kind or "")
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
                    return (hit["value_num"].iloc[0], math.nan, 0, 0) if len(hit) else None  # n = 0: printed

                for metric in _metrics(c, p.loc[p["scenario"] == scen, "metric"], scen):
                    r = _check(c, look, scen, metric)
                    if r:
                        rows.append(dict(base, who=f"paper ({name})", scenario=scen, our_scenario="", public="",
                                         structure="", proxy=False, **r))
        if agg is None or agg.empty:
            continue
        if "reached" not in agg.columns:
            agg = agg.assign(reached=agg["n"])
        for (scen, public, struct), g in agg.groupby(["scenario", "public", "structure"], sort=False):
            target = scenario_map.get(scen, scen)
            if scope and target not in scope:
                continue
            if want_kind and kinds.get((scen, public, struct)) != want_kind:
                continue  # a claim about homogeneous models says nothing about heterogeneous runs, and vice versa
            sub = agg[(agg["public"] == public) & (agg["structure"] == struct)]

            def look(method, at, metric, part, scen=scen, sub=sub, public=public, struct=struct):
                want = scen
                if at:
                    want = next((s for s in sub["scenario"].unique() if scenario_map.get(s, s) == at), None)
                here = sub[sub["scenario"] == want]
                method = _ours_method(here["method"], dict(method_names or {}).get(method, method))
                hit = here[(here["method"] == method) & (here["metric"] == metric) & (here["participant"] == part)]
                if not len(hit):
                    return None
                h = hit.iloc[0]
                seeds = None
                if per_seed is not None and len(per_seed):
                    s = per_seed[(per_seed["scenario"] == want) & (per_seed["public"] == public)
                                 & (per_seed["structure"] == struct) & (per_seed["method"] == method)
                                 & (per_seed["metric"] == metric) & (per_seed["participant"] == part)]
                    seeds = {int(k): float(v) for k, v in zip(s["seed"], s["value"]) if not pd.isna(v)}
                return (h["mean"], h["ci"], int(h["n"]), int(h["reached"]), seeds)

            for metric in _metrics(c, g["metric"], target, scen):
                r = _check(c, look, target, metric)
                if r:
                    rows.append(dict(base, who="ours", scenario=target, our_scenario=scen, public=public,
                                     structure=struct, proxy=target != scen, **r))
    cols = ["id", "paper", "claim", "source", "claim_structure", "who", "scenario", "our_scenario", "public",
            "structure", "proxy", "metric", "status", "held", "separated", "against", "pairs", "numbers"]
    out = pd.DataFrame(rows, columns=cols)
    out["verdict"] = [claim_verdict(r) for _, r in out.iterrows()]  # what the reader sees
    return out.drop_duplicates(subset=["id", "who", "scenario", "our_scenario", "public", "structure", "metric",
                                       "numbers"])


# ----------------------------------------------------------------------------- rendering


def _fmt_ours(r) -> str:
    if r["metric"].startswith("rounds_to/"):
        if r["reached"] < r["n"]:
            return f"≥ {r['ours']:.1f} (reached {r['reached']}/{r['n']})"
        return fmt_interval(r["ours"], r["ci"], r["n"], bounded=False, digits=1) + f" (reached {r['reached']}/{r['n']})"
    return fmt_interval(r["ours"], r["ci"], r["n"])


def _fmt_delta(r) -> str:
    if pd.isna(r["delta"]):
        return "–"
    return ("≥ " if r["reached"] < r["n"] else "") + f"{r['delta']:+.2f}"


def cells_markdown(cells: pd.DataFrame, title: str, margin: float = DEFAULT_MARGIN, schedule: str = "",
                   margin_reason: str = "", schedule_differs: str = "") -> str:
    """One section's cells. A proxy section (our stand-in scenario) opens with both schedules and has no
    verdict column: its numbers and Δ are shown, not judged. A section on the paper's data whose schedule
    is not the paper's (``schedule_differs``: e.g. 500 of 10,000 rounds) states both schedules and its
    verdict column says "no verdict"."""
    proxy = bool(cells["proxy"].any())
    head = "| method | participant | metric | n | ours (mean ± 95% CI) | published | Δ |"
    rule = "|---|---|---|---:|---:|---:|---:|"
    lines = [f"### {title}", ""]
    if proxy:
        lines += [schedule, "", "No verdicts here: a stand-in run on another schedule cannot agree or differ "
                  "with the paper; the numbers and Δ are for orientation only.", ""]
    elif schedule_differs:
        lines += [schedule, "", f"No verdicts here: {schedule_differs}; a run on another schedule cannot agree or "
                  "differ with the paper's numbers.", ""]
    if not proxy:
        if margin_reason:
            lines += [f"Margin {margin_reason}.", ""]
        head, rule = head + f" verdict (margin ±{margin:g}) |", rule + "---|"
    lines += [head, rule]
    for _, r in cells.iterrows():
        pub = "–" if pd.isna(r["published"]) else f"{r['published']:.2f}" + (" ⚑" if r["flag"] else "")
        name = r["method"] if r["ours_method"] in (r["method"], BASE) else f"{r['method']} (ours: {r['ours_method']})"
        row = (f"| {name} | {r['participant']} | {r['metric']} | {r['n']} | {_fmt_ours(r)} | {pub} | "
               f"{_fmt_delta(r)} |")
        if not proxy:
            row += f" {r['verdict']} |"
        lines.append(row)
    if (cells["ours_method"] == BASE_PRETRAIN).any():
        lines.append("\nThe published `base` (SOLO/BASE) row is matched with our `base_pretrain`; our federated "
                     "`base` is listed as an extra, unmatched row.")
    flagged = cells[cells["flag"] != ""]
    for _, r in flagged.drop_duplicates("flag").iterrows():
        lines.append(f"\n⚑ {r['method']} / {r['participant']}: {r['flag']}")
    reused = cells[cells["note"].str.contains("same numbers as", na=False)]
    for method, g in reused.groupby("method", sort=False):
        src = g["note"].iloc[0].split("same numbers as", 1)[1].split(";")[0].strip()
        lines.append(f"\n↺ {method}: the paper reprints the same numbers as {src}")
    return "\n".join(lines) + "\n"


def summary_markdown(summary: pd.DataFrame) -> str:
    lines = ["| table | scenario (ours) | public / structure | metric | cells | mean \\|Δ\\| | agree / inconclusive / "
             "differ | ranking τ | same order |", "|---|---|---|---|---:|---:|---|---:|---|"]
    for _, r in summary.iterrows():
        scen = r["scenario"] + (f" (proxy: {r['our_scenario']})" if r["proxy"] else "")
        tau = "" if pd.isna(r["kendall_tau"]) else f"{r['kendall_tau']:+.2f}"
        same = "" if r["same_order"] is None or pd.isna(r["same_order"]) else ("yes" if r["same_order"] else "no")
        counts = ("no verdicts (proxy)" if r["proxy"] else
                  f"{r['agree']} / {r['inconclusive']} / {r['differ']} (min n={r['min_n']})")
        lines.append(f"| {r['table']} | {scen} | {r['public']} / {r['structure']} | {r['metric']} | {r['cells']} | "
                     f"{r['mean_abs_delta']:.2f} | {counts} | {tau} | {same} |")
    return "\n".join(lines) + "\n"


MEANS_ONLY = "held by the means only: inconclusive"
NOT_MEANS_ONLY = "NOT held by the means only: inconclusive"


def claim_verdict(r: Mapping) -> str:
    """The verdict a reader sees. On our runs "held" and "NOT held" need the same evidence: the 95%
    intervals apart (each side n ≥ MIN_N, non-zero width; paired claims: the interval of the per-seed
    differences clear of 0), else the means alone decided and the verdict is inconclusive. The paper's
    tables have no seeds: their printed numbers are read as they stand."""
    if r["who"] != "ours":
        return r["status"]
    if r["status"] == "held":
        return "held (CI-separated)" if r["separated"] else MEANS_ONLY
    if r["status"] == "NOT held":
        return "NOT held (CI-separated)" if r.get("against") else NOT_MEANS_ONLY
    return r["status"]


def claims_markdown(claims: pd.DataFrame) -> str:
    lines = ["| claim | paper | where | verdict | numbers |", "|---|---|---|---|---|"]
    for _, r in claims.iterrows():
        where = (f"{r['who']}: {r['scenario']}" if r["who"].startswith("paper") else
                 f"ours: {r['our_scenario']} / {r['public']} / {r['structure']}"
                 + (f" (proxy for {r['scenario']}: another schedule)" if r["proxy"] else ""))
        if r["claim_structure"]:
            where += f" [{r['claim_structure']} claim]"
        lines.append(f"| {r['id']}: {r['claim']} | {r['paper']} | {where} | {r['verdict']} | {r['pairs']} pairs: "
                     f"{r['numbers']} |")
    return "\n".join(lines) + "\n"


def _schedules(path: Optional[Path] = None) -> dict:
    path = Path(path) if path else (Path("params/papers/schedules.yaml") if Path("params/papers/schedules.yaml").is_file()
                                    else _repo_root() / "params/papers/schedules.yaml")
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def schedule_note(runs: pd.DataFrame, source: str, paper: str, our_scenario: str, public: str, structure: str,
                  schedules: Mapping) -> str:
    """Both schedules of a proxy comparison, side by side (data, rounds, local epochs, models)."""
    g = runs[(runs["scenario"] == our_scenario) & (runs["public"] == public) & (runs["structure"] == structure)
             & (runs["method"] != BASE_PRETRAIN)]
    archs = participant_archs(g[g["participant"] != "global"])
    rounds = int(g["round"].max()) if len(g) else "?"
    epochs = (", ".join(str(int(e)) for e in sorted(g["local_epochs"].dropna().unique()))
              if "local_epochs" in g.columns and g["local_epochs"].notna().any() else "not recorded in runs.csv")
    models = ", ".join(f"{p} {a}" for p, a in archs.items()) or "?"
    theirs = schedules.get(source) or schedules.get(f"default_{paper}")
    ours = (f"**Schedule differs.** Ours: data {our_scenario} (public {public}), {rounds} rounds, local epochs "
            f"{epochs}, models {models}.")
    if not theirs:
        return ours + " The paper's: not recorded in params/papers/schedules.yaml."
    return (ours + f" The paper's: data {theirs.get('data', '?')}, {theirs.get('rounds', '?')} rounds, local epochs "
            f"{theirs.get('local_epochs', '?')}, models {theirs.get('models', '?')} ({theirs.get('source', '')}).")


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


def interval_coverage(runs: pd.DataFrame) -> str:
    """What the seeds' spread measures: training noise on one data draw (``data_seed: fixed``, every seed
    reads the same partition) or data draw + training (``data_seed: run``)."""
    ds = set(runs["data_seed"].dropna().astype(str)) if "data_seed" in runs.columns else set()
    if ds == {"run"}:
        return ("each seed drew its own private/public/test subsets (`data_seed: run`, as the authors' code "
                "does): the intervals cover data draw and training noise.")
    if "run" in ds:
        return ("some groups redrew their data per seed (`data_seed: run`: data draw + training noise) and others "
                "share one draw (`data_seed: fixed`: training noise only); runs.csv's data_seed column says which.")
    return ("every seed trained and was evaluated on one data draw (`data_seed: fixed`): the intervals cover "
            "training noise (initialisation, batch order) only, not the variation of another draw of the "
            "partitions and test images, which can be as large: a test set of n images at accuracy p alone has a "
            "binomial sd of √(p(1 − p)/n), 2.7 points for 150 images at 88 %.")


def delta_figure(cells: pd.DataFrame, path: Path, title: str) -> None:
    """Ours (mean ± 95% CI) against the published value, one panel per metric, one point per cell
    (square = AVG / server model, circle = a participant); the diagonal is agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .palette import method_colours

    cells = cells[cells["published"].notna()].copy()
    if "ours_method" in cells.columns:  # the published BASE is drawn as (and coloured like) our base_pretrain
        cells["method"] = [m if o == m else f"{m} = ours {o}" for m, o in zip(cells["method"], cells["ours_method"])]
    metrics = list(dict.fromkeys(cells["metric"]))
    methods = list(dict.fromkeys(cells["method"]))
    colour = {m: method_colours([m.split(" = ours ")[-1]])[m.split(" = ours ")[-1]] for m in methods}
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
                    bounded = not metric.startswith("rounds_to/")  # accuracy intervals drawn inside [0, 100]
                    ci = gg["ci"].fillna(0)
                    lo = (gg["ours"] - ci).clip(lower=0) if bounded else gg["ours"] - ci
                    hi = (gg["ours"] + ci).clip(upper=100) if bounded else gg["ours"] + ci
                    yerr = [gg["ours"] - lo, hi - gg["ours"]]
                    ax.errorbar(gg["published"], gg["ours"], yerr=yerr, fmt="s" if summary else "o",
                                ms=8 if summary else 4, color=colour[m], capsize=3, alpha=0.9,
                                markeredgecolor="black" if summary else "none")
        err = c["ci"].fillna(0)
        lo = float(min(c["published"].min(), (c["ours"] - err).min()))
        hi = float(max(c["published"].max(), (c["ours"] + err).max()))
        if not metric.startswith("rounds_to/"):
            lo, hi = max(lo, 0.0), min(hi, 100.0)
        pad = (hi - lo) * 0.08 + 1
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", lw=1, ls="--")
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("published (%)" if not metric.startswith("rounds_to/") else "published (rounds)")
        ax.set_ylabel("ours: mean ± 95% CI over seeds")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    handles = [plt.Line2D([], [], marker="s", ls="", color=colour[m], markeredgecolor="black", label=m) for m in methods]
    handles.append(plt.Line2D([], [], ls="--", color="grey", label="ours = published"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title + " (square = AVG, circle = a participant)", 40 * cols + 20)),
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * (len(handles) > 4), 1, 0.97))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def published_inconsistencies(published: Dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every flagged published row (arithmetic and cross-table), for the closing note."""
    flagged = [p[p["flag"] != ""] for p in published.values()]
    cols = ["source", "paper", "table", "scenario", "method", "participant", "metric", "value", "flag"]
    return pd.concat(flagged, ignore_index=True)[cols] if flagged else pd.DataFrame(columns=cols)


def table_margin(name: str, table: pd.DataFrame, claims: Sequence[dict],
                 explicit: Optional[float] = None) -> Tuple[float, str]:
    """The equivalence margin of one published table and its reason (issue 34 item 3).

    ``report.margin`` in the grid wins (reason: set by the grid). Otherwise half the smallest printed gap
    that a claim of ``claims.yaml`` reading this table rests on (the pair's printed values, in the claimed
    direction): agreeing within that margin cannot turn the claim around. A table no claim rests on keeps
    :data:`DEFAULT_MARGIN`, said to be a convention (no paper prints a seed spread). Units are the table's:
    percentage points for accuracies, rounds for rounds-to-target tables."""
    if explicit is not None:
        return explicit, f"±{explicit:g}, set by the grid (`report.margin`)"
    best = None
    p = table[table["participant"] != "delta_base"] if len(table) else table
    for c in claims:
        if name not in (c.get("published") or []):
            continue
        lower = bool(c.get("lower_is_better", False)) or c.get("kind") == "ratio"
        scope = set(c.get("scenarios") or [])
        for scen in sorted(set(p["scenario"])) if len(p) else []:
            if scope and scen not in scope:
                continue
            metric = _claim_metric(c, scen)
            if metric is None or metric == "rounds_to/*":
                continue
            metric = _resolve_metric(metric, scen)
            part = c.get("participant", "avg")

            def value(term):
                method, at = _term(term)
                hit = p[(p["scenario"] == (at or scen)) & (p["method"] == method) & (p["metric"] == metric)
                        & (p["participant"] == part)]
                return float(hit["value_num"].iloc[0]) if len(hit) else None

            for a, b in c["compare"]:
                va, vb = value(a), value(b)
                if va is None or vb is None:
                    continue
                gap = (vb - va) if lower else (va - vb)
                if gap > 0 and (best is None or gap < best[0]):
                    best = (gap, f"{c['id']}: {a} {va:g} vs {b} {vb:g} on {scen} ({metric})")
    if best is None:
        return DEFAULT_MARGIN, (f"±{DEFAULT_MARGIN:g}, a convention: no claim of params/papers/claims.yaml rests "
                                "on this table (no paper prints a seed spread to derive one from)")
    m = round(best[0] / 2, 2)
    return m, f"±{m:g}, half the smallest printed gap a claim of this table rests on ({best[1]})"


def report_margin(report_cfg: Mapping) -> Optional[float]:
    """``report.margin`` (the table's units) when the grid sets it, else None (each table derives its own,
    :func:`table_margin`); a clear error for anything but a positive number."""
    m = report_cfg.get("margin")
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
        raise ConfigError(f"report.margin: {m!r} must be a positive number of percentage points (default "
                          f"{DEFAULT_MARGIN:g})")
    return float(m)


def delta_report(runs: pd.DataFrame, report_cfg: Mapping, out_dir: Path, last_k: int = 3,
                 published_root: Optional[Path] = None, claims_file: Optional[Path] = None) -> List[str]:
    """Write ``delta__<table>.csv/.png``, ``delta_summary.csv``, ``claims.csv``,
    ``published_flags.csv`` into ``out_dir``; return the Markdown section."""
    out_dir = Path(out_dir)
    specs = [PublishedSpec.parse(e) for e in report_cfg.get("published", []) or []]
    scenario_map = dict(report_cfg.get("published_scenarios") or {})
    published = all_published(published_root)
    renamed = published_method_names(report_cfg)  # report.published_methods: our reading of a published row
    tables = {s.name: rename_published(load_published(s.name, published_root), renamed) for s in specs}
    targets = sorted({m.split("/", 1)[1] for t in tables.values() for m in t["metric"] if m.startswith("rounds_to/")})
    long = ours_long(runs, last_k, targets)
    agg = aggregate(long)
    explicit = report_margin(report_cfg)
    claims = load_claims(claims_file) if (claims_file or claims_path().is_file()) else []
    schedules = _schedules()
    md = ["## Paper delta", "",
          "Ours: mean over seeds ± the 95% confidence half-width (Student t, n − 1 degrees of freedom; n shown) of "
          f"{value_source(runs, last_k)}, rounded once; an interval beyond 0 or 100 is printed clipped as "
          f"`mean [low, high]`. **What the intervals cover:** {interval_coverage(runs)} "
          "Verdict against each table's margin (stated with its reason under the table's sections): **agrees "
          "within margin** when the 90% interval of Δ = ours − published lies inside ±margin (two one-sided t tests "
          "at 5%) and the 95% half-width is no wider than the margin; **differs** when the 95% interval of Δ lies "
          f"wholly beyond the margin; otherwise **inconclusive**, and always below n = {MIN_N} seeds or with a "
          "zero-width interval (the reason is printed). "
          "Rounds to a target: a seed that never reaches it counts as its last round + 1 (`≥`: a lower bound), "
          "with `reached k/n`. **Proxy** sections (our scenario stands in for the published one; AVG cells only, "
          "its domains are not the paper's) and sections whose schedule is not the paper's state both schedules "
          "and give no verdicts. ⚑ = the printed value does not recompute (kept as printed).", ""]
    if renamed:
        md += ["Compared with the published rows of another name (`report.published_methods`): "
               + ", ".join(f"our `{o}` as the paper's `{p}`" for p, o in renamed.items()) + ".", ""]
    all_cells = []
    for spec in specs:
        margin, why = table_margin(spec.name, tables[spec.name], claims, explicit)
        cells = compare(agg, tables[spec.name], scenario_map, spec, margin)
        if cells.empty:
            md.append(f"{spec.name}: no run of this grid matches the published table's scenarios/methods.\n")
            continue
        cells["margin"] = margin
        for (scen, our, pubset, struct), g in cells.groupby(["scenario", "our_scenario", "public", "structure"], sort=False):
            paper = g["table"].iloc[0].split(" ")[0]
            differs = schedule_differs(runs, spec.name, paper, our, pubset, struct, schedules)
            if differs and not g["proxy"].any():  # the paper's data on another schedule: numbers, no verdicts
                idx = g.index[g["published"].notna()]
                cells.loc[idx, "verdict"] = f"no verdict ({differs})"
                g = cells.loc[g.index]
            label = f"{g['table'].iloc[0]}: {scen}" + (f" — PROXY: ours on {our}" if our != scen else "") + f" / {pubset} / {struct}"
            note = schedule_note(runs, spec.name, paper, our, pubset, struct, schedules)
            md.append(cells_markdown(g, label, margin, note, why, differs))
        all_cells.append(cells)
        cells.to_csv(out_dir / f"delta__{spec.name}.csv", index=False)
        title = f"{cells['table'].iloc[0]}: ours vs published" + (" (proxy: other schedule)" if cells["proxy"].any() else "")
        delta_figure(cells, out_dir / f"delta__{spec.name}.png", title)
        md.append(f"![delta](delta__{spec.name}.png)\n")
    if all_cells:
        summary = summarize(pd.concat(all_cells, ignore_index=True))
        summary.to_csv(out_dir / "delta_summary.csv", index=False)
        md += ["### Per-table summary", "", summary_markdown(summary)]
    wanted = {s.name for s in specs}
    verdicts = evaluate_claims(claims, agg, published, scenario_map, paper_tables=wanted, kinds=group_kinds(runs),
                               per_seed=long, method_names=renamed)
    verdicts.to_csv(out_dir / "claims.csv", index=False)
    if len(verdicts):
        md += ["### Claims", "", "A claim is held only when every pair it names was evaluated and holds; NOT held "
               "as soon as one evaluated pair fails; otherwise partly evaluable (k of n pairs). A claim naming a "
               "structure is evaluated only on our runs of that kind. A rounds claim is judged at its own "
               "target only (per scenario where params/papers/claims.yaml maps targets); where the reference "
               "never reached it in any seed the claim is *not evaluable*, and a challenger that never reached a "
               "target its reference reached fails. On our runs *held* and *NOT held* need the same evidence: "
               f"*(CI-separated)* when both sides have n ≥ {MIN_N} and their 95% intervals (non-zero width) do "
               "not overlap, else *… by the means only: inconclusive* (n < 3 or overlapping intervals cannot "
               "order the methods). The intervals are per side, except for a claim marked `paired: seeds`: its "
               "sides share their seeds (and evaluation images), so it is judged on the per-seed differences, "
               "CI-separated when their 95% interval clears 0.", "",
               claims_markdown(verdicts)]

        def counts(v):
            c = v["verdict"].map(lambda x: x.split(":")[0] if x.startswith(("partly", "not evaluable")) else x
                                 ).value_counts()
            kinds = (("held (CI-separated)", MEANS_ONLY, "NOT held (CI-separated)", NOT_MEANS_ONLY)
                     if (v["who"] == "ours").all() else ("held", "NOT held"))
            return ", ".join(f"{int(c.get(k, 0))} {k}" for k in (*kinds, "partly evaluable", "not evaluable"))

        ours = verdicts[verdicts["who"] == "ours"]
        paper = verdicts[verdicts["who"] != "ours"]
        md.append(f"Claims on our runs: {counts(ours)} ({int(ours['proxy'].sum())} of these {len(ours)} evaluations "
                  f"on proxy scenarios, another schedule); on the papers' own tables: {counts(paper)}.\n")
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
