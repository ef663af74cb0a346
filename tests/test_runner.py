"""Job runner: outputs written atomically, BASE checkpoints reused, seeds derived once."""

from __future__ import annotations

import json

import pytest
import torch

from fedshift import runner
from fedshift.errors import ConfigError
from fedshift.experiments import load_experiments

DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}}


def _configs(root, method="fccl", structure="demo_mixed", **engine):
    exp = {"engine": {"rounds": 2, "local_epochs": 1, "local_batch": 32, "public_batch": 64, "device": "cpu", **engine},
           "pretrain": {"epochs": 1, "batch": 32, "device": "cpu"},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method], "structures": [structure]}]}
    plan = load_experiments(exp, DATA, results=str(root / "results"), build=str(root))
    return plan


def test_model_init_is_shared_between_pretrain_and_federate():
    a = runner.build_models(["lenet", "simple_cnn", "lenet"], 10, 1, "batch", seed=3)
    b = runner.build_models(["lenet"] * 3, 10, 1, "batch", seed=3)
    assert all(torch.equal(a[2].state_dict()[k], b[2].state_dict()[k]) for k in a[2].state_dict())
    assert not torch.equal(a[0].state_dict()["head.weight"], a[2].state_dict()["head.weight"])


def test_pretrain_then_federate_from_base(tiny_data, tmp_path):
    plan = _configs(tiny_data)
    solo = {}
    for job, cfg in plan.pretrain.items():
        out = tmp_path / "results/pretrain" / plan.folder(job)  # seed<k>-<identity> (issue 50)
        m = runner.run_pretrain(cfg, out)
        assert (out / "model.pt").exists()
        solo[job.participant] = m["final"][f"{job.participant}/intra/top1"]
    (cfg,) = plan.federate.values()
    cfg["paths"]["pretrained"] = [p.replace(str(tiny_data / "results"), str(tmp_path / "results"))
                                  for p in cfg["paths"]["pretrained"]]
    out = tmp_path / "fed"
    metrics = runner.run_federate(cfg, out)
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["headline"] == pytest.approx(metrics["headline"])
    lines = (out / "rounds.csv").read_text().splitlines()
    assert lines[0] == "round,participant,arch,domain,kind,top1,top5"
    assert len(lines) - 1 == 3 * 4 * 4  # rounds 0..2 x 4 participants x 4 domains
    # Round 0 evaluates the loaded BASE models: exactly the pretraining's final accuracies.
    import pandas as pd

    df = pd.read_csv(out / "rounds.csv")
    r0 = df[(df["round"] == 0) & (df["kind"] == "intra")].set_index("participant")["top1"]
    assert r0.to_dict() == pytest.approx(solo)


def test_missing_checkpoint_is_a_clear_error(tiny_data, tmp_path):
    plan = _configs(tiny_data)
    (cfg,) = plan.federate.values()
    with pytest.raises(ConfigError, match="missing BASE checkpoint .*run the pretrain rule"):
        runner.run_federate(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failed_run_leaves_previous_outputs(tiny_data, tmp_path, monkeypatch):
    plan = _configs(tiny_data, method="fedmd")
    (cfg,) = plan.federate.values()
    out = tmp_path / "out"
    runner.run_federate(cfg, out)
    before = (out / "metrics.json").read_text()
    from fedshift.methods.fedmd import FedMD

    def boom(self, ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(FedMD, "collaborate", boom)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    assert (out / "metrics.json").read_text() == before
    # No temporary folder is left; the checkpoint area stays for a rerun to resume (no round finished yet).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.partial"]
    assert sorted(p.name for p in (tmp_path / "out.partial").iterdir()) == ["job.json"]


@pytest.mark.parametrize("bf16", ["auto", False])
def test_metrics_say_how_this_machine_evaluated(tiny_data, tmp_path, bf16):
    """engine.bf16 / eval_fold_bn ``auto`` resolve per CPU kind: metrics.json records the resolved values
    (and the kind), so scores from an AVX2 and an AVX-512 BF16 machine can be told apart."""
    from fedshift.engine.cpu import KIND_LEVERS, cpu_capabilities, cpu_kind

    plan = _configs(tiny_data, method="fedavg", structure="homo_lenet", rounds=1, bf16=bf16)
    (cfg,) = plan.federate.values()
    runner.run_federate(cfg, tmp_path / "fed")
    numerics = json.loads((tmp_path / "fed/metrics.json").read_text())["numerics"]
    assert numerics["cpu_kind"] == cpu_kind()
    assert numerics["cpu_flags"] == [f for f, on in cpu_capabilities().items() if on]
    levers = KIND_LEVERS.get(cpu_kind(), KIND_LEVERS["other"])
    assert numerics["eval_bf16"] is (bf16 == "auto" and levers.eval_bf16)
    assert numerics["eval_bf16"] is False or cpu_kind() in ("amx", "avx512_bf16")  # never where bf16 is emulated
    assert numerics["eval_fold_bn"] is levers.eval_fold_bn
    assert numerics["torch"] == torch.__version__
    # engine.bf16_train: auto keeps LeNets in float32 (no gain measured, engine/cpu.py KIND_LEVERS); a LeNet has
    # no block to checkpoint, so it never recomputes
    assert set(numerics["train_bf16"].values()) == {False}
    assert len(numerics["train_bf16"]) == 4 and set(numerics["recompute_above_batch"].values()) == {None}
