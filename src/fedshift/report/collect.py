"""Gather run folders into one tidy CSV: one row per (scenario, public, method,
structure, seed, round, participant, evaluated domain).

The run folders' ``rounds.csv`` and ``config.yaml`` are the source of truth; this
only joins them. Written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd
import yaml

from ..data.store import atomic_write_text

ID_COLUMNS = ["scenario", "public", "method", "base_method", "structure", "seed"]


def load_run(run_dir: Path) -> pd.DataFrame:
    run_dir = Path(run_dir)
    if run_dir.name == "metrics.json":
        run_dir = run_dir.parent
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    df = pd.read_csv(run_dir / "rounds.csv")
    for col in ID_COLUMNS:
        df[col] = cfg.get(col)
    return df


def collect(run_dirs: Iterable[Path], out: Path) -> pd.DataFrame:
    frames = [load_run(Path(d)) for d in run_dirs]
    df = pd.concat(frames, ignore_index=True)
    cols = ID_COLUMNS + ["round", "participant", "arch", "domain", "kind", "top1", "top5"]
    df = df[cols].sort_values(["scenario", "public", "structure", "method", "seed", "round", "participant", "domain"])
    atomic_write_text(Path(out), df.to_csv(index=False))
    return df
