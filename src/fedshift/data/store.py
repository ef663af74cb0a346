"""On-disk format shared by every dataset, public set and partition.

A *split* is two ``.npy`` files: ``<split>_images.npy`` (uint8, N x C x H x W) and
``<split>_labels.npy`` (int64, N; -1 for unlabeled). ``.npy`` is deterministic (the
same arrays give the same bytes, so ``dvc.lock`` hashes are stable across machines),
memory-mappable and readable without fedshift. Each folder carries ``manifest.json``
(source, licence note, counts per class, sha256 of every file) written last, so a
folder without a manifest is unfinished.

Writers never leave half-written folders: :func:`atomic_dir` builds the folder under
a temporary name beside the target and swaps it in with renames at the end.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterator, Mapping, Optional, Tuple

import numpy as np

from ..errors import ConfigError

MANIFEST = "manifest.json"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def image_hashes(images: np.ndarray) -> np.ndarray:
    """One 16-hex-digit blake2b digest per image (content identity for audits)."""
    if len(images) == 0:
        return np.empty(0, dtype="<U16")
    flat = np.ascontiguousarray(images).reshape(len(images), -1)
    return np.array([hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in flat])


def tensor_bytes(obj) -> int:
    """Bytes of every tensor/array in a nested structure: what a torch.save of it needs, about."""
    if hasattr(obj, "nbytes") and not isinstance(obj, (int, float)):
        return int(obj.nbytes)
    if hasattr(obj, "element_size") and hasattr(obj, "nelement"):
        return int(obj.element_size() * obj.nelement())
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def write_failure(what: str, folder: Path, needed: int, exc: BaseException):
    """The one-line :class:`RunError` for a write that failed (full disk, ``ulimit -f``...):
    names the folder, the bytes needed and the bytes free."""
    from ..errors import RunError

    try:
        st = os.statvfs(folder)
        free = f"{st.f_bavail * st.f_frsize:,} bytes free"
    except OSError:
        free = "free space unknown"
    reason = getattr(exc, "strerror", None) or "the write stopped short"
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        free += f", file-size limit {limit:,} bytes"
    return RunError(f"cannot write {what} in {folder}: needs about {needed:,} bytes, {free} ({reason}); "
                    "free space there (or raise `ulimit -f`) and rerun")


def remove_stale(target: Path) -> None:
    """Remove ``.<name>.tmp-*`` / ``.<name>.old-*`` left beside ``target`` by a writer killed
    during its final rename (only one job ever writes a given output folder)."""
    target = Path(target)
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for p in target.parent.glob(pattern):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def current_umask() -> int:
    """The process umask, read without changing it (``/proc/self/status``), else via os.umask."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def published_mode(directory: bool) -> int:
    """What a plain ``mkdir``/``open`` would give under the user's umask. ``tempfile`` creates
    0700 folders and 0600 files whatever the umask; published results keep that mode after the
    rename, so collaborators on a shared cluster could not read them (issue 22, point 3)."""
    return (0o777 if directory else 0o666) & ~current_umask()


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``target``; on error it is removed.

    The previous content of ``target`` stays untouched until the new one is complete.
    Temporary folders a killed earlier writer left beside ``target`` are removed first.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(tmp, published_mode(directory=True))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def check_writable(out_dir: Path, reserve: int = 1 << 20) -> None:
    """Fail before training when the results folder (and its checkpoint area) cannot be written,
    or cannot take ``reserve`` bytes (reserved with fallocate, then released)."""
    parent = Path(out_dir).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent) as f:
            try:
                os.posix_fallocate(f.fileno(), 0, reserve)  # a full disk creates files but cannot fill them
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):  # no fallocate there: skip
                    raise
    except OSError as exc:
        raise ConfigError(f"results folder {parent} is not writable ({exc.strerror}); "
                          "fix its permissions or free space before running the job") from None


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file through a temporary name and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.fchmod(fd, published_mode(directory=False))
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


NONFINITE = "nonfinite"  # the key under which json_text lists the values it wrote as null


