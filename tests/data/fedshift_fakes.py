"""Tiny files in the real published formats, generated for the offline fetch tests.

Each generator returns the file's bytes (and what a correct reader must find in it),
written from the format descriptions (idx headers, libsvm lines, MATLAB .mat, CIFAR
pickles, Tiny-ImageNet and image-folder layouts), never from fedshift's readers.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

import numpy as np


def snapshot(folder: Path) -> Dict[str, bytes]:
    """Every file below ``folder`` (relative path -> bytes), hidden files included."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def labels_cycle(n: int, classes: int = 10) -> np.ndarray:
    return (np.arange(n) % classes).astype(np.int64)


# ---------------------------------------------------------------- MNIST idx (gzip)


def idx_images(images: np.ndarray) -> bytes:
    """idx3-ubyte: magic 0x00000803 (unsigned byte, 3 dims), then N, H, W big-endian."""
    n, h, w = images.shape
    return gzip.compress(struct.pack(">IIII", 0x00000803, n, h, w) + images.astype(np.uint8).tobytes(), mtime=0)


def idx_labels(labels: np.ndarray) -> bytes:
    """idx1-ubyte: magic 0x00000801 (unsigned byte, 1 dim), then N."""
    return gzip.compress(struct.pack(">II", 0x00000801, len(labels)) + labels.astype(np.uint8).tobytes(), mtime=0)


def mnist_files(n_train: int = 30, n_test: int = 20, seed: int = 0) -> Tuple[Dict[str, bytes], dict]:
    g = rng(seed)
    truth = {"train": (g.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), labels_cycle(n_train)),
             "test": (g.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), labels_cycle(n_test))}
    files = {
        "train-images-idx3-ubyte.gz": idx_images(truth["train"][0]),
        "train-labels-idx1-ubyte.gz": idx_labels(truth["train"][1]),
        "t10k-images-idx3-ubyte.gz": idx_images(truth["test"][0]),
        "t10k-labels-idx1-ubyte.gz": idx_labels(truth["test"][1]),
    }
    return files, truth


# -------------------------------------------------------------- USPS libsvm (bz2)


def usps_bz2(levels: np.ndarray, labels: np.ndarray) -> bytes:
    """libsvm lines ``<label 1-10> 1:<v> ... 256:<v>`` with v in [-1, 1]."""
    lines = []
    for row, y in zip(levels, labels):
        feats = " ".join(f"{i + 1}:{v:.6f}" for i, v in enumerate(row))
        lines.append(f"{int(y) + 1} {feats}")
    return bz2.compress(("\n".join(lines) + "\n").encode())


def usps_files(n_train: int = 20, n_test: int = 10, seed: int = 1):
    g = rng(seed)
    files, truth = {}, {}
    for split, n, name in (("train", n_train, "usps.bz2"), ("test", n_test, "usps.t.bz2")):
        # values k/255*2-1 map back to exactly k under torchvision's ((v + 1) / 2 * 255) floor.
        pix = g.integers(0, 256, (n, 256))
        levels = (pix + 0.5) / 255.0 * 2 - 1
        labels = labels_cycle(n)
        files[name] = usps_bz2(levels, labels)
        truth[split] = (pix.reshape(n, 16, 16).astype(np.uint8), labels)
    return files, truth


# ------------------------------------------------------------------ SVHN (.mat)


def svhn_mat(images: np.ndarray, labels: np.ndarray) -> bytes:
    """MATLAB file with X (32, 32, 3, N) uint8 and y (N, 1), digit 0 stored as 10."""
    from scipy.io import savemat

    buf = io.BytesIO()
    y = np.where(labels == 0, 10, labels).reshape(-1, 1).astype(np.uint8)
    savemat(buf, {"X": images.transpose(2, 3, 1, 0), "y": y})  # N x C x H x W -> H x W x C x N
    return buf.getvalue()


