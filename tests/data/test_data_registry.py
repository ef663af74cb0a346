"""Registries name every dataset, public set and scenario of the benchmark; public sets
sample as documented."""

from __future__ import annotations

import numpy as np
import pytest

from fedshift.cli import main
from fedshift.data import DATASETS, PUBLIC_SETS, SCENARIOS, build, store
from fedshift.errors import ConfigError

EXPECTED = {
    "datasets": {"mnist", "fashion_mnist", "usps", "svhn", "cifar10", "cifar100", "tiny_imagenet", "syn",
                 "office_caltech", "office31", "office_home", "pacs", "mnist5k", "uci_digits", "photo_patches"},
    "public": {"cifar100", "tiny_imagenet", "fashion_mnist", "uci_digits", "photo_patches"},
    "scenarios": {"digits", "digits_offline", "office_caltech", "office31", "office_home", "pacs",
                  "office_home_h2l", "rotmnist", "rotmnist_full", "mnist_binary", "mnist_shards",
                  "mnist_permuted", "mnist_iid", "mnist_dirichlet", "cifar10_binary", "cifar10_shards",
                  "cifar10_iid", "cifar10_dirichlet"},
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_cli_lists_every_name(kind, capsys):
    assert main(["list", kind]) == 0
    assert EXPECTED[kind] <= set(capsys.readouterr().out.split())


@pytest.mark.parametrize("name", PUBLIC_SETS.names())
def test_public_sets_sample_registered_datasets(name):
    assert PUBLIC_SETS.get(name).dataset in DATASETS


@pytest.mark.parametrize("name", SCENARIOS.names())
def test_scenarios_read_registered_datasets(name):
    spec = SCENARIOS.get(name)
    params = build.resolve_params(spec, {}, name)
    assert set(spec.datasets_for(params)) <= set(DATASETS.names())
    assert len(spec.participants_for(params)) >= 2


@pytest.mark.parametrize("name", DATASETS.names())
def test_dataset_specs_document_source_and_licence(name):
    spec = DATASETS.get(name)
    assert spec.source and spec.licence and spec.doc
    assert spec.offline or spec.source.startswith("manual") == bool(spec.manual)


def test_fashion_mnist_public_default_is_5000_seeded(tmp_path):
    folder = tmp_path / "fashion_mnist"
    g = np.random.default_rng(0)
    store.save_split(folder, "train", g.integers(0, 256, (6000, 1, 28, 28), dtype=np.uint8),
                     (np.arange(6000) % 10).astype(np.int64))
    store.write_manifest(folder, {"name": "fashion_mnist"})
    a = build.build_public("fashion_mnist", folder, tmp_path / "a")
    b = build.build_public("fashion_mnist", folder, tmp_path / "b")
    c = build.build_public("fashion_mnist", folder, tmp_path / "c", {"seed": 1})
    assert a["splits"]["train"]["n"] == 5000 and a["files"] == b["files"] != c["files"]
    x, y = store.load_split(tmp_path / "a", "train")
    assert (y == -1).all() and x.shape == (5000, 1, 28, 28)
    with pytest.raises(ConfigError, match="7000 samples asked"):
        build.build_public("fashion_mnist", folder, tmp_path / "d", {"n": 7000})
