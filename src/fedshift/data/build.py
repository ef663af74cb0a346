"""Drivers of the DVC stages: fetch a dataset, sample a public set, partition a scenario.

Each writes its output folder atomically (:func:`store.atomic_dir`) and ends with a
manifest, so an interrupted stage leaves the previous output intact and nothing
half-written that a rerun would take for finished.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from ..config import resolve, to_dict
from ..errors import ConfigError
from . import store
from .registry import DATASETS, PUBLIC_SETS, SCENARIOS, FetchContext

log = logging.getLogger(__name__)


def _splits_of(folder: Path):
    return sorted(p.name[: -len("_labels.npy")] for p in Path(folder).glob("*_labels.npy"))


def resolve_params(spec, overrides: Optional[Mapping[str, Any]], where: str):
    if spec.params is None:
        if overrides:
            raise ConfigError(f"{where}: takes no parameters, got {sorted(overrides)}")
        return None
    return resolve(spec.params, overrides or {}, where)


def fetch_dataset(name: str, out_dir: Path, ctx: FetchContext, overrides: Optional[Mapping] = None) -> dict:
    """Fetch dataset ``name`` into ``out_dir`` (splits + manifest)."""
    spec = DATASETS.get(name, key="datasets")
    params = resolve_params(spec, overrides, f"datasets.{name}")
    with store.atomic_dir(Path(out_dir)) as tmp:
        extra = spec.fetch(tmp, ctx, params) or {}
        splits = {}
        for split in _splits_of(tmp):
            x, y = store.load_split(tmp, split, mmap=True)
            splits[split] = store.split_summary(x, y)
        if not splits:
            raise RuntimeError(f"fetcher of {name!r} wrote no split")
        info = {
            "kind": "dataset",
            "name": name,
            "source": spec.source,
            "licence": spec.licence,
            "num_classes": spec.num_classes,
            "params": to_dict(params) if params is not None else {},
            "splits": splits,
            **extra,
        }
        manifest = store.write_manifest(tmp, info)
    log.info("dataset %s: %s", name, {k: v["n"] for k, v in splits.items()})
    return manifest


def build_public(name: str, dataset_dir: Path, out_dir: Path, overrides: Optional[Mapping] = None) -> dict:
    """Sample the unlabeled public set ``name`` from its dataset folder into ``out_dir``."""
    spec = PUBLIC_SETS.get(name, key="public")
    params = resolve_params(spec, overrides, f"public.{name}")
    x, _ = store.load_split(dataset_dir, spec.split, mmap=True)
    n = getattr(params, "n", None) or len(x)
    if n > len(x):
        raise ConfigError(f"public.{name}.n: {n} samples asked, {spec.dataset}/{spec.split} has {len(x)}")
    rng = np.random.default_rng(getattr(params, "seed", 0))
    idx = np.sort(rng.choice(len(x), size=n, replace=False))
    with store.atomic_dir(Path(out_dir)) as tmp:
        images = np.asarray(x[idx])
        store.save_split(tmp, "train", images, np.full(n, -1, dtype=np.int64))
        np.save(tmp / "train_index.npy", idx.astype(np.int64))
        dup = len(images) - len(np.unique(store.image_hashes(images)))
        info = {
            "kind": "public",
            "name": name,
            "dataset": spec.dataset,
            "split": spec.split,
            "dataset_manifest": store.sha256_file(Path(dataset_dir) / store.MANIFEST),
            "params": to_dict(params) if params is not None else {},
            "splits": {"train": {"n": int(n), "shape": list(images.shape[1:])}},
            "duplicate_images": int(dup),
        }
        return store.write_manifest(tmp, info)


def seed_override(name: str, seed: int) -> int:
    """``seed`` for scenario ``name``'s draw (``engine.data_seed: run``); a scenario without a ``seed``
    parameter cannot be redrawn: one line saying so."""
    import dataclasses

    spec = SCENARIOS.get(name, key="scenarios")
    fields = {f.name for f in dataclasses.fields(spec.params)} if spec.params else set()
    if "seed" not in fields:
        raise ConfigError(f"engine.data_seed: run: scenario {name!r} has no `seed` parameter, so its partition "
                          "cannot be redrawn per run seed; use data_seed: fixed for it")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed: {seed!r} must be a non-negative integer")
    return seed


def partition(name: str, dataset_dirs: Mapping[str, Path], out_dir: Path, overrides: Optional[Mapping] = None) -> dict:
    """Partition scenario ``name`` into participants under ``out_dir`` with an audited manifest."""
    from .audit import audit_partition, drop_leaks, split_hashes

    spec = SCENARIOS.get(name, key="scenarios")
    params = resolve_params(spec, overrides, f"scenarios.{name}")
    needed = spec.datasets_for(params)
    missing = [d for d in needed if d not in dataset_dirs or not (Path(dataset_dirs[d]) / store.MANIFEST).exists()]
    if missing:
        raise ConfigError(
            f"scenario {name!r} needs dataset(s) {', '.join(missing)}: add them to `datasets` in "
            "params/data.yaml and run `dvc repro`"
        )
    parts = spec.build({d: Path(dataset_dirs[d]) for d in needed}, params)
    hashes = split_hashes(parts)  # each image hashed once for both checks
    removed = drop_leaks(parts, hashes)
    audit = audit_partition(parts, hashes)
    if not audit["disjoint_by_index"] or not audit["disjoint_by_hash"]:
        raise RuntimeError(f"scenario {name!r}: training and evaluation splits overlap: {audit['overlaps'][:5]}")
    audit["eval_samples_removed_as_duplicates"] = removed
    try:
        return _write_partition(name, spec, params, needed, dataset_dirs, parts, audit, Path(out_dir))
    except OSError as exc:  # full disk / ulimit -f: numpy's "470400 requested and 266112 written" (issue 38)
        needed_bytes = sum(store.tensor_bytes([s.images, s.labels]) * 2 for p in parts.values() for s in p.splits.values())
        raise store.write_failure(f"partition {name!r}", Path(out_dir).parent, needed_bytes, exc) from None


def _write_partition(name, spec, params, needed, dataset_dirs, parts, audit, out_dir: Path) -> dict:
    with store.atomic_dir(Path(out_dir)) as tmp:
        participants = {}
        for pname, part in parts.items():
            pdir = tmp / pname
            participants[pname] = {"domain": part.domain, "splits": {}}
            for split, s in part.splits.items():
                store.save_split(pdir, split, s.images, s.labels)
                np.save(pdir / f"{split}_index.npy", np.asarray(s.index, dtype=np.int64))
                participants[pname]["splits"][split] = {**store.split_summary(s.images, s.labels), "source": s.source}
        info = {
            "kind": "partition",
            "name": name,
            "paper": spec.paper,
            "image_shape": list(spec.image_shape),
            "num_classes": spec.num_classes,
            "participants_order": list(parts),
            "params": to_dict(params) if params is not None else {},
            "datasets": {
                d: store.sha256_file(Path(dataset_dirs[d]) / store.MANIFEST) for d in needed
            },
            "participants": participants,
            "audit": audit,
        }
        return store.write_manifest(tmp, info)
