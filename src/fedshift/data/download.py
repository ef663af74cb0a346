"""Downloads that are verified, retried and atomic, and archive extraction that is safe.

* :func:`download` fetches one URL into the download cache: written under a temporary
  name beside the target, checked against its md5 / sha256, then renamed. A bounded
  number of attempts with exponential backoff absorbs transient network errors and
  truncated transfers; an HTTP 4xx answer fails at once. A file already in the cache
  whose checksum matches is reused; a failure leaves the cache as it was.
* :func:`safe_extract` unpacks a zip or tar archive into a folder that replaces its
  target only when complete, after checking every member: no absolute path, no ``..``
  component, no link pointing outside the folder, no device or FIFO member.
* :func:`mirrored` applies the mirror option (``mirror`` in params/data.yaml, or
  ``FEDSHIFT_MIRROR``): a download of file ``F`` for dataset ``D`` is fetched from
  ``<mirror>/D/F`` instead of its canonical URL. A mirror without a scheme is a local
  folder laid out the same way.

Every failure raises :class:`DownloadError` (a :class:`~fedshift.errors.ConfigError`,
so the CLI prints one line saying what to do) and never a half-written file.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import http.client
import logging
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Optional
from urllib.parse import urlparse

from ..errors import ConfigError
from .store import atomic_dir, published_mode, sha256_file

log = logging.getLogger(__name__)

RETRIES = 3  # attempts per file: a flaky link or a cut transfer usually succeeds on the 2nd
BACKOFF_S = 2.0  # wait before attempt k+1 is BACKOFF_S * 2**(k-1) seconds (2 s, 4 s)
TIMEOUT_S = 60.0  # socket timeout of one request; a stalled server counts as a failed attempt
CHUNK = 1 << 20  # bytes per read and per hash update
USER_AGENT = "fedshift-fetch (python-urllib)"  # some hosts refuse requests without one
EXTRACT_STAMP = ".fedshift-extracted"  # file in an extracted folder naming its archive's sha256


REMEDY = ("Check the network, or set a mirror (FEDSHIFT_MIRROR or `mirror` in params/data.yaml, laid out as "
          "<mirror>/<dataset>/<file>), or put the verified file at {dest} yourself; then rerun `dvc repro`")


class DownloadError(ConfigError):
    """A download or an archive could not be obtained intact."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class ChecksumError(DownloadError):
    """A file's digest differs from the expected one."""


class UnsafeArchiveError(DownloadError):
    """An archive member would land outside the extraction folder (or is a device/FIFO)."""


# ----------------------------------------------------------------------------- URLs


def mirrored(url: str, dataset: str, mirror: Optional[str]) -> str:
    """``url`` itself, or ``<mirror>/<dataset>/<file name of url>`` when a mirror is set.

    The dataset folder keeps files of the same name apart (MNIST and Fashion-MNIST both
    ship ``train-images-idx3-ubyte.gz``).
    """
    if not mirror:
        return url
    base = mirror if "://" in mirror else Path(mirror).expanduser().resolve().as_uri()
    return f"{base.rstrip('/')}/{dataset}/{posixpath.basename(urlparse(url).path)}"


def mirrored_base(base_url: str, dataset: str, mirror: Optional[str]) -> str:
    """The folder URL (ending in ``/``) that :func:`mirrored` maps ``base_url`` to."""
    return mirrored(base_url + "_", dataset, mirror)[:-1]


# ------------------------------------------------------------------------ checksums


def file_digest(path: Path, algorithm: str) -> str:
    if algorithm == "sha256":
        return sha256_file(path, CHUNK)
    h = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, md5: Optional[str] = None, sha256: Optional[str] = None, what: str = "") -> None:
    """Raise :class:`ChecksumError` unless ``path`` matches every digest given."""
    for algorithm, expected in (("md5", md5), ("sha256", sha256)):
        if not expected:
            continue
        actual = file_digest(path, algorithm)
        if actual.lower() != expected.lower():
            raise ChecksumError(f"{what or path}: {algorithm} {actual} differs from the expected {expected} "
                                "(corrupt or truncated transfer, or a mirror serving another file)")


