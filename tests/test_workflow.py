"""The real workflow end to end on a tiny grid: dvc repro -> snakemake -> MLflow -> report.

Runs the actual `dvc` and `snakemake` commands in a scratch copy of the pipeline files
(dvc.yaml, params/, workflow/) with the one tiny grid and its data (tests/config/), then checks the
collected table, the report, the MLflow store and that both tools find nothing to do
afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO
from helpers import pipeline_copy, planned_dir, run_dir, tiny_grid

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

TINY_GRID = tiny_grid()  # tests/config/tiny.yaml, with its data tests/config/tiny_data.yaml


def run(cmd, cwd, check=True, timeout=900):
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("FEDSHIFT_TRACKING", None)  # the workflow test uses the real MLflow store
    env.pop("MLFLOW_TRACKING_URI", None)
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, shell=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return res


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = pipeline_copy(tmp_path_factory.mktemp("project") / "p", link_src=True)  # the tiny grid and its data
    run("git init -q . && dvc init -q && dvc config core.analytics false", root)
    return root


@pytest.fixture(scope="module")
def ran(project):
    first = run("dvc repro", project)
    wf = run("snakemake --cores 2", project)
    return project, first, wf


def test_runs_csv_has_every_method(ran):
    root, _, _ = ran
    df = pd.read_csv(root / "results/collect/runs.csv")
    assert set(df["method"]) == {"base", "fedavg", "fedmd", "fccl_plus", "base_pretrain"}
    assert {"method", "top1", "top5", "scenario", "public", "structure", "seed", "round", "participant", "domain"} <= set(df.columns)
    # 4 participants x 4 evaluated domains x (round 0..3) per method
    solo = df["method"] == "base_pretrain"
    assert (df[~solo].groupby("method").size() == 4 * 4 * 4).all()
    # the papers' SOLO/BASE row: the pretrain runs' final epoch, placed at the last round
    assert solo.sum() == 4 * 4 and (df.loc[solo, "round"] == 3).all()
    assert df["top1"].between(0, 1).all() and (df["top5"] >= df["top1"]).all()
    last = df[df["round"] == 3]
    assert last.groupby("method")["top1"].mean().min() > 0.15  # better than chance (0.1) after 3 rounds


def test_report_table_and_figures(ran):
    root, _, _ = ran
    rep = root / "results/report"
    tables = sorted(p.name for p in rep.glob("table_*.csv"))
    assert tables == ["table_inter__rotmnist__photo_patches__homo_lenet.csv",
                      "table_intra__rotmnist__photo_patches__homo_lenet.csv"]
    t = pd.read_csv(rep / tables[0], index_col=0)
    assert set(t.index) == {"base", "fedavg", "fedmd", "fccl_plus", "base_pretrain"}
    assert list(t.columns) == ["m0→", "m20→", "m40→", "m60→", "AVG→", "seeds"]
    # AVG is the mean of the participants' columns
    assert (t[["m0→", "m20→", "m40→", "m60→"]].mean(axis=1) - t["AVG→"]).abs().max() < 0.011
    png = rep / "curves__rotmnist__photo_patches__homo_lenet.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "| fccl_plus |" in (rep / "report.md").read_text()


def test_mlflow_holds_every_run_with_metrics_and_artifacts(ran):
    root, _, _ = ran
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rotmnist")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    # pretrain runs have their own experiment (tracking.job_experiment), apart from the federated ones
    runs += client.search_runs([client.get_experiment_by_name("rotmnist-pretrain").experiment_id], max_results=100)
    kinds = sorted(r.data.tags["fedshift.kind"] for r in runs)
    assert kinds == ["federate"] * 4 + ["pretrain"] * 4
    assert len({r.info.run_name for r in runs}) == 8  # short names, one per job
    fed = next(r for r in runs if r.info.run_name.startswith("fccl_plus s0 homo_lenet photo_patches "))
    folder = run_dir(root, "rotmnist/photo_patches/fccl_plus/homo_lenet/seed0")  # <slot>-<identity> (issue 50)
    assert fed.data.tags["fedshift.run_key"] == f"federate/{folder.relative_to(root / 'results/federate')}"
    assert folder.name.endswith(fed.data.tags["fedshift.identity"]) and fed.info.run_name.endswith(
        fed.data.tags["fedshift.identity"][:6])
    assert fed.info.status == "FINISHED"
    # the tables' number is a metric; device and phase times are recorded
    assert 0 < fed.data.metrics["table/AVG_inter"] <= 100
    assert fed.data.metrics["time/total_s"] >= fed.data.metrics["time/train_s"] > 0
    assert fed.data.params["env.device"] == "cpu" and fed.data.params["engine.threads"] == "1"
    assert fed.data.params["method_params.omega"] == "3.0"
    assert fed.data.tags["wildcard.method"] == "fccl_plus" and fed.data.tags["git.commit"]
    assert any(k.startswith("data.partition/rotmnist") for k in fed.data.tags)
    hist = client.get_metric_history(fed.info.run_id, "avg/inter/top1")
    assert sorted(m.step for m in hist) == [0, 1, 2, 3]
    assert len(client.get_metric_history(fed.info.run_id, "m20/intra/top5")) == 4
    arts = {a.path for a in client.list_artifacts(fed.info.run_id)}
    assert {"config.yaml", "metrics.json", "rounds.csv", "models.pt"} <= arts
    assert not list((root / "results/federate").rglob("*.partial"))  # finished jobs leave no checkpoint area
    rep = client.get_experiment_by_name("report")
    assert client.search_runs([rep.experiment_id])


def test_nothing_left_to_do(ran):
    root, _, _ = ran
    dry = run("snakemake -n --cores 1", root)
    assert "Nothing to be done" in dry.stdout + dry.stderr
    status = run("dvc status", root)
    assert "up to date" in status.stdout


def test_every_run_folder_records_the_current_manifests(ran):
    """Issue 38: each published run (pretrain and federate) holds its inputs' sha256, equal to the
    manifests it read, and the code version."""
    import json

    from fedshift.data.store import sha256_file

    root, _, _ = ran
    folders = [p.parent for p in (root / "results").glob("*/rotmnist/**/metrics.json")]
    assert len(folders) == 8
    for folder in folders:
        rec = json.loads((folder / "inputs.json").read_text())
        for name, path in rec["paths"].items():
            assert rec["inputs"][name] == sha256_file(root / path), (folder, name)
        assert "partition/rotmnist" in rec["inputs"] and len(rec["code"]["files_sha256"]) == 64
    fccl = json.loads((run_dir(root, "rotmnist/photo_patches/fccl_plus/homo_lenet/seed0") / "inputs.json").read_text())
    assert sorted(fccl["inputs"]) == ["base/0", "base/1", "base/2", "base/3", "partition/rotmnist", "public/photo_patches"]
    import mlflow  # the MLflow run carries the same code version, and says whether the tree was dirty

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rotmnist")
    (run,) = [r for r in client.search_runs([exp.experiment_id], max_results=100)
              if "/fccl_plus/homo_lenet/seed0-" in r.data.tags["fedshift.run_key"]]
    code = fccl["code"]
    assert run.data.tags["code.sha256"] == code["files_sha256"]
    assert run.data.tags["git.dirty"] == str(code["dirty"]).lower()
    if code["commit"]:
        assert run.data.tags["git.commit"] == code["commit"] + ("-dirty" if code["dirty"] else "")


def test_html_report_carries_report_md_with_its_figures_and_says_what_the_pm_is(ran):
    """`snakemake --report` bundles report.md as its own item and report.html inline, the figures inside it
    (issue 50: a data-URI page cannot reach the PNGs beside it); its captions say the ± is a 95% CI (not a
    standard deviation). The tiny grid names no published table: no paper delta, no papers' claims."""
    import base64
    import re

    root, _, _ = ran
    run("snakemake --report report.html", root)
    html = (root / "report.html").read_text(errors="replace")
    assert "report.md" in html and "tables.tex" in html
    inner = re.search(r"filename=report\.html;base64,([A-Za-z0-9+/=]+)", html)  # shown inline (eye icon)
    assert inner and "data:text/html;charset=" in html
    page = base64.b64decode(inner.group(1)).decode()
    assert page.count('<img src="data:image/png;base64,') >= 3 and "<h3>Inter-domain top1:" in page
    assert "Paper delta" not in page and "filename=claims.html" not in html  # no paper delta, no papers' claims
    assert "95% confidence half-width" in html and "± the standard deviation" not in html


