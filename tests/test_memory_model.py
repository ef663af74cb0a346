"""The memory model behind SLURM's mem_mb (fedshift.resources): its counts by hand, its
requests against the peak RSS of real jobs (issue 22 point 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import REPO
from fedshift import resources
from fedshift.experiments import load_experiments

sys.path.insert(0, str(REPO / "benchmarks"))
import memory_model  # noqa: E402


def test_lenet_counts_by_hand():
    """LeNet-5 at 1x28x28 (norm none): every leaf module's output, by hand."""
    weights_mb, act_mb = resources.arch_profile("lenet", (1, 28, 28), 10)
    params = (1 * 6 * 25 + 6) + (6 * 16 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)
    # conv, norm (Identity), ReLU at 6x24x24; pool 6x12x12; conv, norm, ReLU at 16x8x8; pool 16x4x4;
    # FC 120, ReLU, FC 84, ReLU, head 10
    outputs = 3 * 6 * 24 * 24 + 6 * 12 * 12 + 3 * 16 * 8 * 8 + 16 * 4 * 4 + 2 * 120 + 2 * 84 + 10
    assert weights_mb == pytest.approx(params * 4 / 2**20)
    assert act_mb == pytest.approx(outputs * 4 / 2**20)
    # no block runs under checkpointing: recompute changes nothing
    assert resources.arch_profile("lenet", (1, 28, 28), 10, recompute=False)[1] == act_mb


def test_recompute_keeps_less_than_every_output_and_scales_with_pixels():
    _, full = resources.arch_profile("resnet10", (3, 32, 32), 10, recompute=False)
    _, kept = resources.arch_profile("resnet10", (3, 32, 32), 10, recompute=True)
    assert 0 < kept < full
    # a CIFAR-style ResNet keeps its resolution: 4x the pixels, 4x the activations (up to the head)
    _, big = resources.arch_profile("resnet10", (3, 64, 64), 10, recompute=False)
    assert big == pytest.approx(4 * full, rel=0.01)


def test_estimate_components_and_request():
    e = resources.estimate(["lenet"] * 4, (1, 28, 28), copies=2, local_batch=64, public_batch=0,
                           eval_batch=256, optimiser=2, data_mb=10.0)
    w, a = resources.arch_profile("lenet", (1, 28, 28), 10)
    slots = 1 + 1 + 2 + 2 + 1
    assert e.weights == pytest.approx(4 * w * slots)
    assert e.activations == pytest.approx(resources.ACT_FACTOR * 64 * a + resources.KEEP_FACTOR * 256 * 4 * a)
    assert e.base == resources.BASE_MB and e.data == 10.0
    assert e.request_mb() >= resources.HEADROOM * e.total and e.request_mb() % 256 == 0
    assert e.request_mb(2) >= 2 * e.request_mb() - 256  # a retry asks for twice as much
    # all graphs alive in FCCL's collaborative step: the public batch of every participant at once
    one = resources.estimate(["lenet"] * 4, (1, 28, 28), copies=2, local_batch=8, public_batch=512)
    every = resources.estimate(["lenet"] * 4, (1, 28, 28), copies=2, local_batch=8, public_batch=512,
                               all_graphs=True)
    assert every.activations - one.activations == pytest.approx(resources.ACT_FACTOR * 512 * 3 * a)
    # on a GPU the host holds the CUDA runtime and the data, not the activations
    gpu = resources.estimate(["resnet10"] * 4, (3, 32, 32), local_batch=256, device="cuda",
                             data_mb=100.0)
    assert gpu.activations == 0 and gpu.base == resources.CUDA_BASE_MB


def test_methods_declare_their_memory_profile():
    """resources reads the method classes, never their names: a variant or a plugin method
    gets the profile of the class it runs."""
    from fedshift.methods import METHODS

    assert METHODS.get("moon").weight_copies == 2 and METHODS.get("fedavg").weight_copies == 1
    assert METHODS.get("base").weight_copies == 0
    assert METHODS.get("fccl_plus").public_graphs == "engine"  # inherited from FCCL
    for name in ("feddf", "fedmatch", "rhfl"):  # counted as one graph: FedDF's measured peak (resources doc)
        assert METHODS.get(name).public_graphs == "one", name
    assert METHODS.get("fedh2l").steps_on_peer_batches and not METHODS.get("ind").steps_on_peer_batches

    def job(method, graphs="one", archs=("lenet",) * 4):
        return {"kind": "federate", "scenario": "rotmnist", "method": method, "archs": list(archs),
                "paths": {"public": "build/public/x"}, "method_params": {},
                "engine": {"local_batch": 32, "public_batch": 256, "eval_batch": 256, "public_graphs": graphs,
                           "optimizer": "adam", "device": "cpu", "norm": "default", "recompute": "auto"}}

    est = lambda *a, **k: resources.job_estimate(job(*a, **k)).activations  # noqa: E731
    assert est("fccl", "all") > est("fccl", "one")  # engine.public_graphs decides for FCCL
    assert est("feddf", "one") == est("feddf", "all") == est("fccl", "one")  # only FCCL follows the engine key
    assert est("fedh2l") > est("ind")  # the mutual step: K peer batches through one model


DATA = {
    "datasets": ["mnist5k", "photo_patches"],
    "public": {"photo_patches": {"n": 256, "seed": 0}},
    "scenarios": {"rotmnist": {"source": "mnist5k", "per_class": 20, "alpha": 0.1, "val": 0.1, "test": 0.25, "seed": 0}},
}


@pytest.mark.slow
def test_requests_hold_real_peaks_with_headroom(tiny_data, tmp_path):
    """Real jobs, one process each, MLflow on, as the workflow runs them: the request is at least
    1.25x the job's peak RSS and not more than 2.5x (a request a cluster would queue for nothing)."""
    eng = {"rounds": 1, "local_epochs": 1, "local_batch": 64, "public_batch": 256, "device": "cpu",
           "checkpoint_min_s": 0, "threads": 1}
    exp = {"engine": eng, "pretrain": {"epochs": 1, "batch": 64, "eval_every": 1, "device": "cpu", "threads": 1},
           "grid": [{"name": "mem", "scenarios": ["rotmnist"], "public": ["photo_patches"],
                     "methods": ["fedavg"], "structures": ["homo_lenet"], "seeds": [0]},
                    {"name": "mem_mixed", "scenarios": ["rotmnist"], "public": ["photo_patches"],
                     "methods": ["base", "fedmd", "fccl_plus"], "structures": ["demo_mixed"], "seeds": [0]}]}
    plan = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data))
    jobs = {f"{cfg['method']}_{cfg['structure']}": cfg for cfg in plan.federate.values() if cfg["method"] != "base"}
    jobs["pretrain_fedavg_cnn_mnist"] = next(c for c in plan.pretrain.values() if c["arch"] == "fedavg_cnn_mnist")
    assert len(jobs) == 4
    lines = []
    for name, cfg in jobs.items():
        r = memory_model.measure(cfg, tmp_path / name, threads=1)
        lines.append(f"{name}: peak {r['peak_mb']:.0f} MB, request {r['request_mb']} MB "
                     f"({r['request_mb'] / r['peak_mb']:.2f}x; {r['estimate'].describe()})")
        assert r["peak_mb"] > 300, lines[-1]  # VmHWM was read: the job's own peak, not nothing
        assert 1.25 * r["peak_mb"] <= r["request_mb"] <= 2.5 * r["peak_mb"], "\n".join(lines)
    print("\n".join(lines))
