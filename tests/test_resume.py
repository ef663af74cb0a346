"""Resume after any interruption: a real `fedshift federate` job SIGKILLed at a random round
and rerun ends bit-identical to an uninterrupted run; every method's state survives a
state_dict() round trip; a changed config starts afresh."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from fedshift import runner
from fedshift.engine import checkpoint
from fedshift.experiments import load_experiments

from fedshift.testing import resumed_round_three, tiny_federation

DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}}
ROUNDS = 6


def _config(root, tmp_path, method="fcclp_resume", rounds=ROUNDS, **engine):
    exp = {"engine": {"rounds": rounds, "local_epochs": 1, "local_batch": 32, "public_batch": 64, "device": "cpu", "checkpoint_min_s": 0,
                      "threads": 1, "eval_batch": 512, **engine},
           "variants": {"fcclp_resume": {"method": "fccl_plus",
                                         "params": {"fresh_optimizer": False, "corr_samples": 16}}},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method],
                     "structures": ["demo_mixed"]}]}
    plan = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(root))
    (cfg,) = plan.federate.values()
    return cfg


def _outputs(out):
    metrics = json.loads((out / "metrics.json").read_text())
    metrics.pop("timings")  # wall-clock seconds differ between any two runs
    models = torch.load(out / "models.pt", weights_only=True)["participants"]
    return metrics, (out / "rounds.csv").read_bytes(), models, (out / "cross_correlation.npz").read_bytes()


def _checkpoint_round(partial):
    try:
        return torch.load(partial / checkpoint.CHECKPOINT, weights_only=True)["round"]
    except Exception:  # not written yet (or being replaced)
        return 0


def _stop_in_round(monkeypatch, cls, stop_at=3):
    """Make ``cls.run_round`` raise KeyboardInterrupt in round ``stop_at`` (an interruption inside a
    round); returns the list of rounds entered and the original run_round."""
    calls, real = [], cls.run_round

    def run_round(self, ctx):
        r = ctx.round
        calls.append(r)
        if r == stop_at:
            raise KeyboardInterrupt
        return real(self, ctx)

    monkeypatch.setattr(cls, "run_round", run_round)
    return calls, real


def _interrupt_and_resume(monkeypatch, cfg, cls, out, stop_at=3):
    """Run ``cfg`` into ``out``, interrupted inside round ``stop_at`` (after round ``stop_at - 1``
    was checkpointed), then rerun it: it resumes from that checkpoint and runs to the end."""
    _, real = _stop_in_round(monkeypatch, cls, stop_at)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    assert _checkpoint_round(checkpoint.partial_dir(out)) == stop_at - 1
    monkeypatch.setattr(cls, "run_round", real)
    runner.run_federate(cfg, out)


def _same_run(ref, out, files=("rounds.csv",)):
    """Both runs' metrics.json equal but for the wall-clock timings, and ``files`` equal byte for byte;
    returns ref's metrics and out's timings."""
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (ref, out))
    a.pop("timings")
    timings = b.pop("timings")
    assert a == b
    for name in files:
        assert (ref / name).read_bytes() == (out / name).read_bytes(), name
    return a, timings


def test_sigkill_at_random_round_then_rerun_is_bit_identical(tiny_data, tmp_path):
    cfg = _config(tiny_data, tmp_path)
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    ref = tmp_path / "ref"
    runner.run_federate(cfg, ref)
    assert not checkpoint.partial_dir(ref).exists()  # a finished job removes its checkpoint area

    # A random round, different on every run, at least two rounds before the end so that the
    # kill lands before the job could finish.
    kill_after = random.Random().randint(1, ROUNDS - 3)
    out = tmp_path / "out"
    partial = checkpoint.partial_dir(out)
    cmd = [sys.executable, "-m", "fedshift.cli", "federate", str(cfg_path), str(out), "--no-tracking"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while _checkpoint_round(partial) < kill_after and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = _checkpoint_round(partial)
    assert kill_after <= killed_at < ROUNDS, proc.stderr.read().decode()[-2000:]
    assert not (out / "metrics.json").exists()

    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"after round {killed_at}" in done.stdout + done.stderr  # INFO lines on stdout since progress took stderr; it resumed instead of starting over
    a, b = _outputs(ref), _outputs(out)
    assert a[0] == b[0] and a[1] == b[1] and a[3] == b[3]
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        sa, sb = a[2][name]["state_dict"], b[2][name]["state_dict"]
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
    assert json.loads((out / "metrics.json").read_text())["timings"]["resumed_after_rounds"] == [killed_at]
    assert not partial.exists()


def test_changed_config_starts_afresh(tiny_data, tmp_path, monkeypatch):
    cfg = _config(tiny_data, tmp_path, rounds=3)
    out = tmp_path / "out"
    partial = checkpoint.partial_dir(out)
    from fedshift.methods.fccl_plus import FCCLPlus

    calls, _ = _stop_in_round(monkeypatch, FCCLPlus)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    assert _checkpoint_round(partial) == 2
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)  # same config: resumes at round 3
    assert calls == [3]
    calls.clear()
    cfg["engine"]["lr"] = 5e-4
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)  # changed config: starts again at round 1
    assert calls == [1, 2, 3]


def test_checkpoint_min_s_throttles_checkpoints(tiny_data, tmp_path, monkeypatch):
    """With engine.checkpoint_min_s longer than the job, no round writes a checkpoint (a FedH2L
    round is one step: a checkpoint per round would double its time); with 0, every round does."""
    from fedshift.methods.fccl_plus import FCCLPlus

    _stop_in_round(monkeypatch, FCCLPlus)
    for min_s, expected in ((3600, 0), (0, 2)):
        cfg = _config(tiny_data, tmp_path, rounds=4, checkpoint_min_s=min_s)
        out = tmp_path / f"out{min_s}"
        with pytest.raises(KeyboardInterrupt):
            runner.run_federate(cfg, out)
        assert _checkpoint_round(checkpoint.partial_dir(out)) == expected, min_s

STATEFUL = [
    ("base", ("lenet", "simple_cnn"), {}),
    ("fedmd", ("lenet", "simple_cnn"), {"public_subset": 64}),
    ("fedavg", ("lenet", "lenet"), {}),
    ("feddf", ("lenet", "lenet"), {"fresh_optimizer": False}),
    ("fccl", ("lenet", "simple_cnn"), {"fresh_optimizer": False, "teacher": "collaborated", "teacher_bn": "train",
                                       "corr_samples": 16}),
    ("fccl_plus", ("lenet", "simple_cnn"), {"local_distill": "ewc", "fresh_optimizer": False, "corr_samples": 16}),
    ("fccl_plus", ("lenet", "lenet"), {"fntd": False, "teacher_bn": "train", "corr_samples": 16}),
]


@pytest.mark.parametrize("name,archs,params", STATEFUL, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(STATEFUL)])
def test_method_restored_from_state_dict_behaves_identically(tiny_data, tmp_path, name, archs, params):
    """Round r+1 after a save/load (through torch.save and weights_only=True) equals round r+1 straight on."""
    from fedshift.methods import create_method

    def build():
        torch.manual_seed(0)
        fed = tiny_federation(tiny_data, archs, seed=0, rounds=3, public_aug="weak")
        method = create_method(name, params)
        fed.method_name = name
        fed.setup(method)
        return fed, method

    resumed_round_three(build, tmp_path / "state.pt")


def test_interrupted_pretrain_resumes_bit_identically(tiny_data, tmp_path, monkeypatch):
    exp = {"engine": {"device": "cpu"}, "pretrain": {"epochs": 4, "batch": 32, "eval_every": 1, "device": "cpu",
                                                      "threads": 1, "eval_batch": 512},
           "grid": [{"scenarios": ["rotmnist"], "methods": ["base"], "structures": ["homo_lenet"]}]}
    plan = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data))
    cfg = next(iter(plan.pretrain.values()))
    runner.run_pretrain(cfg, tmp_path / "ref")

    from fedshift.engine.federation import Federation

    real, calls = Federation.train_local, []

    def die_in_epoch_3(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(Federation, "train_local", die_in_epoch_3)
    with pytest.raises(KeyboardInterrupt):
        runner.run_pretrain(cfg, tmp_path / "out")
    assert _checkpoint_round(checkpoint.partial_dir(tmp_path / "out")) == 2
    monkeypatch.setattr(Federation, "train_local", real)
    runner.run_pretrain(cfg, tmp_path / "out")
    a = torch.load(tmp_path / "ref/model.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "out/model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "ref/rounds.csv").read_bytes() == (tmp_path / "out/rounds.csv").read_bytes()
    ma, mb = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("ref", "out"))
    ma.pop("timings"), mb.pop("timings")
    assert ma == mb


def test_sampled_server_model_run_resumes_bit_identically(tiny_data, tmp_path, monkeypatch):
    """Client sampling, the shared server model and the global-model curve survive an interruption:
    the resumed run's metrics (rounds_to/*, global/top1), rounds.csv and sampled.csv equal a straight run's."""
    from fedshift.methods.fedmmd import FedMMD

    exp = {"engine": {"rounds": 4, "local_epochs": 1, "local_batch": 32, "device": "cpu", "checkpoint_min_s": 0, "threads": 1,
                      "eval_batch": 512, "clients_per_round": 2, "server_model": True, "participant_eval": False,
                      "global_eval_every": 1, "targets": [0.3, 0.99]},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedmmd"],
                     "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data)).federate.values()
    ref, out = tmp_path / "ref", tmp_path / "out"
    runner.run_federate(cfg, ref)
    _interrupt_and_resume(monkeypatch, cfg, FedMMD, out)
    a, timings = _same_run(ref, out, ("rounds.csv", "sampled.csv"))
    assert timings["resumed_after_rounds"] == [2] and "rounds_to/0.99" in a["headline"]


def test_the_pending_delivery_is_saved_once_per_distinct_state_and_tensor(tmp_path):
    """scoring.eval_models: local keeps the server's delivery in the checkpoint: one state for every
    participant is saved once, and per-participant states sharing the server's tensors share them on disk
    and after loading (FDSE's shared + personalised packages)."""
    shared = {"w": torch.arange(4096, dtype=torch.float32)}
    pending = {"a": shared, "b": shared, "c": {"w": shared["w"], "p": torch.zeros(3)}}
    state = checkpoint.pending_state(pending)
    assert len(state["states"]) == 2 and state["of"] == {"a": 0, "b": 0, "c": 1}
    torch.save(state, tmp_path / "pending.pt")
    assert (tmp_path / "pending.pt").stat().st_size < 1.5 * 4096 * 4  # one copy of the shared tensor
    back = checkpoint.restore_pending(torch.load(tmp_path / "pending.pt", weights_only=True), torch.device("cpu"))
    assert back["a"] is back["b"] and back["c"]["w"].data_ptr() == back["a"]["w"].data_ptr()
    assert torch.equal(back["c"]["w"], shared["w"]) and torch.equal(back["c"]["p"], torch.zeros(3))
    assert checkpoint.pending_state(None) == {} and checkpoint.restore_pending({}, torch.device("cpu")) is None
