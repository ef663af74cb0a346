"""Issue 23: runs that never lie. Each test here failed on main before the fix it covers."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from fedshift.data import store
from fedshift import runner
from fedshift.engine import checkpoint

from test_resume import _checkpoint_round, _config, _stop_in_round


def _reseed_partition(root, tmp_path):
    """A copy of build/ whose rotmnist partition has other content (as after a seed change +
    `dvc repro`): one participant's training labels permuted, manifest re-hashed."""
    new = tmp_path / "build2"
    shutil.copytree(root, new)
    part = new / "partitions/rotmnist"
    manifest = store.read_manifest(part)
    name = manifest["participants_order"][0]
    y = np.load(part / name / "private_labels.npy")
    np.save(part / name / "private_labels.npy", np.roll(y, 1), allow_pickle=False)
    manifest.pop("files")
    store.write_manifest(part, manifest)
    return new


def test_resume_after_a_data_change_starts_afresh_and_says_why(tiny_data, tmp_path, monkeypatch, caplog):
    """Case 1: same config path, other partition content -> the checkpoint is not used."""
    build = tmp_path / "build"
    shutil.copytree(tiny_data, build)
    cfg = _config(build, tmp_path, rounds=3)
    out = tmp_path / "out"
    partial = checkpoint.partial_dir(out)
    from fedshift.methods.fccl_plus import FCCLPlus

    calls, _ = _stop_in_round(monkeypatch, FCCLPlus)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    assert _checkpoint_round(partial) == 2
    changed = _reseed_partition(build, tmp_path)
    shutil.rmtree(build / "partitions/rotmnist")
    shutil.copytree(changed / "partitions/rotmnist", build / "partitions/rotmnist")
    calls.clear()
    with caplog.at_level(logging.WARNING, logger="fedshift.engine.checkpoint"):
        with pytest.raises(KeyboardInterrupt):
            runner.run_federate(cfg, out)
    assert calls == [1, 2, 3]  # afresh, not "resuming after round 2" on the old partition
    msgs = [r.getMessage() for r in caplog.records if "other data" in r.getMessage()]
    assert len(msgs) == 1 and "partition/rotmnist sha256" in msgs[0], caplog.text


# ----------------------------------------------------------------- case 5: no name reaches a shell
HOSTILE = ["z$(touch PWNED_dollar)", "z`touch PWNED_tick`", "z;touch PWNED_semi", "z&&touch PWNED_and",
           "z'touch PWNED_quote'", 'z"x', "z\ntouch PWNED_newline"]


def _dvc_project(tmp_path, data):
    import os
    import subprocess
    import sys

    import yaml

    from conftest import REPO

    root = tmp_path / "project"
    root.mkdir(parents=True)
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, root / name)
    (root / "params").mkdir()
    (root / "params/data.yaml").write_text(yaml.safe_dump(data))
    (root / "src").mkdir()
    os.symlink(REPO / "src/fedshift", root / "src/fedshift")
    (root / "data").mkdir()
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")

    def run(cmd):
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, shell=True, timeout=300)

    assert run("git init -q . && dvc init -q && dvc config core.analytics false").returncode == 0
    return root, run


@pytest.mark.slow
def test_no_params_name_runs_a_shell_command_under_dvc_repro(tmp_path):
    """Case 5: `$(...)`, backticks, `;`, `&&`, quotes and newlines as a dataset (list item),
    public set key, scenario key, and as values, through the real `dvc repro -k`: nothing runs;
    each hostile stage fails with fedshift's one-line error naming the value."""
    good = {"photo_patches": {"n": 64, "size": 32, "seed": 0}}
    runs = [
        {"mirror": None, "datasets": ["photo_patches", *HOSTILE], "dataset_params": good, "public": {}, "scenarios": {}},
        {"mirror": None, "datasets": ["photo_patches"], "dataset_params": good,
         "public": {h: {"n": 8, "seed": 0} for h in HOSTILE} | {"photo_patches": {"n": 8, "seed": "$(touch PWNED_value)"}},
         "scenarios": {h: {"source": "$(touch PWNED_value2)", "seed": 0} for h in HOSTILE}},
    ]
    for i, data in enumerate(runs):
        root, run = _dvc_project(tmp_path / str(i), data)
        res = run("dvc repro -k")
        out = res.stdout + res.stderr
        assert res.returncode != 0, out
        assert not list((tmp_path / str(i)).rglob("PWNED*")), out  # no shell ran any of it
        assert "is not a plain name" in out, out[-3000:]
        assert (root / "build/datasets/photo_patches/manifest.json").exists(), out[-3000:]  # the sane stage ran


