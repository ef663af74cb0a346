"""Tuning leak guard (issue 47): no validation image of a tuning seed may be a test image of a
reported seed.

A tuning candidate scores its candidates on validation images (each participant's ``val`` split,
else the validation holdout of its private split, :func:`.build.record_holdout`); the grid then
reports test accuracy of other seeds. Where a seed redraws the test split (``engine.data_seed: run``
on a scenario whose test depends on ``seed``), or where the test holds training images (``test_protocol:
authors``), the images chosen on can be the images reported on: 76-87 of 100 validation images of
tuning seed 7 lay in the test sets of seeds 0-2 of ``mnist5k_permuted``.

Counted twice, as :mod:`.audit` does within one partition: by source row (``<dataset>/<split>`` and
row, whatever the participant: a rotated or recoloured copy of a row is the same image) and by the
hash of the stored pixels. The rows are read from the built partitions when they exist, else drawn
in memory from the fetched datasets exactly as ``fedshift partition`` would draw them; with neither
(before ``dvc repro``) :func:`structural` says what the scenario's construction guarantees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from . import store
from .registry import SCENARIOS


@dataclass(frozen=True)
class Draw:
    """One partition a run reads: its folder and how to draw it (scenario + its data-file overrides,
    ``holdout`` and ``test_protocol`` included, with the seed it is drawn with)."""

    scenario: str
    folder: str
    overrides: Mapping = field(default_factory=dict)


@dataclass
class Rows:
    """Images of one role: (source, row) pairs and pixel hashes, one entry per image."""

    keys: List[Tuple[str, int]] = field(default_factory=list)
    hashes: List[str] = field(default_factory=list)

    def add(self, source: str, index, hashes) -> None:
        self.keys += [(source, int(i)) for i in np.asarray(index).tolist()]
        self.hashes += list(hashes)


def _from_folder(folder: Path, role: str) -> Rows:
    manifest = store.read_manifest(folder)
    out = Rows()
    for pname, info in manifest["participants"].items():
        pdir = folder / pname
        splits = info["splits"]
        if role == "test":
            names = [s for s in ("test",) if s in splits]
            pos = None
        elif "val" in splits:
            names, pos = ["val"], None
        elif info.get("holdout"):
            names, pos = ["private"], np.load(pdir / info["holdout"]["file"])
        else:
            continue
        for split in names:
            x, _ = store.load_split(pdir, split, mmap=True)
            index = np.load(pdir / f"{split}_index.npy")
            if pos is not None:
                x, index = x[pos], index[pos]
            out.add(splits[split]["source"], index, store.image_hashes(np.asarray(x)))
    return out


def _drawn(draw: Draw, datasets: Path, role: str) -> Optional[Rows]:
    """The role's rows drawn in memory, or None when a dataset the scenario reads is not fetched."""
    from .build import draw_partition, resolve_params, split_holdout_key
    from .scenarios.common import holdout_positions

    spec = SCENARIOS.get(draw.scenario, key="scenarios")
    fraction, overrides = split_holdout_key(draw.overrides)
    params = resolve_params(spec, overrides, f"scenarios.{draw.scenario}")
    needed = spec.datasets_for(params)
    if not all((Path(datasets) / d / store.MANIFEST).is_file() for d in needed):
        return None
    parts, _ = draw_partition(spec, draw.scenario, {d: Path(datasets) / d for d in needed}, params)
    out = Rows()
    for k, part in enumerate(parts.values()):
        if role == "test":
            s = part.splits.get("test")
            picked = [(s, None)] if s is not None else []
        elif "val" in part.splits:
            picked = [(part.splits["val"], None)]
        elif "private" in part.splits and fraction:
            priv = part.splits["private"]
            picked = [(priv, holdout_positions(priv.labels, float(fraction), getattr(params, "seed", 0), k))]
        else:
            picked = []
        for s, pos in picked:
            images, index = (s.images, s.index) if pos is None else (s.images[pos], np.asarray(s.index)[pos])
            out.add(s.source, index, store.image_hashes(np.asarray(images)))
    return out


def rows(draw: Draw, datasets: Path, role: str) -> Optional[Rows]:
    """``role`` (``val``: what tuning scores on; ``test``) of a partition: from its folder when built,
    else drawn from the datasets, else None."""
    folder = Path(draw.folder)
    if (folder / store.MANIFEST).is_file():
        return _from_folder(folder, role)
    return _drawn(draw, datasets, role)


def count_leaks(tuning: Sequence[Draw], reported: Sequence[Draw], datasets: Path) -> Optional[int]:
    """How many validation images of the tuning draws are test images of the reported draws, by source
    row or by pixel hash (an image counted once per tuning draw); None when some draw cannot be read."""
    test_keys: Set[Tuple[str, int]] = set()
    test_hashes: Set[str] = set()
    cache: Dict[Tuple[str, str], Optional[Rows]] = {}

    def get(d: Draw, role: str) -> Optional[Rows]:
        if (d.folder, role) not in cache:
            cache[d.folder, role] = rows(d, datasets, role)
        return cache[d.folder, role]

    for d in {d.folder: d for d in reported}.values():
        r = get(d, "test")
        if r is None:
            return None
        test_keys.update(r.keys)
        test_hashes.update(r.hashes)
    total = 0
    for d in {d.folder: d for d in tuning}.values():
        v = get(d, "val")
        if v is None:
            return None
        total += sum(1 for key, h in zip(v.keys, v.hashes) if key in test_keys or h in test_hashes)
    return total


def structural(scenario: str, params, same_folder: bool) -> str:
    """What the scenario's construction says before any data is built: ``certain`` (its test holds its
    training images: ``test_protocol: authors`` on a scenario that builds it), ``none`` (tuning and
    reported runs read one clean partition, whose audit proves validation, a part of private, disjoint
    from test by row and by hash; or a clean test the seed does not redraw, disjoint by row from the
    pool private is drawn from) or ``possible`` (the seed redraws the test split)."""
    from .build import protocol_of

    spec = SCENARIOS.get(scenario, key="scenarios")
    if spec.builds_authors() and protocol_of(params) == "authors":
        return "certain"
    if same_folder:
        return "none"
    seeded = set(spec.seeded_splits(params))
    return "possible" if seeded & {"test", "partition"} else "none"


__all__ = ["Draw", "Rows", "count_leaks", "rows", "structural"]
