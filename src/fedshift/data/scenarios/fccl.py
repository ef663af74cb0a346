"""FCCL+ scenarios (Huang et al., TPAMI; FCCL, CVPR 2022): Digits, Office-Caltech-10,
Office-31 and Office-Home, one participant per domain, everything at 3x32x32.

* ``digits``: MNIST / USPS / SVHN / SYN; private = 150 / 80 / 5,000 / 1,800 random
  images of each train split (Table V), or with ``sizing: fractions`` the authors'
  code's shares 0.23% / 1.3% / 13% / 23%; test = each domain's test split, as in the
  authors' code (so ``test_protocol: authors`` tests on the same split).
* ``office_caltech``, ``office31``: ``test_protocol: clean`` (default): each domain split
  80/20 (stratified) by ``split_seed``, the same split for every ``seed``; private = 48%
  of the 80% part (drawn by ``seed``); test = the held-out 20%.
* ``office_home``: clean: a stratified 20% of each domain held out (``split_seed``);
  private = 1,400 / 2,000 / 2,500 / 2,000 random images of the other 80% of Art / Clipart /
  Product / Real World; test = the held-out part.

``test_protocol: authors`` (issue 47) reproduces the authors' loaders, which test on the
whole domain folder, training images included (fccl+/datasets/utils/federated_dataset.py:
197-200: ``imagefolder_obj``; fccl/Dataset/utils_dataset.py:274, 295: ``Subset(ds, full_idx)``),
and draw private data from a class-sorted prefix of the folder (:func:`.common.authors_prefix_draw`,
:func:`.common.cvpr_prefix_draw`): test contains private, and the last classes of a folder
never reach private data. Positions are those of a torchvision ``ImageFolder``: the stored
splits are in that order (classes sorted by name, files sorted; fedshift.data.manual).

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
from .common import (TestProtocol, authors_prefix_draw, authors_train_len, check_folder_order, cvpr_prefix_draw,
                     make_split, sample_rows, seeds, split_rng, stratified_split_exact)

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
    doc="Digits: MNIST / USPS / SVHN / SYN, private 150 / 80 / 5,000 / 1,800, test = each test split",
    authors_test=("each domain's whole test split (SYN: its val folder), the clean split: "
                  "fccl+/datasets/digits.py:120-133 and fccl+/datasets/utils/federated_dataset.py:170-179; "
                  "the CVPR code: fccl/Dataset/utils_dataset.py:217-253"),
    seeded=lambda p: ("private",) if p.test == 0 else ("private", "test")))

# ------------------------------------------------------- Office-Caltech, Office-31


@dataclass(frozen=True)
class OfficeParams:
    test: float = 0.2  # clean: held-out share of each domain (FCCL+: 80/20 split)
    private: float = 0.48  # share of the 80% train part drawn as private data (FCCL+; the authors' percent_dict)
    seed: int = 0  # draws the private sample (what engine.data_seed: run redraws)
    split_seed: int = 0  # clean: draws the held-out split, the same for every `seed` (the authors' i % 10 split is fixed)
    test_protocol: TestProtocol = "clean"  # authors: test on the whole folder, private from its class-sorted 80% prefix

    def __post_init__(self):
        if not (0 < self.test < 1 and 0 < self.private <= 1):
            raise ValueError(f"test must lie in (0, 1) and private in (0, 1], got {self.test}, {self.private}")
        if self.test_protocol == "authors" and self.test != 0.2:
            raise ValueError(f"test: {self.test} with test_protocol authors, whose loaders fix the split at "
                             "i % 10 <= 7 (fccl+/datasets/office31.py:27-31): leave test at 0.2")


def _office_builder(dataset: str, domains: Tuple[str, ...]):
    def build(dirs: Dict[str, Path], p: OfficeParams) -> Dict[str, Participant]:
        parts = {}
        for k, (domain, rng) in enumerate(zip(domains, seeds(p.seed, len(domains)))):
            x, y = load_split(dirs[dataset], domain, mmap=True)
            src = f"{dataset}/{domain}"
            if p.test_protocol == "authors":  # fccl+/datasets/utils/federated_dataset.py:183-216
                check_folder_order(y, src)
                private = authors_prefix_draw(len(y), int(p.private * authors_train_len(len(y))), rng, src)
                test = np.arange(len(y))  # imagefolder_obj: the whole folder (l. 197-200)
            else:
                held = stratified_split_exact(y, {"test": p.test}, split_rng(p.split_seed, k), rest="train")
                local = stratified_split_exact(y[held["train"]], {"private": p.private}, rng, rest="unused")
                private, test = held["train"][local["private"]], held["test"]
            parts[domain] = Participant(domain, {
                "private": make_split(x, y, private, src, SHAPE),
                "test": make_split(x, y, test, src, SHAPE),
            })
        return parts

    return build


OFFICE_CALTECH = ("amazon", "caltech", "dslr", "webcam")
OFFICE31 = ("amazon", "dslr", "webcam")
OFFICE_AUTHORS = ("the whole domain folder, training images included; private = int(0.48 x n_train) random positions "
                  "of the class-sorted first n_train = |{{i : i % 10 <= 7}}| images: "
                  "fccl+/datasets/{file}:{lines}, fccl+/datasets/utils/federated_dataset.py:183-216")


def _office_seeded(p) -> Tuple[str, ...]:
    return ("private",)  # clean: the held-out split is split_seed's; authors: the whole folder


SCENARIOS.add("office_caltech", ScenarioSpec(
    name="office_caltech", build=_office_builder("office_caltech", OFFICE_CALTECH), datasets=("office_caltech",),
    sources=lambda p: ("office_caltech",), participants=lambda p: OFFICE_CALTECH, image_shape=SHAPE,
    num_classes=10, paper="FCCL+ § 4.1", params=OfficeParams, metric_topk=(1, 5), headline_topk=1,
    doc="Office-Caltech-10: amazon / caltech / dslr / webcam, private 48% of an 80% part, test the other 20%",
    authors_test=OFFICE_AUTHORS.format(file="officecaltech.py", lines="19-30, 60"), seeded=_office_seeded))
SCENARIOS.add("office31", ScenarioSpec(
    name="office31", build=_office_builder("office31", OFFICE31), datasets=("office31",),
    sources=lambda p: ("office31",), participants=lambda p: OFFICE31, image_shape=SHAPE,
    num_classes=31, paper="FCCL+ § 4.1", params=OfficeParams, metric_topk=(1, 5), headline_topk=5,
    doc="Office-31: amazon / dslr / webcam, private 48% of an 80% part, test the other 20%",
    authors_test=OFFICE_AUTHORS.format(file="office31.py", lines="20-31, 61"), seeded=_office_seeded))

# ------------------------------------------------------------------- Office-Home

OFFICE_HOME = ("art", "clipart", "product", "real_world")


@dataclass(frozen=True)
class OfficeHomeParams:
    private: Tuple[int, ...] = (1400, 2000, 2500, 2000)  # FCCL+: Art, Clipart, Product, Real World
    test: int = 0  # clean: images of each domain's held-out part kept as test; 0 = all of it
    held_out: float = 0.2  # clean: stratified share of each domain held out as test, the same for every seed
    seed: int = 0  # draws the private samples (what engine.data_seed: run redraws)
    split_seed: int = 0  # clean: draws the held-out part
    test_protocol: TestProtocol = "clean"  # authors: test on the whole folder, private from a class-sorted prefix
    # authors: whose loader: "fccl_plus" (TPAMI code, fccl+/datasets/officehome.py) or "fccl" (the CVPR code
    # behind CVPR Table 3, fccl/Dataset/utils_dataset.py:275-295)
    authors_code: Literal["fccl_plus", "fccl"] = "fccl_plus"

    def __post_init__(self):
        if len(self.private) != len(OFFICE_HOME):
            raise ValueError(f"private: one size per domain {OFFICE_HOME} expected")
        if not 0 < self.held_out < 1:
            raise ValueError(f"held_out: {self.held_out} is not a share in (0, 1)")


def build_office_home(dirs: Dict[str, Path], p: OfficeHomeParams) -> Dict[str, Participant]:
    parts = {}
    for k, (domain, rng) in enumerate(zip(OFFICE_HOME, seeds(p.seed, len(OFFICE_HOME)))):
        x, y = load_split(dirs["office_home"], domain, mmap=True)
        src = f"office_home/{domain}"
        if p.test_protocol == "authors":
            check_folder_order(y, src)
            if p.authors_code == "fccl":  # fccl/Dataset/utils_dataset.py:282-295
                private = cvpr_prefix_draw(y, p.private[k], rng, f"office_home {domain}")
            else:  # fccl+/datasets/officehome.py:11-30, 60, federated_dataset.py:183-216
                private = authors_prefix_draw(len(y), p.private[k], rng, f"office_home {domain}")
            test = np.arange(len(y))  # the whole folder, both codes
        else:
            held = stratified_split_exact(y, {"test": p.held_out}, split_rng(p.split_seed, k), rest="train")
            private = held["train"][sample_rows(len(held["train"]), p.private[k], rng, f"office_home {domain} private")]
            test = held["test"] if p.test == 0 else np.sort(rng.choice(held["test"], size=min(p.test, len(held["test"])),
                                                                         replace=False))
        parts[domain] = Participant(domain, {
            "private": make_split(x, y, private, src, SHAPE),
            "test": make_split(x, y, test, src, SHAPE),
        })
    return parts


SCENARIOS.add("office_home", ScenarioSpec(
    name="office_home", build=build_office_home, datasets=("office_home",), sources=lambda p: ("office_home",),
    participants=lambda p: OFFICE_HOME, image_shape=SHAPE, num_classes=65, paper="FCCL+ § 4.1",
    params=OfficeHomeParams, metric_topk=(1, 5), headline_topk=5,
    doc="Office-Home: art / clipart / product / real_world, private 1,400 / 2,000 / 2,500 / 2,000 of 80%, "
        "test = the held-out 20%",
    authors_test=("the whole domain folder, training images included; private drawn from a class-sorted prefix: "
                  "authors_code fccl_plus: random positions of the first |{i : i % 10 <= 7}| images "
                  "(fccl+/datasets/officehome.py:11-30, fccl+/datasets/utils/federated_dataset.py:183-216); "
                  "authors_code fccl: the first k in ascending order of a random 70% of each class "
                  "(fccl/Dataset/utils_dataset.py:275-295)"),
    seeded=lambda p: ("private",) if p.test == 0 or p.test_protocol == "authors" else ("private", "test")))