def test_user_grid_reports_only_its_own_report_block(ran):
    root, _, _ = ran
    own = dict(TINY_GRID, report={"name": "mine"})
    (root / "user.yaml").write_text(yaml.safe_dump(own))
    run("snakemake -n --cores 1 --configfile user.yaml", root)
    mine = yaml.safe_load((root / "results/configs/report-mine.yaml").read_text())
    assert mine == {"name": "mine", "method_order": TINY_GRID["grid"][0]["methods"]}  # no title


def test_hyperparameter_change_reruns_only_affected_jobs(ran):
    root, _, _ = ran
    grid = yaml.safe_load((root / "params/experiments.yaml").read_text())
    grid["methods"]["fccl_plus"]["omega"] = 1.0
    (root / "params/experiments.yaml").write_text(yaml.safe_dump(grid))
    try:
        dry = run("snakemake -n --cores 1", root).stdout
        jobs = [l.split()[1].rstrip(":") for l in dry.splitlines() if l.startswith("rule ")]
        assert sorted(jobs) == ["all", "collect", "federate", "report"]
        outputs = [l.strip() for l in dry.splitlines() if l.strip().startswith("output: results/federate/")]
        assert len(outputs) == 1 and "/fccl_plus/" in outputs[0]
    finally:
        grid["methods"]["fccl_plus"].pop("omega")
        (root / "params/experiments.yaml").write_text(yaml.safe_dump(grid))


