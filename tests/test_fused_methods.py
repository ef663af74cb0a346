"""engine.fused_clients reaches the server-averaging methods: fused == sequential, refusals, the log line."""

from __future__ import annotations

import logging

import pytest
import torch

from fedshift.engine import fused
from fedshift.errors import ConfigError
from fedshift.methods import create_method
from fedshift.losses import mmd2_rbf, two_stream_l2
from fedshift.testing import synthetic_federation

REACHED = ["fedavg", "fedprox", "fedmmd", "fedmmd_l2", "fedfusion_conv", "fedfusion_multi", "fedfusion_single"]


def _float64_batches(monkeypatch):
    from fedshift.engine import federation
    monkeypatch.setattr(federation, "normalize", lambda x: (x.double() / 255.0 - 0.5) / 0.5)


def one_round(method: str, mode: str, optimizer: str = "sgd"):
    # 7 clients of 12-14 images (unequal: padded last batches), 4 sampled per round, batch 5, 2 epochs
    fed = synthetic_federation(7, clients_per_round=4, local_epochs=2, fused_clients=mode, optimizer=optimizer,
                               momentum=0.9, lr=0.05)
    params = {"mu": 0.5} if method == "fedprox" else {}
    m = create_method(method, params)
    fed.setup(m)  # FedFusion wraps the models here: float64 after it
    for model in [c.model for c in fed.clients] + [getattr(m, "global_net", fed.clients[0].model)]:
        model.double()
    fused.decide_for_run(fed, m)
    metrics = fed.run_round(1)
    return fed, metrics


@pytest.mark.parametrize("method", REACHED)
def test_fused_round_equals_sequential_in_float64(method, monkeypatch):
    _float64_batches(monkeypatch)
    seq, seq_metrics = one_round(method, "off")
    fus, fus_metrics = one_round(method, "on")
    assert getattr(fus, "fused_rounds", 0) == 1 and not hasattr(seq, "fused_rounds")  # the fused path ran
    assert seq_metrics.keys() == fus_metrics.keys() and len(seq_metrics) == 4
    for k in seq_metrics:
        assert fus_metrics[k] == pytest.approx(seq_metrics[k], rel=1e-6), k  # both means kept in float32
    a, b = seq.clients[0].model.state_dict(), fus.clients[0].model.state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-9, atol=1e-11)


def test_fused_adam_round_equals_sequential(monkeypatch):
    _float64_batches(monkeypatch)
    seq, _ = one_round("fedavg", "off", optimizer="adam")
    fus, _ = one_round("fedavg", "on", optimizer="adam")
    for k, v in seq.clients[0].model.state_dict().items():
        torch.testing.assert_close(fus.clients[0].model.state_dict()[k], v, rtol=1e-9, atol=1e-11)


def test_the_round_changes_the_model(monkeypatch):
    # guards the equality test above against a round that trains nothing
    _float64_batches(monkeypatch)
    fed = synthetic_federation(7, clients_per_round=4, fused_clients="on")
    for m in {id(c.model): c.model for c in fed.clients}.values():
        m.double()
    before = {k: v.clone() for k, v in fed.clients[0].model.state_dict().items()}
    m = create_method("fedavg")
    fed.setup(m)
    fused.decide_for_run(fed, m)
    fed.run_round(1)
    assert fed.fused_rounds == 1
    assert any(not torch.equal(before[k], v) for k, v in fed.clients[0].model.state_dict().items())


@pytest.mark.parametrize("n", [5, 8])
def test_masked_penalties_equal_the_unpadded_ones(n):
    g = torch.Generator().manual_seed(n)
    x, y = torch.randn(8, 10, generator=g, dtype=torch.float64), torch.randn(8, 10, generator=g, dtype=torch.float64)
    w = (torch.arange(8) < n).double()
    torch.testing.assert_close(mmd2_rbf(x, y, min_scale=1.0, mask=w), mmd2_rbf(x[:n], y[:n], min_scale=1.0))
    torch.testing.assert_close(mmd2_rbf(x, y, mask=w), mmd2_rbf(x[:n], y[:n]))
    torch.testing.assert_close(two_stream_l2(x, y, mask=w), two_stream_l2(x[:n], y[:n]))


