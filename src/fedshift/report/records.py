"""The report's "Where the numbers come from" section (issue 52): which runs were read from committed
records (``records/<grid>/``, :mod:`fedshift.archive`) and with which code, which from run folders
under ``results/``, and which records were left out as stale, with the keys that differ.

Inputs: ``runs.csv``'s ``record`` and ``code`` columns (``fedshift collect``) and the archive status the
workflow wrote when it planned (``fedshift report --archive``, a JSON file of
``fedshift.archive.GridStatus.as_json``, reaching here as ``report_cfg["archive"]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Mapping

import pandas as pd

from .tables import Table

RUN = ["scenario", "public", "method", "structure", "seed"]


def records_section(report_cfg: Mapping, runs: pd.DataFrame) -> List[str]:
    """Markdown lines; none when the grid names no archive status and no run came from a record."""
    status_file = (report_cfg or {}).get("archive")
    status = {}
    if status_file and Path(status_file).exists():
        status = json.loads(Path(status_file).read_text())
    has_record = "record" in runs.columns and runs["record"].fillna("").astype(str).ne("").any()
    if not status and not has_record:
        return []
    from ..provenance import code_version

    here = str(code_version()["files_sha256"])[:12]
    md = ["## Where the numbers come from", ""]
    if "record" in runs.columns:
        fed = runs[runs["method"] != "base_pretrain"]
        per_run = fed.groupby(RUN, dropna=False)[["record", "code"]].first().reset_index()
        per_run["record"] = per_run["record"].fillna("").astype(str)
        archived = per_run[per_run["record"] != ""]
        md.append(f"{len(archived)} of {len(per_run)} federated runs were read from committed records "
                  f"(`records/`), {len(per_run) - len(archived)} from run folders under `results/`. A record keeps "
                  "the run's resolved config, inputs.json (data sha256, code version), metrics.json and per-round "
                  "curves; the code version of each is listed, *other code* where it is not this checkout's "
                  f"(package files' sha256 {here}).")
        md.append("")
        if len(archived):
            rows = [[f"{r.scenario}/{r.public}/{r.method}/{r.structure}/seed{int(r.seed)}", f"`{r.record}`",
                     f"{r.code}" + ("" if here in str(r.code) else " — *other code*")]
                    for r in archived.itertuples(index=False)]
            md += [Table(["run", "record", "code"], rows, align="lll").text(), ""]
    rows = status.get("records") or []
    stale = [r for r in rows if r.get("state") == "stale"]
    unbuilt = [r for r in rows if r.get("state") == "current" and r.get("unbuilt_inputs")]
    if stale:
        md += [f"**Stale records, left out** ({len(stale)}): the grid now asks for other settings or other data "
               "than these runs had; the workflow planned the runs again.", "",
               Table(["run", "record", "differs"], [[f"{r['kind']}/{r['run']}", f"`{r['record']}`", r["why"]]
                                                    for r in stale], align="lll").text(), ""]
    if unbuilt:
        md += [f"The data of {len(unbuilt)} record(s) is not built in this checkout, so their recorded data sha256 "
               "were not compared with a build (their configs were); `dvc repro` builds it.", ""]
    return md


def diverged_section(runs_csv: Path) -> List[str]:
    """The runs collect counted as diverged (``diverged.csv`` beside ``runs.csv``: their recorded outcome, a
    non-finite loss or weight), in no mean; none when there are none."""
    path = Path(runs_csv).with_name("diverged.csv")
    if not path.exists():
        return []
    df = pd.read_csv(path)
    if not len(df):
        return []
    from .collect import divergence_text

    md = ["## Diverged runs (in no mean)", "",
          f"{len(df)} run(s) stopped on a non-finite loss or weight (`engine.on_nonfinite: fail`); each is that "
          "seed's recorded outcome at its settings (rerunning repeats it), so it has no score. The tables' means "
          "and intervals are over the seeds that finished: a row missing a diverged seed is not the method's "
          "result at that setting, and gives no verdict.", ""]
    md += [f"- {divergence_text(d)} (`{d['run_dir']}`)" for d in df.to_dict("records")]
    return md + [""]
