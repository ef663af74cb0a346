"""Tiny-ImageNet through the mirror, and the hand-supplied datasets (SYN, Office-Caltech,
Office-31, Office-Home, PACS) from archives or folders in data/, all generated here."""

from __future__ import annotations

import hashlib
import io
import tarfile

import numpy as np
import pytest
from fedshift_fakes import image_bytes, image_folder_members, md5, rng, tiny_imagenet_zip, zip_bytes
from fedshift_fixtures import (  # noqa: F401 (fixtures used by name)
    ctx_for, fast_retries, http_root, mirror, no_partial_files, previous_output)

from fedshift.cli import main
from fedshift.data import build, manual, store
from fedshift.data import tiny_imagenet as ti
from fedshift.data.download import ChecksumError, UnsafeArchiveError
from fedshift.errors import ConfigError

# ----------------------------------------------------------------- Tiny-ImageNet


def test_tiny_imagenet_regroups_val(mirror, monkeypatch, ctx_for, tmp_path, no_partial_files):
    data, counts = tiny_imagenet_zip()
    monkeypatch.setitem(ti.MD5, ti.FILENAME, mirror.put("tiny_imagenet", ti.FILENAME, data))
    out = tmp_path / "out"
    manifest = build.fetch_dataset("tiny_imagenet", out, ctx_for(mirror.url), {"size": 16})
    for split in ("train", "val"):
        x, y = store.load_split(out, split)
        assert x.shape == (counts[split], 3, 16, 16)
        assert sorted(set(y.tolist())) == list(range(200))  # every class in each split
    # val_k belongs to class k (the generator writes one per class, in wnid order)
    _, yv = store.load_split(out, "val")
    assert yv.tolist() == list(range(200))
    assert manifest["splits"]["val"]["n"] == 200


def test_tiny_imagenet_missing_class_fails(mirror, monkeypatch, ctx_for, previous_output):
    data, _ = tiny_imagenet_zip(drop_val_class=True)
    monkeypatch.setitem(ti.MD5, ti.FILENAME, mirror.put("tiny_imagenet", ti.FILENAME, data))
    out, unchanged = previous_output
    with pytest.raises(ConfigError, match="absent from val"):
        build.fetch_dataset("tiny_imagenet", out, ctx_for(mirror.url))
    unchanged()


def test_tiny_imagenet_traversal_member(mirror, monkeypatch, ctx_for, previous_output, tmp_path):
    data = zip_bytes([("tiny-imagenet-200/wnids.txt", b"n1\n"), ("tiny-imagenet-200/../../evil.txt", b"x")])
    monkeypatch.setitem(ti.MD5, ti.FILENAME, mirror.put("tiny_imagenet", ti.FILENAME, data))
    out, unchanged = previous_output
    with pytest.raises(UnsafeArchiveError):
        build.fetch_dataset("tiny_imagenet", out, ctx_for(mirror.url))
    unchanged()
    assert not list(tmp_path.rglob("evil.txt"))


# ----------------------------------------------------------------- manual sets


def _domains(spec, per_class=1, rename=None):
    rename = rename or {}
    return {rename.get(f, f): {c: per_class for c in spec.classes} for f in spec.domains.values()}


def _counts(monkeypatch, spec, per_class):
    for split in spec.domains:
        monkeypatch.setitem(spec.counts, split, per_class * len(spec.classes))


@pytest.mark.parametrize("name,prefix,as_folder", [
    ("syn", "syn", False),
    ("office_caltech", "office_caltech_10", False),
    ("office_home", "OfficeHomeDataset_10072016", True),
])
def test_image_folder_sets(name, prefix, as_folder, monkeypatch, ctx_for, tmp_path, no_partial_files):
    spec = manual.SETS[name]
    _counts(monkeypatch, spec, 2)
    members = image_folder_members(prefix, _domains(spec, 2), size=12)
    ctx = ctx_for()
    if as_folder:  # the unpacked folder, under the dataset's official name
        for rel, data in members:
            path = ctx.data_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    else:
        (ctx.data_dir / f"{name}.zip").write_bytes(zip_bytes(members))
    out = tmp_path / "out"
    build.fetch_dataset(name, out, ctx, {"size": 16})
    for split, folder in spec.domains.items():
        x, y = store.load_split(out, split)
        assert x.shape == (2 * len(spec.classes), 3, 16, 16)
        assert np.bincount(y).tolist() == [2] * len(spec.classes)
        files = (out / f"{split}_files.txt").read_text().split("\n")
        assert files[0].startswith(f"{folder}/{spec.classes[0]}/")  # "Real World" keeps its space


def test_office31_original_layout_with_images_folder(monkeypatch, ctx_for, tmp_path):
    spec = manual.SETS["office31"]
    _counts(monkeypatch, spec, 1)
    members, g = [], rng(0)
    for dom in spec.domains.values():
        for c in spec.classes:
            members.append((f"domain_adaptation_images/{dom}/images/{c}/frame_0001.jpg", image_bytes(g, 20, "JPEG")))
    ctx = ctx_for()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, data in members:
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (ctx.data_dir / "domain_adaptation_images.tar.gz").write_bytes(buf.getvalue())
    out = tmp_path / "out"
    build.fetch_dataset("office31", out, ctx)
    x, y = store.load_split(out, "webcam")
    assert x.shape == (31, 3, 32, 32) and y.tolist() == list(range(31))