def json_text(obj, indent: Optional[int] = 2, sort_keys: bool = True) -> str:
    """``obj`` as strict JSON (RFC 8259; Python's ``json.dumps`` writes bare ``NaN`` / ``Infinity``, which strict
    parsers refuse: issue 51 R26): every NaN/inf float is written as ``null`` and, when ``obj`` is a mapping,
    listed under ``"nonfinite"`` (dotted path -> ``"NaN"``, ``"inf"`` or ``"-inf"``), so a reader can tell an
    undefined number from a missing one. Every JSON file fedshift writes goes through it."""
    bad: Dict[str, str] = {}

    def clean(x, where):
        if isinstance(x, float) and not math.isfinite(x):
            bad[where or "(top level)"] = "NaN" if math.isnan(x) else ("inf" if x > 0 else "-inf")
            return None
        if isinstance(x, Mapping):
            return {k: clean(v, f"{where}.{k}" if where else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(x)]
        if isinstance(x, np.generic):
            return clean(x.item(), where)
        return x

    out = clean(obj, "")
    if bad and isinstance(out, dict):
        out[NONFINITE] = {**(out.get(NONFINITE) or {}), **bad}
    return json.dumps(out, indent=indent, sort_keys=sort_keys, allow_nan=False) + "\n"


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json_text(obj))


def check_split(images: np.ndarray, labels: np.ndarray, name: str = "split") -> None:
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"{name}: images must be uint8 N x C x H x W, got {images.dtype} {images.shape}")
    if labels.dtype != np.int64 or labels.shape != (len(images),):
        raise ValueError(f"{name}: labels must be int64 of length {len(images)}, got {labels.dtype} {labels.shape}")