# ------------------------------------------------- cases 2-3: evaluate and loaded data are checked
def _copy_partition(tiny_data, tmp_path):
    part = tmp_path / "partitions/rotmnist"
    shutil.copytree(tiny_data / "partitions/rotmnist", part)
    name = store.read_manifest(part)["participants_order"][0]
    return part, part / name


def _rehash(part):
    m = store.read_manifest(part)
    m.pop("files")
    store.write_manifest(part, m)


def test_evaluate_checks_sha256_and_label_range(tiny_data, tmp_path):
    """Case 2: 10 test labels set to 12 in place -> `fedshift evaluate` refuses (it scored them)."""
    from fedshift.experiments import load_experiments

    build = tmp_path / "build"
    shutil.copytree(tiny_data, build)
    exp = {"engine": {"rounds": 1, "local_epochs": 1, "local_batch": 32, "device": "cpu", "threads": 1},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedavg"],
                     "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}},
                              results=str(tmp_path / "results"), build=str(build)).federate.values()
    out = tmp_path / "run"
    runner.run_federate(cfg, out)
    part = build / "partitions/rotmnist"
    name = store.read_manifest(part)["participants_order"][0]
    y = np.load(part / name / "test_labels.npy")
    y[:10] = 12
    np.save(part / name / "test_labels.npy", y, allow_pickle=False)
    from fedshift.errors import ConfigError
    with pytest.raises(ConfigError, match="sha256 differs"):
        runner.evaluate_run(out)
    _rehash(part)  # even with a manifest that agrees, labels 12 of 10 classes are refused
    with pytest.raises(ConfigError, match=r"was trained on partition/rotmnist sha256"):  # issue 38: other data
        runner.evaluate_run(out)
    with pytest.raises(ConfigError, match=r"labels span \d+\.\.12, outside 0\.\.9"):
        runner.evaluate_run(out, force=True)


@pytest.mark.parametrize("damage, message", [
    ("nan_float", r"images are float32 .* expected uint8"),
    ("unit_float", r"images are float64 .* expected uint8"),
    ("small", r"images are \[\d+, 1, 20, 20\], the manifest says \[\d+, 1, 28, 28\]"),
    ("num_classes", r"num_classes is 12 but the labels of its splits span 0\.\.9"),
    ("json", r"manifest.json is not valid JSON"),
])
def test_loaded_data_is_checked_against_its_manifest(tiny_data, tmp_path, damage, message):
    """Case 3: every damage below used to load and train to the end with wrong accuracies."""
    from fedshift.data.loading import load_federated
    from fedshift.errors import ConfigError

    part, client = _copy_partition(tiny_data, tmp_path)
    x = np.load(client / "test_images.npy")
    if damage == "nan_float":
        x = x.astype(np.float32)
        x[0, 0, 0, 0] = np.nan
    elif damage == "unit_float":
        x = x / 255.0
    elif damage == "small":
        x = np.ascontiguousarray(x[:, :, :20, :20])
    if damage in ("nan_float", "unit_float", "small"):
        np.save(client / "test_images.npy", x, allow_pickle=False)
    _rehash(part)
    if damage == "num_classes":
        m = store.read_manifest(part)
        m["num_classes"] = 12
        store.write_json(part / store.MANIFEST, m)
    if damage == "json":
        (part / store.MANIFEST).write_text('{"name": "rotmnist",')
    with pytest.raises(ConfigError, match=message):
        load_federated(part, None, "cpu")


# -------------------------------------------------------------- case 6: full disk, file-size limit
_FSIZE = r"""
import resource, sys, torch
from pathlib import Path
from fedshift import runner
from fedshift.engine import checkpoint
from fedshift.errors import RunError
from fedshift.tracking import NullTracker
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # ulimit -f 1024
big = {"w": torch.zeros(1 << 20)}  # 4 MiB
try:
    if sys.argv[1] == "checkpoint":
        checkpoint.save(Path(sys.argv[2]), {"models": [big]})
    else:
        runner._write_outputs(Path(sys.argv[2]), {"a": 1}, {"m": 1}, [], NullTracker(), models=big)
except RunError as exc:
    print(f"RunError: {exc}")
"""


