"""Registries of datasets, public sets and scenarios, and their spec types.

* A **dataset** is fetched once into ``build/datasets/<name>/`` (splits + manifest).
* A **public set** is an unlabeled sample of a dataset written to ``build/public/<name>/``.
* A **scenario** partitions datasets into participants (private / val / test / labeled
  public seed) under ``build/partitions/<name>/``.

Each spec carries a parameter dataclass with commented defaults; ``params/data.yaml``
holds only overrides, checked key by key (see :func:`fedshift.config.resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from ..registry import Registry

def _is(cls_name: str):
    return lambda obj: "" if type(obj).__name__ == cls_name else f"not a fedshift.data.registry.{cls_name}"


# Entry-point groups: installed packages add their own (see fedshift.registry, docs/extending.md).
DATASETS: "Registry[DatasetSpec]" = Registry("dataset", group="fedshift.datasets", check=_is("DatasetSpec"))
PUBLIC_SETS: "Registry[PublicSpec]" = Registry("public set", group="fedshift.public_sets", check=_is("PublicSpec"))
SCENARIOS: "Registry[ScenarioSpec]" = Registry("scenario", group="fedshift.scenarios", check=_is("ScenarioSpec"))


@dataclass(frozen=True)
class FetchContext:
    """Everything a fetcher may use besides its own parameters."""

    data_dir: Path = Path("data")  # archives supplied by hand (tracked by data.dvc)
    cache_dir: Path = Path("build/downloads")  # downloaded archives, reused across runs
    mirror: Optional[str] = None  # replaces every download's base URL when set


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    fetch: Callable[..., Dict[str, Any]]  # fetch(out_dir, ctx, params) -> manifest info; writes splits
    num_classes: int
    source: str  # where it comes from (URL, package or manual)
    licence: str
    offline: bool  # True when it needs no download (shipped inside a wheel)
    doc: str = ""
    params: Any = None  # a dataclass type with the fetcher's parameters, or None
    manual: str = ""  # manual steps, when the data cannot be downloaded by script


@dataclass(frozen=True)
class PublicSpec:
    name: str
    dataset: str  # dataset it samples from
    split: str = "train"
    doc: str = ""
    params: Any = None


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    build: Callable[..., Dict[str, Any]]  # build(dataset_dirs, params) -> {participant: {split: (x, y, idx)}}
    datasets: Tuple[str, ...]  # datasets the partition reads (possibly depending on params)
    image_shape: Tuple[int, int, int]  # (C, H, W) every participant's data is stored at
    num_classes: int
    paper: str
    doc: str = ""
    params: Any = None
    metric_topk: Tuple[int, ...] = (1, 5)
    headline_topk: int = 1  # FCCL+ code: top-1 for Digits/Office-Caltech, top-5 for Office31/Home
    sources: Callable[[Any], Tuple[str, ...]] = field(default=None)  # params -> datasets read
    participants: Callable[[Any], Tuple[str, ...]] = field(default=None)  # params -> participant names
    # Test protocols (issue 47). ``clean`` (always): evaluation splits share no image with training data.
    # ``authors_test``: the test set of the authors' code for this scenario, cited file:line; "" = none
    # known (no public code), so ``test_protocol: authors`` is refused. A scenario whose Params has a
    # ``test_protocol`` field builds another partition under ``authors``; one without tests on the
    # clean split under both (the authors' code tests on it too).
    authors_test: str = ""
    # The splits its ``seed`` parameter draws (params -> names), the rest being the same at every seed:
    # what ``engine.data_seed: run`` redraws; None = every split.
    seeded: Optional[Callable[[Any], Tuple[str, ...]]] = field(default=None)

    def datasets_for(self, params) -> Tuple[str, ...]:
        return tuple(self.sources(params)) if self.sources else self.datasets

    def participants_for(self, params) -> Tuple[str, ...]:
        """Participant names in order, known from the parameters alone (before partitioning)."""
        return tuple(self.participants(params))

    def builds_authors(self) -> bool:
        """True when ``test_protocol: authors`` draws another partition (its Params has the field)."""
        import dataclasses

        return bool(self.params) and "test_protocol" in {f.name for f in dataclasses.fields(self.params)}

    def seeded_splits(self, params) -> Tuple[str, ...]:
        """The splits a new ``seed`` redraws (:attr:`seeded`); ``("partition",)`` when undeclared."""
        return tuple(self.seeded(params)) if self.seeded else ("partition",)


# Roles of a partition's splits: training data may never share an image with
# evaluation data (the FCCL+ authors' Office loaders tested on training images).
TRAIN_SPLITS = ("private", "public")
EVAL_SPLITS = ("val", "test")


@dataclass
class Split:
    """One split of one participant, as a scenario builder returns it."""

    images: Any  # uint8 N x C x H x W (numpy)
    labels: Any  # int64 N (numpy)
    index: Any  # int64 N: row of each sample in its source split
    source: str  # "<dataset>/<split>" the indices refer to


@dataclass
class Participant:
    domain: str  # the domain (dataset / rotation / style) this participant's data comes from
    splits: Dict[str, Split]