def svhn_files(n_train: int = 20, n_test: int = 10, seed: int = 2):
    g = rng(seed)
    files, truth = {}, {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = g.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        labels = labels_cycle(n)
        files[f"{split}_32x32.mat"] = svhn_mat(images, labels)
        truth[split] = (images, labels)
    return files, truth


# --------------------------------------------------------- CIFAR python (tar.gz)


def _tar_bytes(members: Iterable[Tuple[str, bytes]], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def cifar_archive(kind: str = "cifar10", per_batch: int = 6, n_test: int = 8, seed: int = 3):
    """(archive bytes, {inner file: md5}, truth) for cifar-10/100-python.tar.gz."""
    g = rng(seed)
    classes = 10 if kind == "cifar10" else 100
    label_key = "labels" if kind == "cifar10" else "fine_labels"
    folder = "cifar-10-batches-py" if kind == "cifar10" else "cifar-100-python"
    train_names = [f"data_batch_{i}" for i in range(1, 6)] if kind == "cifar10" else ["train"]
    test_names = ["test_batch"] if kind == "cifar10" else ["test"]
    meta_name, meta_key = ("batches.meta", "label_names") if kind == "cifar10" else ("meta", "fine_label_names")
    inner, truth = {}, {"train": ([], []), "test": ([], [])}
    for split, names, n in (("train", train_names, per_batch), ("test", test_names, n_test)):
        for name in names:
            data = g.integers(0, 256, (n, 3072), dtype=np.uint8)
            labels = [int(v) for v in g.integers(0, classes, n)]
            inner[name] = pickle.dumps({"data": data, label_key: labels, "batch_label": name})
            truth[split][0].append(data.reshape(n, 3, 32, 32))
            truth[split][1].extend(labels)
    inner[meta_name] = pickle.dumps({meta_key: [f"class{i}" for i in range(classes)]})
    truth = {k: (np.concatenate(v[0]), np.asarray(v[1], np.int64)) for k, v in truth.items()}
    archive = _tar_bytes([(f"{folder}/{k}", v) for k, v in inner.items()])
    return archive, {k: md5(v) for k, v in inner.items()}, truth


# -------------------------------------------------------------- image files, zips


def image_bytes(g: np.random.Generator, size: int = 8, fmt: str = "PNG") -> bytes:
    from PIL import Image

    arr = g.integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def zip_bytes(members: Iterable[Tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def tiny_imagenet_zip(classes: int = 200, train_per_class: int = 2, val_per_class: int = 1,
                      drop_val_class: bool = False, seed: int = 4) -> Tuple[bytes, dict]:
    """tiny-imagenet-200/{wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG,
    val/val_annotations.txt, test/images/*.JPEG}; returns (zip bytes, {split: n})."""
    g = rng(seed)
    wnids = [f"n{10000000 + 7 * i:08d}" for i in range(classes)]
    top = "tiny-imagenet-200"
    members: List[Tuple[str, bytes]] = [(f"{top}/wnids.txt", ("\n".join(wnids) + "\n").encode()),
                                        (f"{top}/words.txt", "".join(f"{w}\tthing {w}\n" for w in wnids).encode())]
    ann, k = [], 0
    for ci, w in enumerate(wnids):
        for j in range(train_per_class):
            members.append((f"{top}/train/{w}/images/{w}_{j}.JPEG", image_bytes(g, 64, "JPEG")))
        members.append((f"{top}/train/{w}/{w}_boxes.txt", b""))
        if drop_val_class and ci == classes - 1:
            continue
        for _ in range(val_per_class):
            members.append((f"{top}/val/images/val_{k}.JPEG", image_bytes(g, 64, "JPEG")))
            ann.append(f"val_{k}.JPEG\t{w}\t0\t0\t63\t63")
            k += 1
    members.append((f"{top}/val/val_annotations.txt", ("\n".join(ann) + "\n").encode()))
    members.append((f"{top}/test/images/test_0.JPEG", image_bytes(g, 64, "JPEG")))
    return zip_bytes(members), {"train": classes * train_per_class, "val": k}


def image_folder_members(prefix: str, domains: Dict[str, Dict[str, int]], seed: int = 5,
                         size: int = 8) -> List[Tuple[str, bytes]]:
    """``<prefix>/<domain>/<class>/img<k>.png`` for {domain: {class: count}}."""
    g = rng(seed)
    out = []
    for domain, classes in domains.items():
        for cls, n in classes.items():
            for k in range(n):
                out.append((f"{prefix}/{domain}/{cls}/img{k}.png", image_bytes(g, size)))
    return out


# ------------------------------------------------------------ hostile archives


def tar_with_member(name: str, data: bytes = b"evil", linkname: str = "", kind: bytes = tarfile.REGTYPE,
                    decoys: int = 1) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(decoys):
            info = tarfile.TarInfo(f"ok/file{i}.txt")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        info.size = 0 if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else len(data)
        tar.addfile(info, io.BytesIO(data) if info.size else None)
    return buf.getvalue()


def zip_with_symlink(name: str, target: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ok/file.txt", b"ok")
        info = zipfile.ZipInfo(name)
        info.external_attr = (0o120777 << 16)  # S_IFLNK | 0777
        zf.writestr(info, target)
    return buf.getvalue()