@pytest.mark.parametrize("what", ["checkpoint", "publish"])
def test_file_size_limit_is_one_line_naming_folder_and_bytes(tmp_path, what):
    """Case 6: `ulimit -f` at checkpoint/publish time gave torch's `unexpected pos` traceback and
    left the temp file behind; now one line naming the folder and the bytes, nothing left."""
    import subprocess
    import sys

    target = tmp_path / ("run.partial" if what == "checkpoint" else "run")
    res = subprocess.run([sys.executable, "-c", _FSIZE, what, str(target)], capture_output=True, text=True,
                         timeout=120)
    lines = [l for l in res.stdout.splitlines() if l.startswith("RunError:")]
    assert len(lines) == 1, res.stdout + res.stderr[-2000:]
    folder = target if what == "checkpoint" else tmp_path
    import re

    m = re.search(rf"cannot write the \w+ in {re.escape(str(folder))}: needs about ([\d,]+) bytes, [\d,]+ bytes free, "
                  r"file-size limit 1,048,576 bytes \(", lines[0])
    assert m and int(m.group(1).replace(",", "")) >= 4 << 20, lines[0]
    left = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert left == [], left  # no temporary file/folder stays behind


def test_stale_temporary_folders_are_removed_by_the_next_publish(tmp_path):
    """Case 6: a kill during the final write left a complete hidden `.run.tmp-*` for ever."""
    from fedshift.tracking import NullTracker

    stale = tmp_path / ".run.tmp-abc123"
    stale.mkdir()
    (stale / "models.pt").write_bytes(b"x" * 100)
    (tmp_path / "run.partial").mkdir()
    (tmp_path / "run.partial" / ".checkpoint.pt.tmp-999").write_bytes(b"x")
    runner._write_outputs(tmp_path / "run", {"a": 1}, {"m": 1}, [], NullTracker())
    checkpoint.save(tmp_path / "run.partial", {"round": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run.partial"]
    assert sorted(p.name for p in (tmp_path / "run.partial").iterdir()) == ["checkpoint.pt"]


def test_results_folder_on_a_full_disk_fails_the_writability_check(tmp_path):
    """Case 6: a full disk still creates empty files, so the old check passed; it reserves space now."""
    import subprocess

    from fedshift.errors import ConfigError

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        with open(mnt / "filler", "wb") as f:
            try:
                f.write(b"\0" * (2 << 20))
            except OSError:
                pass
        with pytest.raises(ConfigError, match=rf"results folder {mnt}/results is not writable \(No space left"):
            runner.check_writable(mnt / "results" / "run")
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# ------------------------------------------------------ case 4: skip_batch does not hide divergence
def _fedavg_cfg(build, tmp_path, **engine):
    from fedshift.experiments import load_experiments

    exp = {"engine": {"rounds": 2, "local_epochs": 1, "local_batch": 32, "device": "cpu", "threads": 1,
                      "checkpoint_every": 0, **engine},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedavg"],
                     "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}},
                              results=str(tmp_path / "results"), build=str(build)).federate.values()
    return cfg


def test_skip_batch_divergence_fails_loudly_and_counts_are_printed(tiny_data, tmp_path, capsys):
    """Case 4: lr 1e6 with skip_batch skipped most batches and exited 0 at chance accuracy, the
    count only in metrics.json. Now past max_skipped_fraction the job fails naming the count;
    under it, the count is printed per round and in the job's last line."""
    from fedshift.errors import NonFiniteError

    cfg = _fedavg_cfg(tiny_data, tmp_path, lr=1e6, on_nonfinite="skip_batch")
    with pytest.raises(NonFiniteError, match=r"(\d+) of (\d+) batches of the (round|run) .* more than "
                                             r"engine.max_skipped_fraction 0.1: the run diverged"):
        runner.run_federate(cfg, tmp_path / "diverged")
    assert not (tmp_path / "diverged").exists()
    cfg = _fedavg_cfg(tiny_data, tmp_path, lr=1e6, on_nonfinite="skip_batch", max_skipped_fraction=1.0)
    capsys.readouterr()
    metrics = runner.run_federate(cfg, tmp_path / "tolerated")
    out = capsys.readouterr().out
    assert metrics["skipped_batches"] > 0
    assert f"done with {metrics['skipped_batches']} of {metrics['checked_batches']} batches skipped" in out
    assert "round 1: skipped" in out or "round 2: skipped" in out


# ------------------------------------------- case 9: values that passed `validate` and failed late
_DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}}


def _grid(engine=None, methods=("fedavg",), method_params=None, report=None):
    exp = {"engine": {"rounds": 4, **(engine or {})},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": list(methods),
                     "structures": ["homo_lenet"]}]}
    if method_params:
        exp["methods"] = method_params
    if report:
        exp["report"] = report
    return exp


