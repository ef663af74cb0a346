"""Shared fixtures: a tiny rotmnist partition + public set built with the real stages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# torch.compile's kernel cache, one per kernel set: a suite run with ATEN_CPU_CAPABILITY=avx2 on an AVX-512
# machine (the other CPU kind of this project's machines) reused the default cache's kernels and failed inside
# one ("index out of bounds"); with a cache of its own it passes (tests/test_levers.py).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
    __import__("tempfile").gettempdir(), f"torchinductor_fedshift_{os.environ.get('ATEN_CPU_CAPABILITY', 'native')}"))
os.environ.setdefault("FEDSHIFT_TRACKING", "none")

REPO = Path(__file__).resolve().parents[1]

# One intra-op thread: on a 2-core machine, torch's default pool oversubscribes the CPU
# when pytest and workflow subprocesses run side by side (several times slower).
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _denormals_back_on():
    """A run in this process (runner._setup_torch) turns flush-to-zero on for the whole process; put it back
    after each test, or a later hypothesis test refuses to draw floats ("can't represent subnormal floats")."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """build/ with mnist5k, photo_patches, a small rotmnist partition and public set."""
    from fedshift.testing import build_tiny_data

    return build_tiny_data(tmp_path_factory.mktemp("build"))


def pytest_collection_modifyitems(config, items):
    """Files with end-to-end (``slow``) tests first, in their own order: `make test` runs two workers that take
    whole files (--dist loadfile), and a long file handed out last would leave one worker idle at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the files' and their tests' order otherwise kept
