"""fedshift.data.download: verified, retried, atomic downloads and safe extraction."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest
from fedshift_fakes import md5, snapshot, tar_with_member, zip_bytes, zip_with_symlink
from fedshift_fixtures import (  # noqa: F401 (fixtures used by name)
    fast_retries, http_root, mirror, no_partial_files)

from fedshift.data import download as dl


def test_mirrored_maps_every_url_into_the_dataset_folder(tmp_path):
    url = "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz"
    assert dl.mirrored(url, "mnist", None) == url
    assert dl.mirrored(url, "mnist", "http://lab:8000/m/") == "http://lab:8000/m/mnist/train-images-idx3-ubyte.gz"
    local = dl.mirrored(url, "fashion_mnist", str(tmp_path))
    assert local == f"{tmp_path.as_uri()}/fashion_mnist/train-images-idx3-ubyte.gz"
    assert dl.mirrored_base("https://x/y/", "mnist", "http://m") == "http://m/mnist/"


def test_download_verifies_and_reuses_the_cache(mirror, tmp_path, no_partial_files):
    data = b"payload" * 1000
    digest = mirror.put("d", "f.bin", data)
    dest = tmp_path / "cache" / "f.bin"
    dl.download(dl.mirrored("https://x/f.bin", "d", mirror.url), dest, md5=digest)
    assert dest.read_bytes() == data
    (mirror.folder / "d" / "f.bin").unlink()  # a second call must not need the server
    dl.download(dl.mirrored("https://x/f.bin", "d", mirror.url), dest, md5=digest)
    assert dest.read_bytes() == data


def test_download_from_a_local_folder_mirror(tmp_path):
    (tmp_path / "m" / "d").mkdir(parents=True)
    (tmp_path / "m" / "d" / "f.bin").write_bytes(b"abc")
    dest = dl.download(dl.mirrored("https://x/f.bin", "d", str(tmp_path / "m")), tmp_path / "out" / "f.bin",
                       sha256="ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    assert dest.read_bytes() == b"abc"


def test_checksum_mismatch_leaves_cache_as_it_was(mirror, tmp_path, no_partial_files):
    mirror.put("d", "f.bin", b"served bytes")
    dest = tmp_path / "cache" / "f.bin"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"older, corrupt copy")
    with pytest.raises(dl.DownloadError, match="md5"):
        dl.download(dl.mirrored("https://x/f.bin", "d", mirror.url), dest, md5=md5(b"expected bytes"))
    assert dest.read_bytes() == b"older, corrupt copy"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["f.bin"]


def test_missing_file_fails_without_retrying(mirror, tmp_path, monkeypatch):
    calls = []
    real = dl._copy_url
    monkeypatch.setattr(dl, "_copy_url", lambda url, out: calls.append(url) or real(url, out))
    with pytest.raises(dl.DownloadError, match="404"):
        dl.download(dl.mirrored("https://x/none.bin", "d", mirror.url), tmp_path / "none.bin")
    assert len(calls) == 1 and not (tmp_path / "none.bin").exists()


def test_transient_failure_is_retried(mirror, tmp_path, monkeypatch):
    digest = mirror.put("d", "f.bin", b"good")
    real, calls = dl._copy_url, []

    def flaky(url, out):
        calls.append(url)
        if len(calls) == 1:
            out.write(b"go")  # a cut transfer: short file, wrong md5
            return
        real(url, out)

    monkeypatch.setattr(dl, "_copy_url", flaky)
    dest = dl.download(dl.mirrored("https://x/f.bin", "d", mirror.url), tmp_path / "f.bin", md5=digest)
    assert dest.read_bytes() == b"good" and len(calls) == 2


# ------------------------------------------------------------------ extraction


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_safe_extract_tar_and_zip(tmp_path):
    t = _write(tmp_path, "a.tar.gz", tar_with_member("ok/link", kind=tarfile.SYMTYPE, linkname="file0.txt"))
    out = dl.safe_extract(t, tmp_path / "t")
    assert (out / "ok" / "file0.txt").read_bytes() == b"ok"
    assert (out / "ok" / "link").read_bytes() == b"ok"  # a link inside the tree is fine
    z = _write(tmp_path, "a.zip", zip_bytes([("top/x.txt", b"x"), ("top/sub/y.txt", b"y")]))
    out = dl.safe_extract(z, tmp_path / "z")
    assert (out / "top" / "sub" / "y.txt").read_bytes() == b"y"


@pytest.mark.parametrize("member", [
    dict(name="../evil.txt"),
    dict(name="ok/../../evil.txt"),
    dict(name="/tmp/evil-absolute.txt"),
    dict(name="ok/escape", kind=tarfile.SYMTYPE, linkname="../../evil.txt"),
    dict(name="ok/abs", kind=tarfile.SYMTYPE, linkname="/etc/passwd"),
    dict(name="ok/hard", kind=tarfile.LNKTYPE, linkname="../evil.txt"),
    dict(name="ok/fifo", kind=tarfile.FIFOTYPE),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink-out", "symlink-abs", "hardlink-out", "fifo"])
def test_hostile_tar_member_is_refused_and_nothing_changes(tmp_path, member):
    archive = _write(tmp_path, "evil.tar.gz", tar_with_member(**member))
    dest = tmp_path / "work" / "dest"
    dest.mkdir(parents=True)
    (dest / "previous.txt").write_text("previous")
    before = snapshot(tmp_path / "work")
    with pytest.raises(dl.UnsafeArchiveError):
        dl.safe_extract(archive, dest)
    assert snapshot(tmp_path / "work") == before
    assert not list(tmp_path.rglob("evil*.txt")) and not (tmp_path.parent / "evil.txt").exists()
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["dest"]


@pytest.mark.parametrize("data", [
    zip_bytes([("ok.txt", b"ok"), ("../evil.txt", b"evil")]),
    zip_bytes([("ok.txt", b"ok"), ("/abs/evil.txt", b"evil")]),
    zip_with_symlink("ok/link", "../../outside"),
], ids=["dotdot", "absolute", "symlink-out"])
def test_hostile_zip_member_is_refused(tmp_path, data):
    archive = _write(tmp_path, "evil.zip", data)
    with pytest.raises(dl.UnsafeArchiveError):
        dl.safe_extract(archive, tmp_path / "cache" / "zipset" / "dest")
    assert not (tmp_path / "cache").exists() and not list(tmp_path.rglob("evil.txt"))


def test_truncated_archive_is_reported_and_nothing_changes(tmp_path):
    full = zip_bytes([(f"d/f{i}.txt", b"x" * 5000) for i in range(20)])
    archive = _write(tmp_path, "cut.zip", full[: len(full) // 2])
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        for i in range(20):
            info = tarfile.TarInfo(f"d/f{i}.bin")
            data = bytes(range(256)) * 40
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    cut_tar = _write(tmp_path, "cut.tar.gz", tgz.getvalue()[: len(tgz.getvalue()) // 2])
    for a in (archive, cut_tar):
        with pytest.raises(dl.DownloadError, match="corrupt or truncated"):
            dl.safe_extract(a, tmp_path / "dest")
        assert not (tmp_path / "dest").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_extraction_is_reused_for_the_same_archive(tmp_path):
    archive = _write(tmp_path, "a.zip", zip_bytes([("x.txt", b"1")]))
    out = dl.safe_extract(archive, tmp_path / "x")
    (out / "marker").write_text("kept")  # reuse: the folder is not rebuilt
    dl.safe_extract(archive, tmp_path / "x")
    assert (out / "marker").exists()
    archive.write_bytes(zip_bytes([("x.txt", b"2")]))
    dl.safe_extract(archive, tmp_path / "x")
    assert not (out / "marker").exists() and (out / "x.txt").read_bytes() == b"2"


def test_zip_stdlib_check_sees_our_symlink_helper():
    # The hostile-zip helper really marks a symlink (else the test above proves nothing).
    with zipfile.ZipFile(io.BytesIO(zip_with_symlink("a", "../b"))) as zf:
        assert (zf.getinfo("a").external_attr >> 16) & 0o170000 == 0o120000