def test_command_line_overrides_plan_through_snakemake(project):
    """Issue 39 point 1: `fedshift run` with dotted overrides (a new seed, one method, a named report,
    so the module's grid is left alone) plus Snakemake's own `--config engine='{rounds: 1}'`, whose
    BaseLoader strings the workflow types: Snakemake plans exactly that one job, from a config with
    both (planning writes it; a dry run: the real job would add ~25 s and nothing this checks)."""
    slot = "rotmnist/photo_patches/fedavg/homo_lenet/seed7"
    res = run("FEDSHIFT_TRACKING=none fedshift run grid.0.seeds=[7] grid.0.methods=[fedavg] report.name=cli "
              "-- -n --cores 1 --config 'engine={rounds: 1, lr: 1e-3}'", project)
    assert "grid.0.seeds=[7], grid.0.methods=[fedavg], report.name=cli on params/experiments.yaml: " \
           "0 pretrain and 1 federate jobs planned" in res.stderr
    planned = [l.strip() for l in res.stdout.splitlines() if l.strip().startswith("output: results/federate/")]
    assert len(planned) == 1 and planned[0].startswith(f"output: results/federate/{slot}-"), res.stdout[-2000:]
    (path,) = (project / "results/configs/federate").glob(f"{slot}-*.yaml")
    cfg = yaml.safe_load(path.read_text())
    assert planned[0].startswith(f"output: results/federate/{slot}-{cfg['identity']}/metrics.json")
    assert cfg["seed"] == 7 and cfg["engine"]["rounds"] == 1 and cfg["engine"]["lr"] == 0.001
    assert cfg["engine"]["local_batch"] == TINY_GRID["engine"]["local_batch"]  # the rest of the grid kept


