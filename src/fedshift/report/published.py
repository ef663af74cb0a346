"""What the papers printed, as data: the published tables, their own arithmetic re-checked, and the
other files of ``params/papers`` (schedules; where claims.yaml lives).

* A published table is ``params/papers/published/<paper>_<table>.csv``, one row per printed cell
  (columns in :data:`COLUMNS`, contract in that folder's README); :func:`load_published` adds the
  numeric ``value_num``.
* :func:`check_printed` re-computes the printed averages from the printed cells: an AVG that is not
  the mean of its row, a Δ that is not AVG − BASE AVG, a "reduction" that is not (ref − x) / ref. The
  CSVs carry these as ``flag`` (the printed value is kept); :func:`published_inconsistencies` lists
  them for the report's closing note.
* The published ``base`` row (the papers' SOLO/BASE: 50 epochs alone) is our ``base_pretrain``
  wherever a group has it (:func:`ours_method`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Tuple

import pandas as pd
import yaml

from ..errors import ConfigError

COLUMNS = ["paper", "table", "scenario", "method", "participant", "metric", "value", "flag", "note"]
SPECIAL_PARTICIPANTS = ("avg", "delta_base", "global")  # not a domain: the printed AVG, Δ vs BASE, server model
ARITHMETIC_FLAGS = ("avg_mismatch", "delta_mismatch", "reduction_mismatch")  # re-checked by check_printed
TOLERANCE = 0.01  # two-decimal cells: half a unit of the cells' rounding + half of the average's
BASE, BASE_PRETRAIN = "base", "base_pretrain"  # the published SOLO/BASE row is our base_pretrain


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


def repo_file(rel: str) -> Path:
    """``rel`` in the working directory, else in the source checkout."""
    here = Path(rel)
    return here if here.is_file() else _repo_root() / rel


def claims_path() -> Path:
    return repo_file("params/papers/claims.yaml")


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


DERIVED = "not printed"  # a row's note starts with it: the project computed it, the paper printed none


def is_derived(pub: pd.DataFrame) -> pd.Series:
    """Rows the paper did not print (their ``note`` starts with "not printed", e.g. fccl_table3.csv's AVG
    rows, the mean of the four printed cells): shown for orientation, never judged or counted."""
    if "note" not in pub.columns:
        return pd.Series(False, index=pub.index)
    return pub["note"].fillna("").astype(str).str.startswith(DERIVED)


def ours_method(methods: Iterable[str], published_method: str) -> str:
    """Our method a published row is matched with: ``base`` -> ``base_pretrain`` where the group has it."""
    return BASE_PRETRAIN if published_method == BASE and BASE_PRETRAIN in set(methods) else published_method


def published_inconsistencies(published: Dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every flagged published row (arithmetic and cross-table), for the closing note."""
    flagged = [p[p["flag"] != ""] for p in published.values()]
    cols = ["source", "paper", "table", "scenario", "method", "participant", "metric", "value", "flag"]
    return pd.concat(flagged, ignore_index=True)[cols] if flagged else pd.DataFrame(columns=cols)


def schedules(path: Optional[Path] = None) -> dict:
    path = Path(path) if path else repo_file("params/papers/schedules.yaml")
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
