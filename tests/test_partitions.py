"""Rotated-MNIST partition: sizes, disjointness, determinism, manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedshift.data import build, store
from fedshift.data.registry import SCENARIOS
from fedshift.errors import ConfigError


def _load(root, part, split):
    x, y = store.load_split(root / "partitions/rotmnist" / part, split)
    idx = np.load(root / "partitions/rotmnist" / part / f"{split}_index.npy")
    return x, y, idx


def test_sizes_and_class_balance(tiny_data):
    man = store.read_manifest(tiny_data / "partitions/rotmnist")
    assert man["participants_order"] == ["m0", "m20", "m40", "m60"]
    for part in man["participants_order"]:
        counts = {s: v["n"] for s, v in man["participants"][part]["splits"].items()}
        # 20 per class x 10 classes: 2 public, 2 val, 5 test, 11 private per class.
        assert counts == {"public": 20, "val": 20, "test": 50, "private": 110}
        for split in ("private", "test"):
            _, y, _ = _load(tiny_data, part, split)
            assert np.bincount(y, minlength=10).tolist() == [len(y) // 10] * 10


def test_roles_disjoint_across_all_participants(tiny_data):
    roles = {}
    for part in ("m0", "m20", "m40", "m60"):
        for split in ("private", "public", "val", "test"):
            _, _, idx = _load(tiny_data, part, split)
            for i in idx.tolist():
                roles.setdefault(i, set()).add(split)
    assert all(len(r) == 1 for r in roles.values())
    man = store.read_manifest(tiny_data / "partitions/rotmnist")
    assert man["audit"]["disjoint_by_index"] and man["audit"]["disjoint_by_hash"]


def test_rotations_are_rotated_copies_of_m0(tiny_data):
    x0, y0, i0 = _load(tiny_data, "m0", "test")
    x60, y60, i60 = _load(tiny_data, "m60", "test")
    assert (i0 == i60).all() and (y0 == y60).all()
    assert not (x0 == x60).all()
    # Clockwise rotation: the top-left corner of the digit content moves right, so the mass
    # centre of a rotated image set differs; rotating back by torch recovers most pixels.
    from fedshift.data.scenarios.common import rotate

    back = rotate(x60, -60).astype(float)
    assert np.abs(back - x0).mean() < np.abs(x60.astype(float) - x0).mean() / 2


def test_deterministic_per_seed_and_different_across_seeds(tiny_data, tmp_path):
    src = {"mnist5k": tiny_data / "datasets/mnist5k"}
    params = {"per_class": 20, "alpha": 0.1, "val": 0.1, "test": 0.25}
    a = build.partition("rotmnist", src, tmp_path / "a", params)
    b = build.partition("rotmnist", src, tmp_path / "b", params)
    c = build.partition("rotmnist", src, tmp_path / "c", {**params, "seed": 1})
    assert a["files"] == b["files"]
    assert a["files"] != c["files"]


def test_manifest_hashes_every_file(tiny_data):
    folder = tiny_data / "partitions/rotmnist"
    store.verify_manifest(folder)
    man = json.loads((folder / "manifest.json").read_text())
    assert "m0/private_images.npy" in man["files"]
    (folder / "m0/test_labels.npy").write_bytes((folder / "m0/test_labels.npy").read_bytes())  # same bytes: still fine
    store.verify_manifest(folder)


def test_bad_params_name_the_key(tiny_data, tmp_path):
    src = {"mnist5k": tiny_data / "datasets/mnist5k"}
    with pytest.raises(ConfigError, match=r"scenarios.rotmnist.per_clas: unknown key.*per_class"):
        build.partition("rotmnist", src, tmp_path / "x", {"per_clas": 3})
    with pytest.raises(ConfigError, match=r"scenarios.rotmnist.alpha: expected float"):
        build.partition("rotmnist", src, tmp_path / "x", {"alpha": "ten"})
    with pytest.raises(ConfigError, match="leaves no private data"):
        build.partition("rotmnist", src, tmp_path / "x", {"alpha": 0.5, "val": 0.3, "test": 0.3})
    with pytest.raises(ConfigError, match="unknown scenario 'rotmnst'.*rotmnist"):
        build.partition("rotmnst", src, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_failed_partition_keeps_previous_output(tiny_data, tmp_path, monkeypatch):
    src = {"mnist5k": tiny_data / "datasets/mnist5k"}
    out = tmp_path / "p"
    build.partition("rotmnist", src, out, {"per_class": 10})
    before = store.read_manifest(out)["files"]

    def boom(*a, **k):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(store, "write_manifest", boom)
    with pytest.raises(RuntimeError):
        build.partition("rotmnist", src, out, {"per_class": 12})
    monkeypatch.undo()
    assert store.read_manifest(out)["files"] == before
    assert [p.name for p in tmp_path.iterdir()] == ["p"]  # no temporary folder left behind


def test_embedded_sources(tiny_data):
    x, y = store.load_split(tiny_data / "datasets/mnist5k", "train")
    assert x.shape == (5000, 1, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y).min() > 400  # every digit present
    p, _ = store.load_split(tiny_data / "public/photo_patches", "train")
    assert p.shape == (256, 3, 32, 32) and p.std() > 10  # real image content, not blank


def test_every_scenario_declares_its_participants():
    for name in SCENARIOS.names():
        spec = SCENARIOS.get(name)
        params = spec.params() if spec.params else None
        parts = spec.participants_for(params)
        assert len(parts) >= 2 and len(set(parts)) == len(parts)
