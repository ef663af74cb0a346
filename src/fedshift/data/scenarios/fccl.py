"""FCCL+ scenarios (Huang et al., TPAMI; FCCL, CVPR 2022): Digits, Office-Caltech-10,
Office-31 and Office-Home, one participant per domain, everything at 3x32x32.

* ``digits``: MNIST / USPS / SVHN / SYN; private = 150 / 80 / 5,000 / 1,800 random
  images of each train split (Table V), or with ``sizing: fractions`` the authors'
  code's shares 0.23% / 1.3% / 13% / 23%; test = each domain's test split.
* ``office_caltech``, ``office31``: each domain split 80/20 (stratified); private = 48%
  of the 80% part; test = the held-out 20%.
* ``office_home``: private = 1,400 / 2,000 / 2,500 / 2,000 random images of Art /
  Clipart / Product / Real World; test = the rest of the domain. The authors' loaders
  tested on the whole domain folder, training images included; here test is held out.

No scenario has a labeled public split: the public data is an unlabeled public set
(``fedshift list public``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Literal, Tuple

import numpy as np

from ..registry import SCENARIOS, Participant, ScenarioSpec
from ..store import load_split
from .common import make_split, sample_rows, seeds, stratified_split_exact

SHAPE = (3, 32, 32)  # FCCL/FCCL+ resize every domain to 32x32 RGB

# ------------------------------------------------------------------------ Digits

DIGIT_DOMAINS = ("mnist", "usps", "svhn", "syn")


@dataclass(frozen=True)
class DigitsParams:
    private: Tuple[int, ...] = (150, 80, 5000, 1800)  # FCCL+ Table V: MNIST, USPS, SVHN, SYN private images
    sizing: Literal["counts", "fractions"] = "counts"  # "fractions": the FCCL+ authors' code (about 138/94/9523/2300)
    fractions: Tuple[float, ...] = (0.0023, 0.013, 0.13, 0.23)  # authors' code: share of each train split
    test: int = 0  # images kept from each domain's test split; 0 = all of it
    seed: int = 0  # draws every private (and test) sample

    def __post_init__(self):
        for key in ("private", "fractions"):
            if len(getattr(self, key)) != len(DIGIT_DOMAINS):
                raise ValueError(f"{key}: one value per domain {DIGIT_DOMAINS} expected")
        if not all(0 < f <= 1 for f in self.fractions):
            raise ValueError(f"fractions must lie in (0, 1], got {self.fractions}")


def build_digits(dirs: Dict[str, Path], p: DigitsParams) -> Dict[str, Participant]:
    parts = {}
    for k, (domain, rng) in enumerate(zip(DIGIT_DOMAINS, seeds(p.seed, len(DIGIT_DOMAINS)))):
        x, y = load_split(dirs[domain], "train", mmap=True)
        n = p.private[k] if p.sizing == "counts" else int(p.fractions[k] * len(y))  # authors: int(share * len)
        private = sample_rows(len(y), n, rng, f"{domain} private")
        xt, yt = load_split(dirs[domain], "test", mmap=True)
        test = np.arange(len(yt)) if p.test == 0 else sample_rows(len(yt), p.test, rng, f"{domain} test")
        parts[domain] = Participant(domain, {
            "private": make_split(x, y, private, f"{domain}/train", SHAPE),
            "test": make_split(xt, yt, test, f"{domain}/test", SHAPE),
        })
    return parts


SCENARIOS.add("digits", ScenarioSpec(
    name="digits", build=build_digits, datasets=DIGIT_DOMAINS, sources=lambda p: DIGIT_DOMAINS,
    participants=lambda p: DIGIT_DOMAINS, image_shape=SHAPE, num_classes=10,
    paper="FCCL+ § 4.1, Table V", params=DigitsParams, metric_topk=(1, 5), headline_topk=1,
    doc="Digits: MNIST / USPS / SVHN / SYN, private 150 / 80 / 5,000 / 1,800, test = each test split"))

# ------------------------------------------------------- Office-Caltech, Office-31


@dataclass(frozen=True)
class OfficeParams:
    test: float = 0.2  # held-out share of each domain (FCCL+: 80/20 split)
    private: float = 0.48  # share of the 80% train part drawn as private data (FCCL+)
    seed: int = 0  # draws the split and the private sample

    def __post_init__(self):
        if not (0 < self.test < 1 and 0 < self.private <= 1):
            raise ValueError(f"test must lie in (0, 1) and private in (0, 1], got {self.test}, {self.private}")


def _office_builder(dataset: str, domains: Tuple[str, ...]):
    def build(dirs: Dict[str, Path], p: OfficeParams) -> Dict[str, Participant]:
        parts = {}
        for domain, rng in zip(domains, seeds(p.seed, len(domains))):
            x, y = load_split(dirs[dataset], domain, mmap=True)
            held = stratified_split_exact(y, {"test": p.test}, rng, rest="train")
            local = stratified_split_exact(y[held["train"]], {"private": p.private}, rng, rest="unused")
            src = f"{dataset}/{domain}"
            parts[domain] = Participant(domain, {
                "private": make_split(x, y, held["train"][local["private"]], src, SHAPE),
                "test": make_split(x, y, held["test"], src, SHAPE),
            })
        return parts

    return build


OFFICE_CALTECH = ("amazon", "caltech", "dslr", "webcam")
OFFICE31 = ("amazon", "dslr", "webcam")

SCENARIOS.add("office_caltech", ScenarioSpec(
    name="office_caltech", build=_office_builder("office_caltech", OFFICE_CALTECH), datasets=("office_caltech",),
    sources=lambda p: ("office_caltech",), participants=lambda p: OFFICE_CALTECH, image_shape=SHAPE,
    num_classes=10, paper="FCCL+ § 4.1", params=OfficeParams, metric_topk=(1, 5), headline_topk=1,
    doc="Office-Caltech-10: amazon / caltech / dslr / webcam, private 48% of an 80% part, test the other 20%"))
SCENARIOS.add("office31", ScenarioSpec(
    name="office31", build=_office_builder("office31", OFFICE31), datasets=("office31",),
    sources=lambda p: ("office31",), participants=lambda p: OFFICE31, image_shape=SHAPE,
    num_classes=31, paper="FCCL+ § 4.1", params=OfficeParams, metric_topk=(1, 5), headline_topk=5,
    doc="Office-31: amazon / dslr / webcam, private 48% of an 80% part, test the other 20%"))

# ------------------------------------------------------------------- Office-Home

OFFICE_HOME = ("art", "clipart", "product", "real_world")


@dataclass(frozen=True)
class OfficeHomeParams:
    private: Tuple[int, ...] = (1400, 2000, 2500, 2000)  # FCCL+: Art, Clipart, Product, Real World
    test: int = 0  # images of each domain's held-out rest kept as test; 0 = all of the rest
    seed: int = 0  # draws the private samples

    def __post_init__(self):
        if len(self.private) != len(OFFICE_HOME):
            raise ValueError(f"private: one size per domain {OFFICE_HOME} expected")


def build_office_home(dirs: Dict[str, Path], p: OfficeHomeParams) -> Dict[str, Participant]:
    parts = {}
    for k, (domain, rng) in enumerate(zip(OFFICE_HOME, seeds(p.seed, len(OFFICE_HOME)))):
        x, y = load_split(dirs["office_home"], domain, mmap=True)
        private = sample_rows(len(y), p.private[k], rng, f"office_home {domain} private")
        rest = np.setdiff1d(np.arange(len(y)), private)
        test = rest if p.test == 0 else np.sort(rng.choice(rest, size=min(p.test, len(rest)), replace=False))
        src = f"office_home/{domain}"
        parts[domain] = Participant(domain, {
            "private": make_split(x, y, private, src, SHAPE),
            "test": make_split(x, y, test, src, SHAPE),
        })
    return parts


SCENARIOS.add("office_home", ScenarioSpec(
    name="office_home", build=build_office_home, datasets=("office_home",), sources=lambda p: ("office_home",),
    participants=lambda p: OFFICE_HOME, image_shape=SHAPE, num_classes=65, paper="FCCL+ § 4.1",
    params=OfficeHomeParams, metric_topk=(1, 5), headline_topk=5,
    doc="Office-Home: art / clipart / product / real_world, private 1,400 / 2,000 / 2,500 / 2,000, test = the rest"))
