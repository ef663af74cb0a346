"""FedMMD / FedFusion partitions (Yao et al. 2019, § 4) of MNIST and CIFAR-10.

* ``<dataset>_binary``: 2 clients x 5 disjoint classes ("binary separated non-IID");
  each client holds every training image of its classes.
* ``<dataset>_shards``: McMahan et al.'s pathological split: sort by label, cut into
  200 shards of 300 (MNIST; CIFAR-10: 250, i.e. train size / shards), 2 shards for each
  of 100 clients.
* ``mnist_permuted``: user-specific non-IID: the training set dealt IID to the clients,
  each client applying its own fixed pixel permutation to its images (train and test).
* ``<dataset>_iid``: the training set dealt uniformly at random.
* ``<dataset>_dirichlet``: label skew: each class spread over the clients with
  proportions drawn from Dirichlet(alpha) (redrawn until every client has ``min_size``).

Test data (the papers evaluate the global model on the dataset's test set):
``test_mode: full`` gives every client the whole test set (binary: restricted to its
classes; permuted: in its permutation); ``test_mode: slice`` deals the test set into
disjoint slices, one per client, so pooling every client's test split gives the test
set exactly once (the default with 100 clients: full copies would store the test set
100 times, 3 GB for CIFAR-10). Participants are ``client000``, ``client001``...; each
is its own domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Literal, Optional, Tuple

import numpy as np

from ...errors import ConfigError
from ..registry import SCENARIOS, Participant, ScenarioSpec, Split
from ..store import load_split
from .common import make_split, seeds

SHAPES = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


def client_names(n: int) -> Tuple[str, ...]:
    return tuple(f"client{i:03d}" for i in range(n))


# ------------------------------------------------------------ pure partitioners


def binary_split(labels: np.ndarray, groups: Tuple[Tuple[int, ...], ...]) -> List[np.ndarray]:
    """Rows of each group of classes (every row of those classes)."""
    return [np.flatnonzero(np.isin(labels, g)) for g in groups]


def shard_split(labels: np.ndarray, shards: int, per_client: int, shard_size: int,
                rng: np.random.Generator) -> List[np.ndarray]:
    """Sort rows by label (random order inside a class), cut ``shards`` shards of
    ``shard_size``, give ``per_client`` random shards to each client."""
    size = shard_size or len(labels) // shards
    if shards % per_client:
        raise ConfigError(f"shards ({shards}) must be a multiple of per_client ({per_client})")
    if shards * size > len(labels) or size < 1:
        raise ConfigError(f"{shards} shards of {size} need {shards * size} images, {len(labels)} available")
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    cut = order[: shards * size].reshape(shards, size)
    owner = rng.permutation(shards).reshape(shards // per_client, per_client)
    return [np.sort(cut[own].ravel()) for own in owner]


def iid_split(n: int, clients: int, rng: np.random.Generator) -> List[np.ndarray]:
    """``range(n)`` shuffled and dealt into ``clients`` near-equal parts."""
    if clients > n:
        raise ConfigError(f"{clients} clients for {n} images")
    return [np.sort(part) for part in np.array_split(rng.permutation(n), clients)]


def dirichlet_split(labels: np.ndarray, clients: int, alpha: float, min_size: int,
                    rng: np.random.Generator, attempts: int = 1000) -> List[np.ndarray]:
    """Label skew: each class's rows split over clients with Dirichlet(alpha) proportions;
    redrawn until every client holds at least ``min_size`` rows."""
    for _ in range(attempts):
        parts: List[list] = [[] for _ in range(clients)]
        for c in np.unique(labels):
            rows = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(rows)).astype(int)[:-1]
            for k, piece in enumerate(np.split(rows, cuts)):
                parts[k].append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ConfigError(f"no Dirichlet({alpha}) draw gave every one of {clients} clients {min_size} images "
                     f"in {attempts} attempts; lower min_size or clients, or raise alpha")


def client_test_rows(labels: np.ndarray, clients: int, mode: str, rng: np.random.Generator,
              classes: Optional[List[Tuple[int, ...]]] = None) -> List[np.ndarray]:
    """Each client's test rows: the whole test set (restricted to ``classes[i]``) or a slice."""
    if mode == "slice":
        return iid_split(len(labels), clients, rng)
    if classes is not None:
        return binary_split(labels, tuple(classes))
    return [np.arange(len(labels))] * clients


