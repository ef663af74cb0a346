"""Per-run headline numbers from ``runs.csv``, shared by every report section (the tables of
report.py and the paper delta of paper_delta.py read the same frame, so neither imports the other)."""

from __future__ import annotations

import pandas as pd


def topk(scenario: str) -> str:
    """The scenario's headline metric: top-1 (Digits, Office Caltech, Rotated MNIST) or top-5
    (Office31, Office-Home), as the authors' code prints them."""
    try:
        from ..data import SCENARIOS

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
    return tail.groupby(keys[:5] + ["participant", "kind"], as_index=False)[["top1", "top5"]].mean()


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
    from ..errors import ConfigError

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
