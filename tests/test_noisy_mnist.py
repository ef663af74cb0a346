"""The scenario docs/datasets.md "Adding a scenario" adds, step by step (issue 49): its noise against the
definition, its partition audited and deterministic, `fedshift validate` of a grid naming it, and a
federation trained and scored on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedshift.data import SCENARIOS, build, store
from fedshift.data.scenarios.noisy_mnist import NoisyMnistParams, add_noise
from fedshift.errors import ConfigError


def test_add_noise_is_the_rounded_clipped_gaussian():
    x = np.full((2, 1, 40, 40), 128, dtype=np.uint8)
    x[1] = 250
    out = add_noise(x, 20.0, np.random.default_rng(3))
    want = np.clip(np.rint(x.astype(np.float64) + np.random.default_rng(3).normal(0.0, 20.0, x.shape)), 0, 255)
    np.testing.assert_array_equal(out, want.astype(np.uint8))
    d = out[0].astype(np.float64) - 128  # unclipped: mean 0, std sigma (3,200 draws: within 4 standard errors)
    assert abs(d.mean()) < 4 * 20 / np.sqrt(d.size) and abs(d.std() - 20) < 4 * 20 / np.sqrt(2 * d.size)
    assert out[1].max() == 255  # clipped at the top
    np.testing.assert_array_equal(add_noise(x, 0, np.random.default_rng(0)), x)


def test_params_refuse_what_leaves_no_data():
    with pytest.raises(ValueError, match="distinct"):
        NoisyMnistParams(sigmas=(10, 10))
    with pytest.raises(ValueError, match="private data"):
        NoisyMnistParams(val=0.5, test=0.5)


def test_partition_roles_shared_noise_per_participant_and_audited(tiny_data, tmp_path):
    out = tmp_path / "noisy"
    build.partition("noisy_mnist", {"mnist5k": tiny_data / "datasets/mnist5k"}, out, {"per_class": 20})
    man = store.read_manifest(out)
    assert sorted(man["participants"]) == ["s0", "s48", "s96"]
    clean, _ = store.load_split(tiny_data / "datasets/mnist5k", "train")
    splits = {p: {s: store.load_split(out / p, s) for s in ("private", "val", "test")} for p in ("s0", "s48", "s96")}
    idx = {s: np.load(out / "s0" / f"{s}_index.npy") for s in ("private", "val", "test")} \
        if (out / "s0" / "private_index.npy").exists() else None
    for s in ("private", "val", "test"):
        x0, y0 = splits["s0"][s]
        assert len(y0) == {"private": 130, "val": 20, "test": 50}[s]  # 20 per class: 13 / 2 / 5
        for p, sigma in (("s48", 48), ("s96", 96)):
            x, y = splits[p][s]
            np.testing.assert_array_equal(y, y0)  # the same images in the same roles
            d = x.astype(np.float64) - x0.astype(np.float64)
            mid = (x0 >= 112) & (x0 <= 143)  # clean pixels 2.3 sigma from both clips at sigma 48
            if sigma == 48 and mid.sum() > 500:  # noise of the participant's sigma (clipping: <= 2 % of it)
                assert abs(d[mid].mean()) < 4 * sigma / np.sqrt(mid.sum())
                assert d[mid].std() == pytest.approx(sigma, rel=0.06)
            assert (d != 0).mean() > 0.3  # every image is noisy (background: half the draws clip to 0)
        if idx is not None:
            np.testing.assert_array_equal(x0, clean[idx[s]])  # s0: the clean source rows
    # the exact recipe: participant k's noise from SeedSequence(seed).spawn(K)[k], split after split
    children = np.random.SeedSequence(0).spawn(3)
    for k, (p, sigma) in enumerate((("s0", 0), ("s48", 48), ("s96", 96))):
        g = np.random.default_rng(children[k])
        for s in ("val", "test", "private"):  # the partition's order (stratified_split: named splits, then the rest)
            np.testing.assert_array_equal(splits[p][s][0], add_noise(splits["s0"][s][0], sigma, g))
    again = tmp_path / "again"
    build.partition("noisy_mnist", {"mnist5k": tiny_data / "datasets/mnist5k"}, again, {"per_class": 20})
    for p in ("s0", "s96"):
        for s in ("private", "test"):
            np.testing.assert_array_equal(store.load_split(again / p, s)[0], splits[p][s][0])  # deterministic


def test_a_grid_names_it_and_a_federation_trains_and_scores_on_it(tiny_data, tmp_path):
    from fedshift.data.loading import load_federated
    from fedshift.engine.config import EngineConfig
    from fedshift.engine.federation import Federation, summarise
    from fedshift.experiments import load_experiments
    from fedshift.methods import create_method
    from fedshift.runner import build_models

    grid = {"engine": {"rounds": 1, "device": "cpu"},
            "grid": [{"scenarios": ["noisy_mnist"], "methods": ["fedavg"], "structures": ["homo_lenet"]}]}
    with pytest.raises(ConfigError, match="scenario 'noisy_mnist' is registered but not built"):
        load_experiments(grid, {"scenarios": {}}, build=str(tmp_path))
    (cfg,) = load_experiments(grid, {"scenarios": {"noisy_mnist": {"per_class": 20}}}, build=str(tmp_path)).federate.values()
    assert cfg["participants"] == ["s0", "s48", "s96"] and len(cfg["archs"]) == 3
    build.partition("noisy_mnist", {"mnist5k": tiny_data / "datasets/mnist5k"}, tmp_path / "partitions/noisy_mnist",
                    {"per_class": 20})
    data = load_federated(tmp_path / "partitions/noisy_mnist", None, "cpu")
    eng = EngineConfig(rounds=1, local_epochs=1, local_batch=32, device="cpu", optimizer="sgd", lr=0.05)
    fed = Federation(data, build_models(["lenet"] * 3, 10, 1, "default", 0), ["lenet"] * 3, eng, 0, torch.device("cpu"))
    fed.setup(create_method("fedavg"))
    metrics = fed.run_round(1)
    assert set(metrics) == {f"s{s}/train/local_loss" for s in (0, 48, 96)}
    summ = summarise(fed.evaluate())
    assert 0 <= summ["avg/inter/top1"] <= 1 and "s96/intra/top1" in summ
    assert SCENARIOS.get("noisy_mnist").image_shape == (1, 28, 28)
