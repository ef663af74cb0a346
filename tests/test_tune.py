"""Issue 36, tune then run: the validation holdout, the tune block, selection on validation only."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedshift.errors import ConfigError

PERMUTED = {"clients": 2, "test": 0.9, "seed": 0}  # 2 clients x 250 private images of MNIST 5k (10 % kept)


@pytest.fixture(scope="module")
def permuted(tiny_data, tmp_path_factory):
    """A scenario without a val split (mnist5k_permuted, 2 clients), partitioned with the default holdout."""
    from fedshift.data import build

    out = tmp_path_factory.mktemp("holdout") / "mnist5k_permuted"
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, out, PERMUTED)
    return out


def test_holdout_is_recorded_stratified_and_never_a_test_image(permuted):
    from fedshift.data.loading import load_federated

    man = json.loads((permuted / "manifest.json").read_text())
    for name, info in man["participants"].items():
        held = info["holdout"]
        n_priv = info["splits"]["private"]["n"]
        assert held["fraction"] == 0.2 and held["n"] == round(0.2 * n_priv) and held["of"] == "private"
        assert f"{name}/{held['file']}" in man["files"]  # hashed: verified with the partition before a run
        pos = np.load(permuted / name / held["file"])
        priv_src = np.load(permuted / name / "private_index.npy")
        test_src = np.load(permuted / name / "test_index.npy")
        val_src = priv_src[pos]
        train_src = np.delete(priv_src, pos)
        assert len(np.unique(pos)) == len(pos) == held["n"]
        assert not set(val_src) & set(test_src)  # tuning never sees a test image
        assert not set(val_src) & set(train_src)  # nor trains on its validation images
        labels = np.load(permuted / name / "private_labels.npy")
        counts = np.bincount(labels, minlength=10)
        assert np.all(np.abs(np.bincount(labels[pos], minlength=10) - 0.2 * counts) < 1 + 1e-9)  # stratified
    plain = load_federated(permuted)
    held = load_federated(permuted, holdout=True)
    for a, b, name in zip(plain.clients, held.clients, plain.names):
        assert "val" not in a.splits  # a run that asks for no validation trains on all of private
        n_val = man["participants"][name]["holdout"]["n"]
        assert len(b.get("val")[1]) == n_val and b.num_private == a.num_private - n_val
        pos = np.load(permuted / name / "private_holdout.npy")
        assert np.array_equal(b.get("val")[0].numpy(), a.get("private")[0].numpy()[pos])


def test_holdout_is_deterministic_and_leaves_val_scenarios_alone(permuted, tiny_data, tmp_path):
    from fedshift.data import build

    again = tmp_path / "again"
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, again, PERMUTED)
    for name in ("client000", "client001"):
        assert np.array_equal(np.load(permuted / name / "private_holdout.npy"),
                              np.load(again / name / "private_holdout.npy"))
    man = json.loads((tiny_data / "partitions/rotmnist/manifest.json").read_text())
    assert all("holdout" not in p for p in man["participants"].values())  # rotmnist has its own val split
    none = tmp_path / "none"
    build.partition("mnist5k_permuted", {"mnist5k": tiny_data / "datasets/mnist5k"}, none, PERMUTED, holdout=0)
    from fedshift.data.loading import load_federated

    with pytest.raises(ConfigError, match="no validation split and no recorded holdout"):
        load_federated(none, holdout=True)
