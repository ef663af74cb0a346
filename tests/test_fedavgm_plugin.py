"""Issue 35's "done when": the FedAvgM plugin of docs/extending.md (<= 20 lines of code, checked by
tests/test_method_contract.py), installed as a newcomer would (a distribution with a
``fedshift.methods`` entry point, here written as pip leaves it), runs through Snakemake on the one
tiny grid (tests/config/tiny.yaml) beside FedAvg, resumes after its job is killed with a checkpoint
on disk, and is reported beside FedAvg under the same protocol."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from helpers import dry_run_dirs, pipeline_copy, tiny_grid
from test_method_contract import _doc_plugin
from test_plugins import _dist, _env, _kill_at_checkpoint, _run



@pytest.mark.slow
def test_fedavgm_from_extending_md_runs_resumes_and_is_reported_beside_fedavg(tmp_path, tiny_data):
    code, _ = _doc_plugin()  # the block of docs/extending.md, as pasted into the newcomer's fedavgm.py
    site = tmp_path / "site"
    _dist(site, "fedavgm", "fedshift.methods", {"fedavgm": "fedavgm:FedAvgM"}, {"fedavgm": code})
    env = _env(PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), FEDSHIFT_TRACKING="none")

    grid = tiny_grid(methods=["fedavg", "fedavgm"], report={"title": "fedavgm"})
    rounds = grid["engine"]["rounds"]
    root = pipeline_copy(tmp_path / "project", grid=grid)
    for part in ("partitions/rotmnist", "public/photo_patches"):  # the session's build of the tiny data
        shutil.copytree(tiny_data / part, root / "build" / part)
    _run("git init -q .", root, env)

    # kill -9 FedAvgM's job once it has checkpointed a round; Snakemake records the failure
    runs = {m: next(d for d in dry_run_dirs(root, env) if f"/{m}/" in d) for m in ("fedavg", "fedavgm")}  # issue 50
    run_dir = root / runs["fedavgm"]
    _kill_at_checkpoint(f"snakemake --cores 1 {runs['fedavgm']}/metrics.json", root, env, run_dir, "fedavgm")

    _run("snakemake --cores 2", root, env)  # the whole grid: FedAvgM resumes from its checkpoint, FedAvg runs beside it
    resumed = yaml.safe_load((run_dir / "metrics.json").read_text())["timings"]["resumed_after_rounds"]
    assert len(resumed) == 1 and 1 <= resumed[0] < rounds
    assert not Path(f"{run_dir}.partial").exists()

    # the same protocol: both rows score the same model (eval_models) with the same weighting
    cfgs = {m: yaml.safe_load((root / runs[m] / "config.yaml").read_text()) for m in ("fedavg", "fedavgm")}
    protocol = {m: (c["method_params"]["eval_models"], c["method_params"]["weighting"]) for m, c in cfgs.items()}
    assert protocol["fedavg"] == protocol["fedavgm"], protocol
    assert cfgs["fedavgm"]["method_params"]["beta"] == 0.9 and cfgs["fedavg"]["engine"] == cfgs["fedavgm"]["engine"]

    df = pd.read_csv(root / "results/collect/runs.csv")
    assert set(df["method"]) == {"fedavg", "fedavgm"}
    table = pd.read_csv(root / "results/report/table_inter__rotmnist__photo_patches__homo_lenet.csv", index_col=0)
    assert set(table.index) == {"fedavg", "fedavgm"}
    report = (root / "results/report/report.md").read_text()
    assert "| fedavg |" in report and "| fedavgm |" in report
