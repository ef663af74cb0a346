"""Fetch MNIST, Fashion-MNIST, USPS, SVHN, CIFAR-10/100 through the mirror option from a
local HTTP server serving generated files in the real formats.

The md5 tables are overridden with the generated files' digests
(``torchvision_sets.MD5_OVERRIDES``), so the checks of fedshift and of torchvision's
classes both run on them; nothing of the network stack is mocked.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedshift_fakes import cifar_archive, md5, mnist_files, svhn_files, tar_with_member, usps_files
from fedshift_fixtures import (  # noqa: F401 (fixtures used by name)
    ctx_for, fast_retries, http_root, mirror, no_partial_files, previous_output)

from fedshift.data import build, store
from fedshift.data import torchvision_sets as tv
from fedshift.data.download import DownloadError, UnsafeArchiveError


def _serve(mirror, monkeypatch, dataset, files, extra_md5=None):
    table = {name: mirror.put(dataset, name, data) for name, data in files.items()}
    table.update(extra_md5 or {})
    monkeypatch.setitem(tv.MD5_OVERRIDES, dataset, table)


def _assert_split(out, split, images, labels):
    x, y = store.load_split(out, split)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
def test_idx_datasets(dataset, mirror, monkeypatch, ctx_for, tmp_path, no_partial_files):
    files, truth = mnist_files(seed=len(dataset))
    _serve(mirror, monkeypatch, dataset, files)
    out = tmp_path / "build" / "datasets" / dataset
    manifest = build.fetch_dataset(dataset, out, ctx_for(mirror.url))
    for split, (images, labels) in truth.items():
        _assert_split(out, split, images[:, None], labels)
    assert manifest["splits"]["train"]["shape"] == [1, 28, 28]
    assert "ossci" in str(manifest["downloads"]) or "fashion" in str(manifest["downloads"])  # canonical URL kept
    store.verify_manifest(out)


def test_usps(mirror, monkeypatch, ctx_for, tmp_path):
    files, truth = usps_files()
    _serve(mirror, monkeypatch, "usps", files)
    out = tmp_path / "out"
    build.fetch_dataset("usps", out, ctx_for(mirror.url))
    for split, (images, labels) in truth.items():
        _assert_split(out, split, images[:, None], labels)


def test_svhn(mirror, monkeypatch, ctx_for, tmp_path):
    files, truth = svhn_files()
    _serve(mirror, monkeypatch, "svhn", files)
    out = tmp_path / "out"
    build.fetch_dataset("svhn", out, ctx_for(mirror.url))
    for split, (images, labels) in truth.items():
        _assert_split(out, split, images, labels)  # digit 0 comes back as label 0


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_cifar(dataset, mirror, monkeypatch, ctx_for, tmp_path, no_partial_files):
    archive, inner, truth = cifar_archive(dataset)
    filename = "cifar-10-python.tar.gz" if dataset == "cifar10" else "cifar-100-python.tar.gz"
    _serve(mirror, monkeypatch, dataset, {filename: archive}, inner)
    out = tmp_path / "out"
    build.fetch_dataset(dataset, out, ctx_for(mirror.url))
    for split, (images, labels) in truth.items():
        _assert_split(out, split, images, labels)


def test_cifar_inner_md5_is_checked_by_torchvision(mirror, monkeypatch, ctx_for, previous_output):
    archive, inner, _ = cifar_archive("cifar10")
    inner["data_batch_3"] = md5(b"another batch")
    _serve(mirror, monkeypatch, "cifar10", {"cifar-10-python.tar.gz": archive}, inner)
    out, unchanged = previous_output
    with pytest.raises(DownloadError, match="corrupt"):
        build.fetch_dataset("cifar10", out, ctx_for(mirror.url))
    unchanged()


# ----------------------------------------------------------------- failure paths


def test_checksum_mismatch_leaves_output_untouched(mirror, monkeypatch, ctx_for, previous_output, tmp_path,
                                                  no_partial_files):
    files, _ = mnist_files()
    _serve(mirror, monkeypatch, "mnist", files)
    tv.MD5_OVERRIDES["mnist"]["t10k-images-idx3-ubyte.gz"] = md5(b"what the publisher released")
    out, unchanged = previous_output
    data_before = sorted(p.name for p in (tmp_path / "data").iterdir()) if (tmp_path / "data").exists() else []
    with pytest.raises(DownloadError, match="md5"):
        build.fetch_dataset("mnist", out, ctx_for(mirror.url))
    unchanged()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == data_before
    assert not (tmp_path / "build" / "downloads" / "mnist" / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz").exists()


def test_truncated_archive_leaves_output_untouched(mirror, monkeypatch, ctx_for, previous_output, no_partial_files):
    archive, inner, _ = cifar_archive("cifar100")
    cut = archive[: len(archive) * 2 // 3]
    _serve(mirror, monkeypatch, "cifar100", {"cifar-100-python.tar.gz": cut}, inner)  # md5 of the cut file
    out, unchanged = previous_output
    with pytest.raises(DownloadError, match="corrupt or truncated"):
        build.fetch_dataset("cifar100", out, ctx_for(mirror.url))
    unchanged()


def test_truncated_gzip_member_is_reported(mirror, monkeypatch, ctx_for, previous_output):
    files, _ = mnist_files()
    files["train-labels-idx1-ubyte.gz"] = files["train-labels-idx1-ubyte.gz"][:-12]
    _serve(mirror, monkeypatch, "mnist", files)
    out, unchanged = previous_output
    with pytest.raises(DownloadError, match="corrupt or truncated"):
        build.fetch_dataset("mnist", out, ctx_for(mirror.url))
    unchanged()


def test_path_traversal_member_leaves_everything_untouched(mirror, monkeypatch, ctx_for, previous_output, tmp_path):
    evil = tar_with_member("../../evil.txt", decoys=3)
    _serve(mirror, monkeypatch, "cifar10", {"cifar-10-python.tar.gz": evil})
    out, unchanged = previous_output
    with pytest.raises(UnsafeArchiveError, match="climbs out"):
        build.fetch_dataset("cifar10", out, ctx_for(mirror.url))
    unchanged()
    assert not list(tmp_path.rglob("evil.txt")) and not (tmp_path.parent / "evil.txt").exists()
    assert not (tmp_path / "build" / "downloads" / "cifar10" / "extracted").exists()


def test_unreachable_mirror_names_the_remedy(ctx_for, tmp_path, previous_output):
    out, unchanged = previous_output
    with pytest.raises(DownloadError, match="FEDSHIFT_MIRROR"):
        build.fetch_dataset("usps", out, ctx_for("http://127.0.0.1:9"))  # discard port: refused
    unchanged()
    assert not (tmp_path / "build" / "downloads").exists()  # no empty cache folders left behind
