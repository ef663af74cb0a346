"""Every registered scenario partitions, audits clean and is deterministic per seed.

Parametrised over the registry (a new scenario is covered once it has an entry in
SMALL, the overrides that fit the synthetic datasets). Datasets that need downloads
or manual archives are replaced by small synthetic folders of the same layout
(random pixels, balanced classes); the offline ones (mnist5k, uci_digits,
photo_patches) are fetched for real. Protocol-specific checks follow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedshift.data import SCENARIOS, build, manual, store
from fedshift.data.audit import audit_partition
from fedshift.data.public_sets import public_overlap
from fedshift.data.registry import FetchContext, Participant, Split
from fedshift.data.scenarios import common, fedmmd
from fedshift.errors import ConfigError

# dataset -> {split: (n, (C, H, W), classes)}
FAKE = {
    "mnist": {"train": (600, (1, 28, 28), 10), "test": (100, (1, 28, 28), 10)},
    "cifar10": {"train": (500, (3, 32, 32), 10), "test": (100, (3, 32, 32), 10)},
    "usps": {"train": (120, (1, 16, 16), 10), "test": (40, (1, 16, 16), 10)},
    "svhn": {"train": (300, (3, 32, 32), 10), "test": (60, (3, 32, 32), 10)},
    "syn": {"train": (200, (3, 32, 32), 10), "test": (50, (3, 32, 32), 10)},
    "office_caltech": {d: (50, (3, 32, 32), 10) for d in ("amazon", "caltech", "dslr", "webcam")},
    "office31": {d: (93, (3, 32, 32), 31) for d in ("amazon", "dslr", "webcam")},
    "office_home": {d: (1300, (3, 32, 32), 65) for d in ("art", "clipart", "product", "real_world")},
    "pacs": {f"{d}_{s}": (n, (3, 32, 32), 7) for d in ("photo", "art_painting", "cartoon", "sketch")
             for s, n in (("train", 42), ("test", 70))},
}
OFFLINE = ("mnist5k", "uci_digits", "photo_patches")

# Overrides that fit the synthetic sizes; {} = the scenario's defaults.
SMALL = {
    "digits": {"private": [20, 10, 50, 30]},
    "digits_offline": {},
    "office_caltech": {},
    "office31": {},
    "office_home": {"private": [100, 120, 150, 100]},
    "pacs": {},
    "office_home_h2l": {},
    "rotmnist": {},
    "rotmnist_full": {"per_class": 20},
    "rotmnist_a05": {},
    "rotmnist_a10": {},
    "rotmnist_a15": {},
    "mnist_binary": {},
    "cifar10_binary": {},
    "mnist_shards": {"shards": 20, "per_client": 2},
    "cifar10_shards": {"shards": 20, "per_client": 2},
    "mnist_permuted": {"clients": 3},
    "mnist_iid": {"clients": 10},
    "cifar10_iid": {"clients": 10},
    "mnist_dirichlet": {"clients": 5, "alpha": 0.5, "min_size": 5},
    "cifar10_dirichlet": {"clients": 5, "alpha": 0.5, "min_size": 5},
    "mnist5k_shards": {},
    "mnist5k_binary": {},
    "mnist5k_permuted": {"clients": 3},
}


def _fake_dataset(folder: Path, name: str, seed: int) -> None:
    g = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for split, (n, shape, classes) in FAKE[name].items():
        images = g.integers(0, 256, (n, *shape), dtype=np.uint8)
        store.save_split(folder, split, images, (np.arange(n) % classes).astype(np.int64))
    store.write_manifest(folder, {"kind": "dataset", "name": name, "synthetic": True})


@pytest.fixture(scope="session")
def dataset_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    for k, name in enumerate(FAKE):
        _fake_dataset(root / name, name, k)
    ctx = FetchContext(data_dir=root / "none", cache_dir=root / "cache")
    for name in OFFLINE:
        build.fetch_dataset(name, root / name, ctx)
    return {p.name: p for p in root.iterdir() if (p / store.MANIFEST).exists()}


def _partition(name, dirs, out, overrides=None):
    return build.partition(name, dirs, out, SMALL[name] if overrides is None else overrides)


def _load(out: Path, manifest: dict):
    return {p: {s: store.load_split(out / p, s) + (np.load(out / p / f"{s}_index.npy"),)
                for s in info["splits"]} for p, info in manifest["participants"].items()}


def test_every_scenario_has_small_overrides():
    assert sorted(SMALL) == SCENARIOS.names()


@pytest.mark.parametrize("name", SCENARIOS.names())
def test_partition_audited_and_deterministic(name, dataset_dirs, tmp_path):
    spec = SCENARIOS.get(name)
    m1 = _partition(name, dataset_dirs, tmp_path / "a")
    m2 = _partition(name, dataset_dirs, tmp_path / "b")
    assert m1["files"] == m2["files"], "same seed, different bytes"
    audit = m1["audit"]
    assert audit["disjoint_by_index"] and audit["disjoint_by_hash"] and audit["hash_overlaps"] == 0
    params = build.resolve_params(spec, SMALL[name], name)
    assert m1["participants_order"] == list(spec.participants_for(params))
    data = _load(tmp_path / "a", m1)
    for p, splits in data.items():
        assert "private" in splits and "test" in splits
        for split, (x, y, idx) in splits.items():
            assert x.shape[1:] == spec.image_shape and x.dtype == np.uint8
            assert len(x) == len(y) == len(idx) > 0
            assert y.min() >= 0 and y.max() < spec.num_classes
    # Independent re-check of the audit: per source, training rows never meet evaluation rows,
    # and no pixel content is shared between the two roles.
    train_rows, eval_rows, train_hash, eval_hash = {}, {}, set(), set()
    for p, info in m1["participants"].items():
        for split, s in info["splits"].items():
            _, _, idx = data[p][split]
            rows, hashes = (eval_rows, eval_hash) if split in ("val", "test") else (train_rows, train_hash)
            rows.setdefault(s["source"], set()).update(idx.tolist())
            hashes.update(store.image_hashes(data[p][split][0]).tolist())
    for src in train_rows:
        assert not train_rows[src] & eval_rows.get(src, set()), src
    assert not train_hash & eval_hash
    if hasattr(params, "seed"):
        other = _partition(name, dataset_dirs, tmp_path / "c", {**SMALL[name], "seed": 1})
        assert other["files"] != m1["files"], "the seed changes nothing"


# ------------------------------------------------------------------ FCCL+ sizes


def _sizes(manifest, split="private"):
    return {p: v["splits"][split]["n"] for p, v in manifest["participants"].items() if split in v["splits"]}


def test_digits_sizes_and_fractions(dataset_dirs, tmp_path):
    m = _partition("digits", dataset_dirs, tmp_path / "a")
    assert _sizes(m) == {"mnist": 20, "usps": 10, "svhn": 50, "syn": 30}
    assert _sizes(m, "test") == {"mnist": 100, "usps": 40, "svhn": 60, "syn": 50}  # whole test splits
    m = _partition("digits", dataset_dirs, tmp_path / "b", {"sizing": "fractions", "fractions": [0.1, 0.2, 0.3, 0.5]})
    assert _sizes(m) == {"mnist": 60, "usps": 24, "svhn": 90, "syn": 100}
    with pytest.raises(ConfigError, match="5000 images asked"):
        _partition("digits", dataset_dirs, tmp_path / "c", {})  # the paper's sizes exceed the fakes


def test_office_80_20_then_48(dataset_dirs, tmp_path):
    m = _partition("office31", dataset_dirs, tmp_path / "a")
    # 93 images per domain: test round(18.6) = 19; private round(0.48 * 74) = 36
    assert _sizes(m, "test") == {d: 19 for d in ("amazon", "dslr", "webcam")}
    assert _sizes(m) == {d: 36 for d in ("amazon", "dslr", "webcam")}
    m = _partition("office_caltech", dataset_dirs, tmp_path / "b")
    assert _sizes(m, "test") == {d: 10 for d in ("amazon", "caltech", "dslr", "webcam")}
    assert _sizes(m) == {d: 19 for d in ("amazon", "caltech", "dslr", "webcam")}  # round(0.48 * 40)
    for info in m["participants"].values():  # stratified: 1 test image per class
        assert info["splits"]["test"]["class_counts"] == {str(c): 1 for c in range(10)}


def test_stratified_split_exact_known_answer():
    labels = np.repeat(np.arange(65), 37)  # an Office-Home-like domain: 2,405 images
    parts = common.stratified_split_exact(labels, {"public": 0.1, "val": 0.1, "test": 0.15},
                                          np.random.default_rng(0))
    assert {k: len(v) for k, v in parts.items()} == {"public": 240, "val": 240, "test": 361, "private": 1564}
    for k in ("public", "val", "test"):
        per_class = np.bincount(labels[parts[k]], minlength=65)
        assert per_class.max() - per_class.min() <= 1  # as close to stratified as integers allow
    rows = np.concatenate(list(parts.values()))
    assert sorted(rows.tolist()) == list(range(len(labels)))
    tiny = common.stratified_split_exact(np.array([0, 1, 2]), {"a": 0.5, "b": 0.5}, np.random.default_rng(1))
    assert {k: len(v) for k, v in tiny.items()} == {"a": 2, "b": 1, "private": 0}  # b asks 2, 1 is left


def test_office_home_private_counts_and_fixed_held_out_test(dataset_dirs, tmp_path):
    m = _partition("office_home", dataset_dirs, tmp_path / "a")
    assert _sizes(m) == {"art": 100, "clipart": 120, "product": 150, "real_world": 100}
    # clean: a stratified 20 % of each domain held out (1300 images, 20 per class: 4 per class), by split_seed
    assert _sizes(m, "test") == {d: 260 for d in ("art", "clipart", "product", "real_world")}
    assert all(info["splits"]["test"]["class_counts"] == {str(c): 4 for c in range(65)}
               for info in m["participants"].values())
    other = _partition("office_home", dataset_dirs, tmp_path / "b", {**SMALL["office_home"], "seed": 1})
    for d in m["participants"]:  # another seed draws other private images, never the held-out test
        t0, t1 = (np.load(out / d / "test_index.npy") for out in (tmp_path / "a", tmp_path / "b"))
        p0, p1 = (np.load(out / d / "private_index.npy") for out in (tmp_path / "a", tmp_path / "b"))
        assert np.array_equal(t0, t1) and not np.array_equal(p0, p1)
        assert not set(p1.tolist()) & set(t0.tolist())
    assert other["params"]["seed"] == 1


# ----------------------------------------------------------------- FedH2L sizes


def test_pacs_public_seed_is_ten_percent_of_test(dataset_dirs, tmp_path):
    m = _partition("pacs", dataset_dirs, tmp_path / "a")
    for dom, info in m["participants"].items():
        s = info["splits"]
        assert s["public"]["n"] == 7 and s["test"]["n"] == 63  # 10 / class of the official test part: 1 + 9
        # the official train part (42) is private + a 10 % stratified validation split (issue 34 item 4)
        assert s["private"]["n"] + s["val"]["n"] == 42 and s["val"]["n"] == round(0.1 * 42)
        assert s["public"]["class_counts"] == {str(c): 1 for c in range(7)}


def test_office_home_h2l_fractions(dataset_dirs, tmp_path):
    m = _partition("office_home_h2l", dataset_dirs, tmp_path / "a")
    for info in m["participants"].values():  # 20 per class: 2 public, 2 val, 3 test, 13 private
        assert {k: v["n"] for k, v in info["splits"].items()} == {"private": 845, "public": 130, "val": 130,
                                                                  "test": 195}


# ------------------------------------------------------------ FedMMD / FedFusion


def test_binary_clients_hold_disjoint_class_halves(dataset_dirs, tmp_path):
    m = _partition("cifar10_binary", dataset_dirs, tmp_path / "a")
    data = _load(tmp_path / "a", m)
    halves = [set(range(5)), set(range(5, 10))]
    for (p, splits), classes in zip(sorted(data.items()), halves):
        assert set(splits["private"][1].tolist()) == classes and set(splits["test"][1].tolist()) == classes
        assert len(splits["private"][1]) == 250 and len(splits["test"][1]) == 50  # every image of its classes


def test_shards_are_sorted_label_blocks(dataset_dirs, tmp_path):
    m = _partition("mnist_shards", dataset_dirs, tmp_path / "a")
    data = _load(tmp_path / "a", m)
    assert len(data) == 10
    rows = np.concatenate([s["private"][2] for s in data.values()])
    assert len(rows) == len(set(rows.tolist())) == 600  # 20 shards of 30 cover the fake train set once
    for s in data.values():
        assert len(s["private"][1]) == 60 and len(set(s["private"][1].tolist())) <= 2  # 60/class: 2 classes max
    test_rows = np.concatenate([s["test"][2] for s in data.values()])
    assert sorted(test_rows.tolist()) == list(range(100))  # slices: the test set exactly once


def test_shard_split_known_answer():
    labels = np.repeat(np.arange(4), 6)  # 24 rows, classes in blocks of 6
    parts = fedmmd.shard_split(labels, shards=8, per_client=2, shard_size=3, rng=np.random.default_rng(0))
    assert len(parts) == 4 and all(len(p) == 6 for p in parts)
    for p in parts:  # shard boundaries fall on class boundaries: whole shards of one class each
        values, counts = np.unique(labels[p], return_counts=True)
        assert len(values) <= 2 and all(c % 3 == 0 for c in counts)
    assert sorted(np.concatenate(parts).tolist()) == list(range(24))


def test_iid_and_dirichlet(dataset_dirs, tmp_path):
    m = _partition("mnist_iid", dataset_dirs, tmp_path / "a")
    assert set(_sizes(m).values()) == {60}
    m = _partition("mnist_dirichlet", dataset_dirs, tmp_path / "b")
    sizes = _sizes(m)
    assert sum(sizes.values()) == 600 and min(sizes.values()) >= 5
    skew = _partition("mnist_dirichlet", dataset_dirs, tmp_path / "c",
                      {"clients": 5, "alpha": 0.05, "min_size": 1})
    counts = [len(v["splits"]["private"]["class_counts"]) for v in skew["participants"].values()]
    assert min(counts) < 10  # strong skew: some client misses classes


def test_permuted_clients_share_one_permutation_for_train_and_test(dataset_dirs, tmp_path):
    m = _partition("mnist_permuted", dataset_dirs, tmp_path / "a")
    raw_x, _ = store.load_split(dataset_dirs["mnist"], "train")
    raw_t, _ = store.load_split(dataset_dirs["mnist"], "test")
    perms = []
    for p, s in _load(tmp_path / "a", m).items():
        x, _, idx = s["private"]
        flat_in, flat_out = raw_x[idx].reshape(len(idx), -1), x.reshape(len(idx), -1)
        # recover the permutation from the first image (random pixels: unique values with high probability)
        perm = np.array([np.flatnonzero((flat_in[:8] == flat_out[:8, j:j + 1]).all(0))[0] for j in range(784)])
        np.testing.assert_array_equal(flat_in[:, perm], flat_out)
        xt, _, idxt = s["test"]
        np.testing.assert_array_equal(raw_t[idxt].reshape(len(idxt), -1)[:, perm], xt.reshape(len(idxt), -1))
        assert len(idxt) == 100  # full test set
        perms.append(perm)
    assert not np.array_equal(perms[0], perms[1])


# --------------------------------------------------------------- digits_offline


def test_digits_offline_sizes_and_disjoint_mnist_rows(dataset_dirs, tmp_path):
    m = _partition("digits_offline", dataset_dirs, tmp_path / "a")
    assert _sizes(m) == {"mnist": 150, "uci": 100, "mnistm": 400, "mnist_inv": 300}
    assert _sizes(m, "test") == {"mnist": 250, "uci": 250, "mnistm": 250, "mnist_inv": 250}
    data = _load(tmp_path / "a", m)
    used = [set(data[d][s][2].tolist()) for d in ("mnist", "mnistm", "mnist_inv") for s in ("private", "test")]
    assert sum(len(u) for u in used) == len(set().union(*used))  # no mnist5k row in two places


def test_public_sets_disjoint_from_offline_partitions(dataset_dirs, tmp_path):
    part = tmp_path / "part"
    _partition("digits_offline", dataset_dirs, part)
    photo = build.build_public("photo_patches", dataset_dirs["photo_patches"], tmp_path / "pp", {"n": 5000})
    uci = build.build_public("uci_digits", dataset_dirs["uci_digits"], tmp_path / "uci")
    assert photo["splits"]["train"]["n"] == 5000 and uci["splits"]["train"]["n"] == 1797
    assert sum(public_overlap(part, tmp_path / "pp").values()) == 0
    # The UCI public set shares its source with the ``uci`` domain: the check must see it.
    overlap = public_overlap(part, tmp_path / "uci")
    assert overlap["uci/test"] == 250 and overlap["mnist/test"] == 0
    rot = tmp_path / "rot"
    _partition("rotmnist", dataset_dirs, rot)
    assert sum(public_overlap(rot, tmp_path / "pp").values()) == 0


# -------------------------------------------------------------------- the audit


def test_duplicates_inside_a_source_are_reported_and_never_leak(dataset_dirs, tmp_path):
    folder = tmp_path / "mnist_dup"
    folder.mkdir()
    x, y = store.load_split(dataset_dirs["mnist"], "train")
    x = x.copy()
    x[1::2] = x[0::2]  # every odd row duplicates the row before it
    store.save_split(folder, "train", x, y)
    store.save_split(folder, "test", *store.load_split(dataset_dirs["mnist"], "test"))
    store.write_manifest(folder, {"kind": "dataset", "name": "mnist"})
    m = build.partition("rotmnist_full", {**dataset_dirs, "mnist": folder}, tmp_path / "p",
                        {"per_class": 20, "seed": 3})
    audit = m["audit"]
    assert audit["duplicate_images_in_sources"]["mnist/train@m0"] > 0
    assert audit["eval_samples_removed_as_duplicates"] > 0  # test copies of training images dropped
    assert audit["disjoint_by_hash"]


def test_audit_flags_overlap_by_index_and_by_hash():
    g = np.random.default_rng(0)
    img = g.integers(0, 256, (4, 1, 4, 4), dtype=np.uint8)
    lab = np.zeros(4, np.int64)
    parts = {"a": Participant("a", {"private": Split(img[:2], lab[:2], np.array([0, 1]), "s/train"),
                                    "test": Split(img[2:], lab[2:], np.array([1, 2]), "s/train")})}
    audit = audit_partition(parts)
    assert not audit["disjoint_by_index"] and audit["overlaps"] == ["s/train#1"]
    parts["a"].splits["test"] = Split(img[1:3], lab[:2], np.array([2, 3]), "s/train")
    audit = audit_partition(parts)
    assert audit["disjoint_by_index"] and not audit["disjoint_by_hash"] and audit["hash_overlaps"] == 1


def test_manual_sets_match_their_scenarios():
    # the scenario domain names are the split names the fetch writes
    assert tuple(manual.SETS["office_home"].domains) == ("art", "clipart", "product", "real_world")
    assert tuple(manual.SETS["office_caltech"].domains) == ("amazon", "caltech", "dslr", "webcam")
    assert tuple(manual.SETS["pacs"].domains) == ("photo", "art_painting", "cartoon", "sketch")
