"""Issues 35 and 49, "done when": the plugins of docs/extending.md, installed as a newcomer would (a
distribution with ``fedshift.methods`` entry points, here written as pip leaves it), run through Snakemake
on the one tiny grid (tests/config/tiny.yaml, scored by the FCCL+ protocol of params/experiments.yaml's
rotmnist, ``eval_models: local``) beside FedAvg: the SCAFFOLD-like plugin (per-participant state, a server step)
is killed with a checkpoint on disk, resumes and ends bit-identical to a straight run; the report table
holds one protocol; FedAvgM's server momentum moves its weights and curves away from FedAvg's there and,
in-process on the same grid, under ``eval_models: global``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from helpers import dry_run_dirs, pipeline_copy, tiny_grid
from test_method_contract import _doc_plugin, _doc_scaffold
from test_plugins import _dist, _env, _kill_at_checkpoint, _run

SCAFFOLD_SGD = {"method": "scaffold_plugin", "engine": {"optimizer": "sgd", "momentum": 0.0, "lr": 0.05}}


def _weights(run_dir):
    return torch.load(Path(run_dir) / "models.pt", weights_only=True)["participants"]


def _same_weights(a, b):
    return all(torch.equal(v, b[p]["state_dict"][k]) for p in a for k, v in a[p]["state_dict"].items())


def _curve(run_dir):
    df = pd.read_csv(Path(run_dir) / "rounds.csv")
    return df[df["kind"] == "inter"].groupby("round")["top1"].mean().tolist()


@pytest.mark.slow
def test_doc_plugins_run_resume_bit_identically_and_report_under_one_protocol(tmp_path, tiny_data, monkeypatch):
    fedavgm_code, FedAvgM = _doc_plugin()  # the blocks of docs/extending.md, as pasted into a newcomer's files
    scaffold_code, Scaffold = _doc_scaffold()
    site = tmp_path / "site"
    _dist(site, "fedavgm", "fedshift.methods", {"fedavgm": "fedavgm:FedAvgM"}, {"fedavgm": fedavgm_code})
    _dist(site, "scaffold-plugin", "fedshift.methods", {"scaffold_plugin": "scaffold_plugin:Scaffold"},
          {"scaffold_plugin": scaffold_code})
    env = _env(PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), FEDSHIFT_TRACKING="none")

    grid = tiny_grid(methods=["fedavg", "fedavgm", "scaffold_sgd"], report={"title": "doc plugins"})
    grid["variants"] = {"scaffold_sgd": SCAFFOLD_SGD}  # SCAFFOLD declares plain SGD (validate refuses Adam)
    # the FCCL+ protocol (params/experiments.yaml's for rotmnist): the server's delivery waits in the checkpoint
    grid["scoring"] = {"eval_models": "local", "weighting": "uniform"}
    rounds = grid["engine"]["rounds"]
    root = pipeline_copy(tmp_path / "project", grid=grid)
    for part in ("partitions/rotmnist", "public/photo_patches"):  # the session's build of the tiny data
        shutil.copytree(tiny_data / part, root / "build" / part)
    _run("git init -q .", root, env)

    # kill -9 the SCAFFOLD plugin's job once it has checkpointed a round; Snakemake records the failure
    planned = {m: next(d for d in dry_run_dirs(root, env) if f"/{m}/" in d)  # <slot>/seed0-<identity> (issue 50)
               for m in ("fedavg", "fedavgm", "scaffold_sgd")}
    run_dir = root / planned["scaffold_sgd"]
    _kill_at_checkpoint(f"snakemake --cores 1 {planned['scaffold_sgd']}/metrics.json", root, env, run_dir,
                        "scaffold_sgd")
    _run("snakemake --cores 2", root, env)  # the whole grid: SCAFFOLD resumes, FedAvg and FedAvgM run beside it
    resumed = yaml.safe_load((run_dir / "metrics.json").read_text())["timings"]["resumed_after_rounds"]
    assert len(resumed) == 1 and 1 <= resumed[0] < rounds
    assert not Path(f"{run_dir}.partial").exists()

    # bit-identical to a straight run of the same resolved config (in-process; the plugins as entry points give them)
    from fedshift import runner
    from fedshift.methods import METHODS

    monkeypatch.setattr(METHODS, "_plugins_loaded", True)  # the in-process registry: the classes themselves
    for name, cls in (("scaffold_plugin", Scaffold), ("fedavgm", FedAvgM)):
        monkeypatch.setitem(METHODS._items, name, cls)
        monkeypatch.setitem(METHODS._origin, name, "plugin (this test)")
    monkeypatch.chdir(root)  # the resolved config's paths are the project's
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    runner.run_federate(cfg, tmp_path / "straight")
    assert (tmp_path / "straight/rounds.csv").read_bytes() == (run_dir / "rounds.csv").read_bytes()
    assert _same_weights(_weights(tmp_path / "straight"), _weights(run_dir))

    # one protocol: every row of the table scored alike (the grid's scoring, not a method's)
    df = pd.read_csv(root / "results/collect/runs.csv")
    assert set(df["method"]) == {"fedavg", "fedavgm", "scaffold_sgd"}
    assert set(df["protocol"]) == {"eval_models local, weighting uniform"}
    table = pd.read_csv(root / "results/report/table_inter__rotmnist__photo_patches__homo_lenet.csv", index_col=0)
    assert set(table.index) == {"fedavg", "fedavgm", "scaffold_sgd"}
    report = (root / "results/report/report.md").read_text()
    assert "| fedavgm |" in report and "| scaffold_sgd |" in report and "Mixed scoring protocols" not in report

    # FedAvgM acts under eval_models: local (its server step runs; before issue 49 `aggregate` did not)
    runs = {m: root / planned[m] for m in ("fedavg", "fedavgm")}
    cfgs = {m: yaml.safe_load((d / "config.yaml").read_text()) for m, d in runs.items()}
    assert cfgs["fedavgm"]["method_params"]["beta"] == 0.9 and cfgs["fedavg"]["engine"] == cfgs["fedavgm"]["engine"]
    assert cfgs["fedavg"]["scoring"] == cfgs["fedavgm"]["scoring"]
    assert not _same_weights(_weights(runs["fedavg"]), _weights(runs["fedavgm"]))
    assert _curve(runs["fedavg"]) != _curve(runs["fedavgm"])
    # ... and under eval_models: global: the same grid's two runs, in-process
    for m, c in cfgs.items():
        runner.run_federate({**c, "scoring": {**c["scoring"], "eval_models": "global"}}, tmp_path / f"global_{m}")
    g = {m: tmp_path / f"global_{m}" for m in cfgs}
    assert not _same_weights(_weights(g["fedavg"]), _weights(g["fedavgm"]))
    assert _curve(g["fedavg"]) != _curve(g["fedavgm"])
