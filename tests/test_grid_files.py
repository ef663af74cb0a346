"""Issue 22 point 4: a paper grid names its own data file, and that file reaches the planned
`dvc_repro` job, which stops with one line instead of building from another file."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedshift.cli import main

ROOT = Path(__file__).resolve().parents[1]
FCCL_PLUS_REAL = ["fccl_plus_table8", "fccl_plus_table15", "fccl_plus_table19"]


@pytest.mark.parametrize("grid", FCCL_PLUS_REAL)
def test_real_data_grid_names_its_data_file_and_validates_alone(grid, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = yaml.safe_load((ROOT / f"params/papers/{grid}.yaml").read_text())
    assert (ROOT / cfg["data_params"]).is_file()
    assert main(["validate", "--experiments", f"params/papers/{grid}.yaml"]) == 0  # no --data-params
    assert capsys.readouterr().out.startswith("ok: ")


def test_dvc_repro_job_carries_the_grids_data_file(tmp_path):
    snakemake = Path(sys.executable).with_name("snakemake")
    res = subprocess.run([str(snakemake), "-n", "-p", "--configfile", "params/papers/fccl_plus_table8.yaml",
                          "--until", "dvc_repro"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    text = res.stdout + res.stderr
    shell = text.split("rule dvc_repro:", 1)[1].split("Shell command:", 1)[1]
    shell = shell.split("\nReasons:", 1)[0].split("\nJob stats", 1)[0]
    assert "fedshift dvc-repro --data params/papers/fccl_plus_data.yaml" in shell
    assert "error" not in text  # Snakemake prints the command: no error text in it on a good run (issue 50)
    # run the planned command where params/data.yaml is the demo's: one line naming both files, no dvc run
    (tmp_path / "params/papers").mkdir(parents=True)
    shutil.copy(ROOT / "params/data.yaml", tmp_path / "params/data.yaml")
    shutil.copy(ROOT / "params/papers/fccl_plus_data.yaml", tmp_path / "params/papers/fccl_plus_data.yaml")
    fake = tmp_path / "bin"  # a dvc that fails loudly: the check must stop before it
    fake.mkdir()
    (fake / "dvc").write_text("#!/bin/sh\necho dvc ran >&2\nexit 9\n")
    (fake / "dvc").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{Path(sys.executable).parent}:/usr/bin:/bin")
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=env)
    assert run.returncode == 2
    err = run.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedshift: error: this grid needs the data of "
                                               "params/papers/fccl_plus_data.yaml")
    assert "cp params/papers/fccl_plus_data.yaml params/data.yaml" in err[0]


def _grid_files():
    return sorted(p for p in (ROOT / "params/papers").glob("*.yaml") if "grid" in (yaml.safe_load(p.read_text()) or {}))


def _install_example_plugin(monkeypatch):
    """examples/fedprox_adaptive registered as its entry point would register it (undone after the test);
    test_plugins.py installs it with pip and runs it through Snakemake."""
    from fedshift.methods import METHODS

    monkeypatch.syspath_prepend(str(ROOT / "examples/fedprox_adaptive"))
    import fedprox_adaptive

    METHODS.load_plugins()  # the installed plugins first, so the one added here is not read over
    monkeypatch.setitem(METHODS._items, "fedprox_adaptive", fedprox_adaptive.FedProxAdaptive)
    monkeypatch.setitem(METHODS._origin, "fedprox_adaptive", "plugin fedshift-fedprox-adaptive (test)")


@pytest.mark.parametrize("path", _grid_files(), ids=lambda p: p.stem)
def test_every_paper_grid_plans_alone_or_refuses_naming_the_file_it_adds_to(path, capsys, monkeypatch):
    """Complete on its own (its engine block with the schedule) or an overlay that refuses alone."""
    monkeypatch.chdir(ROOT)
    cfg = yaml.safe_load(path.read_text())
    rel = str(path.relative_to(ROOT))
    if "fedprox_adaptive" in path.read_text():  # the example plugin's overlay: as if pip had installed it
        _install_example_plugin(monkeypatch)
    code = main(["validate", "--experiments", rel])
    out = capsys.readouterr()
    if "overlay_of" in cfg:
        assert code != 0
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and f"--configfile {cfg['overlay_of']} {rel}" in lines[0], out.err
        assert main(["validate", "--experiments", cfg["overlay_of"], rel]) == 0  # in order: it plans
        assert main(["validate", "--experiments", rel, cfg["overlay_of"]]) != 0  # wrong order: refused
    else:
        assert code == 0, out.err
        assert "rounds" in (cfg.get("engine") or {}), f"{rel} sets no engine.rounds: it would run the demo's"


def test_table5_6_shares_table2s_fedh2l_run(monkeypatch):
    """fedh2l_table5_6.yaml alone plans Table II's schedule: its `fedh2l` row is the same job
    config as Table II's alpha = 10 % row (one run under results/federate/ serves both reports)."""
    from fedshift.experiments import load_experiments, snakemake_config

    monkeypatch.chdir(ROOT)
    key = "rotmnist_a10/none/fedh2l/homo_lenet/seed0"
    t2 = load_experiments(snakemake_config(ROOT / "params/papers/fedh2l_table2.yaml"), ROOT / "params/data.yaml")
    t56 = load_experiments(snakemake_config(ROOT / "params/papers/fedh2l_table5_6.yaml"), ROOT / "params/data.yaml")
    (j2,), (j56,) = ([j for j in plan.federate if j.path == key] for plan in (t2, t56))
    assert t56.folder(j56) == t2.folder(j2)  # one run folder (its identity: the same settings)
    assert t56.federate[j56] == t2.federate[j2]
    assert t56.federate[j56]["engine"]["rounds"] == 10000


