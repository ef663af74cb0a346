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
