"""Which runs a report read, and whether each still is what the report shows (issue 50).

``collect`` writes ``runs_read.csv`` beside ``runs.csv``: one row per run folder it read (kind, folder,
the run's identity as its config records it, the sha256 of the ``rounds.csv`` it read). The report copies
it into its folder and lists the count; :func:`stale_runs` says, for every run of such a list, what no
longer holds:

* ``settings``: its folder's config no longer hashes to the identity it was published under (the config was
  edited, or the folder is not the run the report read);
* ``newer run``: the folder's ``rounds.csv`` is not the one the report read: a newer run of the same
  identity replaced it (a ``--forcerun``, or another grid with the same settings under other code);
* ``gone``: the folder is missing;
* ``not asked``: the grid that made the report no longer asks for this run (its settings changed since):
  only when the caller passes the grid's planned folders (``fedshift validate`` does).

Run folders are ``results/<kind>/<slot>-<identity>`` (:func:`fedshift.provenance.run_folder`), so two grids
that set a method differently never share one and neither grid's report goes stale when the other runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Optional, Set

import pandas as pd

from ..config import safe_load_yaml
from ..data.store import atomic_write_text, sha256_file
from ..provenance import run_identity

RUNS_READ = "runs_read.csv"
COLUMNS = ["kind", "run_dir", "identity", "rounds_sha256"]


def rounds_file(folder: Path) -> Path:
    """A run folder's per-round curves: ``rounds.csv``, else ``rounds.csv.gz`` (an archived record's
    compressed copy, :mod:`fedshift.archive`)."""
    folder = Path(folder)
    plain = folder / "rounds.csv"
    return plain if plain.exists() or not (folder / "rounds.csv.gz").exists() else folder / "rounds.csv.gz"


def _folder(d) -> Path:
    d = Path(d)
    return d.parent if d.name in ("metrics.json", "model.pt") else d


def _identity(folder: Path) -> str:
    cfg = safe_load_yaml((folder / "config.yaml").read_text(), str(folder / "config.yaml")) or {}
    return str(cfg.get("identity") or "")


def record(run_dirs: Iterable, pretrain_dirs: Iterable = ()) -> pd.DataFrame:
    """One row per run folder read: its kind, folder, recorded identity and the sha256 of its rounds.csv."""
    rows = []
    for kind, dirs in (("federate", run_dirs), ("pretrain", pretrain_dirs)):
        for d in dirs:
            folder = _folder(d)
            rows.append({"kind": kind, "run_dir": str(folder), "identity": _identity(folder),
                         "rounds_sha256": sha256_file(rounds_file(folder))})
    return pd.DataFrame(rows, columns=COLUMNS)


def write(runs_csv: Path, frame: pd.DataFrame) -> Path:
    """``runs_read.csv`` beside ``runs_csv`` (written atomically)."""
    path = Path(runs_csv).parent / RUNS_READ
    atomic_write_text(path, frame.to_csv(index=False))
    return path


def read(folder: Path) -> Optional[pd.DataFrame]:
    """``folder``'s ``runs_read.csv`` (a collect or report folder), or None (made before issue 50)."""
    path = Path(folder) / RUNS_READ
    if not path.exists():
        return None
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def stale_runs(frame: pd.DataFrame, base: Optional[Path] = None, planned: Optional[Set[str]] = None) -> List[str]:
    """One line per run of ``frame`` (:func:`record`) that is no longer what was read (see the module
    docstring); ``planned``: the folders the grid asks for now (``results/<kind>/<folder>``), to name the
    runs it no longer asks for. Relative folders are taken from ``base`` (default: the working folder)."""
    lines = []
    for r in frame.itertuples(index=False):
        folder = Path(r.run_dir) if base is None or Path(r.run_dir).is_absolute() else Path(base) / r.run_dir
        if not rounds_file(folder).exists() or not (folder / "config.yaml").exists():
            lines.append(f"{r.run_dir}: gone (the report read it; rerun the grid)")
            continue
        cfg = safe_load_yaml((folder / "config.yaml").read_text(), str(folder / "config.yaml")) or {}
        if r.identity and run_identity(cfg) != r.identity:
            lines.append(f"{r.run_dir}: settings: its config.yaml now hashes to {run_identity(cfg)}, the report "
                         f"read identity {r.identity}")
        elif sha256_file(rounds_file(folder)) != r.rounds_sha256:
            lines.append(f"{r.run_dir}: newer run: a newer run of identity {r.identity or '?'} replaced the "
                         "rounds.csv the report read (rerun the report)")
        elif planned is not None and str(r.run_dir).rstrip("/") not in planned:
            lines.append(f"{r.run_dir}: not asked: the grid no longer asks for this run (its settings changed); "
                         "snakemake reruns the grid and its report")
    return lines


def section(runs_csv: Path, out: Path) -> List[str]:
    """The report's "Runs read" lines, with ``runs_read.csv`` copied into ``out``; [] when collect wrote
    none (a runs.csv made by hand)."""
    frame = read(Path(runs_csv).parent)
    if frame is None:
        return []
    frame.to_csv(Path(out) / RUNS_READ, index=False)
    counts = frame["kind"].value_counts()
    lines = ["## Runs read", "",
             f"{int(counts.get('federate', 0))} federated and {int(counts.get('pretrain', 0))} pretrain run folders "
             f"(`{RUNS_READ}`: each folder, the identity of its settings and the sha256 of the rounds.csv read). "
             "A run folder is `<slot>/seed<k>-<identity>`: two grids that set a method differently write two "
             "folders. `fedshift validate --experiments <grid>` says whether every run is still the one read."]
    stale = stale_runs(frame)
    if stale:
        lines += ["", f"**{len(stale)} run(s) changed between collect and this report:**", ""]
        lines += [f"* {line}" for line in stale]
    return lines + [""]
