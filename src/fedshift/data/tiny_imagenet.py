"""Tiny-ImageNet (cs231n): 200 ImageNet classes, 500 train and 50 validation images each.

FCCL/FCCL+ draw 5,000 unlabeled public samples from it. The archive
``tiny-imagenet-200.zip`` is downloaded (mirror, retries, md5) and extracted safely;
``val/`` keeps its images in one folder, so they are regrouped by class through
``val/val_annotations.txt``. Every JPEG is decoded once here (PIL) into uint8 arrays at
``size`` x ``size`` (native 64; 32 by default, the FCCL protocol's resolution). The
``test/`` split has no labels and is not stored. A check makes sure each of the 200
classes of ``wnids.txt`` occurs in both stored splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import numpy as np

from ..errors import ConfigError
from .download import download, mirrored, safe_extract
from .manual import decode_images
from .registry import DATASETS, DatasetSpec, FetchContext
from .store import save_split

URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
FILENAME = "tiny-imagenet-200.zip"
MD5 = {FILENAME: "90528d7ca1a48142e341f4ef8d21d0de"}  # tests replace it with their generated archive's
NUM_CLASSES = 200


@dataclass(frozen=True)
class TinyImageNetParams:
    size: int = 32  # stored side; 64 = native (4x the disk), 32 = what FCCL/FCCL+ train at


def _is_image(p: Path) -> bool:
    return p.suffix.lower() in (".jpeg", ".jpg", ".png")


def read_tree(root: Path) -> Dict[str, tuple]:
    """{split: (paths, labels)} for train and val of an extracted ``tiny-imagenet-200`` folder."""
    wnids_file = root / "wnids.txt"
    if not wnids_file.exists():
        raise ConfigError(f"{root}: wnids.txt missing; not a tiny-imagenet-200 archive")
    wnids = sorted(w.strip() for w in wnids_file.read_text().split() if w.strip())
    if len(wnids) != NUM_CLASSES or len(set(wnids)) != NUM_CLASSES:
        raise ConfigError(f"{wnids_file}: {len(set(wnids))} distinct classes, {NUM_CLASSES} expected")
    index = {w: i for i, w in enumerate(wnids)}
    train_paths, train_labels = [], []
    for w in wnids:
        files = sorted(p for p in (root / "train" / w / "images").glob("*") if _is_image(p))
        train_paths += files
        train_labels += [index[w]] * len(files)
    val_paths, val_labels = [], []
    ann = root / "val" / "val_annotations.txt"
    if not ann.exists():
        raise ConfigError(f"{ann} missing: cannot regroup the validation images by class")
    for line_no, line in enumerate(ann.read_text().splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in index:
            raise ConfigError(f"{ann}:{line_no}: expected '<file>\\t<wnid>...' with a wnid of wnids.txt")
        path = root / "val" / "images" / fields[0]
        if not path.exists():
            raise ConfigError(f"{ann}:{line_no}: {path} does not exist")
        val_paths.append(path)
        val_labels.append(index[fields[1]])
    splits = {"train": (train_paths, np.asarray(train_labels, np.int64)),
              "val": (val_paths, np.asarray(val_labels, np.int64))}
    for split, (_, labels) in splits.items():
        missing = sorted(set(range(NUM_CLASSES)) - set(labels.tolist()))
        if missing:
            raise ConfigError(f"tiny_imagenet: {len(missing)} class(es) absent from {split}, e.g. "
                              f"{wnids[missing[0]]}; the archive is incomplete")
    return splits


def _fetch(out: Path, ctx: FetchContext, params: TinyImageNetParams) -> dict:
    root = Path(ctx.cache_dir) / "tiny_imagenet"
    archive = download(mirrored(URL, "tiny_imagenet", ctx.mirror), root / FILENAME, md5=MD5[FILENAME])
    tree = safe_extract(archive, root / "extracted")
    top = tree / "tiny-imagenet-200"
    if not top.is_dir():
        raise ConfigError(f"{archive}: no tiny-imagenet-200/ folder inside")
    for split, (paths, labels) in read_tree(top).items():
        save_split(out, split, decode_images(paths, params.size), labels)
    return {"origin": URL, "downloads": {FILENAME: {"url": URL, "md5": MD5[FILENAME]}},
            "storage": f"3x{params.size}x{params.size} (native 3x64x64)"}


DATASETS.add("tiny_imagenet", DatasetSpec(
    name="tiny_imagenet", fetch=_fetch, num_classes=NUM_CLASSES, params=TinyImageNetParams,
    source=URL, licence="ImageNet terms of access: non-commercial research and education only",
    offline=False, doc="Tiny-ImageNet 100,000 train / 10,000 val (regrouped), 200 classes"))
