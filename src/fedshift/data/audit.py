"""Split audit: proves training and evaluation data never share a sample.

Checked twice: by source index (``<dataset>/<split>`` + row) and by image content
(hash of the stored pixels), so a duplicate image inside a source dataset cannot leak
from a private set into a test set either. Evaluation samples whose pixels also occur
in training data are removed before the partition is written (:func:`drop_leaks`) and
counted in the manifest.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import numpy as np

from .registry import EVAL_SPLITS, Participant, Split
from .store import image_hashes


Hashes = Dict[Tuple[str, str], np.ndarray]  # (participant, split) -> image hashes


def _roles(parts: Dict[str, Participant]):
    for pname, part in parts.items():
        for split, s in part.splits.items():
            role = "train" if split not in EVAL_SPLITS else "eval"
            yield pname, split, role, s


def split_hashes(parts: Dict[str, Participant]) -> Hashes:
    """Hash every image of every split once (both checks below reuse them)."""
    return {(pname, split): image_hashes(s.images) for pname, split, _, s in _roles(parts)}


def drop_leaks(parts: Dict[str, Participant], hashes: Optional[Hashes] = None) -> int:
    """Remove eval samples whose image also occurs in any training split; return how many.

    ``hashes`` (from :func:`split_hashes`) is updated in place for the filtered splits.
    """
    hashes = split_hashes(parts) if hashes is None else hashes
    train_hashes = set()
    for pname, split, role, _ in _roles(parts):
        if role == "train":
            train_hashes.update(hashes[pname, split].tolist())
    removed = 0
    for pname, split, role, s in _roles(parts):
        if role != "eval" or len(s.images) == 0:
            continue
        keep = ~np.isin(hashes[pname, split], list(train_hashes))
        if not keep.all():
            removed += int((~keep).sum())
            s.images, s.labels, s.index = s.images[keep], s.labels[keep], s.index[keep]
            hashes[pname, split] = hashes[pname, split][keep]
    return removed


def audit_partition(parts: Dict[str, Participant], hashes: Optional[Hashes] = None) -> dict:
    """Check role disjointness by index and by hash; count duplicates inside each source."""
    hashes = split_hashes(parts) if hashes is None else hashes
    index_roles: Dict[str, Dict[int, set]] = defaultdict(lambda: defaultdict(set))
    hash_roles: Dict[str, set] = defaultdict(set)
    overlaps: List[str] = []
    # Rotated/styled copies share an index but not pixels, so source duplicates are counted
    # per (source, domain): one hash per source row within each domain.
    per_source_hashes: Dict[str, Dict[int, str]] = defaultdict(dict)
    for pname, split, role, s in _roles(parts):
        rows = per_source_hashes[f"{s.source}@{parts[pname].domain}"]
        for i, h in zip(s.index.tolist(), hashes[pname, split].tolist()):
            index_roles[s.source][i].add(role)
            hash_roles[h].add(role)
            rows.setdefault(i, h)
    for src, rows in index_roles.items():
        bad = [i for i, roles in rows.items() if len(roles) > 1]
        overlaps += [f"{src}#{i}" for i in bad[:10]]
    n_hash_overlap = sum(1 for roles in hash_roles.values() if len(roles) > 1)
    source_dups = {key: len(rows) - len(set(rows.values())) for key, rows in per_source_hashes.items()}
    return {
        "disjoint_by_index": not overlaps,
        "disjoint_by_hash": n_hash_overlap == 0,
        "overlaps": overlaps,
        "hash_overlaps": n_hash_overlap,
        "duplicate_images_in_sources": source_dups,
    }


__all__ = ["audit_partition", "drop_leaks", "split_hashes", "Split"]
