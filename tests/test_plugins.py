"""Plugins from outside packages (entry points): the registry's handling of good, broken and clashing plugins, and the example package installed
by pip and run through Snakemake (kill -9, resume, report, MLflow). The example method's own
tests (its loss, its rule, its state round trip) live beside it:
examples/fedprox_adaptive/test_fedprox_adaptive.py, collected by `pytest` (pyproject testpaths)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO
from helpers import dry_run_dirs, pipeline_copy, tiny_grid

from fedshift.errors import ConfigError
from fedshift.registry import Registry

EXAMPLE = REPO / "examples/fedprox_adaptive"
BIN = Path(sys.executable).parent


# ------------------------------------------------------------------- the registry
def _dist(site: Path, pkg: str, group: str, entries: dict, modules: dict) -> None:
    """An installed distribution as pip leaves it: a dist-info with METADATA and entry_points.txt."""
    info = site / f"{pkg.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    for name, src in modules.items():
        (site / f"{name}.py").write_text(src)


def test_registry_loads_good_plugins_and_leaves_bad_ones_out(tmp_path, monkeypatch, caplog):
    group = "fedshift_test.things"
    _dist(tmp_path, "good-things", group, {"triple": "good_mod:triple"}, {"good_mod": "def triple(x):\n    return 3 * x\n"})
    _dist(tmp_path, "broken-things", group, {"broken": "broken_mod:f"}, {"broken_mod": "import no_such_module_xyz\n"})
    _dist(tmp_path, "clashing-things", group, {"double": "clash_mod:double"}, {"clash_mod": "def double(x):\n    return x\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("thing", group=group)
    reg.add("double", lambda x: 2 * x)  # a built-in
    assert reg.names() == ["double", "triple"]
    assert reg.get("triple")(2) == 6 and reg.get("double")(2) == 4  # the built-in keeps its name
    assert reg.origin("triple") == "plugin good-things 1.0 (good_mod:triple)"
    assert reg.origin("double").startswith("built-in ")
    with pytest.raises(ConfigError) as exc:
        reg.get("broken", key="grid[0].things")
    msg = str(exc.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("grid[0].things: thing plugin 'broken'")
    assert "broken-things 1.0" in msg and "ModuleNotFoundError: No module named 'no_such_module_xyz'" in msg
    clash = reg.broken["double"]
    assert "clashing-things 1.0" in clash and "clashes with the thing of that name already registered" in clash
    warned = [r.getMessage() for r in caplog.records if r.name == "fedshift.plugins"]
    assert len(warned) == 2 and all(len(w.splitlines()) == 1 for w in warned)


def test_registry_checks_what_a_plugin_gives(tmp_path, monkeypatch):
    group = "fedshift_test.methods"
    _dist(tmp_path, "odd-methods", group, {"not_a_method": "odd_mod:value", "misnamed": "odd_mod:Named"},
          {"odd_mod": "value = 3\nclass Named:\n    name = 'other'\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("method", group=group, check=lambda obj: "" if isinstance(obj, type) else "not a class")
    assert reg.names() == []
    assert reg.broken["not_a_method"].endswith(": not a class")
    assert "its object is named 'other'" in reg.broken["misnamed"]


def _env(**extra):
    if extra.get("PYTHONPATH") and os.environ.get("PYTHONPATH"):  # the plugins first, then the fedshift under test
        extra["PYTHONPATH"] = os.pathsep.join([extra["PYTHONPATH"], os.environ["PYTHONPATH"]])
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", MLFLOW_DISABLE_TELEMETRY="true", **extra)
    env.pop("FEDSHIFT_TRACKING", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def test_cli_marks_plugins_and_a_broken_one_is_one_line(tmp_path):
    site = tmp_path / "site"
    _dist(site, "broken-plugin", "fedshift.methods", {"half_baked": "half_baked:Method"},
          {"half_baked": "raise RuntimeError('half baked\\nsecond line')\n"})
    env = _env(PYTHONPATH=f"{site}{os.pathsep}{EXAMPLE}")
    shutil.copytree(EXAMPLE / "", site, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.toml", "*.md"))
    _dist(site, "fedshift-fedprox-adaptive", "fedshift.methods", {"fedprox_adaptive": "fedprox_adaptive:FedProxAdaptive"}, {})
    res = subprocess.run([sys.executable, "-m", "fedshift.cli", "list", "methods"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "fedavg" in lines and "fedprox_adaptive\t[plugin fedshift-fedprox-adaptive 1.0]" in lines
    err = [l for l in res.stderr.splitlines() if "half_baked" in l]
    assert len(err) == 1 and "broken-plugin 1.0" in err[0] and "RuntimeError: half baked" in err[0]
    assert "Traceback" not in res.stderr
    grid = {"grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedavg", "fedprox_adaptive"],
                      "structures": ["homo_lenet"], "seeds": [0]}]}
    validate = [sys.executable, "-m", "fedshift.cli", "validate", "--experiments", str(tmp_path / "e.yaml"),
                "--data-params", str(REPO / "params/data.yaml")]
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(grid))
    res = subprocess.run(validate, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr  # the plugin beside a built-in (and the broken one unasked: no error)
    grid["grid"][0]["methods"] = ["half_baked"]
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(grid))
    res = subprocess.run(validate, env=env, capture_output=True, text=True)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and last.startswith("fedshift: error: ") and "broken-plugin 1.0" in last
    assert "Traceback" not in res.stderr


# ------------------------------------------------- installed by pip, run by Snakemake
ROUNDS = 3
# the one tiny grid (tests/config/tiny.yaml; its data are the session's tiny_data build) with the plugin
TINY_GRID = tiny_grid(methods=["fedprox_adaptive"], method_params={"fedprox_adaptive": {"mu": 0.5, "patience": 2}},
                      report={"title": "plugin"})
assert TINY_GRID["engine"]["rounds"] == ROUNDS


def _run(cmd, cwd, env, check=True):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, shell=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return res


def _job_pids(cwd: Path, words):
    """Processes running in ``cwd`` whose command line holds every word (the job this test's
    Snakemake started; never another test run's)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or Path(os.readlink(proc / "cwd")) != cwd.resolve():
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if all(w in cmd for w in words) and "/bin/sh" not in cmd:
            pids.append(int(proc.name))
    return pids


def _kill_at_checkpoint(cmd: str, root: Path, env, run_dir: Path, method: str) -> None:
    """Run ``cmd`` (Snakemake) in ``root`` and kill -9 ``method``'s federate job once it has checkpointed a
    round; asserts Snakemake recorded the failure and the job stopped mid-run (checkpoint, no metrics.json)."""
    ckpt = Path(f"{run_dir}.partial") / "checkpoint.pt"
    proc = subprocess.Popen(cmd, cwd=root, env=env, shell=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    victims = _job_pids(root, ["fedshift", "federate", method])
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=120)[0]
    assert victims and proc.returncode != 0, out[-3000:]
    assert ckpt.exists() and not (run_dir / "metrics.json").exists(), "the job was not stopped mid-run"


@pytest.mark.slow
def test_plugin_installed_by_pip_runs_through_snakemake_resumes_and_reports(tmp_path, tiny_data):
    # pip builds and installs the example package (its own pyproject) into a folder on PYTHONPATH
    src = tmp_path / "pkg"
    shutil.copytree(EXAMPLE, src)  # pip's build leaves build/ + egg-info beside the sources: not in the repo
    site = tmp_path / "site"
    _run(f"{sys.executable} -m pip install -q --no-deps --no-build-isolation --no-index --target {site} {src}",
         tmp_path, _env())
    env = _env(PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))  # the sources under test too
    from importlib import metadata

    (dist,) = metadata.distributions(path=[str(site)])  # what pip wrote: the entry point fedshift reads
    assert dist.name == "fedshift-fedprox-adaptive" and [(e.group, e.name, e.value) for e in dist.entry_points] == [
        ("fedshift.methods", "fedprox_adaptive", "fedprox_adaptive:FedProxAdaptive")]

    # the pipeline files; the data are the real stages' outputs of the session's tiny build
    # (the DVC stages themselves are tested in test_workflow.py), so Snakemake's dvc rule has nothing to do
    root = pipeline_copy(tmp_path / "project", grid=TINY_GRID)
    for part in ("partitions/rotmnist", "public/photo_patches"):
        shutil.copytree(tiny_data / part, root / "build" / part)
    _run("git init -q .", root, env)

    # kill -9 the plugin's job once it has checkpointed a round; Snakemake records the failure
    (planned,) = dry_run_dirs(root, env)  # results/federate/<slot>-<identity> (issue 50)
    run_dir = root / planned
    _kill_at_checkpoint("snakemake --cores 1", root, env, run_dir, "fedprox_adaptive")

    _run("snakemake --cores 1", root, env)  # the same command again: the job resumes from its checkpoint
    metrics = yaml.safe_load((run_dir / "metrics.json").read_text())
    resumed = metrics["timings"]["resumed_after_rounds"]
    assert len(resumed) == 1 and 1 <= resumed[0] < ROUNDS
    assert not Path(f"{run_dir}.partial").exists()

    df = pd.read_csv(root / "results/collect/runs.csv")
    assert set(df["method"]) == {"fedprox_adaptive"}
    assert sorted(df["round"].unique()) == list(range(ROUNDS + 1))
    table = pd.read_csv(root / "results/report/table_inter__rotmnist__photo_patches__homo_lenet.csv", index_col=0)
    assert list(table.index) == ["fedprox_adaptive"]
    assert "| fedprox_adaptive |" in (root / "results/report/report.md").read_text()

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("rotmnist").experiment_id], max_results=50)
    assert len(runs) == 1, "the resumed job logs into the run it started"
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["wildcard.method"] == "fedprox_adaptive"
    assert run.data.params["method_params.patience"] == "2"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "avg/inter/top1")) == list(range(ROUNDS + 1))
    mu = client.get_metric_history(run.info.run_id, "fedprox_adaptive/mu")
    assert sorted(m.step for m in mu) == list(range(1, ROUNDS + 1)) and min(mu, key=lambda m: m.step).value == 0.5


def test_the_documented_groups_are_the_registries_groups():
    """docs/extending.md and the example's pyproject name these groups; the registries must read them."""
    from fedshift.data import DATASETS, PUBLIC_SETS, SCENARIOS
    from fedshift.methods import METHODS
    from fedshift.models import MODELS

    groups = {"fedshift.methods": METHODS, "fedshift.models": MODELS, "fedshift.scenarios": SCENARIOS,
              "fedshift.public_sets": PUBLIC_SETS, "fedshift.datasets": DATASETS}
    doc = (REPO / "docs/extending.md").read_text()
    for group, reg in groups.items():
        assert reg.group == group and f"`{group}`" in doc
    assert '[project.entry-points."fedshift.methods"]' in (EXAMPLE / "pyproject.toml").read_text()


def test_list_where_names_the_module_that_registered_each_name(capsys):
    from fedshift.cli import main

    assert main(["list", "methods", "--where"]) == 0
    assert "fedavg\tbuilt-in fedshift.methods.fedavg" in capsys.readouterr().out.splitlines()
    assert main(["list", "scenarios", "--where"]) == 0
    assert "rotmnist\tbuilt-in fedshift.data.scenarios.rotmnist" in capsys.readouterr().out.splitlines()
