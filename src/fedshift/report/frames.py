"""Per-run headline numbers from ``runs.csv``, shared by every report section (the tables of
report.py and the paper delta (paper_delta.py and its parts) read the same frame, so neither imports the other)."""

from __future__ import annotations

from typing import List, Optional, Sequence

import pandas as pd

from ..errors import ConfigError


def topk(scenario: str) -> str:
    """The scenario's headline metric: top-1 (Digits, Office Caltech, Rotated MNIST) or top-5
    (Office31, Office-Home), as the authors' code prints them."""
    try:
        from ..data import SCENARIOS  # here, not at the top: fedshift.data imports torch

        return f"top{SCENARIOS.get(scenario).headline_topk}"
    except Exception:
        return "top1"


def headline_frame(df: pd.DataFrame, last_k: int = 3) -> pd.DataFrame:
    """Per (scenario, public, structure, method, seed, participant, kind): mean of the last k rounds
    (round 0, the starting point, excluded); inter = mean over the other domains first (Eq. 22)."""
    df = df[df["round"] > 0]
    keys = ["scenario", "public", "structure", "method", "seed", "round", "participant", "kind"]
    per_round = df.groupby(keys, as_index=False)[["top1", "top5"]].mean()  # Eq. 22: mean over other domains
    last = per_round.groupby(["scenario", "public", "structure", "method", "seed"])["round"].transform(
        lambda r: r.isin(sorted(r.unique())[-last_k:]))
    tail = per_round[last]
    if "selected_round" in df.columns and df["selected_round"].notna().any():
        tail = _best_val_rows(df, per_round, tail, keys)
    return tail.groupby(keys[:5] + ["participant", "kind"], as_index=False)[["top1", "top5"]].mean()


def _best_val_rows(df: pd.DataFrame, per_round: pd.DataFrame, tail: pd.DataFrame, keys) -> pd.DataFrame:
    """Runs with ``engine.select: best_val`` (issue 36; FLGo-Bench's optimal_gtest_by_gval, FedH2L § IV-A):
    each participant's rows at its best-validation round replace that run's last-k rows."""
    run, part = keys[:5], keys[:5] + ["participant"]
    chosen = df.dropna(subset=["selected_round"])[part + ["selected_round"]].drop_duplicates()
    m = per_round.merge(chosen, on=part, how="inner")
    best = m[m["round"] == m["selected_round"]].drop(columns="selected_round")
    selected_runs = chosen[run].drop_duplicates()
    rest = tail.merge(selected_runs, on=run, how="left", indicator=True)
    rest = rest[rest["_merge"] == "left_only"].drop(columns="_merge")
    return pd.concat([rest, best], ignore_index=True)


def selection_note(df: pd.DataFrame, last_k: int) -> str:
    """The line a results table prints under it: how its numbers were selected, and which rows were
    tuned (issue 36)."""
    sel = sorted(set(df.loc[df.get("select", pd.Series(dtype=str)) == "best_val", "method"])) if "select" in df else []
    rest = sorted(set(df["method"]) - set(sel))
    parts = []
    if rest:
        parts.append(f"mean of the last {last_k} rounds: {', '.join(rest)}")
    if sel:
        parts.append(f"test accuracy at each participant's best-validation round (select: best_val): {', '.join(sel)}")
    line = "Selection: " + "; ".join(parts) + "."
    if "tuned" in df.columns and df["tuned"].fillna(False).astype(bool).any():
        tuned = sorted(set(df.loc[df["tuned"].fillna(False).astype(bool), "method"]))
        line += f" Tuned on the validation holdout (tuned.csv): {', '.join(tuned)}."
    return line


def tuned_budget(report_cfg: dict, sub: pd.DataFrame) -> str:
    """`` Budget: ...`` for a group whose rows include tuned runs (issue 36), else ''."""
    t = (report_cfg or {}).get("tuned")
    if not t or "tuned" not in sub.columns or not sub["tuned"].fillna(False).astype(bool).any():
        return ""
    b = t.get("budget") or {}
    return (f" Tuning budget per candidate: {b.get('rounds')} rounds, tuning seeds {b.get('seeds')}, early-stopping "
            f"patience {b.get('patience')} evaluation{'' if b.get('patience') == 1 else 's'} (0: none), "
            f"selected by {t.get('metric')} on validation.")


def tuned_values(df: pd.DataFrame) -> dict:
    """method -> the values its tune chose (``lr=0.003 beta=0.9``, collect's ``tuned_values``), '' for an
    untuned method: the tables' ``tuned`` column (issue 50)."""
    if "tuned_values" not in df.columns:
        return {}
    text = df["tuned_values"].astype(object).where(df["tuned_values"].notna(), "").astype(str)  # all-NaN: float64
    vals = df.assign(tuned_values=text).groupby("method")["tuned_values"]
    return {m: " / ".join(sorted(set(v) - {""})) for m, v in vals}


def ordered(present, methods: Optional[Sequence[str]] = None) -> List[str]:
    """``present`` in the order of ``methods`` (the grid's), the rest after them, sorted."""
    present = list(present)
    first = [m for m in (methods or []) if m in present]
    return first + sorted(m for m in present if m not in first)


def participant_archs(df: pd.DataFrame) -> dict:
    """participant -> architecture of one (scenario, public, structure) group's runs (``arch`` column)."""
    if "arch" not in df.columns:
        return {}
    a = df.dropna(subset=["arch"]).drop_duplicates("participant")
    return dict(zip(a["participant"], a["arch"]))


def is_homogeneous(df: pd.DataFrame) -> bool:
    """Every participant of the group's runs has the same architecture (parameter averaging possible)."""
    archs = set(participant_archs(df[df["participant"] != "global"]).values()) if len(df) else set()
    return len(archs) == 1


def published_method_names(report_cfg) -> dict:
    """``report.published_methods`` inverted: published method -> our method (the grid's own name).

    A grid that runs a reading of a published method under its own name (``fedh2l_seedlocal`` for
    the paper's ``fedh2l``) maps it here, so the paper delta, the claims and the FedH2L table compare
    it with that published row; our names stay ours everywhere in the report."""
    ours_to_pub = dict((report_cfg or {}).get("published_methods") or {})
    inverse: dict = {}
    for ours, pub in ours_to_pub.items():
        if pub in inverse:
            raise ConfigError(f"report.published_methods: {inverse[pub]!r} and {ours!r} both map to {pub!r}; "
                              "map one of our methods to each published one")
        inverse[pub] = ours
    return inverse


def rename_published(frame: pd.DataFrame, inverse: dict) -> pd.DataFrame:
    """A published table with its method names replaced by ours (:func:`published_method_names`)."""
    if not inverse or frame is None or "method" not in frame.columns:
        return frame
    return frame.assign(method=frame["method"].map(lambda m: inverse.get(m, m)))
