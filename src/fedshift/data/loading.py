"""Load a built partition and public set as device tensors for training.

Images stay uint8 (N x C x H x W) on the training device and are normalised per
batch (:func:`normalize`), so even SVHN-sized sets fit and no per-sample decoding
ever happens. The public set is converted once to the scenario's image format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ..errors import ConfigError
from . import store
from .scenarios.common import to_format

MEAN, STD = 0.5, 0.5  # images are mapped to [-1, 1]: no per-dataset statistics leak across domains


def normalize(x: torch.Tensor) -> torch.Tensor:
    """uint8 batch -> float in [-1, 1]."""
    return (x.float() / 255.0 - MEAN) / STD


@dataclass
class ClientData:
    name: str
    domain: str
    splits: Dict[str, Tuple[torch.Tensor, torch.Tensor]]  # split -> (uint8 images, int64 labels)

    def get(self, split: str) -> Tuple[torch.Tensor, torch.Tensor]:
        if split not in self.splits:
            raise ConfigError(f"participant {self.name!r} has no {split!r} split (has {sorted(self.splits)})")
        return self.splits[split]

    @property
    def num_private(self) -> int:
        return len(self.splits["private"][1])


@dataclass
class FederatedData:
    scenario: str
    num_classes: int
    image_shape: Tuple[int, int, int]
    clients: List[ClientData]
    public: Optional[torch.Tensor]  # unlabeled uint8 images at the scenario's format, or None
    public_name: Optional[str]
    manifests: Dict[str, str] = field(default_factory=dict)  # name -> sha256 of its manifest.json

    @property
    def names(self) -> List[str]:
        return [c.name for c in self.clients]


def load_federated(partition_dir: Path, public_dir: Optional[Path] = None, device: str | torch.device = "cpu",
                   participants: Optional[List[str]] = None, holdout: bool = False) -> FederatedData:
    """A partition (and public set) as device tensors; a manifest missing a key is one line naming
    the manifest and the key (issue 38), not a KeyError.

    ``holdout``: the run asks for validation data (tuning, ``engine.select: best_val``): a participant
    without a ``val`` split gets its recorded validation holdout as ``val`` and trains on the rest of
    its private split (:func:`split_holdout`); without it, the holdout stays in private (no change)."""
    where = [Path(partition_dir) / store.MANIFEST]  # the manifest being read, for the message
    try:
        return _load_federated(Path(partition_dir), public_dir, device, participants, where, holdout)
    except KeyError as exc:
        key = exc.args[0] if exc.args else "?"
        raise ConfigError(f"{where[-1]}: missing key {key!r}; {store.rebuild_hint(where[-1])}") from None


def _load_federated(partition_dir: Path, public_dir, device, participants, where, holdout: bool = False) -> FederatedData:
    manifest = store.read_manifest(partition_dir)
    num_classes = store.check_num_classes(manifest, str(partition_dir / store.MANIFEST))
    shape = tuple(manifest["image_shape"])
    order = manifest["participants_order"]
    if participants is not None:
        unknown = [p for p in participants if p not in order]
        if unknown:
            raise ConfigError(f"unknown participant(s) {unknown} in {partition_dir}; valid: {', '.join(order)}")
        order = [p for p in order if p in participants]
    clients = []
    for name in order:
        info = manifest["participants"][name]
        splits = {}
        for split in info["splits"]:
            x, y = store.load_split(partition_dir / name, split)
            store.check_loaded(x, y, {"shape": list(shape), **info["splits"][split]}, num_classes,
                               f"participant {name!r} split {split!r}", partition_dir)
            splits[split] = (x, y)
        if holdout and "val" not in splits:
            splits.update(split_holdout(splits, info, partition_dir / name, f"participant {name!r}"))
        splits = {k: (torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for k, (x, y) in splits.items()}
        clients.append(ClientData(name=name, domain=info["domain"], splits=splits))
    manifests = {f"partition/{manifest['name']}": store.sha256_file(partition_dir / store.MANIFEST)}
    public = None
    public_name = None
    if public_dir is not None:
        where.append(Path(public_dir) / store.MANIFEST)
        pm = store.read_manifest(public_dir)
        px, py = store.load_split(public_dir, "train")
        if px.dtype != np.uint8 or px.ndim != 4:
            raise ConfigError(f"{public_dir} split 'train': images are {px.dtype} with {px.ndim} dims, "
                              "expected uint8 N x C x H x W; rebuild it with `dvc repro`")
        public = torch.from_numpy(to_format(px, shape)).to(device)
        public_name = pm["name"]
        manifests[f"public/{public_name}"] = store.sha256_file(Path(public_dir) / store.MANIFEST)
    return FederatedData(
        scenario=manifest["name"], num_classes=num_classes, image_shape=shape,
        clients=clients, public=public, public_name=public_name, manifests=manifests,
    )


def split_holdout(splits: Dict[str, Tuple[np.ndarray, np.ndarray]], info: dict, folder: Path, who: str):
    """``private`` minus the participant's validation holdout, and the holdout as ``val`` (issue 36).
    The positions file is one of the partition's hashed files (verified with the others before a run)."""
    entry = info.get("holdout")
    if not entry or "private" not in splits:
        raise ConfigError(f"{who} of {folder.parent} has no validation split and no recorded holdout: "
                          "give its scenario `holdout: <fraction > 0>` in params/data.yaml (default 0.2) and run `dvc repro`")
    pos = np.load(folder / entry["file"])
    x, y = splits["private"]
    keep = np.ones(len(y), dtype=bool)
    keep[pos] = False
    if int((~keep).sum()) != int(entry["n"]):
        raise ConfigError(f"{folder / entry['file']}: {int((~keep).sum())} holdout rows, the manifest says "
                          f"{entry['n']}; rebuild it with `dvc repro`")
    return {"private": (np.ascontiguousarray(x[keep]), np.ascontiguousarray(y[keep])),
            "val": (np.ascontiguousarray(x[pos]), np.ascontiguousarray(y[pos]))}