def _models(arch, norm="group", k=1):
    from fedshift.runner import build_models
    return build_models([arch] * k, 10, 1, norm, 0)


@pytest.mark.parametrize("method,pattern", [
    ("moon", "'moon' overrides local_loss of FedAvg"),
    ("fedrs", "'fedrs' overrides local_loss of FedAvg"),
    ("fedmd", "'fedmd' has no fused local objective"),
])
def test_on_refuses_methods_it_does_not_reach_in_one_line(method, pattern):
    with pytest.raises(ConfigError, match=pattern) as e:
        fused.fusion_decision("on", create_method(method), ["lenet"] * 2, _models("lenet"), "cpu")
    assert "\n" not in str(e.value) and "fused_clients: auto or off" in str(e.value)
    fuse, why = fused.fusion_decision("auto", create_method(method), ["lenet"] * 2, _models("lenet"), "cuda")
    assert not fuse and why.startswith("auto fell back: ")


def test_on_refuses_batchnorm_and_mixed_architectures():
    with pytest.raises(ConfigError, match="BatchNorm at"):
        fused.plan_check(create_method("fedavg"), ["resnet10"] * 2, "batch", "on", "cpu")
    with pytest.raises(ConfigError, match="architectures differ"):
        fused.fusion_decision("on", create_method("fedavg"), ["lenet", "resnet10"], _models("lenet"), "cpu")
    fused.plan_check(create_method("fedavg"), ["lenet"] * 2, "group", "on", "cpu")  # fusable: no error
    with pytest.raises(ConfigError, match="on_nonfinite: skip_batch"):
        fused.plan_check(create_method("fedavg"), ["lenet"] * 2, "group", "on", "cpu", "skip_batch")


def test_auto_follows_the_measured_per_device_default():
    lenet = _models("lenet")
    big = _models("fedavg_cnn_mnist")  # 1.66 M parameters: measured 0.87x fused on CPU
    assert fused.fusion_decision("auto", create_method("fedavg"), ["lenet"] * 2, lenet, "cpu")[0]
    assert fused.fusion_decision("auto", create_method("fedavg"), ["lenet"] * 2, lenet, "cuda")[0]
    assert fused.fusion_decision("auto", create_method("fedavg"), ["fedavg_cnn_mnist"] * 2, big, "cuda")[0]
    fuse, why = fused.fusion_decision("auto", create_method("fedavg"), ["fedavg_cnn_mnist"] * 2, big, "cpu")
    assert not fuse and why.startswith("auto fell back: on cpu fusion pays off only up to 200,000 parameters")
    assert not fused.fusion_decision("auto", create_method("fedavg"), ["lenet"] * 2, lenet, "mps")[0]