@pytest.mark.parametrize("exp, message", [
    (_grid({"lr": float("nan")}), r"engine \(fedavg on rotmnist\)\.lr: nan is not a finite number"),
    (_grid({"weight_decay": float("inf")}), r"\.weight_decay: inf is not a finite number"),
    (_grid(methods=["fedmmd"], method_params={"fedmmd": {"lam": float("nan")}}), r"methods\.fedmmd\.lam: nan is not a finite"),
    (_grid(methods=["fedprox"], method_params={"fedprox": {"mu": float("inf")}}), r"methods\.fedprox\.mu: inf is not a finite"),
    (_grid(methods=["moon"], method_params={"moon": {"tau": float("nan")}}), r"methods\.moon\.tau: nan is not a finite"),
    (_grid({"lr": 0}), r"lr must be > 0"),
    (_grid({"last_k": 50}), r"engine \(fedavg on rotmnist\)\.last_k: 50 exceeds rounds \(4\)"),
    (_grid({"clients_per_round": 9}), r"clients_per_round: 9 exceeds the scenario's 4 participants"),
    (_grid({"clients_per_round": 2}, methods=["fccl_plus"]), r"method 'fccl_plus' trains every participant"),
    (_grid({"server_model": True}, methods=["fccl_plus"]), r"engine.server_model: method 'fccl_plus' keeps a model"),
    (_grid({"global_eval_every": 1}, methods=["fccl_plus"]), r"engine.global_eval_every: method 'fccl_plus' has no global"),
    (_grid({"device": "mps"}), r"device: 'mps' asks for Apple's Metal backend"),
    (_grid(report={"tables": [{"name": "t", "methods": ["fedavg", "fedprox"]}]}),
     r"report.tables\[0\]\.methods: \['fedprox'\] not run by the grid"),
])
def test_bad_values_fail_in_validate(exp, message):
    """Case 9: each of these passed `fedshift validate` on main and failed late or silently."""
    from fedshift.errors import ConfigError
    from fedshift.experiments import load_experiments

    with pytest.raises(ConfigError, match=message):
        load_experiments(exp, _DATA)


def test_gpu_slot_must_be_an_integer(monkeypatch):
    from fedshift.errors import ConfigError
    from fedshift.experiments import load_experiments

    monkeypatch.setenv("FEDSHIFT_GPU_SLOT", "abc")
    with pytest.raises(ConfigError, match=r"FEDSHIFT_GPU_SLOT must be a non-negative integer, got 'abc'"):
        load_experiments(_grid(), _DATA)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    from fedshift.errors import ConfigError
    from fedshift.experiments import load_yaml

    path = tmp_path / "experiments.yaml"
    path.write_text("engine:\n  rounds: 3\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"{path}:4:1: invalid YAML: "):
        load_yaml(path)


# ------------------------------------------------- case 8: the job does not outlive a killed parent
_PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "fedshift.cli", "federate", "--die-with-parent", "--no-tracking",
                          sys.argv[1], sys.argv[2]], stdout=open(sys.argv[3], "w"), stderr=subprocess.STDOUT)
open(sys.argv[4], "w").write(str(child.pid))
time.sleep(600)
"""


def test_job_stops_when_its_parent_is_killed_and_the_rerun_resumes(tiny_data, tmp_path):
    """Case 8: after `kill -9` of Snakemake the running job finished and published behind it
    (and was then redone from scratch); with --die-with-parent (the rules exec the job, so its
    parent is Snakemake) it stops at once keeping its checkpoint, and the rerun resumes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    cfg = _fedavg_cfg(tiny_data, tmp_path, rounds=40, checkpoint_every=1, checkpoint_min_s=0)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out, partial = tmp_path / "run", checkpoint.partial_dir(tmp_path / "run")
    log, pidfile = tmp_path / "job.log", tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / "cfg.yaml"), str(out), str(log),
                               str(pidfile)])
    deadline = time.time() + 240
    while _checkpoint_round(partial) < 1 and time.time() < deadline:
        time.sleep(0.1)
    assert _checkpoint_round(partial) >= 1, log.read_text()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    child = int(pidfile.read_text())
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the job outlived its killed parent")
    assert not out.exists(), "published after its parent died"
    killed_at = _checkpoint_round(partial)
    assert 1 <= killed_at < 40, log.read_text()
    assert "stopped by SIGTERM" in log.read_text()
    res = subprocess.run([sys.executable, "-m", "fedshift.cli", "federate", "--no-tracking", str(tmp_path / "cfg.yaml"),
                          str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"resuming {cfg['run_name']} after round {killed_at}" in res.stdout + res.stderr  # INFO lines go to stdout (the job log), warnings to stderr
