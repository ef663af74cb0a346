"""Helpers shared by scenario builders: stratified splits and format conversion."""

from __future__ import annotations

from typing import Dict, Literal, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import ConfigError


def stratified_split(labels: np.ndarray, fractions: Dict[str, float], rng: np.random.Generator,
                     rest: str = "private") -> Dict[str, np.ndarray]:
    """Split row indices class by class: ``fractions[name]`` of each class goes to ``name``,
    the remainder to ``rest``. Counts are rounded per class; the result is sorted per split."""
    out: Dict[str, list] = {name: [] for name in list(fractions) + [rest]}
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        start = 0
        for name, frac in fractions.items():
            k = int(round(frac * len(rows)))
            out[name].append(rows[start:start + k])
            start += k
        out[rest].append(rows[start:])
    return {k: np.sort(np.concatenate(v)) if v else np.empty(0, np.int64) for k, v in out.items()}


def per_class_sample(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """``per_class`` random rows of every class (sorted); error if a class has fewer."""
    rows = []
    for c in np.unique(labels):
        cand = np.flatnonzero(labels == c)
        if len(cand) < per_class:
            raise ValueError(f"class {c} has {len(cand)} images, {per_class} asked")
        rows.append(rng.choice(cand, size=per_class, replace=False))
    return np.sort(np.concatenate(rows))


def to_format(images: np.ndarray | torch.Tensor, shape: Tuple[int, int, int]) -> np.ndarray:
    """uint8 N x C x H x W -> uint8 at ``shape`` = (C, H, W): grey <-> RGB and antialiased resize.

    Grey to RGB repeats the channel; RGB to grey uses ITU-R 601 luma weights.
    """
    x = torch.as_tensor(np.asarray(images))
    c, h, w = shape
    if x.shape[1] != c:
        if x.shape[1] == 1:
            x = x.expand(-1, c, -1, -1)
        elif c == 1:
            wts = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
            x = (x.float() * wts).sum(1, keepdim=True).round().clamp(0, 255).to(torch.uint8)
        else:
            raise ValueError(f"cannot convert {x.shape[1]} channels to {c}")
    if tuple(x.shape[2:]) != (h, w):
        out = []
        for chunk in torch.split(x, 4096):  # bounded memory on large datasets
            y = F.interpolate(chunk.float(), size=(h, w), mode="bilinear", antialias=True, align_corners=False)
            out.append(y.round().clamp(0, 255).to(torch.uint8))
        x = torch.cat(out) if out else x[:, :, :h, :w]
    return np.ascontiguousarray(x.numpy())


ROT_BITS = 16  # fixed-point precision of cos/sin (1/65536)


def rotate(images: np.ndarray, degrees_clockwise: float) -> np.ndarray:
    """Rotate a uint8 batch (N x C x H x W) clockwise about the centre: bilinear, zero fill.

    Integer-exact: cos/sin are rounded once to 16-bit fixed point and every coordinate,
    weight and sum after that is int64 arithmetic, so the bytes are the same on every CPU
    (float interpolation differed between machines in the last bit, which moved pixels
    across a rounding boundary and changed ``dvc.lock``). Results round half up.
    """
    if degrees_clockwise % 360 == 0 or len(images) == 0:
        return images.copy()
    n, c, h, w = images.shape
    one = 1 << ROT_BITS
    rad = np.deg2rad(float(degrees_clockwise))
    cos, sin = int(round(np.cos(rad) * one)), int(round(np.sin(rad) * one))
    # Coordinates in half pixels about the centre, so (H-1)/2 and (W-1)/2 stay integers.
    dy, dx = np.meshgrid(2 * np.arange(h, dtype=np.int64) - (h - 1), 2 * np.arange(w, dtype=np.int64) - (w - 1),
                         indexing="ij")
    # Source of output pixel (y, x) under a clockwise rotation (y down): R^-1 (dx, dy), in units of 1/(2*one).
    sx = (w - 1) * one + cos * dx + sin * dy
    sy = (h - 1) * one - sin * dx + cos * dy
    den = 2 * one
    x0, fx = np.divmod(sx, den)  # floor and remainder, exact for negatives too
    y0, fy = np.divmod(sy, den)
    padded = np.zeros((n, c, h + 2, w + 2), dtype=np.int64)  # a zero border: neighbours outside read 0
    padded[:, :, 1:-1, 1:-1] = images
    acc = np.zeros((n, c, h, w), dtype=np.int64)
    for oy, wy in ((0, den - fy), (1, fy)):
        yi = np.clip(y0 + oy + 1, 0, h + 1)
        for ox, wx in ((0, den - fx), (1, fx)):
            xi = np.clip(x0 + ox + 1, 0, w + 1)
            acc += padded[:, :, yi, xi] * (wy * wx)
    total = den * den
    out = (acc + total // 2) // total
    return np.ascontiguousarray(np.clip(out, 0, 255).astype(np.uint8))


def take(images: np.ndarray, labels: np.ndarray, rows: Sequence[int]):
    rows = np.asarray(rows, dtype=np.int64)
    return np.ascontiguousarray(images[rows]), np.ascontiguousarray(labels[rows]), rows


def sample_rows(n_total: int, k: int, rng: np.random.Generator, what: str = "split") -> np.ndarray:
    """``k`` distinct random rows of ``range(n_total)``, sorted; error naming ``what`` if too few."""
    if k > n_total:
        raise ConfigError(f"{what}: {k} images asked, only {n_total} available")
    return np.sort(rng.choice(n_total, size=k, replace=False))


def deal(rows: np.ndarray, sizes: Sequence[int], what: str = "split") -> list:
    """Consecutive blocks of ``rows`` with the given sizes (each sorted); error if too few rows."""
    if sum(sizes) > len(rows):
        raise ConfigError(f"{what}: {sum(sizes)} images asked, only {len(rows)} available")
    bounds = np.cumsum([0, *sizes])
    return [np.sort(rows[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def make_split(images: np.ndarray, labels: np.ndarray, rows: Sequence[int], source: str,
               shape: Tuple[int, int, int]):
    """A :class:`~fedshift.data.registry.Split` of ``rows`` converted to ``shape`` with :func:`to_format`."""
    from ..registry import Split

    rows = np.asarray(rows, dtype=np.int64)
    return Split(to_format(images[rows], shape), np.asarray(labels[rows], dtype=np.int64), rows, source)


def seeds(seed: int, n: int) -> list:
    """``n`` independent generators derived from one seed (SeedSequence.spawn)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


def stratified_split_exact(labels: np.ndarray, fractions: Dict[str, float], rng: np.random.Generator,
                           rest: str = "private") -> Dict[str, np.ndarray]:
    """Like :func:`stratified_split`, but split ``name`` holds exactly ``round(fraction * N)``
    rows: per-class quotas are floored and the places left go to the classes with the
    largest remainders (ties at random). Per-class rounding alone drifts by up to half an
    image per class (Office-Home's 65 classes: 10% became 10.7%)."""
    classes, counts = np.unique(labels, return_counts=True)
    taken = np.zeros(len(classes), dtype=np.int64)
    alloc: Dict[str, np.ndarray] = {}
    for name, frac in fractions.items():
        quota = frac * counts
        k = np.minimum(np.floor(quota).astype(np.int64), counts - taken)
        short = int(round(frac * len(labels))) - int(k.sum())
        order = np.lexsort((rng.random(len(classes)), -(quota - np.floor(quota))))
        while short > 0 and (counts - taken - k).sum() > 0:
            for c in order:
                if short > 0 and counts[c] - taken[c] - k[c] > 0:
                    k[c] += 1
                    short -= 1
        taken += k
        alloc[name] = k
    out: Dict[str, list] = {name: [] for name in list(fractions) + [rest]}
    for i, c in enumerate(classes):
        rows = rng.permutation(np.flatnonzero(labels == c))
        start = 0
        for name in fractions:
            out[name].append(rows[start:start + alloc[name][i]])
            start += alloc[name][i]
        out[rest].append(rows[start:])
    return {k: np.sort(np.concatenate(v)).astype(np.int64) if v else np.empty(0, np.int64) for k, v in out.items()}


HOLDOUT_STREAM = 36  # entropy word of the validation-holdout draws (issue 36): independent of every scenario stream


def holdout_positions(labels: np.ndarray, fraction: float, seed: int, participant: int) -> np.ndarray:
    """Positions (sorted, into ``labels``) of a stratified validation holdout of ``fraction`` of the
    rows: exactly ``round(fraction * N)`` rows, per class as :func:`stratified_split_exact` deals them.

    Drawn from its own stream ``[HOLDOUT_STREAM, seed, participant]``, so the holdout is the same on
    every machine and changes nothing of the rows the scenario itself draws (FLGo-Bench holds out 20 %
    of each client's training data for tuning: ``train_holdout``)."""
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"holdout: {fraction} is not a fraction in [0, 1)")
    rng = np.random.default_rng([HOLDOUT_STREAM, int(seed), int(participant)])
    return stratified_split_exact(np.asarray(labels), {"val": fraction}, rng)["val"]


# ------------------------------------------------------------------ test protocols (issue 47)
TestProtocol = Literal["clean", "authors"]  # clean: held out, never trained on; authors: the authors' code's test
SPLIT_STREAM = 47  # entropy word of the fixed held-out splits (``split_seed``): independent of ``seed``'s streams
AUTHORS_SLOTS, AUTHORS_CAPACITY = 8, 10  # the FCCL+ loaders' train part: positions i with i % 10 <= 7


def split_rng(split_seed: int, k: int) -> np.random.Generator:
    """The generator of participant ``k``'s fixed held-out split: its own stream
    ``[SPLIT_STREAM, split_seed, k]``, so a new ``seed`` (``engine.data_seed: run``) leaves it unchanged."""
    return np.random.default_rng([SPLIT_STREAM, int(split_seed), int(k)])


def authors_train_len(n: int) -> int:
    """How many of a folder's ``n`` positions the FCCL+ loaders put in their train list: ``i % 10 <= 7``
    (``ImageFolder_Custom(subset_train_num=7, subset_capacity=10)``, fccl+/datasets/office31.py:12, 24-31;
    officecaltech.py:12, 23-30; officehome.py:12, 23-30): 8 of every 10, about 0.8 N."""
    return (n // AUTHORS_CAPACITY) * AUTHORS_SLOTS + min(n % AUTHORS_CAPACITY, AUTHORS_SLOTS)


def check_folder_order(labels: np.ndarray, where: str) -> None:
    """The authors' positions index a torchvision ``ImageFolder``: classes in sorted order, each class's
    files together. A stored split is in that order when its labels never decrease (the manual fetch
    writes class by class, classes in their sorted names' order: fedshift.data.manual)."""
    if len(labels) and np.any(np.diff(np.asarray(labels)) < 0):
        raise ConfigError(f"{where}: images are not stored class by class, so positions cannot be the authors' "
                          "ImageFolder positions (test_protocol: authors); refetch the dataset")


def authors_prefix_draw(n: int, k: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """The FCCL+ loaders' private draw (sorted positions into the class-sorted folder of ``n`` images):
    ``k`` of a random permutation of ``0 .. n_train - 1``, ``n_train`` = :func:`authors_train_len`
    (fccl+/datasets/utils/federated_dataset.py:192-195, 206-212). The positions index the whole folder
    (``imagefolder_obj``, l. 204, 214), not its train list, so they are the class-sorted first 80 %:
    the last classes of the folder never reach private data."""
    n_train = authors_train_len(n)
    if k > n_train:
        raise ConfigError(f"{what}: {k} private images asked, the authors' prefix holds {n_train} of {n}")
    return np.sort(rng.permutation(n_train)[:k]).astype(np.int64)


def cvpr_prefix_draw(labels: np.ndarray, k: int, rng: np.random.Generator, what: str,
                     test_share: float = 0.3) -> np.ndarray:
    """The FCCL (CVPR) Office loaders' private draw (fccl/Dataset/utils_dataset.py:282-294): per class a
    random ``int(0.3 * n_c)`` positions are set apart (l. 286-289), and private is the first ``k`` of the
    remaining positions in ascending order (``list(set(full_idx) - set(test_idx))[0:len(dataidxs)]``,
    l. 293: CPython iterates a set of small ints in ascending order), a class-sorted prefix again."""
    labels = np.asarray(labels)
    apart = [rng.permutation(np.flatnonzero(labels == c))[:int(test_share * int((labels == c).sum()))]
             for c in np.unique(labels)]
    rest = np.setdiff1d(np.arange(len(labels)), np.concatenate(apart) if apart else np.empty(0, np.int64))
    if k > len(rest):
        raise ConfigError(f"{what}: {k} private images asked, the authors' train part holds {len(rest)}")
    return rest[:k].astype(np.int64)