# ------------------------------------------------------------------- parameters

TestMode = Literal["full", "slice"]


@dataclass(frozen=True)
class BinaryParams:
    groups: Tuple[Tuple[int, ...], ...] = ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))  # classes of each client (disjoint)

    def __post_init__(self):
        flat = [c for g in self.groups for c in g]
        if len(flat) != len(set(flat)) or not all(0 <= c < 10 for c in flat) or len(self.groups) < 2:
            raise ValueError(f"groups must be >= 2 disjoint sets of classes 0-9, got {self.groups}")


@dataclass(frozen=True)
class ShardsParams:
    shards: int = 200  # McMahan et al.: 200 shards ...
    per_client: int = 2  # ... 2 per client, hence 100 clients
    shard_size: int = 0  # images per shard; 0 = train size / shards (MNIST 300, CIFAR-10 250)
    test_mode: TestMode = "slice"  # "full" copies the whole test set to each of the 100 clients
    seed: int = 0  # order inside a class, shard owners, test slices


@dataclass(frozen=True)
class PermutedParams:
    clients: int = 10  # the paper does not say; 10 permutations keep the test copies small (78 MB)
    test_mode: TestMode = "full"  # every client: the whole test set in its own permutation
    seed: int = 0  # data deal and permutations


@dataclass(frozen=True)
class IidParams:
    clients: int = 100  # as McMahan et al.'s IID MNIST split (600 images each)
    test_mode: TestMode = "slice"
    seed: int = 0


@dataclass(frozen=True)
class DirichletParams:
    clients: int = 100  # as the shards split
    alpha: float = 0.5  # concentration: small = strong label skew (0.1 extreme, 100 near IID)
    min_size: int = 10  # redraw until every client holds this many training images
    test_mode: TestMode = "slice"
    seed: int = 0

    def __post_init__(self):
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")


# ---------------------------------------------------------------------- builders


def _assemble(dataset: str, train_rows, test_rows, dirs, transform: Optional[List[Callable]] = None):
    shape = SHAPES[dataset]
    x, y = load_split(dirs[dataset], "train", mmap=True)
    xt, yt = load_split(dirs[dataset], "test", mmap=True)
    parts = {}
    for i, (name, tr, te) in enumerate(zip(client_names(len(train_rows)), train_rows, test_rows)):
        splits = {"private": make_split(x, y, tr, f"{dataset}/train", shape),
                  "test": make_split(xt, yt, te, f"{dataset}/test", shape)}
        if transform is not None:
            splits = {k: Split(transform[i](s.images), s.labels, s.index, s.source) for k, s in splits.items()}
        parts[name] = Participant(name, splits)
    return parts


def _binary(dataset):
    def build(dirs: Dict[str, Path], p: BinaryParams):
        _, y = load_split(dirs[dataset], "train", mmap=True)
        _, yt = load_split(dirs[dataset], "test", mmap=True)
        return _assemble(dataset, binary_split(np.asarray(y), p.groups),
                         client_test_rows(np.asarray(yt), len(p.groups), "full", None, list(p.groups)), dirs)
    return build


def _shards(dataset):
    def build(dirs: Dict[str, Path], p: ShardsParams):
        rng_train, rng_test = seeds(p.seed, 2)
        _, y = load_split(dirs[dataset], "train", mmap=True)
        _, yt = load_split(dirs[dataset], "test", mmap=True)
        train = shard_split(np.asarray(y), p.shards, p.per_client, p.shard_size, rng_train)
        return _assemble(dataset, train, client_test_rows(np.asarray(yt), len(train), p.test_mode, rng_test), dirs)
    return build


