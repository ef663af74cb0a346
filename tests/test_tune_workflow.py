"""Tune, then run, through the real Snakemake (issue 36): a tiny grid with a `tune:` block on a
scenario without a val split (its holdout recorded by the partition stage) tunes FedAvg's lr, the
seeded run trains with the chosen value, the tuned table is written, and a rerun finds nothing to do.
The partition is built in-process beforehand (the workflow's dvc_repro rule then has nothing to do)
and the report is left out, to keep the test short; test_tune.py covers the report's tuned section."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import yaml

from conftest import REPO
from helpers import pipeline_copy, planned_dir
from test_workflow import run

pytestmark = pytest.mark.slow

DATA = {"mirror": None, "datasets": ["mnist5k"], "dataset_params": {}, "public": {},
        "scenarios": {"mnist5k_permuted": {"clients": 2, "test": 0.9, "seed": 0, "holdout": 0.2}}}
GRID = {"engine": {"rounds": 2, "local_epochs": 1, "local_batch": 32, "device": "cpu", "threads": 1},
        "grid": [{"scenarios": ["mnist5k_permuted"], "methods": ["fedavg"], "structures": ["homo_lenet"], "seeds": [0]}],
        "tune": {"budget": {"rounds": 2, "seeds": [0], "patience": 1}, "methods": {"fedavg": {"engine.lr": [0.001, 0.01]}}},
        "report": {"title": "tiny tune"}}


def test_tune_then_run_end_to_end(tiny_data, tmp_path):
    from fedshift.data import build

    root = pipeline_copy(tmp_path / "project", DATA, GRID)
    (root / "src").mkdir()
    os.symlink(REPO / "src/fedshift", root / "src/fedshift")
    (root / "data").mkdir()
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"},
                    root / "build/partitions/mnist5k_permuted", DATA["scenarios"]["mnist5k_permuted"])
    seeded_dir = planned_dir(root, "mnist5k_permuted/none/fedavg/homo_lenet/seed0")  # <slot>-<identity> (issue 50)
    targets = f"{seeded_dir}/metrics.json results/tune/tuned.csv"
    run(f"FEDSHIFT_TRACKING=none snakemake --cores 2 {targets}", root)
    group = root / "results/tune/mnist5k_permuted/none/fedavg/homo_lenet"
    (chosen_file,) = group.glob("chosen-*.yaml")
    chosen = yaml.safe_load(chosen_file.read_text())
    assert [c["values"]["engine.lr"] for c in chosen["candidates"]] == [0.001, 0.01]
    assert all(c["status"] == "ok" and 0 in c["per_seed"] for c in chosen["candidates"])
    best = max(chosen["candidates"], key=lambda c: c["score"])
    assert chosen["chosen"] == best["values"]
    seeded = yaml.safe_load((root / seeded_dir / "config.yaml").read_text())
    assert seeded["engine"]["lr"] == chosen["chosen"]["engine.lr"] and seeded["engine"]["rounds"] == 2
    assert seeded["tuned"]["chosen"] == chosen["chosen"]
    tuned = pd.read_csv(root / "results/tune/tuned.csv")
    assert list(tuned["method"]) == ["fedavg"] and list(tuned["parameter"]) == ["engine.lr"]
    assert float(tuned["chosen"].iloc[0]) == chosen["chosen"]["engine.lr"] and tuned["n_candidates"].iloc[0] == 2
    again = run(f"FEDSHIFT_TRACKING=none snakemake -n --cores 2 {targets}", root)
    assert "Nothing to be done" in again.stdout + again.stderr
    # issue 52: the seeded run and its selection archived, results/ gone: the tuned table is rebuilt from the
    # archived chosen.yaml and collect reads the record; no candidate, selection or seeded run is planned
    import shutil

    out = run("FEDSHIFT_TRACKING=none fedshift archive", root).stdout
    assert "archived tune/mnist5k_permuted/none/fedavg/homo_lenet/chosen.yaml" in out
    record = root / "records/main/tune/mnist5k_permuted/none/fedavg/homo_lenet/chosen.yaml"
    assert yaml.safe_load(record.read_text()) == chosen
    shutil.rmtree(root / "results")
    dry = run("FEDSHIFT_TRACKING=none snakemake -n --cores 2 results/tune/tuned.csv results/collect/runs.csv", root)
    from test_workflow import job_counts

    assert job_counts(dry.stdout) == {"collect": 1, "tune_table": 1, "total": 2}, dry.stdout
    assert f"python -m fedshift.tune table results/tune/tuned.csv {record.relative_to(root)}" in dry.stdout
