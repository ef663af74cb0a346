"""FedH2L scenarios (Li et al. 2021, § 5.2-5.3) on PACS and Office-Home, one participant
per domain, 3x32x32 RGB, each with a labeled ``public`` seed split shared with peers.

* ``pacs``: private = the official train split; the official test part is split
  stratified into 10% labeled public seed data and 90% test. The official test list
  covers the whole domain, so the fetch keeps only its images absent from the train
  list (``<domain>_test``): the test data is never trained on.
* ``office_home_h2l``: each domain split stratified 65 / 10 / 10 / 15 into
  private / public / val / test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import numpy as np

from ..registry import SCENARIOS, Participant, ScenarioSpec
from ..store import load_split
from .common import make_split, seeds, stratified_split_exact
from .fccl import OFFICE_HOME, SHAPE

PACS = ("photo", "art_painting", "cartoon", "sketch")


@dataclass(frozen=True)
class PacsParams:
    public: float = 0.1  # FedH2L: 10% of the official test part is the labeled public seed set
    seed: int = 0  # draws the public seed rows

    def __post_init__(self):
        if not 0 < self.public < 1:
            raise ValueError(f"public must lie in (0, 1), got {self.public}")


def build_pacs(dirs: Dict[str, Path], p: PacsParams) -> Dict[str, Participant]:
    parts = {}
    for domain, rng in zip(PACS, seeds(p.seed, len(PACS))):
        x, y = load_split(dirs["pacs"], f"{domain}_train", mmap=True)
        xt, yt = load_split(dirs["pacs"], f"{domain}_test", mmap=True)
        held = stratified_split_exact(yt, {"public": p.public}, rng, rest="test")
        parts[domain] = Participant(domain, {
            "private": make_split(x, y, np.arange(len(y)), f"pacs/{domain}_train", SHAPE),
            "public": make_split(xt, yt, held["public"], f"pacs/{domain}_test", SHAPE),
            "test": make_split(xt, yt, held["test"], f"pacs/{domain}_test", SHAPE),
        })
    return parts


SCENARIOS.add("pacs", ScenarioSpec(
    name="pacs", build=build_pacs, datasets=("pacs",), sources=lambda p: ("pacs",), participants=lambda p: PACS,
    image_shape=SHAPE, num_classes=7, paper="FedH2L § 5.2", params=PacsParams, metric_topk=(1, 5),
    headline_topk=1,
    doc="PACS: photo / art_painting / cartoon / sketch; official train private, test 10% public + 90% test"))


@dataclass(frozen=True)
class OfficeHomeH2LParams:
    public: float = 0.10  # FedH2L: labeled public seed share of each domain
    val: float = 0.10  # validation share
    test: float = 0.15  # test share; the remaining 65% is private
    seed: int = 0  # draws the split

    def __post_init__(self):
        if self.public + self.val + self.test >= 1:
            raise ValueError("public + val + test leaves no private data")


def build_office_home_h2l(dirs: Dict[str, Path], p: OfficeHomeH2LParams) -> Dict[str, Participant]:
    parts = {}
    for domain, rng in zip(OFFICE_HOME, seeds(p.seed, len(OFFICE_HOME))):
        x, y = load_split(dirs["office_home"], domain, mmap=True)
        roles = stratified_split_exact(y, {"public": p.public, "val": p.val, "test": p.test}, rng, rest="private")
        parts[domain] = Participant(domain, {role: make_split(x, y, roles[role], f"office_home/{domain}", SHAPE)
                                             for role in ("private", "public", "val", "test")})
    return parts


SCENARIOS.add("office_home_h2l", ScenarioSpec(
    name="office_home_h2l", build=build_office_home_h2l, datasets=("office_home",),
    sources=lambda p: ("office_home",), participants=lambda p: OFFICE_HOME, image_shape=SHAPE, num_classes=65,
    paper="FedH2L § 5.3", params=OfficeHomeH2LParams, metric_topk=(1, 5), headline_topk=1,
    doc="Office-Home (FedH2L): per domain 65 / 10 / 10 / 15% private / public / val / test"))