def _iid(dataset):
    def build(dirs: Dict[str, Path], p: IidParams):
        rng_train, rng_test = seeds(p.seed, 2)
        _, y = load_split(dirs[dataset], "train", mmap=True)
        _, yt = load_split(dirs[dataset], "test", mmap=True)
        return _assemble(dataset, iid_split(len(y), p.clients, rng_train),
                         client_test_rows(np.asarray(yt), p.clients, p.test_mode, rng_test), dirs)
    return build


def _dirichlet(dataset):
    def build(dirs: Dict[str, Path], p: DirichletParams):
        rng_train, rng_test = seeds(p.seed, 2)
        _, y = load_split(dirs[dataset], "train", mmap=True)
        _, yt = load_split(dirs[dataset], "test", mmap=True)
        train = dirichlet_split(np.asarray(y), p.clients, p.alpha, p.min_size, rng_train)
        return _assemble(dataset, train, client_test_rows(np.asarray(yt), p.clients, p.test_mode, rng_test), dirs)
    return build


def pixel_permuter(perm: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Apply one fixed permutation to the pixels (H*W) of every image, same for each channel."""
    def apply(images: np.ndarray) -> np.ndarray:
        n, c, h, w = images.shape
        return np.ascontiguousarray(images.reshape(n, c, h * w)[:, :, perm].reshape(n, c, h, w))
    return apply


def _permuted(dataset):
    def build(dirs: Dict[str, Path], p: PermutedParams):
        rng_train, rng_test, rng_perm = seeds(p.seed, 3)
        _, y = load_split(dirs[dataset], "train", mmap=True)
        _, yt = load_split(dirs[dataset], "test", mmap=True)
        _, h, w = SHAPES[dataset]
        perms = [pixel_permuter(rng_perm.permutation(h * w)) for _ in range(p.clients)]
        return _assemble(dataset, iid_split(len(y), p.clients, rng_train),
                         client_test_rows(np.asarray(yt), p.clients, p.test_mode, rng_test), dirs, perms)
    return build


# ---------------------------------------------------------------------- registry

# kind: (params, builder factory, participants from params, description)
KINDS = {
    "binary": (BinaryParams, _binary, lambda p: client_names(len(p.groups)),
               "2 clients x 5 disjoint classes, test = the test images of the client's classes"),
    "shards": (ShardsParams, _shards, lambda p: client_names(p.shards // p.per_client),
               "sorted by label, 200 shards, 2 per client, 100 clients"),
    "permuted": (PermutedParams, _permuted, lambda p: client_names(p.clients),
                 "IID deal, each client a fixed pixel permutation"),
    "iid": (IidParams, _iid, lambda p: client_names(p.clients), "IID deal to 100 clients"),
    "dirichlet": (DirichletParams, _dirichlet, lambda p: client_names(p.clients),
                  "Dirichlet(alpha) label skew over 100 clients"),
}
REGISTERED = (("mnist", "binary"), ("mnist", "shards"), ("mnist", "permuted"), ("mnist", "iid"),
              ("mnist", "dirichlet"), ("cifar10", "binary"), ("cifar10", "shards"), ("cifar10", "iid"),
              ("cifar10", "dirichlet"))

for _dataset, _kind in REGISTERED:
    _params, _factory, _participants, _doc = KINDS[_kind]
    SCENARIOS.add(f"{_dataset}_{_kind}", ScenarioSpec(
        name=f"{_dataset}_{_kind}", build=_factory(_dataset), datasets=(_dataset,),
        sources=(lambda d: lambda p: (d,))(_dataset), participants=_participants,
        image_shape=SHAPES[_dataset], num_classes=10, paper="FedMMD/FedFusion § 4", params=_params,
        metric_topk=(1, 5), headline_topk=1, doc=f"{_dataset.upper()}: {_doc}"))
