"""Tests for fedshift.models.structures: paper tables, assignment rules, homo_<model>."""

from __future__ import annotations

import pytest

from fedshift.errors import ConfigError
from fedshift.models import MODELS, STRUCTURES, Structure, create_model, get_structure

# The papers' tables, typed again here so a typo in structures.py shows up.
PAPER_TABLES = {
    "fcclplus_digits": ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2"),
    "fcclplus_office_caltech": ("googlenet", "resnet12", "resnet10", "resnet12"),
    "fcclplus_office31": ("resnet10", "resnet12", "resnet10"),
    "fcclplus_office_home": ("resnet18", "resnet34", "googlenet", "resnet12"),
    "fcclplus_digits_alt1": ("resnet10", "resnet12", "efficientnet_b0", "simple_cnn"),
    "fcclplus_digits_alt2": ("resnet18", "resnet12", "efficientnet_b0", "mobilenet_v2"),
    "fedh2l_pacs": ("resnet18", "resnet34", "alexnet", "vgg11"),
    "fedh2l_office_home": ("resnet34", "mobilenet_v2", "alexnet", "resnet50"),
    "fedh2l_rotmnist": ("lenet",) * 4,
    "demo_mixed": ("lenet", "fedavg_cnn_mnist", "simple_cnn", "lenet"),
}

NAMES = STRUCTURES.names()


@pytest.mark.parametrize("name", sorted(PAPER_TABLES))
def test_paper_tables(name):
    assert get_structure(name).archs == PAPER_TABLES[name]


@pytest.mark.parametrize("name", NAMES)
def test_every_structure_assigns_registered_models(name):
    s = get_structure(name)
    n = len(s.archs) if s.archs is not None else 3
    archs = s.assign(n)
    assert len(archs) == n
    assert all(a in MODELS for a in archs)
    assert s.doc


@pytest.mark.parametrize("name", [n for n in NAMES if get_structure(n).archs is not None])
def test_count_mismatch_is_a_config_error(name):
    s = get_structure(name)
    k = len(s.archs)
    with pytest.raises(ConfigError) as err:
        s.assign(k + 1)
    msg = str(err.value)
    assert f"structure {name!r} assigns {k} architectures" in msg
    assert f"has {k + 1} participants" in msg
    assert ", ".join(s.archs) in msg


def test_homo_structure_for_every_model():
    for model in MODELS.names():
        s = get_structure(f"homo_{model}")
        assert s.homogeneous and s.archs is None and s.model == model
        assert s.assign(5) == [model] * 5
        assert s.assign(1) == [model]


def test_homogeneous_flag():
    assert get_structure("fedh2l_rotmnist").homogeneous  # fixed, but all LeNet
    assert get_structure("homo_resnet12").homogeneous
    for name in ("fcclplus_digits", "fcclplus_office31", "fedh2l_pacs", "demo_mixed"):
        assert not get_structure(name).homogeneous


def test_unknown_structure_lists_names():
    with pytest.raises(ConfigError) as err:
        get_structure("fccl_digits")
    msg = str(err.value)
    assert "structure" in msg and "fcclplus_digits" in msg and "homo_resnet12" in msg


def test_assign_checks_model_names():
    s = Structure(name="typo", archs=("resnet10", "resnet13"), doc="")
    with pytest.raises(ConfigError, match="resnet13"):
        s.assign(2)


def test_structure_needs_archs_or_model():
    with pytest.raises(ValueError):
        Structure(name="x", archs=None, doc="")
    with pytest.raises(ValueError):
        Structure(name="x", archs=("lenet",), doc="", model="lenet")


def test_structures_are_frozen():
    with pytest.raises(Exception):
        get_structure("demo_mixed").archs = ("resnet50",) * 4


def test_demo_mixed_stays_cheap():
    """The CPU demo must not grow into a GPU workload: under 2M parameters per model, and at
    least two different architectures (feature dimensions differ: a real heterogeneous run)."""
    archs = get_structure("demo_mixed").assign(4)
    dims = set()
    for arch in archs:
        model = create_model(arch, num_classes=10, in_channels=1)
        assert sum(p.numel() for p in model.parameters()) < 2_000_000
        dims.add(model.feature_dim)
    assert len(dims) >= 2