def _pacs_tree(ctx, per_class_train=3, per_class_val=1):
    """PACS/kfold/<domain>/<class>/*.jpg and PACS/pacs_label/<domain>_{train,crossval,test}_kfold.txt,
    the test list covering the whole domain as in the official release."""
    spec = manual.SETS["pacs"]
    g = rng(7)
    root = ctx.data_dir / "PACS"
    for dom in spec.domains.values():
        lists = {"train": [], "crossval": []}
        for ci, c in enumerate(spec.classes):
            for k in range(per_class_train + per_class_val):
                rel = f"{dom}/{c}/pic_{k:03d}.jpg"
                path = root / "kfold" / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(image_bytes(g, 16, "JPEG"))
                lists["train" if k < per_class_train else "crossval"].append(f"{rel} {ci + 1}")
        lists["test"] = lists["train"] + lists["crossval"]
        (root / "pacs_label").mkdir(parents=True, exist_ok=True)
        for which, lines in lists.items():
            (root / "pacs_label" / f"{dom}_{which}_kfold.txt").write_text("\n".join(lines) + "\n")
    return spec


def test_pacs_official_splits(monkeypatch, ctx_for, tmp_path):
    ctx = ctx_for()
    spec = _pacs_tree(ctx)
    _counts(monkeypatch, spec, 4)
    out = tmp_path / "out"
    manifest = build.fetch_dataset("pacs", out, ctx)
    for dom in spec.domains:
        xtr, ytr = store.load_split(out, f"{dom}_train")
        xte, yte = store.load_split(out, f"{dom}_test")
        assert len(ytr) == 21 and len(yte) == 7  # test list minus the train list = crossval
        assert not set(store.image_hashes(xtr)) & set(store.image_hashes(xte))
        assert manifest["official_test_rows_also_in_train"][dom] == 21


def test_pacs_without_split_lists_says_what_is_missing(monkeypatch, ctx_for, tmp_path):
    ctx = ctx_for()
    spec = _pacs_tree(ctx)
    _counts(monkeypatch, spec, 4)
    (ctx.data_dir / "PACS" / "pacs_label" / "sketch_test_kfold.txt").unlink()
    with pytest.raises(ConfigError, match="sketch_test_kfold.txt"):
        build.fetch_dataset("pacs", tmp_path / "out", ctx)


@pytest.mark.parametrize("name", sorted(manual.SETS))
def test_missing_manual_archive(name, ctx_for, previous_output, tmp_path):
    ctx = ctx_for()
    out, unchanged = previous_output
    data_before = sorted(ctx.data_dir.iterdir())
    with pytest.raises(ConfigError) as err:
        build.fetch_dataset(name, out, ctx)
    msg = str(err.value)
    assert f"{ctx.data_dir / name}.zip" in msg and "dvc add data && dvc repro" in msg and "Obtain it from" in msg
    unchanged()
    assert sorted(ctx.data_dir.iterdir()) == data_before


def test_missing_manual_archive_cli_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("mirror: null\n")
    code = main(["fetch", "office_home", "--params", "params.yaml", "--out", "o", "--data-dir", "data"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "OfficeHome" in err[0] and "hemanthdv" in err[0]


def test_structure_errors(monkeypatch, ctx_for, tmp_path):
    spec = manual.SETS["office_caltech"]
    _counts(monkeypatch, spec, 1)
    ctx = ctx_for()
    domains = _domains(spec, 1)
    del domains["dslr"]["mug"]
    domains["dslr"]["teapot"] = 1
    evil = zip_bytes([("oc/amazon/mug/a.png", b"x"), ("oc/../../evil.png", b"x")])
    (ctx.data_dir / "office_caltech.zip").write_bytes(evil)
    with pytest.raises(UnsafeArchiveError):
        build.fetch_dataset("office_caltech", tmp_path / "out", ctx)
    assert not (ctx.cache_dir / "office_caltech").exists() and not list(tmp_path.rglob("evil.png"))
    (ctx.data_dir / "office_caltech.zip").write_bytes(zip_bytes(image_folder_members("oc", domains)))
    with pytest.raises(ConfigError, match="missing: mug; unexpected: teapot"):
        build.fetch_dataset("office_caltech", tmp_path / "out", ctx)
    domains = _domains(spec, 1)
    domains["webcam"]["mug"] = 2  # one image more than published
    (ctx.data_dir / "office_caltech.zip").write_bytes(zip_bytes(image_folder_members("oc", domains)))
    with pytest.raises(ConfigError, match="check_counts: false"):
        build.fetch_dataset("office_caltech", tmp_path / "out", ctx)
    build.fetch_dataset("office_caltech", tmp_path / "out", ctx, {"check_counts": False})
    assert store.load_split(tmp_path / "out", "webcam")[1].shape == (11,)


def test_pinned_sha256(monkeypatch, ctx_for, tmp_path, previous_output):
    spec = manual.SETS["syn"]
    ctx = ctx_for()
    data = zip_bytes(image_folder_members("syn", _domains(spec, 1)))
    (ctx.data_dir / "syn.zip").write_bytes(data)
    out, unchanged = previous_output
    with pytest.raises(ChecksumError, match="sha256"):
        build.fetch_dataset("syn", out, ctx, {"sha256": md5(b"x") * 2})
    unchanged()
    build.fetch_dataset("syn", out, ctx, {"sha256": hashlib.sha256(data).hexdigest()})
    assert store.load_split(out, "test")[0].shape == (10, 3, 32, 32)  # SYN's val/ is stored as test
