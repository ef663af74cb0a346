"""Unlabeled public sets of FCCL/FCCL+ (§ 4.1): CIFAR-100, Tiny-ImageNet, Fashion-MNIST,
plus the offline UCI digits (``photo_patches`` lives in :mod:`.embedded`).

Each is a seeded sample of ``n`` images of its dataset's train split, labels dropped
(:func:`fedshift.data.build.build_public`). Images keep their stored size; training
converts them to the scenario's format (:func:`fedshift.data.loading.load_federated`)
and applies the weak / strong augmentation recipes of :mod:`fedshift.data.augment`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import numpy as np

from . import store
from .embedded import PublicParams
from .registry import PUBLIC_SETS, PublicSpec


@dataclass(frozen=True)
class UciPublicParams:
    n: int = 1797  # every UCI digit: the FCCL+ default of 5,000 would exceed the dataset
    seed: int = 0  # order of the sample (the set itself is all of them)


PUBLIC_SETS.add("cifar100", PublicSpec(
    name="cifar100", dataset="cifar100", params=PublicParams,
    doc="FCCL/FCCL+ default public set: 5,000 CIFAR-100 training images, unlabeled"))
PUBLIC_SETS.add("tiny_imagenet", PublicSpec(
    name="tiny_imagenet", dataset="tiny_imagenet", params=PublicParams,
    doc="5,000 Tiny-ImageNet training images, unlabeled (FCCL+ Table XIV)"))
PUBLIC_SETS.add("fashion_mnist", PublicSpec(
    name="fashion_mnist", dataset="fashion_mnist", params=PublicParams,
    doc="5,000 Fashion-MNIST training images, unlabeled (FCCL+ Table XIV)"))
PUBLIC_SETS.add("uci_digits", PublicSpec(
    name="uci_digits", dataset="uci_digits", params=UciPublicParams,
    doc="offline: all 1,797 UCI 8x8 digits, unlabeled (upsampled to the scenario's format when loaded)"))


def public_overlap(partition_dir: Path, public_dir: Path) -> Dict[str, int]:
    """Images of a public set that also occur in a partition, per ``participant/split``.

    The public set is converted to the partition's format first, as training does, so
    an image shared through a common source (``uci_digits`` public set + the ``uci``
    domain of ``digits_offline``) is found. Pair a scenario only with a public set that
    gives no overlap with its evaluation splits.
    """
    manifest = store.read_manifest(partition_dir)
    from .scenarios.common import to_format

    px, _ = store.load_split(public_dir, "train")
    public = set(store.image_hashes(to_format(px, tuple(manifest["image_shape"]))).tolist())
    out = {}
    for pname, info in manifest["participants"].items():
        for split in info["splits"]:
            x, _ = store.load_split(Path(partition_dir) / pname, split, mmap=True)
            out[f"{pname}/{split}"] = int(np.isin(store.image_hashes(x), list(public)).sum())
    return out
