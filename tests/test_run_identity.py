"""Run identity by settings (issue 50): a run's folder and MLflow run carry a hash of what it computes, so two
grids that set a method differently never share a folder, and a report says which runs it read and whether
each is still the one it read."""

from __future__ import annotations

import copy
import shutil

import pandas as pd
import pytest
import yaml

from fedshift.experiments import load_experiments
from fedshift.provenance import run_identity
from helpers import pipeline_copy, tiny_data_params, tiny_grid

DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}}


def _plan(**changes):
    grid = tiny_grid(methods=["fedavg", "fedmd", "fccl"], **changes)
    return load_experiments(grid, DATA)


def _cfgs(plan):
    return {c["method"]: c for c in plan.federate.values()}


def test_identity_is_twelve_hex_of_the_settings_and_ignores_how_the_job_executes():
    cfg = _cfgs(_plan())["fedavg"]
    rid = run_identity(cfg)
    assert len(rid) == 12 and int(rid, 16) >= 0 and cfg["identity"] == rid
    assert run_identity(dict(reversed(list(cfg.items())))) == rid  # canonical JSON: key order is not a setting
    same = copy.deepcopy(cfg)
    same["engine"].update(threads=7, device="cuda", checkpoint_every=5, checkpoint_min_s=99)  # how it executes
    same["paths"] = {"partition": "/elsewhere", "public": None, "pretrained": None}
    same.update(run_name="x", wildcards={}, identity="0" * 12)  # names derived from the settings
    assert run_identity(same) == rid
    for section, key, value in (("engine", "lr", 0.5), ("engine", "rounds", 9), ("scoring", "eval_models", "local"),
                                (None, "seed", 3), (None, "method", "fedavg_v")):
        other = copy.deepcopy(cfg)
        (other[section] if section else other)[key] = value
        assert run_identity(other) != rid, key


def test_two_grids_that_set_a_method_differently_get_two_folders_and_share_the_rest():
    a, b = _plan(), _plan(method_params={"fedavg": {"init": "base"}})
    fa, fb = ({c["method"]: p.folder(j) for j, c in p.federate.items()} for p in (a, b))
    assert fa["fedavg"] != fb["fedavg"] and fa["fedavg"].startswith("rotmnist/photo_patches/fedavg/homo_lenet/seed0-")
    assert fa["fedmd"] == fb["fedmd"] and fa["fccl"] == fb["fccl"]  # the same settings: one shared run
    cfg = _cfgs(a)["fedavg"]
    assert cfg["run_name"] == f"federate/{fa['fedavg']}" and fa["fedavg"].endswith(cfg["identity"])


def test_a_pretrain_setting_reaches_the_identity_of_the_runs_that_start_from_it():
    """FCCL starts from the BASE checkpoints: paths are left out of the identity, the BASE runs' identities are in."""
    a, b = _plan(), _plan(pretrain={"epochs": 3})
    assert {a.folder(j) for j in a.pretrain}.isdisjoint({b.folder(j) for j in b.pretrain})
    ca, cb = _cfgs(a), _cfgs(b)
    assert ca["fccl"]["identity"] != cb["fccl"]["identity"] and ca["fedmd"]["identity"] == cb["fedmd"]["identity"]
    assert ca["fccl"]["base_runs"] == [a.pretrain[j]["identity"] for j in sorted(a.pretrain, key=lambda j: j.participant)]
    assert all(p.endswith("/model.pt") and f"-{a.pretrain[j]['identity']}/" in p
               for p, j in zip(ca["fccl"]["paths"]["pretrained"], sorted(a.pretrain, key=lambda j: j.participant)))
    # the data a pretrain run reads is a setting too (paths are not): engine.data_seed
    c = _plan(engine={"data_seed": "run"})
    assert {a.folder(j) for j in a.pretrain}.isdisjoint({c.folder(j) for j in c.pretrain})


def test_a_report_says_which_run_it_read_is_no_longer_the_one_it_read(tmp_path):
    """runs_read: the four ways a run read by a report goes stale, each named in one line."""
    from fedshift.report import runs_read

    cfgs = _cfgs(_plan())
    folders = {}
    for m in ("fedavg", "fedmd", "fccl"):
        d = tmp_path / "results/federate" / cfgs[m]["run_name"][len("federate/"):]
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(yaml.safe_dump(cfgs[m]))
        (d / "rounds.csv").write_bytes(b"round,top1\r\n0,0.1\r\n")
        folders[m] = str(d.relative_to(tmp_path))
    frame = runs_read.record([tmp_path / f for f in folders.values()])
    assert list(frame["identity"]) == [cfgs[m]["identity"] for m in folders]
    frame["run_dir"] = list(folders.values())  # as collect gets them from Snakemake: relative
    planned = {f for f in folders.values()}
    assert runs_read.stale_runs(frame, base=tmp_path, planned=planned) == []
    edited = dict(cfgs["fedavg"], engine={**cfgs["fedavg"]["engine"], "lr": 0.5})
    (tmp_path / folders["fedavg"] / "config.yaml").write_text(yaml.safe_dump(edited))
    (tmp_path / folders["fedmd"] / "rounds.csv").write_bytes(b"round,top1\r\n0,0.2\r\n")
    shutil.rmtree(tmp_path / folders["fccl"])
    lines = runs_read.stale_runs(frame, base=tmp_path, planned=planned)
    assert [line.split(": ")[1] for line in lines] == ["settings", "newer run", "gone (the report read it; rerun the grid)"]
    assert lines[0].startswith(f"{folders['fedavg']}: settings: its config.yaml now hashes to {run_identity(edited)}")
    frame = frame.iloc[[1]]  # fedmd: current again, but the grid no longer asks for it
    (tmp_path / folders["fedmd"] / "rounds.csv").write_bytes(b"round,top1\r\n0,0.1\r\n")
    assert runs_read.stale_runs(frame, base=tmp_path, planned=planned - {folders["fedmd"]}) == [
        f"{folders['fedmd']}: not asked: the grid no longer asks for this run (its settings changed); snakemake "
        "reruns the grid and its report"]


