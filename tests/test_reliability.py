"""Issue 23: runs that never lie. Each test here failed on main before the fix it covers."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from fedshift.data import store
from fedshift.engine import checkpoint, runner

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
