"""The run-time model behind SLURM's runtime (fedshift.resources.slurm_runtime, issue 35): its
estimates by hand, monotone in the work a job does, stepwise methods priced per step, and the
planned grids asking what the workflow asks."""

from __future__ import annotations

import pytest

from conftest import REPO
from fedshift import resources
from fedshift.experiments import load_experiments


def federate(method="fedavg", base_method=None, rounds=10, local_epochs=2, public_epochs=1, archs=4,
             scenario="rotmnist"):
    """A resolved federate config, only the keys the run-time model reads."""
    return {"kind": "federate", "scenario": scenario, "method": method, "base_method": base_method or method,
            "archs": ["lenet"] * archs,
            "engine": {"rounds": rounds, "local_epochs": local_epochs, "public_epochs": public_epochs}}


def pretrain(epochs=50, scenario="rotmnist"):
    return {"kind": "pretrain", "scenario": scenario, "arch": "lenet", "pretrain": {"epochs": epochs}}


def test_a_small_grid_by_hand():
    # 10 rounds x (2 local + 1 public epochs) x 4 participants x 4 s per participant-epoch at 28x28
    assert resources.runtime_minutes(federate(), threads=1) == pytest.approx(10 * 3 * 4 * 4 / 60)  # 8 min
    assert resources.slurm_runtime(federate(), 1, threads=1) == 16  # twice the estimate
    assert resources.slurm_runtime(federate(), 2, threads=1) == 32  # doubled on the retry
    assert resources.slurm_runtime(federate(), 3, threads=1) == 64
    # four threads: the estimate over sqrt(4)
    assert resources.runtime_minutes(federate(), threads=4) == pytest.approx(4.0)
    assert resources.slurm_runtime(federate(), 1, threads=4) == resources.MIN_RUNTIME_MINUTES  # 8 < 15
    # 100 rounds on 2 threads: 80 / sqrt(2) = 56.57 min, asked ceil(113.1) = 114
    assert resources.slurm_runtime(federate(rounds=100), 1, threads=2) == 114


def test_public_epochs_default_to_one():
    cfg = federate()
    del cfg["engine"]["public_epochs"]
    assert resources.runtime_minutes(cfg, 1) == resources.runtime_minutes(federate(public_epochs=1), 1)


def test_stepwise_methods_are_priced_per_step_not_per_epoch():
    """FedH2L's Table II: 10,000 rounds of four LeNets, one step each: ~20 min on one thread, not days."""
    for method in ("fedh2l", "agg", "ind"):
        assert resources.is_stepwise(method)
        est = resources.runtime_minutes(federate(method, rounds=10_000), 1)
        assert est == pytest.approx(10_000 * 0.12 / 60)  # 0.12 s per round of four models
        assert resources.slurm_runtime(federate(method, rounds=10_000), 1, threads=1) == 40
        # local epochs do not price a step
        assert resources.runtime_minutes(federate(method, rounds=10_000, local_epochs=50), 1) == est
    assert not resources.is_stepwise("fedavg") and not resources.is_stepwise("fedmd")
    # a variant is priced by its base method
    assert resources.runtime_minutes(federate("fedh2l_variant", "fedh2l", rounds=10_000), 1) == pytest.approx(20.0)


def test_monotone_in_rounds_epochs_participants_and_pixels():
    def minutes(**kw):
        return resources.runtime_minutes(federate(**kw), 1)

    for key, values in (("rounds", (1, 10, 100, 1000)), ("local_epochs", (1, 2, 5, 20)),
                        ("public_epochs", (0, 1, 3)), ("archs", (1, 2, 4, 10))):
        est = [minutes(**{key: v}) for v in values]
        assert est == sorted(est) and len(set(est)) == len(est), (key, est)
        asked = [resources.slurm_runtime(federate(**{key: v}), 1, threads=1) for v in values]
        assert asked == sorted(asked), (key, asked)
    assert minutes(method="fedh2l", rounds=100) < minutes(method="fedh2l", rounds=1000)
    assert [resources.runtime_minutes(federate(), t) for t in (1, 2, 4, 8)] == sorted(
        [resources.runtime_minutes(federate(), t) for t in (1, 2, 4, 8)], reverse=True)
    # colour 32x32 costs 3072 / 784 / 3 = 1.306x a 28x28 grey image; nothing costs less than 28x28 grey
    assert resources.pixel_scale("rotmnist") == 1.0
    assert resources.pixel_scale("digits") == pytest.approx(3 * 32 * 32 / 784 / 3)
    assert minutes(scenario="digits") == pytest.approx(resources.pixel_scale("digits") * minutes())


def test_pretrain_by_hand():
    # 50 epochs x 4 s at 28x28 = 3.33 min: the 15-minute floor
    assert resources.runtime_minutes(pretrain(), 1) == pytest.approx(50 * 4 / 60)
    assert resources.slurm_runtime(pretrain(), 1, threads=1) == 15
    # 500 epochs of Digits on 4 threads: 500 x 4/60 x 1.306 / 2 = 21.77 min, asked ceil(43.5) = 44
    assert resources.slurm_runtime(pretrain(500, "digits"), 1, threads=4) == 44
    assert resources.slurm_runtime(pretrain(500, "digits"), 2, threads=4) == 88


def test_every_planned_job_of_the_default_grid_gets_a_request():
    plan = load_experiments(REPO / "params/experiments.yaml", REPO / "params/data.yaml")
    jobs = list(plan.federate.values()) + list(plan.pretrain.values())
    assert jobs
    for cfg in jobs:
        asked = resources.slurm_runtime(cfg, 1, threads=2)
        assert asked >= resources.MIN_RUNTIME_MINUTES and resources.slurm_runtime(cfg, 2, threads=2) == 2 * asked