def save_split(folder: Path, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    check_split(images, labels, split)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{split}_images.npy", np.ascontiguousarray(images), allow_pickle=False)
    np.save(folder / f"{split}_labels.npy", np.ascontiguousarray(labels), allow_pickle=False)


# build/<this>/<scenario>/seed<k>: a partition redrawn with run seed k (engine.data_seed: run), drawn by the
# workflow's partition_seed rule, not by DVC (fedshift.experiments.SEEDED_PARTITIONS names the same folder)
SEEDED_PARTITIONS = "partitions_seeded"


def rebuild_hint(path: Path) -> str:
    """How to (re)build the data folder holding ``path`` (the folder or a file in it), for one-line messages:
    ``rebuild it with `dvc repro``` for DVC's folders; a per-seed partition is drawn by ``fedshift partition
    <scenario> --seed <k>`` (the workflow's partition_seed rule), which `dvc repro` never runs (issue 51 R19)."""
    for q in (Path(path), *Path(path).parents):
        if q.parent.parent.name == SEEDED_PARTITIONS and q.name.startswith("seed") and q.name[4:].isdigit():
            return (f"build it with `fedshift partition {q.parent.name} --seed {q.name[4:]} --out {q}` (what the "
                    "workflow's partition_seed rule runs; `dvc repro` does not draw per-seed partitions)")
    return "rebuild it with `dvc repro`"


def load_split(folder: Path, split: str, mmap: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    folder = Path(folder)
    img, lab = folder / f"{split}_images.npy", folder / f"{split}_labels.npy"
    if not img.exists() or not lab.exists():
        raise ConfigError(
            f"missing data file {img if not img.exists() else lab}; {rebuild_hint(folder)}"
        )
    mode = "r" if mmap else None
    arrays = []
    for path in (img, lab):
        try:
            arrays.append(np.load(path, mmap_mode=mode, allow_pickle=False))
        except (ValueError, EOFError, OSError) as exc:  # truncated or not a .npy file (issue 38)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise ConfigError(f"{path} is damaged, numpy cannot read it ({first}); {rebuild_hint(folder)}") from None
    return arrays[0], arrays[1]


def class_counts(labels: np.ndarray) -> Dict[str, int]:
    values, counts = np.unique(labels, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def split_summary(images: np.ndarray, labels: np.ndarray) -> dict:
    return {"n": int(len(labels)), "shape": list(images.shape[1:]), "class_counts": class_counts(labels)}


def file_hashes(folder: Path) -> Dict[str, str]:
    """sha256 of every file below ``folder`` except the manifest itself (sorted, relative paths)."""
    folder = Path(folder)
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(folder: Path, info: dict) -> dict:
    """Add the files' sha256 to ``info`` and write it as the folder's manifest (last step)."""
    manifest = dict(info)
    manifest["files"] = file_hashes(folder)
    write_json(Path(folder) / MANIFEST, manifest)
    return manifest


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.exists():
        raise ConfigError(f"missing {path}; {rebuild_hint(folder).replace('rebuild', 'build', 1)}")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); {rebuild_hint(folder)}") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path} is not a JSON object; {rebuild_hint(folder)}")
    return manifest


def check_loaded(images: np.ndarray, labels: np.ndarray, info: dict, num_classes: int, where: str,
                 folder: Path = None) -> None:
    """A loaded split against its manifest entry (``n``, ``shape``, ``class_counts``): uint8
    N x C x H x W images of the manifest's shape (uint8 cannot hold NaN/inf or [0, 1] floats),
    int64 labels in [0, num_classes) whose counts per class are the manifest's. Raises one
    line naming ``where`` (issue 23: a re-hashed manifest must not let wrong data through)."""
    fix = f"; {rebuild_hint(folder or '.')}"
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ConfigError(f"{where}: images are {images.dtype} with {images.ndim} dims, expected uint8 N x C x H x W{fix}")
    shape = list(info.get("shape", images.shape[1:]))
    if list(images.shape[1:]) != shape or len(images) != info.get("n", len(images)):
        raise ConfigError(f"{where}: images are {list(images.shape)}, the manifest says "
                          f"{[info.get('n', len(images)), *shape]}{fix}")
    if labels.dtype != np.int64 or labels.shape != (len(images),):
        raise ConfigError(f"{where}: labels are {labels.dtype} {list(labels.shape)}, expected int64 [{len(images)}]{fix}")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ConfigError(f"{where}: labels span {int(labels.min())}..{int(labels.max())}, "
                          f"outside 0..{num_classes - 1}{fix}")
    if "class_counts" in info and class_counts(labels) != info["class_counts"]:
        raise ConfigError(f"{where}: labels per class {class_counts(labels)} differ from the manifest's "
                          f"{info['class_counts']}{fix}")


def check_num_classes(manifest: dict, where: str) -> int:
    """``num_classes`` is an integer >= 2 and every class up to it occurs in some split of some
    participant (a manifest ``num_classes: 12`` over labels 0..9 would build 12-way heads)."""
    k = manifest.get("num_classes")
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise ConfigError(f"{where}: num_classes {k!r} must be an integer >= 2; {rebuild_hint(where)}")
    seen = {int(c) for p in manifest.get("participants", {}).values()
            for sp in p.get("splits", {}).values() for c in sp.get("class_counts", {})}
    if seen and max(seen) + 1 != k:
        raise ConfigError(f"{where}: num_classes is {k} but the labels of its splits span 0..{max(seen)}; "
                          f"{rebuild_hint(where)}")
    return k


def verify_manifest(folder: Path) -> None:
    """Recompute every file hash and compare with the manifest; raise naming the first mismatch."""
    manifest = read_manifest(folder)
    actual = file_hashes(folder)
    path = Path(folder) / MANIFEST
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ConfigError(f"{path}: key 'files' ({'missing' if files is None else repr(files)[:40]}) must map every "
                          f"data file to its sha256; {rebuild_hint(folder)}")
    # every data file a loader reads must be listed: an empty or partial map verified nothing (issue 38)
    unlisted = sorted(n for n in actual if n.endswith(".npy") and n not in files)
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        raise ConfigError(f"{Path(folder) / unlisted[0]}{more} is not listed in {path}'s 'files', so its sha256 "
                          f"cannot be checked; {rebuild_hint(folder)}")
    for name, digest in files.items():
        if actual.get(name) != digest:
            raise ConfigError(f"{Path(folder) / name}: sha256 differs from {MANIFEST} (file changed or missing); "
                              f"{rebuild_hint(folder)}")