def _matches(path: Path, md5: Optional[str], sha256: Optional[str]) -> bool:
    try:
        verify(path, md5, sha256)
    except ChecksumError:
        return False
    return True


# ------------------------------------------------------------------------ download


def _copy_url(url: str, out) -> None:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:
        length = response.headers.get("Content-Length")  # file:// and http give it; may be absent
        expected = int(length) if length and length.isdigit() else None
        total = 0
        while block := response.read(CHUNK):
            out.write(block)
            total += len(block)
    if expected is not None and total < expected:
        raise http.client.IncompleteRead(b"", expected - total)


def download(url: str, dest: Path, md5: Optional[str] = None, sha256: Optional[str] = None,
             retries: Optional[int] = None, backoff: Optional[float] = None) -> Path:
    """Fetch ``url`` into ``dest`` (verified, retried, atomic); reuse a matching ``dest``.

    Without any checksum an existing ``dest`` is trusted as is.
    """
    dest = Path(dest)
    retries = RETRIES if retries is None else retries
    backoff = BACKOFF_S if backoff is None else backoff
    if dest.exists():
        if _matches(dest, md5, sha256):
            log.info("cached %s", dest)
            return dest
        log.warning("%s: checksum differs, downloading it again", dest)
    first_new = _first_missing(dest.parent)
    dest.parent.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for attempt in range(1, retries + 1):
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.part-", dir=dest.parent)
        os.fchmod(fd, published_mode(directory=False))
        try:
            log.info("downloading %s (attempt %d/%d)", url, attempt, retries)
            with os.fdopen(fd, "wb") as f:
                _copy_url(url, f)
            verify(Path(tmp), md5, sha256, what=url)
            os.replace(tmp, dest)
            return dest
        except urllib.error.HTTPError as exc:
            last = exc
            if 400 <= exc.code < 500:  # not found / forbidden: another attempt would not help
                break
        except (urllib.error.URLError, http.client.HTTPException, OSError, ChecksumError) as exc:
            last = exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if attempt < retries:
            time.sleep(backoff * 2 ** (attempt - 1))
    _prune_empty(dest.parent, first_new)  # leave the cache as it was: no new empty folders
    raise DownloadError(f"could not download {url} to {dest}: {last}. " + REMEDY.format(dest=dest), reason=str(last))


def _first_missing(folder: Path) -> Optional[Path]:
    """The highest ancestor of ``folder`` (itself included) that does not exist yet."""
    missing = None
    for p in (folder, *folder.parents):
        if p.exists():
            break
        missing = p
    return missing


def _prune_empty(leaf: Path, top: Optional[Path]) -> None:
    if top is None:
        return
    for p in (leaf, *leaf.parents):
        with contextlib.suppress(OSError):  # not empty: someone else's files, keep it
            p.rmdir()
        if p == top:
            break


# ---------------------------------------------------------------------- extraction

_CORRUPT = (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error,
            lzma.LZMAError, OSError, ValueError)


def _check_name(name: str, archive: Path) -> PurePosixPath:
    clean = name.replace("\\", "/")
    path = PurePosixPath(clean)
    if clean.startswith("/") or (len(clean) > 1 and clean[1] == ":") or path.is_absolute():
        raise UnsafeArchiveError(f"{archive}: member {name!r} has an absolute path; refusing to extract")
    if ".." in path.parts:
        raise UnsafeArchiveError(f"{archive}: member {name!r} climbs out with '..'; refusing to extract")
    return path


