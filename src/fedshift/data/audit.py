"""Split audit: proves training and evaluation data never share a sample.

Checked twice: by source index (``<dataset>/<split>`` + row) and by image content
(hash of the stored pixels), so a duplicate image inside a source dataset cannot leak
from a private set into a test set either. Evaluation samples whose pixels also occur
in training data are removed before the partition is written (:func:`drop_leaks`) and
counted in the manifest.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List

import numpy as np

from .registry import EVAL_SPLITS, Participant, Split
from .store import image_hashes


def _roles(parts: Dict[str, Participant]):
    for pname, part in parts.items():
        for split, s in part.splits.items():
            role = "train" if split not in EVAL_SPLITS else "eval"
            yield pname, split, role, s


def drop_leaks(parts: Dict[str, Participant]) -> int:
    """Remove eval samples whose image also occurs in any training split; return how many."""
    train_hashes = set()
    for _, _, role, s in _roles(parts):
        if role == "train":
            train_hashes.update(image_hashes(s.images).tolist())
    removed = 0
    for _, split, role, s in list(_roles(parts)):
        if role != "eval" or len(s.images) == 0:
            continue
        keep = ~np.isin(image_hashes(s.images), list(train_hashes))
        if not keep.all():
            removed += int((~keep).sum())
            s.images, s.labels, s.index = s.images[keep], s.labels[keep], s.index[keep]
    return removed


def audit_partition(parts: Dict[str, Participant]) -> dict:
    """Check role disjointness by index and by hash; count duplicates inside each source."""
    index_roles: Dict[str, Dict[int, set]] = defaultdict(lambda: defaultdict(set))
    hash_roles: Dict[str, set] = defaultdict(set)
    overlaps: List[str] = []
    source_dups: Dict[str, int] = {}
    per_source_hashes: Dict[str, Dict[int, str]] = defaultdict(dict)
    for pname, split, role, s in _roles(parts):
        hashes = image_hashes(s.images)
        for i, h in zip(s.index.tolist(), hashes.tolist()):
            index_roles[s.source][i].add(role)
            hash_roles[h].add(role)
        # Rotated/styled copies share an index but not pixels; count source duplicates on
        # the identity domain only (first participant to use each index).
        for i, h in zip(s.index.tolist(), hashes.tolist()):
            per_source_hashes[f"{s.source}@{part_domain(parts, pname)}"].setdefault(i, h)
    for src, rows in index_roles.items():
        bad = [i for i, roles in rows.items() if len(roles) > 1]
        overlaps += [f"{src}#{i}" for i in bad[:10]]
    n_hash_overlap = sum(1 for roles in hash_roles.values() if len(roles) > 1)
    for key, rows in per_source_hashes.items():
        values = list(rows.values())
        source_dups[key] = len(values) - len(set(values))
    return {
        "disjoint_by_index": not overlaps,
        "disjoint_by_hash": n_hash_overlap == 0,
        "overlaps": overlaps,
        "hash_overlaps": n_hash_overlap,
        "duplicate_images_in_sources": source_dups,
    }


def part_domain(parts: Dict[str, Participant], pname: str) -> str:
    return parts[pname].domain


__all__ = ["audit_partition", "drop_leaks", "Split"]
