"""Trustworthy runs: divergence stops a job with one line, signals leave a resumable
checkpoint and a KILLED MLflow run, tracking failures never cost results, corrupt data
and unwritable results folders fail before training."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import numpy as np
import pytest
import torch
import yaml

from fedshift.cli import main
from fedshift.data import store
from fedshift import runner
from fedshift.engine import checkpoint
from fedshift.errors import ConfigError, NonFiniteError
from fedshift.experiments import load_experiments

from fedshift.testing import tiny_federation

DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}}


def _config(build, tmp_path, method="fedmd", rounds=2, structure="demo_mixed", **engine):
    exp = {"engine": {"rounds": rounds, "local_epochs": 1, "local_batch": 32, "public_batch": 64, "device": "cpu", "checkpoint_min_s": 0,
                      "threads": 1, "eval_batch": 512, **engine},
           "methods": {"fedmd": {"public_subset": 64}},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method],
                     "structures": [structure]}]}
    plan = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(build))
    (cfg,) = plan.federate.values()
    return cfg


def _write(tmp_path, cfg):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def _store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    from fedshift.tracking import init_store

    os.environ["MLFLOW_TRACKING_URI"] = uri  # init_store reads it; the function fixture keeps it set
    try:
        init_store(root)
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    import mlflow

    return uri, mlflow.MlflowClient(uri)


@pytest.fixture()
def mlflow_store(_store, monkeypatch):
    """One SQLite store per module (creating one costs seconds); every test starts with no runs."""
    uri, client = _store
    monkeypatch.chdir(uri.split("sqlite:///")[1].rsplit("/", 1)[0])  # artifacts go beside the store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("FEDSHIFT_TRACKING", "mlflow")
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            client.delete_run(run.info.run_id)
    return client


def _runs(client, experiment="rotmnist"):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


# ------------------------------------------------------------------ divergence
def test_diverging_lr_fails_with_one_line_and_mlflow_failed(tiny_data, tmp_path, capsys, mlflow_store):
    cfg = _config(tiny_data, tmp_path, method="base", optimizer="sgd", lr=1e30)
    out = tmp_path / "out"
    capsys.readouterr()  # drop the store's creation messages
    code = main(["federate", str(_write(tmp_path, cfg)), str(out)])
    # stderr carries the job's progress lines ("[run] ..."), then the error as one line
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]
    assert code == 1
    assert len(err) == 1 and err[0].startswith("fedshift: error: non-finite")
    assert "method base, participant m0, round 1, term local_loss" in err[0]
    assert not (out / "metrics.json").exists()
    (run,) = _runs(mlflow_store)
    assert run.info.status == "FAILED"
    # the divergence is the seed's outcome: recorded beside the checkpoint for `fedshift archive` (issue 52)
    div = tmp_path / "out.partial" / "diverged"
    m = json.loads((div / "metrics.json").read_text())
    assert m["diverged"] is True and m["diverged_round"] == 1 and "fedshift: error: " + m["error"] == err[0]
    assert (div / "config.yaml").exists() and (div / "inputs.json").exists() and (div / "rounds.csv").exists()
    assert not (div / "models.pt").exists() and run.data.tags.get("diverged") == "true"


def test_nan_weight_names_the_tensor(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    fed.method_name = "x"
    fed.check_weights()
    with torch.no_grad():
        next(iter(fed.clients[1].model.parameters()))[0].fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"non-finite weight in method x, participant m20, round 1, term \S+"):
        fed.check_weights()


def test_skip_batch_skips_and_counts_nonfinite_steps(tiny_data):
    import torch.nn.functional as F

    def nan_on_even_steps(client, x, y, step):
        loss = F.cross_entropy(client.model(x), y)
        return loss * float("nan") if step % 2 == 0 else loss

    fed = tiny_federation(tiny_data, ("lenet",), on_nonfinite="skip_batch")
    n_batches = len(list(fed.private_batches(fed.clients[0])))
    loss = fed.train_local(fed.clients[0], nan_on_even_steps)
    assert np.isfinite(loss)
    assert fed.skipped_batches == n_batches  # the step counter advances only on real steps: every batch is even
    assert all(torch.isfinite(p).all() for p in fed.clients[0].model.parameters())

    fail = tiny_federation(tiny_data, ("lenet",))
    fail.method_name = "m"
    with pytest.raises(NonFiniteError, match="participant m0, round 1, term local_loss"):
        fail.train_local(fail.clients[0], nan_on_even_steps)


# --------------------------------------------------------------------- signals
def test_sigterm_checkpoints_marks_killed_and_rerun_continues_the_run(tiny_data, tmp_path, mlflow_store,
                                                                       monkeypatch, capsys):
    from fedshift.methods.fedmd import FedMD

    cfg = _config(tiny_data, tmp_path, rounds=3)
    args = ["federate", str(_write(tmp_path, cfg)), str(tmp_path / "out")]
    partial = checkpoint.partial_dir(tmp_path / "out")
    real = FedMD.run_round

    def term_in_round_2(self, ctx):
        r = ctx.round
        if r == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # as SLURM does at the time limit
        return real(self, ctx)

    monkeypatch.setattr(FedMD, "run_round", term_in_round_2)
    capsys.readouterr()
    assert main(args) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in capsys.readouterr().err.strip().splitlines()[-1]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored after the job
    assert torch.load(partial / checkpoint.CHECKPOINT, weights_only=True)["round"] == 1
    assert not (tmp_path / "out" / "metrics.json").exists()
    (run,) = _runs(mlflow_store)
    assert run.info.status == "KILLED"

    monkeypatch.setattr(FedMD, "run_round", real)
    assert main(args) == 0
    (again,) = _runs(mlflow_store)  # the same run, continued: no duplicate
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert "models.pt" in [a.path for a in mlflow_store.list_artifacts(run.info.run_id)]
    assert not partial.exists()


def test_run_left_running_by_a_kill_is_marked_failed(tmp_path, mlflow_store):
    from fedshift.tracking import mlflow_run

    exp = mlflow_store.get_experiment_by_name("scen")
    exp = exp.experiment_id if exp else mlflow_store.create_experiment("scen")
    stale = mlflow_store.create_run(exp, run_name="federate/x").info.run_id  # as a SIGKILLed job leaves it
    with mlflow_run("scen", "federate/x", root=tmp_path):
        pass
    assert mlflow_store.get_run(stale).info.status == "FAILED"


# -------------------------------------------------------------------- tracking
def test_unreachable_tracking_server_degrades_to_a_warning(tiny_data, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("FEDSHIFT_TRACKING", "mlflow")
    monkeypatch.setenv("FEDSHIFT_MLFLOW_TIMEOUT", "20")
    cfg = _config(tiny_data, tmp_path, rounds=1)
    out = tmp_path / "out"
    assert main(["federate", str(_write(tmp_path, cfg)), str(out)]) == 0
    assert (out / "metrics.json").exists()
    assert any("MLflow" in r.getMessage() and "files" in r.getMessage() for r in caplog.records)


def test_a_hung_tracking_call_is_given_up_after_the_time_limit(monkeypatch, caplog):
    from fedshift.tracking import MlflowTracker

    class Hung:
        def log_batch(self, *a, **k):
            time.sleep(30)

    import mlflow.entities  # noqa: F401  (log_metrics imports it first: seconds on a loaded machine, not the call under test)

    monkeypatch.setenv("FEDSHIFT_MLFLOW_TIMEOUT", "0.3")
    t = MlflowTracker(Hung(), "run")
    t0 = time.time()
    t.log_metrics({"a": 1.0}, step=1)
    t.log_metrics({"a": 2.0}, step=2)  # tracking is off after the first failure: no second wait
    assert time.time() - t0 < 5 and t.disabled
    assert sum("tracking is off" in r.getMessage() for r in caplog.records) == 1


# ------------------------------------------------------------ data and folders
def test_unwritable_results_folder_fails_before_training(tiny_data, tmp_path, monkeypatch):
    cfg = _config(tiny_data, tmp_path)
    blocker = tmp_path / "results_file"
    blocker.write_text("a file where the results folder should be")
    from fedshift.methods.fedmd import FedMD

    monkeypatch.setattr(FedMD, "run_round", lambda *a: pytest.fail("trained before checking the folder"))
    with pytest.raises(ConfigError, match=r"results folder .*results_file.* is not writable"):
        runner.run_federate(cfg, blocker / "out")


def _copy_partition(tiny_data, tmp_path):
    build = tmp_path / "build"
    shutil.copytree(tiny_data / "partitions", build / "partitions")
    shutil.copytree(tiny_data / "public", build / "public")
    return build


def test_edited_partition_file_fails_naming_it_and_dvc_repro(tiny_data, tmp_path):
    build = _copy_partition(tiny_data, tmp_path)
    target = build / "partitions/rotmnist/m20/test_images.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    cfg = _config(build, tmp_path)
    with pytest.raises(ConfigError, match=r"m20/test_images.npy: sha256 differs.*`dvc repro`"):
        runner.run_federate(cfg, tmp_path / "out")


def test_label_out_of_range_fails(tiny_data, tmp_path):
    build = _copy_partition(tiny_data, tmp_path)
    folder = build / "partitions/rotmnist"
    labels = np.load(folder / "m0/private_labels.npy")
    labels[0] = 10
    np.save(folder / "m0/private_labels.npy", labels)
    info = {k: v for k, v in store.read_manifest(folder).items() if k != "files"}
    store.write_manifest(folder, info)  # a consistent manifest: only the label check can catch it
    with pytest.raises(ConfigError, match=r"participant 'm0' split 'private': labels span 0..10, outside 0..9"):
        runner.run_federate(_config(build, tmp_path), tmp_path / "out")


def test_models_pt_rescored_by_fedshift_evaluate(tiny_data, tmp_path, capsys, monkeypatch):
    cfg = _config(tiny_data, tmp_path, rounds=1)
    out = tmp_path / "out"
    metrics = runner.run_federate(cfg, out)
    saved = torch.load(out / "models.pt", weights_only=True)
    assert sorted(saved["participants"]) == sorted(cfg["participants"])
    summary = runner.evaluate_run(out)
    assert summary == pytest.approx(metrics["final"])
    assert main(["evaluate", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "avg/inter/top1" in printed
    assert any(line.startswith("# ") and "final models after round 1" in line for line in printed.splitlines())
    # --bf16: the same weights under bf16 autocast (how much bf16 evaluation moves a number),
    # refused, naming the key, where the CPU has no hardware bf16
    from fedshift.engine import cpu

    if cpu.bf16_supported(torch.device("cpu")):
        low = runner.evaluate_run(out, bf16=True)
        assert low.keys() == summary.keys()
        assert low["avg/inter/top1"] == pytest.approx(summary["avg/inter/top1"], abs=0.1)
    monkeypatch.setattr(cpu, "bf16_supported", lambda device: False)
    with pytest.raises(ConfigError, match="engine.bf16"):
        runner.evaluate_run(out, bf16=True)
    assert main(["evaluate", str(out), "--no-bf16"]) == 0