@pytest.mark.slow
def test_two_grids_that_set_one_method_differently_both_survive_and_both_reports_stay_current(tiny_data, tmp_path):
    """The done-when of issue 50: grid b sets FedAvg otherwise than grid a (its start: the BASE checkpoints FedMD
    pretrains anyway; the scoring protocol, issue 49, is the grid's and would change FedMD too); both sets of runs
    survive (folders and MLflow runs), FedMD (the same settings) runs once, both reports stay current; a report
    whose run was replaced, or whose grid no longer asks for a run, is said stale."""
    from test_workflow import run

    root = pipeline_copy(tmp_path / "project")
    for part in ("partitions/rotmnist", "public/photo_patches"):  # the session's build of the tiny data
        shutil.copytree(tiny_data / part, root / "build" / part)
    base = {"grid": [{**tiny_grid()["grid"][0], "methods": ["fedavg", "fedmd"]}]}
    grids = {"a": {**base, "report": {"name": "a"}},
             "b": {**base, "methods": {"fedavg": {"init": "base"}}, "report": {"name": "b"}}}
    for name, g in grids.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(g))
    run("git init -q .", root)
    first = run("snakemake --cores 2 --configfile a.yaml", root)
    second = run("snakemake --cores 2 --configfile b.yaml", root)
    assert "federate" in first.stderr and second.stderr.count("rule federate:") == 1  # b reuses a's FedMD run

    fedavg = sorted((root / "results/federate/rotmnist/photo_patches/fedavg/homo_lenet").glob("seed0-*"))
    assert len(fedavg) == 2 and all((d / "metrics.json").exists() for d in fedavg)
    starts = {yaml.safe_load((d / "config.yaml").read_text())["method_params"]["init"] for d in fedavg}
    assert starts == {"scratch", "base"}
    assert len(list((root / "results/federate/rotmnist/photo_patches/fedmd/homo_lenet").glob("seed0-*"))) == 1
    frames = {n: pd.read_csv(root / f"results/ablations/{n}/report/runs_read.csv") for n in grids}
    assert len(frames["b"][frames["b"]["kind"] == "pretrain"]) == 4  # b's FedAvg starts from the BASE runs it read
    read = {n: r[r["kind"] == "federate"] for n, r in frames.items()}
    assert set(read["a"]["run_dir"]) != set(read["b"]["run_dir"]) and len(read["a"]) == len(read["b"]) == 2
    assert "## Runs read" in (root / "results/ablations/a/report/report.md").read_text()

    for name in grids:  # both reports current after both grids ran
        res = run(f"fedshift validate --experiments {name}.yaml", root)
        assert f"report results/ablations/{name}/report: current ({len(frames[name])} run folders read" in res.stdout, \
            res.stdout

    import mlflow  # both FedAvg runs live in MLflow: the second did not replace (delete) the first

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rotmnist")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags["method"] == "fedavg"]
    assert sorted(r.data.tags["fedshift.identity"] for r in runs) == sorted(d.name.split("-")[1] for d in fedavg)
    assert len({r.info.run_name for r in runs}) == 2 and all("fedshift.replaces" not in r.data.tags for r in runs)

    # a newer run of the same identity (here: its rounds.csv rewritten) makes report a stale, not b
    a_fedavg = next(d for d in read["a"]["run_dir"] if "/fedavg/" in d)
    rounds = root / a_fedavg / "rounds.csv"
    read_bytes = rounds.read_bytes()
    rounds.write_bytes(read_bytes + b"\n")
    res = run("fedshift validate --experiments a.yaml", root)
    assert "report results/ablations/a/report: 1 of 2 run folders it read are stale" in res.stdout
    assert f"{a_fedavg}: newer run: a newer run of identity" in res.stdout
    assert "results/ablations/b/report: current" in run("fedshift validate --experiments b.yaml", root).stdout
    # grid a now asks for another FedAvg: its report names the run it no longer asks for
    (root / "a.yaml").write_text(yaml.safe_dump({**grids["a"], "methods": {"fedavg": {"init": "base"}}}))
    res = run("fedshift validate --experiments a.yaml", root)
    assert f"{a_fedavg}: not asked: the grid no longer asks for this run" not in res.stdout  # stale for the first reason
    rounds.write_bytes(read_bytes)
    res = run("fedshift validate --experiments a.yaml", root)
    assert f"{a_fedavg}: not asked: the grid no longer asks for this run" in res.stdout