def test_data_params_that_disagree_with_the_built_data_are_refused(project):
    """Issue 51 R18: `fedshift run GRID data_params=<a copy of params/data.yaml with rotmnist's seed changed>`
    while the partition built from params/data.yaml exists planned the jobs on the built partition (the
    data file's check ran only when a manifest was missing): validate ok, rc 0, the runs trained on data
    the grid did not name. Now planning (fedshift run, snakemake, fedshift validate) refuses in one line
    naming the key, the built value and the asked one. Dry runs: nothing trains."""
    run("dvc repro", project)  # what the grid reads is built (a no-op after the module's first run)
    data = yaml.safe_load((project / "params/data.yaml").read_text())
    built = data["scenarios"]["rotmnist"]["seed"]
    data["scenarios"]["rotmnist"]["seed"] = built + 1
    (project / "data_other.yaml").write_text(yaml.safe_dump(data))
    want = (f"data_other.yaml: scenarios.rotmnist.seed is {built + 1}, but build/partitions/rotmnist was built "
            f"with {built}")
    res = run("FEDSHIFT_TRACKING=none fedshift run data_params=data_other.yaml -- -n --cores 1", project, check=False)
    err = [l for l in res.stderr.splitlines() if l.startswith("fedshift: error:")]
    assert res.returncode == 2 and len(err) == 1 and want in err[0], res.stdout[-2000:] + res.stderr[-2000:]
    assert "copy data_other.yaml over params/data.yaml" in err[0] and "rule federate" not in res.stdout
    res = run("FEDSHIFT_TRACKING=none snakemake -n --cores 1 --config data_params=data_other.yaml", project, check=False)
    assert res.returncode != 0 and f"fedshift: error: {want}" in res.stdout + res.stderr
    assert "rule federate" not in res.stdout
    # the same file as params/data.yaml, not rebuilt after the edit: `dvc repro` is the fix
    original = (project / "params/data.yaml").read_text()
    try:
        (project / "params/data.yaml").write_text(yaml.safe_dump(data))
        res = run("FEDSHIFT_TRACKING=none fedshift validate", project, check=False)
        assert res.returncode == 2 and "params/data.yaml: scenarios.rotmnist.seed is" in res.stderr
        assert "run `dvc repro`" in res.stderr.strip().splitlines()[-1]
    finally:
        (project / "params/data.yaml").write_text(original)
    assert run("FEDSHIFT_TRACKING=none fedshift validate", project).returncode == 0  # agreeing again


