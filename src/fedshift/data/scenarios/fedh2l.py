"""FedH2L scenarios (Li et al. 2021, § IV-B/IV-C, Tables III-IV) on PACS and Office-Home, one
participant per domain, 3x224x224 RGB, each with a labeled ``public`` seed split shared with
peers and a ``val`` split (the paper's D_i^val, § III: "We also split D_i into its private data
..., validation data and test data"; § IV-A: "evaluate using the validation data every 50 rounds
and keep the model with the maximal ACC", which ``engine.select: best_val`` does).

* ``pacs``: the official train split minus a stratified validation share (``val``, 10%) is
  private; the official test part is split stratified into 10% labeled public seed data and
  90% test (§ IV-B: "We separate out 10% of its test part as the public seed data ..., use
  the rest 90% of its test part as our test data, and directly use the train part as our
  private data"). The official test list covers the whole domain, so the fetch keeps only its
  images absent from the train list (``<domain>_test``): the test data is never trained on.
  The paper does not say where its PACS validation data comes from. PACS's own validation
  list (crossval) is the official test list minus the train list, i.e. exactly the images
  ``<domain>_test`` holds here, so validating on it would select on test images; the
  validation share is therefore held out of the train split, at the release's own
  train : crossval ratio (about 9 : 1).
* ``office_home_h2l``: each domain split stratified 65 / 10 / 10 / 15 into
  private / public / val / test (§ IV-C: "according to the default [65%, 10%, 10%, 15%]").

Image size: the paper never states one. Every architecture it deploys (ResNet18/34/50,
AlexNet, VGG11, MobileNet) is defined on 224x224 inputs and PACS ships 227x227 images, so
both scenarios are stored at 224x224 (``SHAPE_H2L``); fetch the datasets at ``size: 224``
(params/papers/fedh2l_data.yaml), or they are upsampled from the 32-pixel default.
Learning rate and weight decay: § IV-B, "We use AMSGrad (lr=1e-4, weight decay=1e-5) to train
10,000 rounds and set batch_size=32", and § IV-C "use the same hyperparameters as in the PACS
experiment": the FedH2L / IND / AGG ``scenario_defaults`` (methods/stepwise.py) for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import numpy as np

from ..registry import SCENARIOS, Participant, ScenarioSpec
from ..store import load_split
from .common import make_split, seeds, stratified_split_exact
from .fccl import OFFICE_HOME

PACS = ("photo", "art_painting", "cartoon", "sketch")
SHAPE_H2L = (3, 224, 224)  # the input size of the ImageNet architectures FedH2L deploys (the paper states none)
# § IV-B: "We use AMSGrad (lr=1e-4, weight decay=1e-5) ..."; § IV-C: "the same hyperparameters as in the PACS experiment"
H2L_OPTIMISER = {"lr": 1e-4, "weight_decay": 1e-5}


@dataclass(frozen=True)
class PacsParams:
    public: float = 0.1  # FedH2L: 10% of the official test part is the labeled public seed set
    val: float = 0.1  # validation share held out of the official train split (PACS's train : crossval is ~9 : 1)
    seed: int = 0  # draws the public seed rows, then the validation rows

    def __post_init__(self):
        for key in ("public", "val"):
            if not 0 < getattr(self, key) < 1:
                raise ValueError(f"{key} must lie in (0, 1), got {getattr(self, key)}")


def build_pacs(dirs: Dict[str, Path], p: PacsParams) -> Dict[str, Participant]:
    parts = {}
    for domain, rng in zip(PACS, seeds(p.seed, len(PACS))):
        x, y = load_split(dirs["pacs"], f"{domain}_train", mmap=True)
        xt, yt = load_split(dirs["pacs"], f"{domain}_test", mmap=True)
        held = stratified_split_exact(yt, {"public": p.public}, rng, rest="test")
        train = stratified_split_exact(y, {"val": p.val}, rng, rest="private")  # after the public draw: same seed rows
        parts[domain] = Participant(domain, {
            "private": make_split(x, y, train["private"], f"pacs/{domain}_train", SHAPE_H2L),
            "public": make_split(xt, yt, held["public"], f"pacs/{domain}_test", SHAPE_H2L),
            "val": make_split(x, y, train["val"], f"pacs/{domain}_train", SHAPE_H2L),
            "test": make_split(xt, yt, held["test"], f"pacs/{domain}_test", SHAPE_H2L),
        })
    return parts


SCENARIOS.add("pacs", ScenarioSpec(
    name="pacs", build=build_pacs, datasets=("pacs",), sources=lambda p: ("pacs",), participants=lambda p: PACS,
    image_shape=SHAPE_H2L, num_classes=7, paper="FedH2L § IV-B, Table III", params=PacsParams, metric_topk=(1, 5),
    headline_topk=1,
    doc="PACS (FedH2L), 224x224: official train 90% private + 10% val; official test 10% public + 90% test"))


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
        parts[domain] = Participant(domain, {role: make_split(x, y, roles[role], f"office_home/{domain}", SHAPE_H2L)
                                             for role in ("private", "public", "val", "test")})
    return parts


SCENARIOS.add("office_home_h2l", ScenarioSpec(
    name="office_home_h2l", build=build_office_home_h2l, datasets=("office_home",),
    sources=lambda p: ("office_home",), participants=lambda p: OFFICE_HOME, image_shape=SHAPE_H2L,
    num_classes=65, paper="FedH2L § IV-C, Table IV", params=OfficeHomeH2LParams, metric_topk=(1, 5), headline_topk=1,
    doc="Office-Home (FedH2L), 224x224: per domain 65 / 10 / 10 / 15% private / public / val / test"))
