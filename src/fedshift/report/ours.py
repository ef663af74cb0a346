"""Our numbers in the papers' terms: per seed and cell (:func:`ours_long`), then mean ± 95% CI over
seeds (:func:`aggregate`).

* Per seed, the headline number of :func:`fedshift.report.frames.headline_frame` (mean of the last
  ``last_k`` rounds) in percent; across seeds the mean ± the 95% confidence half-width of Student's t
  with n − 1 degrees of freedom (:func:`fedshift.report.stats.mean_ci`).
* FedH2L's WDP / CDP / ACC are the engine's pooled rows when the run wrote them (``kind`` wdp / cdp /
  acc, taken at the best validation ACC, :func:`pooled_selected`), else derived from the same frame:
  WDP = intra top-1, CDP = inter top-1 (mean over the other domains), ACC = (WDP + (n − 1) CDP) / n
  (all domains' test sets, equal sizes).
* Where a run table has ``kind == "global"`` rows (a server model evaluated on the test set), they
  give ``global/top1`` and ``rounds_to/<target>`` (first round reaching the target). A seed that never
  reaches the target stays in the mean, censored at its last round + 1 (the mean is then a lower
  bound, without an interval), and every such cell carries ``reached``.
* Each cell carries its ``resolution`` (:func:`fedshift.report.stats.resolution`): 100 / the number of test
  images behind it (:func:`fedshift.report.stats.images_behind`, from the run's recorded test sizes; the
  stated fallback where runs.csv does not record them), one round for a rounds-to-target count. The
  coarsest over the seeds is kept.
"""

from __future__ import annotations

import json
import math
from typing import Dict, Optional, Sequence

import pandas as pd

from .frames import headline_frame
from .published import SPECIAL_PARTICIPANTS
from .stats import ROUND_STEP, images_behind, mean_ci, resolution


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


def parse_sizes(text) -> Dict[str, Optional[float]]:
    """runs.csv's ``test_sizes`` (JSON {participant: test images}) as a mapping; {} when absent."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or text == "":
        return {}
    try:
        return {str(k): (None if v is None else float(v)) for k, v in json.loads(text).items()}
    except (ValueError, AttributeError):
        return {}


def _with_resolution(long: pd.DataFrame, runs: pd.DataFrame, keys) -> pd.DataFrame:
    """``resolution`` per row: one round for rounds counts, else 100 / the images behind the cell in that
    run (the fallback where the run's test sizes are not recorded)."""
    sizes = {}
    if "test_sizes" in runs.columns:
        first = runs.drop_duplicates(keys)
        sizes = {tuple(k): parse_sizes(t) for k, t in zip(first[keys].itertuples(index=False), first["test_sizes"])}

    def res(row) -> float:
        if str(row["metric"]).startswith("rounds_to/"):
            return ROUND_STEP
        own = sizes.get(tuple(row[k] for k in keys)) or {}
        return resolution(images_behind(row["metric"], row["participant"], own) if own else None)

    long["resolution"] = [res(r) for _, r in long.iterrows()] if len(long) else []
    return long


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
    cols = keys + ["participant", "metric", "value", "reached", "resolution"]
    if not out:
        return pd.DataFrame(columns=cols)
    long = pd.concat(out, ignore_index=True)
    long["reached"] = long["reached"].fillna(True).astype(bool) if "reached" in long else True
    cells = long[~long["participant"].isin(SPECIAL_PARTICIPANTS)]
    avg = cells.groupby(keys + ["metric"], as_index=False)["value"].mean().assign(participant="avg", reached=True)
    long = pd.concat([long, avg], ignore_index=True)
    acc = ~long["metric"].str.startswith("rounds_to/")
    long.loc[acc, "value"] = long.loc[acc, "value"] * 100  # percent, like the papers; rounds stay counts
    return _with_resolution(long, runs, keys)[cols]


def aggregate(long: pd.DataFrame) -> pd.DataFrame:
    """Mean ± CI over seeds per (scenario, public, structure, method, participant, metric); ``reached``
    = seeds that reached a rounds-to target (= n elsewhere); a censored mean has no interval;
    ``resolution``: the coarsest of the seeds' (the fallback where none is recorded)."""
    keys = ["scenario", "public", "structure", "method", "participant", "metric"]
    rows = []
    if "reached" not in long.columns:
        long = long.assign(reached=True)
    if "resolution" not in long.columns:
        long = long.assign(resolution=float("nan"))
    for key, g in long.groupby(keys, sort=False):
        m, h, n = mean_ci(g["value"])
        reached = int(g.loc[g["value"].notna(), "reached"].sum())
        if reached < n:
            h = float("nan")  # a lower bound: no symmetric interval
        res = g["resolution"].max()
        rows.append(dict(zip(keys, key), mean=m, ci=h, n=n, reached=reached,
                         resolution=resolution(None) if pd.isna(res) else float(res)))
    return pd.DataFrame(rows, columns=keys + ["mean", "ci", "n", "reached", "resolution"])