def test_unreachable_tracking_server_does_not_abort_the_run(ran):
    """Issue 23 case 7: onstart's MLflow store check raised and aborted the whole run."""
    root, _, _ = ran
    res = run("MLFLOW_TRACKING_URI=http://127.0.0.1:9 snakemake --cores 1 --forcerun collect", root, check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "fedshift: warning: MLflow tracking at http://127.0.0.1:9 is unreachable" in out
    assert "Finished job" in out or "steps (100%) done" in out


def test_bad_names_fail_before_any_job(project):
    bad = dict(TINY_GRID, grid=[dict(TINY_GRID["grid"][0], methods=["fccl_plsu"])])
    (project / "bad.yaml").write_text(yaml.safe_dump(bad))
    res = run("snakemake -n --cores 1 --configfile bad.yaml", project, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "fedshift: error: grid[0].methods: unknown method 'fccl_plsu' (did you mean 'fccl_plus'?)" in out
    assert "rule federate" not in out
    bad = dict(TINY_GRID, engine={"rounds": 2, "lokal_epochs": 1})
    (project / "bad.yaml").write_text(yaml.safe_dump(bad))
    res = run("snakemake -n --cores 1 --configfile bad.yaml", project, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "engine (base on rotmnist).lokal_epochs: unknown key (did you mean 'local_epochs'?)" in out


def test_lint_is_clean():
    res = run("snakemake --lint", REPO)
    assert "Congratulations, your workflow is in a good condition!" in res.stdout + res.stderr


def job_counts(dry_run: str) -> dict:
    """The first "Job stats" table of a Snakemake dry run: rule -> count."""
    lines = dry_run[dry_run.index("Job stats:"):].splitlines()[3:]
    rows = [line.split() for line in lines[:lines.index("")]] if "" in lines else []
    return {r[0]: int(r[1]) for r in rows if len(r) == 2}


def test_archive_then_report_from_records_without_training(ran, tmp_path):
    """Issue 52: `fedshift archive` copies the finished runs' records (no weights) into records/<grid>/;
    with results/ gone, Snakemake plans no training job, collect reads the records and the report lists
    them with their code; a changed setting makes one record stale: listed with the key, run again,
    left out of collect."""
    import shutil

    root, _, _ = ran
    clone = tmp_path / "clone"
    shutil.copytree(root, clone, symlinks=True)
    before = pd.read_csv(clone / "results/collect/runs.csv")
    out = run("FEDSHIFT_TRACKING=none fedshift archive", clone)
    assert out.stdout.count("archived federate/") == 4 and out.stdout.count("archived pretrain/") == 4, out.stdout
    fedavg = clone / "records/main/federate/rotmnist/photo_patches/fedavg/homo_lenet/seed0"
    assert sorted(p.name for p in fedavg.iterdir()) == ["config.yaml", "inputs.json", "metrics.json", "record.json",
                                                         "rounds.csv"]  # no models.pt
    again = run("FEDSHIFT_TRACKING=none fedshift archive", clone).stderr
    assert "0 record(s) written, 8 unchanged" in again
    shutil.rmtree(clone / "results")
    dry = run("FEDSHIFT_TRACKING=none snakemake -n --cores 1", clone).stdout
    assert job_counts(dry) == {"collect": 1, "report": 1, "all": 1, "total": 3}, dry
    full = job_counts(run("FEDSHIFT_TRACKING=none snakemake -n --cores 1 --config records=none", clone).stdout)
    assert full["federate"] == 4 and full["pretrain"] == 4, full  # records=none: every run planned again
    bad = run("FEDSHIFT_TRACKING=none snakemake -n --cores 1 --config records=recrods", clone, check=False)
    assert bad.returncode != 0 and "--config records=recrods: no such folder" in bad.stdout + bad.stderr
    run("FEDSHIFT_TRACKING=none snakemake --cores 1", clone)
    after = pd.read_csv(clone / "results/collect/runs.csv")
    assert (after["record"].fillna("") != "").all()
    key = ["method", "seed", "round", "participant", "domain", "kind"]
    pd.testing.assert_series_equal(before.sort_values(key)["top1"].reset_index(drop=True),
                                   after.sort_values(key)["top1"].reset_index(drop=True))
    md = (clone / "results/report/report.md").read_text()
    assert "4 of 4 federated runs were read from committed records" in md
    assert "records/main/federate/rotmnist/photo_patches/fedavg/homo_lenet/seed0" in md
    # another setting for one method: its record is stale (named with the key), it is planned again and
    # collect reads the new run folder, not the record
    grid = yaml.safe_load((clone / "params/experiments.yaml").read_text())
    grid["methods"]["fedmd"] = {"digest_epochs": 2}
    (clone / "params/experiments.yaml").write_text(yaml.safe_dump(grid))
    dry = run("FEDSHIFT_TRACKING=none snakemake -n -p --cores 1", clone)
    assert ("records/main/federate/rotmnist/photo_patches/fedmd/homo_lenet/seed0: stale "
            "(method_params.digest_epochs 1 archived, 2 now)") in dry.stderr
    assert job_counts(dry.stdout) == {"federate": 1, "collect": 1, "report": 1, "all": 1, "total": 4}, dry.stdout
    collect_cmd = next(line for line in dry.stdout.splitlines() if "fedshift collect " in line)
    assert "results/federate/rotmnist/photo_patches/fedmd/homo_lenet/seed0" in collect_cmd
    assert "records/main/federate/rotmnist/photo_patches/fedmd/" not in collect_cmd
    assert "records/main/federate/rotmnist/photo_patches/fedavg/homo_lenet/seed0" in collect_cmd
    status = json.loads((clone / "results/configs/archive-main.json").read_text())
    assert [r["run"] for r in status["records"] if r["state"] == "stale"] == ["rotmnist/photo_patches/fedmd/homo_lenet/seed0"]


def test_kill9_then_data_change_then_rerun_starts_afresh(ran):
    """Issue 23 cases 1 and 8 through the real tools: `kill -9` of Snakemake stops its job (the
    rule execs it with --die-with-parent; checkpoint kept, nothing published); the scenario's
    seed changes and `dvc repro` rebuilds the partition; after `--unlock` the rerun does not
    resume on the old partition: the job log says why, in one line. Runs last: it changes data."""
    import signal
    import time

    root, _, _ = ran
    grid = dict(TINY_GRID, engine=dict(TINY_GRID["engine"], rounds=60, checkpoint_min_s=0),
                grid=[dict(TINY_GRID["grid"][0], methods=["fedavg"])])
    (root / "long.yaml").write_text(yaml.safe_dump(grid))
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", MLFLOW_DISABLE_TELEMETRY="true", FEDSHIFT_TRACKING="none")
    folder = root / planned_dir(root, "rotmnist/photo_patches/fedavg/homo_lenet/seed0", configfiles=["long.yaml"])
    partial = folder.parent / f"{folder.name}.partial"
    smk = subprocess.Popen("exec snakemake --cores 1 --configfile long.yaml", cwd=root, env=env, shell=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (partial / "checkpoint.pt").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert (partial / "checkpoint.pt").exists(), "no checkpoint within 300 s"
    smk.send_signal(signal.SIGKILL)
    smk.wait()
    time.sleep(5)  # the job got SIGTERM from the kernel (PR_SET_PDEATHSIG) and stopped
    log = root / "logs" / folder.relative_to(root / "results").with_suffix(".log")
    assert "stopped by SIGTERM" in log.read_text(), log.read_text()[-2000:]
    assert not (folder / "metrics.json").exists()  # nothing published behind the dead workflow
    data = yaml.safe_load((root / "params/data.yaml").read_text())
    data["scenarios"]["rotmnist"]["seed"] = 1
    (root / "params/data.yaml").write_text(yaml.safe_dump(data))
    run("dvc repro", root)
    locked = run("FEDSHIFT_TRACKING=none snakemake --cores 1 --configfile long.yaml -n", root, check=False)
    run("snakemake --unlock --configfile long.yaml", root)
    res = run("FEDSHIFT_TRACKING=none snakemake --cores 1 --configfile long.yaml", root, check=False)
    text = log.read_text()
    assert "was trained on other data: partition/rotmnist sha256" in text, text[-3000:]
    assert "resuming" not in text, text[-3000:]
    assert res.returncode == 0, (locked.stdout + locked.stderr)[-2000:] + res.stderr[-3000:]


def test_data_seed_run_redraws_each_seeds_partition(ran):
    """engine.data_seed: run (issue 34 item 3): seeds 0 and 1 train on different private subsets, drawn by
    the partition_seed rule with the run seed, and on different public subsets (public_seed rule, issue 47);
    the runs read them and the report says what its intervals cover, from what the seeds redrew."""
    import hashlib
    import json

    import numpy as np

    root, _, _ = ran
    grid = dict(TINY_GRID, engine=dict(TINY_GRID["engine"], rounds=1, data_seed="run"),
                grid=[{"name": "ds", "scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedmd"],
                       "structures": ["homo_lenet"], "seeds": [0, 1]}], report={"name": "ds", "title": "ds"})
    (root / "ds.yaml").write_text(yaml.safe_dump(grid))
    run("FEDSHIFT_TRACKING=none snakemake --cores 2 --configfile ds.yaml", root)
    man = [root / f"build/partitions_seeded/rotmnist/seed{k}/manifest.json" for k in (0, 1)]
    sha = [hashlib.sha256(m.read_bytes()).hexdigest() for m in man]
    assert sha[0] != sha[1]
    assert [json.loads(m.read_text())["params"]["seed"] for m in man] == [0, 1]
    idx = [np.load(m.parent / "m0/private_index.npy") for m in man]
    assert not np.array_equal(np.sort(idx[0]), np.sort(idx[1]))  # another private subset, not another order
    read = pd.read_csv(root / "results/ablations/ds/collect/runs.csv").drop_duplicates("seed").set_index("seed")
    for k in (0, 1):  # the grid's own folders (the module's other grids ran FedMD seed 0 with other settings)
        cfg = yaml.safe_load((root / read.loc[k, "run_dir"] / "config.yaml").read_text())
        assert cfg["paths"]["partition"].endswith(f"partitions_seeded/rotmnist/seed{k}")
        assert cfg["paths"]["public"].endswith(f"public_seeded/photo_patches/seed{k}")  # issue 47: the public subset too
    pub = [np.load(root / f"build/public_seeded/photo_patches/seed{k}/train_index.npy") for k in (0, 1)]
    assert not np.array_equal(pub[0], pub[1])
    report = (root / "results/ablations/ds/report/report.md").read_text()
    assert ("each seed drew its own private subsets, labeled public seed sets, validation sets, test sets and public "
            "subset (`data_seed: run`): the intervals cover that draw and training noise.") in report
    assert set(pd.read_csv(root / "results/ablations/ds/collect/runs.csv")["data_seed"]) == {"run"}
    assert "Nothing to be done" in run("snakemake -n --cores 1 --configfile ds.yaml", root).stdout


def test_data_rebuilt_under_finished_runs_reruns_them_and_evaluate_refuses(ran, capsys, monkeypatch):
    """Issue 38 cases 1 and 2 through the real tools: the partition is rebuilt by `dvc repro` and the
    runs' files are newer than the new manifest (as for a job that finished after the rebuild):
    Snakemake still reruns them (the data's hash is a rule param), collect leaves them out, and
    `fedshift evaluate` refuses to score a run on a partition it was not trained on."""
    import time

    root, _, _ = ran
    data = yaml.safe_load((root / "params/data.yaml").read_text())
    data["scenarios"]["rotmnist"]["seed"] = 2
    (root / "params/data.yaml").write_text(yaml.safe_dump(data))
    run("dvc repro", root)
    later = time.time() + 60  # every result newer than the rebuilt data, in the order the rules made them
    for i, sub in enumerate(("configs", "pretrain", "federate", "collect", "report")):
        for p in (root / "results" / sub).rglob("*"):
            os.utime(p, (later + 10 * i, later + 10 * i))
    dry = run("FEDSHIFT_TRACKING=none snakemake -n --cores 1", root).stdout
    import re

    assert re.search(r"\bfederate\s+4\n", dry) and re.search(r"\bpretrain\s+4\n", dry), dry[-3000:]
    assert re.search(r"params have changed since last execution:\s+federate, pretrain", dry), dry[-3000:]
    # the main grid's FedMD run (the data-seed test ran another FedMD seed 0 beside it)
    folder = planned_dir(root, "rotmnist/photo_patches/fedmd/homo_lenet/seed0")
    from fedshift.cli import main

    monkeypatch.chdir(root)  # the command in-process (a second interpreter costs seconds); paths are the project's
    assert main(["evaluate", folder]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{folder} was trained on partition/rotmnist sha256" in err[0] and "--force" in err[0]
    from fedshift.provenance import stale

    why = stale(root / folder, base=root)  # what collect lists when it leaves the run out
    assert why.startswith(f"{root / folder}: input partition/rotmnist (build/partitions/rotmnist/manifest.json)"), why


def test_dvc_builds_only_what_the_grid_reads(project):
    """Issue 35: the workflow's dvc_repro job names the partitions and public sets of the grid's jobs as
    `dvc repro` targets (their datasets follow through dvc.yaml), not every stage of params/data.yaml."""
    res = run("FEDSHIFT_TRACKING=none snakemake -n -p -f --cores 1 dvc_repro", project)
    (line,) = [l.strip() for l in res.stdout.splitlines() if "fedshift dvc-repro" in l]
    scenarios = {s for b in TINY_GRID["grid"] for s in b["scenarios"]}
    publics = {p for b in TINY_GRID["grid"] for p in b["public"]}
    targets = line.split(" -- ", 1)[1].split()
    assert "error" not in res.stdout + res.stderr  # the printed command holds no error text (issue 50)
    assert sorted(targets) == sorted([f"partition@{s}" for s in scenarios] + [f"public@{p}" for p in publics]), line