def _inside(member: PurePosixPath, target: str) -> bool:
    """True when link ``target`` (relative to the member's folder, or absolute) stays in the root."""
    if target.startswith("/") or PurePosixPath(target).is_absolute():
        return False
    depth = 0
    for part in (member.parent / target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in (".", ""):
            depth += 1
    return True


def check_tar_members(tar: tarfile.TarFile, archive: Path) -> list:
    members = tar.getmembers()
    for m in members:
        path = _check_name(m.name, archive)
        if m.issym() and not _inside(path, m.linkname):
            raise UnsafeArchiveError(f"{archive}: symlink {m.name!r} -> {m.linkname!r} points outside; refusing")
        if m.islnk() and not _inside(PurePosixPath("x"), _check_name(m.linkname, archive).as_posix()):
            raise UnsafeArchiveError(f"{archive}: hard link {m.name!r} -> {m.linkname!r} points outside; refusing")
        if m.ischr() or m.isblk() or m.isfifo() or m.isdev():
            raise UnsafeArchiveError(f"{archive}: member {m.name!r} is a device or FIFO; refusing")
    return members


def check_zip_members(zf: zipfile.ZipFile, archive: Path) -> list:
    infos = zf.infolist()
    for info in infos:
        path = _check_name(info.filename, archive)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            target = zf.read(info).decode("utf-8", "replace")
            if not _inside(path, target):
                raise UnsafeArchiveError(f"{archive}: symlink {info.filename!r} -> {target!r} points outside; refusing")
    return infos


def _extract_tar(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as tar:
        members = check_tar_members(tar, archive)
        # The "data" filter (Python >= 3.11.4) re-checks every member and drops modes.
        tar.extractall(into, members=members, filter="data")


def _extract_zip(archive: Path, into: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = check_zip_members(zf, archive)
        root = into.resolve()
        for info in infos:
            dest = (into / info.filename).resolve()
            if dest != root and root not in dest.parents:  # belt and braces after the name check
                raise UnsafeArchiveError(f"{archive}: member {info.filename!r} would land outside; refusing")
            if stat.S_ISLNK(info.external_attr >> 16):
                continue  # links inside the tree are not needed by any dataset: skip them
            zf.extract(info, into)


def safe_extract(archive: Path, dest: Path, reuse: bool = True) -> Path:
    """Extract ``archive`` (zip or tar, any compression) into folder ``dest``.

    ``dest`` is replaced only after every member was checked and written; with ``reuse``
    an earlier extraction of the same archive (by sha256) is kept as is.
    """
    archive, dest = Path(archive), Path(dest)
    digest = sha256_file(archive, CHUNK)
    stamp = dest / EXTRACT_STAMP
    if reuse and stamp.exists() and stamp.read_text().strip() == digest:
        return dest
    first_new = _first_missing(dest.parent)
    try:
        with atomic_dir(dest) as tmp:
            if zipfile.is_zipfile(archive):
                _extract_zip(archive, tmp)
            else:
                _extract_tar(archive, tmp)
            (tmp / EXTRACT_STAMP).write_text(digest + "\n")
    except DownloadError:
        _prune_empty(dest.parent, first_new)
        raise
    except _CORRUPT as exc:
        _prune_empty(dest.parent, first_new)
        raise DownloadError(f"{archive}: corrupt or truncated archive ({type(exc).__name__}: {exc}); "
                            "delete it and rerun to fetch it again") from None
    return dest


_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def decompress(src: Path, dest: Path) -> Path:
    """Decompress a single ``.gz`` / ``.bz2`` / ``.xz`` file into ``dest`` (atomic)."""
    src, dest = Path(src), Path(dest)
    opener = _OPENERS[src.suffix]
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.part-", dir=dest.parent)
    os.fchmod(fd, published_mode(directory=False))
    try:
        with os.fdopen(fd, "wb") as out, opener(src, "rb") as f:
            shutil.copyfileobj(f, out, CHUNK)
        os.replace(tmp, dest)
    except _CORRUPT as exc:
        raise DownloadError(f"{src}: corrupt or truncated file ({type(exc).__name__}: {exc}); "
                            "delete it and rerun to fetch it again") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest
