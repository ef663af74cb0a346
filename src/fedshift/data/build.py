"""Drivers of the DVC stages: fetch a dataset, sample a public set, partition a scenario.

Each writes its output folder atomically (:func:`store.atomic_dir`) and ends with a
manifest, so an interrupted stage leaves the previous output intact and nothing
half-written that a rerun would take for finished.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

import numpy as np

from ..config import resolve, to_dict
from ..errors import ConfigError
from . import store
from .registry import DATASETS, PUBLIC_SETS, SCENARIOS, FetchContext

log = logging.getLogger(__name__)

# Validation holdout (issue 36): the fraction of each participant's private data that a scenario
# without a validation split keeps apart for tuning and best-validation selection (FLGo-Bench's
# ``train_holdout`` = 0.2); ``holdout: <fraction>`` under a scenario in params/data.yaml changes it
# (0: none). Only the positions are stored (``private_holdout.npy``); a run uses them when it asks for
# validation (data.loading.load_federated(holdout=True)), else trains on all of private.
HOLDOUT = 0.2
HOLDOUT_FILE = "private_holdout.npy"
HOLDOUT_KEY = "holdout"


def split_holdout_key(overrides: Optional[Mapping[str, Any]]):
    """(holdout fraction, the scenario's own parameters): ``holdout`` is read by the partition stage,
    not by the scenario's Params dataclass."""
    rest = dict(overrides or {})
    fraction = rest.pop(HOLDOUT_KEY, HOLDOUT)
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction < 1:
        raise ConfigError(f"{HOLDOUT_KEY}: {fraction!r} is not a fraction in [0, 1) (default {HOLDOUT})")
    return float(fraction), rest


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


def build_public(name: str, dataset_dir: Path, out_dir: Path, overrides: Optional[Mapping] = None,
                 seed: Optional[int] = None) -> dict:
    """Sample the unlabeled public set ``name`` from its dataset folder into ``out_dir``; ``seed``
    replaces its parameters' seed (``engine.data_seed: run``: each run seed draws its own subset, as
    the authors' code does, fccl+/datasets/utils/public_dataset.py:70-79)."""
    spec = PUBLIC_SETS.get(name, key="public")
    if seed is not None:
        overrides = {**(overrides or {}), "seed": public_seed_override(name, seed)}
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


_SECTIONS = {"dataset": ("dataset_params", DATASETS), "public": ("public", PUBLIC_SETS),
             "partition": ("scenarios", SCENARIOS)}


def built_disagreement(folder: Path, data: Mapping[str, Any], seed: Optional[int] = None,
                       protocol: Optional[str] = None) -> Optional[Tuple[str, Any, Any]]:
    """``(key, built value, asked value)`` of the first parameter where the data built in ``folder`` (its
    manifest's ``params``) differs from what the data params ``data`` (a params/data.yaml mapping) ask of it,
    e.g. ``("scenarios.rotmnist.seed", 0, 1)``; None when they agree, when nothing is built there or its
    manifest records no parameters (issue 51 R18: a grid's ``data_params`` that disagreed with the built
    partition trained on the built one, silently). ``seed``: the run seed a redrawn partition
    (``engine.data_seed: run``) or public set was drawn with, in place of the scenario's own; ``protocol``:
    the test protocol a grid's own partition was drawn under (issue 47, ``build/partitions_<protocol>/...``).

    Only keys both sides know are compared, plus every key ``data`` sets itself: a parameter a newer
    fedshift added at its old default does not make older data disagree. A partition's validation
    holdout (``scenarios.<s>.holdout``) is compared with the fraction its manifest recorded."""
    import json

    path = Path(folder) / store.MANIFEST
    if not path.exists():
        return None
    manifest = store.read_manifest(Path(folder))
    kind, name, built = manifest.get("kind"), manifest.get("name"), manifest.get("params")
    if kind not in _SECTIONS or not isinstance(name, str) or not isinstance(built, dict):
        return None
    section, registry = _SECTIONS[kind]
    spec = registry.get(name, key=section)
    given = dict((data.get(section) or {}).get(name) or {})
    where = f"{section}.{name}"
    if kind == "partition":
        fraction, given = split_holdout_key(given)
        parts = [p for p in (manifest.get("participants") or {}).values() if isinstance(p, dict)]
        held = [p["holdout"].get("fraction") for p in parts if isinstance(p.get("holdout"), dict)]
        has_val = any("val" in (p.get("splits") or {}) for p in parts)
        if parts and not has_val and (held[0] if held else 0.0) != fraction:
            return f"{where}.{HOLDOUT_KEY}", held[0] if held else 0.0, fraction
        if protocol is not None:
            given = with_protocol(name, given, protocol)
    asked = to_dict(resolve_params(spec, given, where)) if spec.params is not None else {}
    if seed is not None:
        asked["seed"] = seed
    plain = lambda v: json.loads(json.dumps(v))  # noqa: E731  tuples as lists, as the manifest holds them
    asked, built = plain(asked), plain(built)
    if "test_protocol" in asked:  # a manifest records test_protocol only when it is not clean (recorded_params)
        built.setdefault("test_protocol", "clean")
    for key in sorted((set(asked) & set(built)) | set(given)):
        if asked.get(key, "absent") != built.get(key, "absent"):
            return f"{where}.{key}", built.get(key, "absent"), asked.get(key, "absent")
    return None


def _checked_seed(kind: str, name: str, params_cls, seed: int) -> int:
    import dataclasses

    if not params_cls or "seed" not in {f.name for f in dataclasses.fields(params_cls)}:
        raise ConfigError(f"engine.data_seed: run: {kind} {name!r} has no `seed` parameter, so it cannot be "
                          f"redrawn per run seed; use data_seed: fixed for it")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed: {seed!r} must be a non-negative integer")
    return seed


def seed_override(name: str, seed: int) -> int:
    """``seed`` for scenario ``name``'s draw (``engine.data_seed: run``); a scenario without a ``seed``
    parameter cannot be redrawn: one line saying so."""
    return _checked_seed("scenario", name, SCENARIOS.get(name, key="scenarios").params, seed)


def public_seed_override(name: str, seed: int) -> int:
    """``seed`` for public set ``name``'s draw (``engine.data_seed: run``); one line when it has no ``seed``."""
    return _checked_seed("public set", name, PUBLIC_SETS.get(name, key="public").params, seed)


def protocol_of(params) -> str:
    """The test protocol a scenario's parameters build (issue 47): ``clean`` unless its Params has a
    ``test_protocol`` field set to ``authors``."""
    return getattr(params, "test_protocol", "clean")


TEST_PROTOCOLS = ("clean", "authors")


def with_protocol(name: str, overrides: Optional[Mapping[str, Any]], protocol: str) -> dict:
    """Scenario ``name``'s overrides under test protocol ``protocol`` (a grid's ``test_protocol``):
    ``test_protocol`` set where the scenario builds another partition for it; unchanged where its
    authors' code tests on the clean split (``authors_test`` without the Params field); one line
    where no authors' test is known."""
    spec = SCENARIOS.get(name, key="scenarios")
    if protocol not in TEST_PROTOCOLS:
        raise ConfigError(f"test_protocol: {protocol!r} is not valid; valid: {', '.join(TEST_PROTOCOLS)}")
    if protocol == "authors" and not spec.authors_test:
        raise ConfigError(f"test_protocol: authors: scenario {name!r} has no authors' test set to follow (no authors' "
                          "code is known for it, so its held-out test is the paper's); use test_protocol: clean")
    out = dict(overrides or {})
    if spec.builds_authors():
        out["test_protocol"] = protocol
    return out


def recorded_params(params) -> dict:
    """A scenario's parameters as its manifest records them: ``test_protocol`` only when it is not
    ``clean`` (absent = clean, as in a run's config), so clean partitions keep their bytes."""
    out = to_dict(params) if params is not None else {}
    if out.get("test_protocol") == "clean":
        out.pop("test_protocol")
    return out


def draw_partition(spec, name: str, dirs: Mapping[str, Path], params):
    """(participants, audit) of scenario ``name`` drawn in memory: under ``clean`` evaluation samples that
    duplicate a training image are dropped and any overlap left is an error; under ``authors`` the test
    keeps the whole folder as the authors' code does, training images included (the audit counts them)."""
    from .audit import audit_partition, drop_leaks, split_hashes

    parts = spec.build(dict(dirs), params)
    hashes = split_hashes(parts)  # each image hashed once for both checks
    if protocol_of(params) == "authors":
        audit = audit_partition(parts, hashes)
        audit.update(test_protocol="authors", eval_samples_removed_as_duplicates=0,
                     note="test_protocol authors: the test split holds training images by design (the authors' code)")
        return parts, audit
    removed = drop_leaks(parts, hashes)
    audit = audit_partition(parts, hashes)
    if not audit["disjoint_by_index"] or not audit["disjoint_by_hash"]:
        raise RuntimeError(f"scenario {name!r}: training and evaluation splits overlap: {audit['overlaps'][:5]}")
    audit["eval_samples_removed_as_duplicates"] = removed
    return parts, audit


def partition(name: str, dataset_dirs: Mapping[str, Path], out_dir: Path, overrides: Optional[Mapping] = None,
              holdout: Optional[float] = None) -> dict:
    """Partition scenario ``name`` into participants under ``out_dir`` with an audited manifest.

    ``holdout``: fraction of each participant's private split recorded as its validation holdout
    when the scenario gives it no ``val`` split (0: none); default: ``overrides['holdout']``, else
    :data:`HOLDOUT`."""
    spec = SCENARIOS.get(name, key="scenarios")
    fraction, overrides = split_holdout_key(overrides)
    holdout = fraction if holdout is None else holdout
    params = resolve_params(spec, overrides, f"scenarios.{name}")
    needed = spec.datasets_for(params)
    missing = [d for d in needed if d not in dataset_dirs or not (Path(dataset_dirs[d]) / store.MANIFEST).exists()]
    if missing:
        raise ConfigError(
            f"scenario {name!r} needs dataset(s) {', '.join(missing)}: add them to `datasets` in "
            "params/data.yaml and run `dvc repro`"
        )
    parts, audit = draw_partition(spec, name, {d: Path(dataset_dirs[d]) for d in needed}, params)
    try:
        return _write_partition(name, spec, params, needed, dataset_dirs, parts, audit, Path(out_dir), holdout)
    except OSError as exc:  # full disk / ulimit -f: numpy's "470400 requested and 266112 written" (issue 38)
        needed_bytes = sum(store.tensor_bytes([s.images, s.labels]) * 2 for p in parts.values() for s in p.splits.values())
        raise store.write_failure(f"partition {name!r}", Path(out_dir).parent, needed_bytes, exc) from None


def _write_partition(name, spec, params, needed, dataset_dirs, parts, audit, out_dir: Path,
                     holdout: float = HOLDOUT) -> dict:
    with store.atomic_dir(Path(out_dir)) as tmp:
        participants = {}
        for pname, part in parts.items():
            pdir = tmp / pname
            participants[pname] = {"domain": part.domain, "splits": {}}
            for split, s in part.splits.items():
                store.save_split(pdir, split, s.images, s.labels)
                np.save(pdir / f"{split}_index.npy", np.asarray(s.index, dtype=np.int64))
                participants[pname]["splits"][split] = {**store.split_summary(s.images, s.labels), "source": s.source}
            held = record_holdout(pdir, part, holdout, getattr(params, "seed", 0), list(parts).index(pname))
            if held:
                participants[pname]["holdout"] = held
        info = {
            "kind": "partition",
            "name": name,
            "paper": spec.paper,
            "image_shape": list(spec.image_shape),
            "num_classes": spec.num_classes,
            "participants_order": list(parts),
            "params": recorded_params(params),
            "datasets": {
                d: store.sha256_file(Path(dataset_dirs[d]) / store.MANIFEST) for d in needed
            },
            "participants": participants,
            "audit": audit,
        }
        return store.write_manifest(tmp, info)


def record_holdout(pdir: Path, part, fraction: float, seed: int, k: int) -> Optional[dict]:
    """Write participant ``k``'s validation holdout (positions into its private split) and return
    its manifest entry; None when the scenario has a ``val`` split, no private split, or fraction 0."""
    from .scenarios.common import HOLDOUT_STREAM, holdout_positions

    if not fraction or "val" in part.splits or "private" not in part.splits:
        return None
    priv = part.splits["private"]
    pos = holdout_positions(priv.labels, float(fraction), seed, k)
    np.save(Path(pdir) / HOLDOUT_FILE, pos.astype(np.int64))
    classes, counts = np.unique(priv.labels[pos], return_counts=True)
    return {"of": "private", "fraction": float(fraction), "n": int(len(pos)), "file": HOLDOUT_FILE,
            "stream": [HOLDOUT_STREAM, int(seed), int(k)],
            "class_counts": {str(int(c)): int(n) for c, n in zip(classes, counts)},
            "source_index_sha256": hashlib.sha256(np.asarray(priv.index, dtype=np.int64)[pos].tobytes()).hexdigest()}
