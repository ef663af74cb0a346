"""dvc.lock does not depend on the CPU: the rotation is integer-exact and a fresh build of the
committed data stages reproduces the committed dvc.lock hashes byte for byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedshift.data.scenarios.common import rotate

from conftest import REPO


def dvc_dir_md5(folder: Path) -> str:
    """DVC 3's hash of an output folder: md5 of the sorted JSON list of (file md5, relative path)."""
    entries = sorted(({"md5": hashlib.md5(p.read_bytes()).hexdigest(), "relpath": p.relative_to(folder).as_posix()}
                      for p in Path(folder).rglob("*") if p.is_file()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def locked_md5(stage: str) -> str:
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    (out,) = lock["stages"][stage]["outs"]
    return out["md5"]


def test_rotate_by_90_is_rot90_and_matches_an_integer_loop():
    rng = np.random.default_rng(0)
    sq = rng.integers(0, 256, (2, 1, 7, 7), dtype=np.uint8)
    assert np.array_equal(rotate(sq, 90), np.rot90(sq, k=-1, axes=(2, 3)))  # clockwise
    img = rng.integers(0, 256, (1, 1, 5, 6), dtype=np.uint8)
    # Independent formula: plain Python integers, pixel by pixel (cos/sin in 1/65536).
    import math

    one, (h, w) = 1 << 16, img.shape[2:]
    c, s = round(math.cos(math.radians(30)) * one), round(math.sin(math.radians(30)) * one)

    def px(y, x):
        return int(img[0, 0, y, x]) if 0 <= y < h and 0 <= x < w else 0

    expect = np.zeros((h, w), dtype=np.uint8)
    for i in range(h):
        for j in range(w):
            dx, dy = 2 * j - (w - 1), 2 * i - (h - 1)
            sx, sy = (w - 1) * one + c * dx + s * dy, (h - 1) * one - s * dx + c * dy
            x0, fx = divmod(sx, 2 * one)
            y0, fy = divmod(sy, 2 * one)
            acc = (px(y0, x0) * (2 * one - fx) * (2 * one - fy) + px(y0, x0 + 1) * fx * (2 * one - fy)
                   + px(y0 + 1, x0) * (2 * one - fx) * fy + px(y0 + 1, x0 + 1) * fx * fy)
            expect[i, j] = (acc + 2 * one * one) // (4 * one * one)
    assert np.array_equal(rotate(img, 30)[0, 0], expect)


def test_fresh_build_reproduces_the_committed_dvc_lock(tiny_data, tmp_path):
    """The fetched MNIST subset and the Rotated MNIST partition built with params/data.yaml hash exactly
    as dvc.lock says (run `dvc repro` and commit dvc.lock after changing src/fedshift/data)."""
    from fedshift.data import build

    params = yaml.safe_load((REPO / "params/data.yaml").read_text())
    assert dvc_dir_md5(tiny_data / "datasets/mnist5k") == locked_md5("fetch@mnist5k")
    out = tmp_path / "partitions/rotmnist"
    build.partition("rotmnist", {"mnist5k": tiny_data / "datasets/mnist5k"}, out, params["scenarios"]["rotmnist"])
    assert dvc_dir_md5(out) == locked_md5("partition@rotmnist")
