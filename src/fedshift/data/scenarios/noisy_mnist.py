"""Noisy MNIST: one sample of digits seen through sensors of increasing noise, one participant each
(the worked example of docs/datasets.md "Adding a scenario").

Domain shift by corruption, after MNIST-C's Gaussian-noise corruption (Mu & Gilmer 2019,
arXiv:1906.02337): ``per_class`` images of every digit are drawn from the 5k MNIST subset (offline),
their roles (private / val / test, stratified by class) drawn once for every participant, so no
participant trains on a noisy copy of another's test image; participant ``s<sigma>`` adds zero-mean
Gaussian pixel noise of standard deviation ``sigma`` grey levels to every image, rounded and clipped to
0..255 (``s0``: the clean images). Every draw comes from the scenario's ``seed``: the images and roles
from one stream, each participant's noise from its own child stream (``SeedSequence(seed).spawn``), so
adding a participant leaves the others' pixels as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

import numpy as np

from ..registry import SCENARIOS, Participant, ScenarioSpec, Split
from ..store import load_split
from .common import per_class_sample, stratified_split


@dataclass(frozen=True)
class NoisyMnistParams:
    per_class: int = 60  # images of each digit (the 5k subset holds at least 400 of each)
    sigmas: Tuple[int, ...] = (0, 48, 96)  # each participant's noise standard deviation, in grey levels
    val: float = 0.1  # validation fraction of each class
    test: float = 0.25  # test fraction of each class; the rest is private
    seed: int = 0  # draws the images, their roles and every participant's noise

    def __post_init__(self):
        if self.per_class < 1:
            raise ValueError(f"per_class must be >= 1, got {self.per_class}")
        if not self.sigmas or len(set(self.sigmas)) != len(self.sigmas) or min(self.sigmas) < 0:
            raise ValueError(f"sigmas must be distinct noise levels >= 0, got {self.sigmas}")
        if self.val < 0 or self.test <= 0 or self.val + self.test >= 1:
            raise ValueError(f"val >= 0 and test > 0 must leave private data, got val={self.val}, test={self.test}")


def add_noise(images: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """uint8 images plus N(0, sigma^2) per pixel, rounded to the nearest level and clipped to 0..255."""
    if sigma == 0:
        return images.copy()
    noisy = images.astype(np.float64) + rng.normal(0.0, sigma, images.shape)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def build_noisy_mnist(dirs: Dict[str, Path], p: NoisyMnistParams) -> Dict[str, Participant]:
    images, labels = load_split(dirs["mnist5k"], "train")
    rng = np.random.default_rng(p.seed)
    rows = per_class_sample(labels, p.per_class, rng)
    roles = stratified_split(labels[rows], {"val": p.val, "test": p.test}, rng)
    noise = np.random.SeedSequence(p.seed).spawn(len(p.sigmas))
    parts = {}
    for sigma, child in zip(p.sigmas, noise):
        g = np.random.default_rng(child)
        splits = {role: Split(add_noise(images[rows[local]], sigma, g), labels[rows[local]].astype(np.int64),
                              rows[local], "mnist5k/train")
                  for role, local in roles.items()}
        parts[f"s{sigma}"] = Participant(domain=f"s{sigma}", splits=splits)
    return parts


SCENARIOS.add("noisy_mnist", ScenarioSpec(
    name="noisy_mnist", build=build_noisy_mnist, datasets=("mnist5k",),
    participants=lambda p: tuple(f"s{s}" for s in p.sigmas), image_shape=(1, 28, 28), num_classes=10,
    paper="after MNIST-C's Gaussian noise (Mu & Gilmer 2019)", params=NoisyMnistParams, metric_topk=(1, 5),
    headline_topk=1, doc="MNIST (5k subset) through sensors of increasing Gaussian noise, one participant each (offline)"))