def test_snakemake_refuses_an_overlay_alone_in_one_line():
    snakemake = Path(sys.executable).with_name("snakemake")
    res = subprocess.run([str(snakemake), "-n", "--configfile", "params/papers/fedh2l_table2_quick.yaml"],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode != 0
    assert ("fedshift: error: params/papers/fedh2l_table2_quick.yaml only adds to params/papers/fedh2l_table2.yaml"
            in res.stdout + res.stderr)


def test_table2_jobs_ask_slurm_for_hours_not_days():
    """A FedH2L round is one minibatch step per node: its 10,000 rounds are ~20 min on one thread
    (the runtime once counted them as epochs: 10,667 min per job); memory from fedshift.resources."""
    import re

    snakemake = Path(sys.executable).with_name("snakemake")
    # records=none: the full plan even once Table II's runs are committed (a current record plans no job)
    res = subprocess.run([str(snakemake), "-n", "--configfile", "params/papers/fedh2l_table2.yaml",
                          "--config", "records=none"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    jobs = re.findall(r"wildcards: scenario=(\S+), public=\S+, method=(\w+),.*?\n\s+resources: ([^\n]+)",
                      res.stdout + res.stderr)
    assert {"fedh2l", "agg", "ind", "fedmd", "fedavg", "fedprox", "fedh2l_async"} <= {m for _, m, _ in jobs}, jobs
    assert len(jobs) == 57, len(jobs)  # every run of the grid, archived or not
    for scenario, method, resources in jobs:
        runtime = int(re.search(r"runtime=(\d+)", resources).group(1))
        mem = int(re.search(r"mem_mb=(\d+)", resources).group(1))
        if method in ("fedh2l", "agg", "ind", "fedh2l_async"):
            assert 15 <= runtime <= 120, (method, resources)
        assert 1500 <= mem <= 4096, (method, resources)  # four LeNets: ~1 GB + Snakemake's process, x 1.3


PLAN_ALL = r"""
import sys, yaml
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

sys.path.insert(0, "examples/fedprox_adaptive")  # the example plugin's overlay: as if pip had installed it
import fedprox_adaptive
from fedshift.methods import METHODS

METHODS.load_plugins()
METHODS._items["fedprox_adaptive"] = fedprox_adaptive.FedProxAdaptive
METHODS._origin["fedprox_adaptive"] = "plugin fedshift-fedprox-adaptive (test)"
for f in sys.argv[1:]:
    doc = yaml.safe_load(Path(f).read_text()) or {}
    files = [Path(doc["overlay_of"]), Path(f)] if "overlay_of" in doc else [Path(f)]
    try:
        with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
            wf = api.workflow(resource_settings=ResourceSettings(cores=1), snakefile=Path("workflow/Snakefile"),
                              config_settings=ConfigSettings(configfiles=files))
            wf.dag().execute_workflow(executor="dryrun")
        print("PLANNED", f, flush=True)
    except Exception as exc:
        print("FAILED", f, type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:300], flush=True)
"""


def test_snakemake_plans_every_shipped_grid():
    """Issue 47: `snakemake -n` plans every shipped grid (params/papers/*.yaml with a grid, an overlay after
    the grid it adds to, and params/ablations/*.yaml), tuned_digits.yaml included: its seeded tuning
    partitions were once build/partitions_seeded/partitions_seeded/..., a path no rule makes. One process
    plans them all through Snakemake's API (the same DAG and rules as `snakemake -n`; ~1 s a grid)."""
    grids = [p for p in sorted((ROOT / "params/papers").glob("*.yaml")) + sorted((ROOT / "params/ablations").glob("*.yaml"))
             if {"grid", "overlay_of"} & set(yaml.safe_load(p.read_text()) or {})]
    assert ROOT / "params/papers/tuned_digits.yaml" in grids and len(grids) > 30
    res = subprocess.run([sys.executable, "-c", PLAN_ALL, *[str(p.relative_to(ROOT)) for p in grids]], cwd=ROOT,
                         capture_output=True, text=True, timeout=900,
                         env={**__import__("os").environ, "FEDSHIFT_TRACKING": "none", "MLFLOW_DISABLE_TELEMETRY": "true"})
    lines = [line for line in res.stdout.splitlines() if line.startswith(("PLANNED", "FAILED"))]
    failed = [line for line in lines if line.startswith("FAILED")]
    assert not failed and len(lines) == len(grids), "\n".join(failed) or res.stderr[-3000:]