def test_the_run_logs_once_which_path_trains(caplog):
    for mode, arch, want in (("auto", "lenet", "clients train fused (engine.fused_clients: auto)"),
                             ("off", "lenet", "clients train sequentially (engine.fused_clients: off)"),
                             ("auto", "fedavg_cnn_mnist", "clients train sequentially (auto fell back: on cpu")):
        caplog.clear()
        fed = synthetic_federation(3, fused_clients=mode, arch=arch)
        with caplog.at_level(logging.INFO, logger="fedshift"):
            fused.decide_for_run(fed, create_method("fedavg"))
        lines = [r.getMessage() for r in caplog.records if "clients train" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith(want), lines


def test_fused_run_resumes_bit_identically_and_logs_its_path(tiny_data, tmp_path, monkeypatch, caplog):
    """fused_clients: on through the runner: the log says fused, and an interrupted run resumes to the
    straight run's metrics and rounds.csv (sampling + server model, FedMMD's second stream)."""
    from fedshift import runner
    from fedshift.experiments import load_experiments
    from fedshift.methods.fedmmd import FedMMD
    from test_resume import DATA, _interrupt_and_resume, _same_run

    exp = {"engine": {"rounds": 4, "local_epochs": 1, "local_batch": 32, "device": "cpu", "checkpoint_min_s": 0,
                      "threads": 1, "eval_batch": 512, "clients_per_round": 3, "server_model": True,
                      "participant_eval": False, "global_eval_every": 1, "targets": [0.3], "fused_clients": "on"},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedmmd"],
                     "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data)).federate.values()
    ref, out = tmp_path / "ref", tmp_path / "out"
    calls = []
    orig = fused.train_clients_fused
    monkeypatch.setattr(fused, "train_clients_fused", lambda *a, **k: calls.append(1) or orig(*a, **k))
    with caplog.at_level(logging.INFO):
        runner.run_federate(cfg, ref)
    assert len(calls) == 4  # every round trained fused
    assert [r.getMessage() for r in caplog.records if "clients train" in r.getMessage()] == \
        ["clients train fused (engine.fused_clients: on)"]
    _interrupt_and_resume(monkeypatch, cfg, FedMMD, out)
    _same_run(ref, out)


def test_fused_fedh2l_run_resumes_bit_identically(tiny_data, tmp_path, monkeypatch):
    """FedH2L with its local, teaching and mutual steps fused, through the runner: an interrupted
    run resumes to the straight run's metrics and rounds.csv (the node state is the sequential one)."""
    from fedshift import runner
    from fedshift.experiments import load_experiments
    from fedshift.methods.fedh2l import FedH2L
    from test_resume import DATA, _interrupt_and_resume, _same_run

    exp = {"engine": {"rounds": 6, "eval_every": 2, "device": "cpu", "checkpoint_min_s": 0, "threads": 1,
                      "public_aug": "none", "norm": "none", "fused_clients": "on"},
           "methods": {"fedh2l": {"log_every": 2}},
           "grid": [{"scenarios": ["rotmnist"], "public": ["none"], "methods": ["fedh2l"],
                     "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data)).federate.values()
    ref, out = tmp_path / "ref", tmp_path / "out"
    mutual = []
    orig = FedH2L.fused_mutual_step
    monkeypatch.setattr(FedH2L, "fused_mutual_step", lambda self, fed, *a: mutual.append(1) or orig(self, fed, *a))
    runner.run_federate(cfg, ref)
    assert len(mutual) == 6  # every round's mutual step ran fused
    _interrupt_and_resume(monkeypatch, cfg, FedH2L, out, stop_at=4)
    _same_run(ref, out)


def test_on_is_refused_at_planning_before_any_job(tiny_data, tmp_path):
    from fedshift.experiments import load_experiments
    from test_resume import DATA

    exp = {"engine": {"rounds": 1, "device": "cpu", "fused_clients": "on"},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["moon"],
                     "structures": ["homo_lenet"]}]}
    with pytest.raises(ConfigError, match="fused_clients: on cannot fuse: method 'moon' overrides local_loss"):
        load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data))


@pytest.mark.parametrize("method", ["fedavg", "fedprox"])
def test_fused_equals_sequential_under_eval_models_local(method, monkeypatch):
    """The authors' protocol (scoring eval_models: local: every participant trains and keeps its own model,
    the average reaching it at the next round's start) fused."""
    _float64_batches(monkeypatch)

    def run(mode):
        fed = synthetic_federation(4, server_model=False, local_epochs=2, fused_clients=mode, lr=0.05,
                                   scoring={"eval_models": "local"})
        m = create_method(method, {"mu": 0.5} if method == "fedprox" else {})
        fed.setup(m)
        for c in fed.clients:
            c.model.double()
        fused.decide_for_run(fed, m)
        for r in (1, 2):
            fed.round = r
            fed.run_round(r)
        return fed

    seq, fus = run("off"), run("on")
    assert fus.fused_rounds == 2 and not hasattr(seq, "fused_rounds")
    for a, b in zip(seq.clients, fus.clients):
        for k, v in a.model.state_dict().items():
            torch.testing.assert_close(b.model.state_dict()[k], v, rtol=1e-9, atol=1e-11)
    assert not torch.equal(seq.clients[0].model.head.weight, seq.clients[1].model.head.weight)  # own models kept


def test_auto_does_not_fuse_the_stepwise_nodes_on_cpu():
    fuse, why = fused.fusion_decision("auto", create_method("fedh2l"), ["lenet"] * 4, _models("lenet"), "cpu")
    assert not fuse and "fuses by auto only on cuda" in why
    assert fused.fusion_decision("auto", create_method("ind"), ["lenet"] * 4, _models("lenet"), "cuda")[0]
    assert fused.fusion_decision("on", create_method("agg"), ["lenet"] * 4, _models("lenet"), "cpu")[0]
