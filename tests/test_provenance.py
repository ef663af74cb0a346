"""Issue 38: runs that know what they were made from (fedshift.provenance).

A published run folder records the sha256 of every input it read, the config's and the code's
hash; a job whose data changed while it ran publishes nothing; collect skips and lists runs whose
inputs changed since; evaluate refuses them (--force scores anyway); resume refuses a checkpoint
written by other code (--resume-across-code-change resumes anyway); one job per run folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from fedshift import provenance, runner
from fedshift.data import store
from fedshift.engine import checkpoint
from fedshift.errors import ConfigError, RunError

from conftest import REPO


def _cfg(build, tmp_path, method="fedavg", rounds=2, **engine):
    from fedshift.experiments import load_experiments

    exp = {"engine": {"rounds": rounds, "local_epochs": 1, "local_batch": 32, "device": "cpu", "threads": 1,
                      "checkpoint_min_s": 0, **engine},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method],
                     "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}},
                              results=str(tmp_path / "results"), build=str(build)).federate.values()
    return cfg


def _rehash(part, **change):
    """Rewrite a folder's manifest as `dvc repro` after a data change would (other content, re-hashed)."""
    m = store.read_manifest(part)
    m.pop("files")
    m.update(change)
    store.write_manifest(part, m)


@pytest.fixture(scope="module")
def published(tiny_data, tmp_path_factory):
    """One finished fedmd run (uses the public set) on a private copy of the data."""
    tmp = tmp_path_factory.mktemp("prov")
    build = tmp / "build"
    shutil.copytree(tiny_data, build)
    cfg = _cfg(build, tmp, method="fedmd", rounds=1)
    out = tmp / "run"
    runner.run_federate(cfg, out)
    return build, cfg, out


def test_run_folder_records_inputs_equal_to_the_current_manifests(published):
    build, cfg, out = published
    rec = json.loads((out / provenance.INPUTS).read_text())
    part, pub = build / "partitions/rotmnist/manifest.json", build / "public/photo_patches/manifest.json"
    assert rec["inputs"] == {"partition/rotmnist": store.sha256_file(part), "public/photo_patches": store.sha256_file(pub)}
    assert rec["paths"] == {"partition/rotmnist": str(part), "public/photo_patches": str(pub)}
    assert rec["config_sha256"] == checkpoint.config_hash(cfg)
    assert rec["code"] == provenance.code_version() and len(rec["code"]["files_sha256"]) == 64
    assert provenance.stale(out) is None


def test_pretrain_and_base_checkpoints_are_recorded(tiny_data, tmp_path):
    """A pretrain run records its partition; a run starting from it records the BASE model.pt's sha256."""
    from fedshift.experiments import load_experiments

    exp = {"engine": {"rounds": 1, "local_epochs": 1, "local_batch": 32, "device": "cpu", "threads": 1},
           "pretrain": {"epochs": 1, "batch": 32, "device": "cpu", "threads": 1},
           "methods": {"fccl": {"init": "base"}},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fccl"],
                     "structures": ["homo_lenet"]}]}
    plan = load_experiments(exp, {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}},
                            results=str(tmp_path / "results"), build=str(tiny_data))
    for job, pcfg in plan.needed_pretrain().items():
        runner.run_pretrain(pcfg, tmp_path / "results/pretrain" / plan.folder(job))
        rec = provenance.read(tmp_path / "results/pretrain" / plan.folder(job))
        assert set(rec["inputs"]) == {"partition/rotmnist"}
    (cfg,) = plan.federate.values()
    runner.run_federate(cfg, tmp_path / "fed")
    rec = provenance.read(tmp_path / "fed")
    ckpts = cfg["paths"]["pretrained"]
    assert [rec["inputs"][f"base/{i}"] for i in range(len(ckpts))] == [store.sha256_file(p) for p in ckpts]


def test_data_rebuilt_during_the_run_publishes_nothing(tiny_data, tmp_path, monkeypatch):
    """Case 1: `dvc repro` while the job ran -> the job refuses to publish, naming input, both hashes, rerun."""
    from fedshift.methods.fedavg import FedAvg

    build = tmp_path / "build"
    shutil.copytree(tiny_data, build)
    part = build / "partitions/rotmnist"
    old = store.sha256_file(part / "manifest.json")
    real = FedAvg.run_round

    def run_round(self, ctx):
        r = ctx.round
        if r == 2:
            _rehash(part, note="rebuilt")
        return real(self, ctx)

    monkeypatch.setattr(FedAvg, "run_round", run_round)
    out = tmp_path / "run"
    with pytest.raises(RunError) as exc:
        runner.run_federate(_cfg(build, tmp_path), out)
    new = store.sha256_file(part / "manifest.json")
    msg = str(exc.value)
    assert "\n" not in msg
    assert (f"input partition/rotmnist ({part / 'manifest.json'}) changed during the run: sha256 {old[:12]} when "
            f"the job started, {new[:12]} now; nothing published") in msg
    assert "rerun the job (`snakemake` reruns it" in msg
    assert not out.exists()


def test_collect_skips_and_lists_runs_whose_inputs_changed(published, tmp_path, capsys):
    build, cfg, out = published
    # a second run made from a private copy of the partition, which then changes
    other_build = tmp_path / "b2"
    shutil.copytree(build / "partitions", other_build / "partitions")
    other = tmp_path / "run2"
    shutil.copytree(out, other)
    rec = provenance.read(other)
    rec["paths"]["partition/rotmnist"] = str(other_build / "partitions/rotmnist/manifest.json")
    provenance.write(other, rec)
    from fedshift.report.collect import collect

    df = collect([out, other], tmp_path / "runs.csv")
    assert len(df) and capsys.readouterr().err == ""
    _rehash(other_build / "partitions/rotmnist", note="rebuilt")
    df2 = collect([out, other / "metrics.json"], tmp_path / "runs.csv")
    err = capsys.readouterr().err
    assert len(df2) * 2 == len(df)  # the stale run's rows are gone
    assert "collect skips 1 federated run(s) whose inputs changed since they ran" in err
    assert f"skipped {other}: input partition/rotmnist" in err and "when it ran" in err
    with pytest.raises(ConfigError, match="every federated run given to collect was made from inputs that changed"):
        collect([other], tmp_path / "runs.csv")


def test_evaluate_refuses_a_run_of_another_partition_and_force_prints_both_hashes(published, tmp_path, capsys):
    """Case 2: the partition was rebuilt since the run -> one line, rc 2; --force scores, printing both."""
    from fedshift.cli import main

    build, cfg, out = published
    run = tmp_path / "run"
    shutil.copytree(out, run)
    rec = provenance.read(run)
    old = rec["inputs"]["partition/rotmnist"]
    rec["inputs"]["partition/rotmnist"] = "0" * 64  # as if trained on a partition since rebuilt
    provenance.write(run, rec)
    now = store.sha256_file(build / "partitions/rotmnist/manifest.json")
    assert old == now
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert (f"{run} was trained on partition/rotmnist sha256 000000000000, "
            f"{build / 'partitions/rotmnist/manifest.json'} now has sha256 {now[:12]}") in err
    assert "pass --force to score it anyway" in err
    assert main(["evaluate", str(run), "--force"]) == 0
    res = capsys.readouterr()
    assert f"sha256 000000000000, {build / 'partitions/rotmnist/manifest.json'} now has sha256 {now[:12]}" in res.err
    assert "avg/intra/top1" in res.out
    (run / provenance.INPUTS).unlink()  # published before runs recorded their inputs
    assert main(["evaluate", str(run)]) == 2
    assert "records no input hashes" in capsys.readouterr().err


def test_evaluate_refuses_nonfinite_and_damaged_weights(published, tmp_path, capsys):
    from fedshift.cli import main

    _, _, out = published
    run = tmp_path / "run"
    shutil.copytree(out, run)
    saved = torch.load(run / "models.pt", weights_only=True)
    name, part = next(iter(saved["participants"].items()))
    key = next(iter(part["state_dict"]))
    part["state_dict"][key] = part["state_dict"][key].clone().fill_(float("nan"))
    torch.save(saved, run / "models.pt")
    assert main(["evaluate", str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"participant {name!r}: tensor {key!r} holds" in err and "non-finite" in err
    (run / "models.pt").write_bytes((out / "models.pt").read_bytes()[:1000])  # truncated
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{run / 'models.pt'} is damaged, torch cannot read it" in err
    torch.save({"scenario": "rotmnist"}, run / "models.pt")
    assert main(["evaluate", str(run)]) == 2
    assert f"{run / 'models.pt'} lacks the key 'participants'" in capsys.readouterr().err


def test_resume_refuses_other_code_unless_asked(tiny_data, tmp_path, monkeypatch, caplog):
    """Case 3 in-process: the checkpoint's code hash differs from the running code -> one line; the
    switch resumes, saying so."""
    import logging

    from fedshift.methods.fedavg import FedAvg
    from test_resume import _checkpoint_round, _stop_in_round

    cfg = _cfg(tiny_data, tmp_path, rounds=3)
    out = tmp_path / "run"
    calls, real = _stop_in_round(monkeypatch, FedAvg, stop_at=2)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    partial = checkpoint.partial_dir(out)
    assert _checkpoint_round(partial) == 1
    monkeypatch.setattr(FedAvg, "run_round", real)
    edited = dict(provenance.code_version(), files_sha256="f" * 64, dirty=True)
    monkeypatch.setattr(provenance, "code_version", lambda root=None: dict(edited))
    with pytest.raises(RunError) as exc:
        runner.run_federate(cfg, out)
    msg = str(exc.value)
    assert "\n" not in msg and f"checkpoint {partial / 'checkpoint.pt'} (round 1) was written by code " in msg
    assert "this job runs code ffffffffffff (commit " in msg and ", dirty)" in msg
    assert "--resume-across-code-change" in msg and _checkpoint_round(partial) == 1
    with caplog.at_level(logging.INFO):
        runner.run_federate(cfg, out, allow_code_change=True)
    assert "resuming anyway (--resume-across-code-change)" in caplog.text
    assert f"resuming {cfg['run_name']} after round 1" in caplog.text


def test_code_version_and_dirty_tag(tmp_path):
    """Without git: the package files' hash alone; in a checkout: commit + dirty flag, and the
    MLflow tag git.commit ends in -dirty when the tree is."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    nogit = provenance._code_version.__wrapped__(str(pkg))
    assert nogit["commit"] is None and nogit["dirty"] is None and len(nogit["files_sha256"]) == 64
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    subprocess.run("git init -q . && git add a.py && git commit -qm init", cwd=pkg, shell=True, check=True, env=env)
    clean = provenance._code_version.__wrapped__(str(pkg))
    assert clean["dirty"] is False and clean["files_sha256"] == nogit["files_sha256"]
    assert provenance.tags(clean)["git.commit"] == clean["commit"] and provenance.tags(clean)["git.dirty"] == "false"
    (pkg / "a.py").write_text("x = 2\n")
    dirty = provenance._code_version.__wrapped__(str(pkg))
    assert dirty["dirty"] is True and dirty["files_sha256"] != clean["files_sha256"]
    assert provenance.tags(dirty)["git.commit"] == clean["commit"] + "-dirty"


def test_second_job_on_the_same_folder_names_the_pid(tmp_path, capsys):
    from fedshift.cli import main

    """flock is per open file: a second run_lock, even in this process, is a second job."""
    out = tmp_path / "run"
    with provenance.run_lock(out) as lock:
        with pytest.raises(RunError) as exc:
            with provenance.run_lock(out):
                pytest.fail("two jobs held one run folder")
        assert str(exc.value) == (f"{out} is being written by another fedshift job (PID {os.getpid()}, lock {lock}); "
                                  "wait for it to end or stop it, then rerun")
        assert main(["federate", "--no-tracking", str(tmp_path / "missing.yaml"), str(out)]) == 1  # the CLI's job
        assert f"(PID {os.getpid()}, lock {lock})" in capsys.readouterr().err
    with provenance.run_lock(out):  # released with its holder
        pass


def test_data_fingerprint_prefers_dvc_lock_then_manifest(tmp_path):
    part = tmp_path / "build/partitions/x"
    part.mkdir(parents=True)
    lock = tmp_path / "dvc.lock"
    assert provenance.data_fingerprint([str(part)], lock) == f"{part}=absent"
    (part / "manifest.json").write_text("{}")
    assert provenance.data_fingerprint([str(part)], lock) == f"{part}=sha256:{store.sha256_file(part / 'manifest.json')}"
    lock.write_text(f"schema: '2.0'\nstages:\n  partition@x:\n    outs:\n    - path: {part}\n      md5: abc.dir\n")
    assert provenance.data_fingerprint([str(part)], lock) == f"{part}=dvc:abc.dir"


@pytest.mark.slow
def test_code_edit_in_a_scratch_clone_stops_the_resume(tiny_data, tmp_path, monkeypatch):
    """Case 3 with the real command: interrupted under this code, rerun by `fedshift federate` from a
    scratch copy of the package with one edit -> one line, rc 1, the checkpoint kept."""
    import yaml

    from fedshift.methods.fedavg import FedAvg
    from test_resume import _checkpoint_round, _stop_in_round

    cfg = _cfg(tiny_data, tmp_path, rounds=2)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    _stop_in_round(monkeypatch, FedAvg, stop_at=2)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    assert _checkpoint_round(checkpoint.partial_dir(out)) == 1
    clone = tmp_path / "clone/src"
    shutil.copytree(REPO / "src/fedshift", clone / "fedshift", ignore=shutil.ignore_patterns("__pycache__"))
    with open(clone / "fedshift/methods/fedavg.py", "a") as f:
        f.write("\n# a harmless edit\n")
    env = dict(os.environ, PYTHONPATH=str(clone), FEDSHIFT_TRACKING="none")
    cmd = [sys.executable, "-m", "fedshift.cli", "federate", str(tmp_path / "cfg.yaml"), str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1, res.stderr[-2000:]
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("fedshift: error:")]
    assert len(line) == 1 and "was written by code" in line[0] and "--resume-across-code-change" in line[0], res.stderr
    assert not out.exists() and _checkpoint_round(checkpoint.partial_dir(out)) == 1  # kept for the switch
    # --resume-across-code-change: test_resume_refuses_other_code_unless_asked (in-process, cheaper)


# ---------------------------------------------------------------------- the poor cases of issue 38
def _part_copy(tiny_data, tmp_path):
    part = tmp_path / "partitions/rotmnist"
    shutil.copytree(tiny_data / "partitions/rotmnist", part)
    return part, store.read_manifest(part)["participants_order"][0]


@pytest.mark.parametrize("files, message", [
    ({}, r"manifest.json: key 'files' \({}\) must map every data file to its sha256"),
    ("partial", r"m\d+/\w+\.npy \(and \d+ more\) is not listed in .*manifest.json's 'files', so its sha256 cannot be checked"),
])
def test_empty_or_partial_files_map_is_refused(tiny_data, tmp_path, files, message):
    """`files: {}` verified nothing (300 inverted images trained to rc 0)."""
    part, _ = _part_copy(tiny_data, tmp_path)
    m = store.read_manifest(part)
    m["files"] = {} if files == {} else dict(list(m["files"].items())[:3])
    store.write_json(part / "manifest.json", m)
    with pytest.raises(ConfigError, match=message):
        runner.verify_inputs([part])


def test_missing_manifest_key_and_damaged_npy_are_one_line(tiny_data, tmp_path):
    from fedshift.data.loading import load_federated

    part, name = _part_copy(tiny_data, tmp_path)
    m = store.read_manifest(part)
    del m["participants"][name]["domain"]
    store.write_json(part / "manifest.json", m)
    with pytest.raises(ConfigError, match=rf"^{part / 'manifest.json'}: missing key 'domain'; rebuild it with `dvc repro`$"):
        load_federated(part)
    del m["image_shape"]
    store.write_json(part / "manifest.json", m)
    with pytest.raises(ConfigError, match=r"manifest.json: missing key 'image_shape'"):
        load_federated(part)
    path = part / name / "test_images.npy"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ConfigError, match=rf"^{path} is damaged, numpy cannot read it \(.+\); rebuild it with `dvc repro`$"):
        store.load_split(part / name, "test")


def test_damaged_base_checkpoint_is_one_line(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ConfigError, match=rf"^{path} is damaged, torch cannot read it \(.*\); rerun the pretrain"):
        runner.load_checkpoint(torch.nn.Linear(2, 2), path, "lenet")
    torch.save({"arch": "lenet"}, path)
    with pytest.raises(ConfigError, match=rf"{path} lacks the key 'state_dict' \(has \['arch'\]\)"):
        runner.load_checkpoint(torch.nn.Linear(2, 2), path, "lenet")


def _interrupted(tiny_data, tmp_path, monkeypatch, rounds=3):
    from fedshift.methods.fedavg import FedAvg
    from test_resume import _stop_in_round

    cfg = _cfg(tiny_data, tmp_path, rounds=rounds)
    out = tmp_path / "run"
    _, real = _stop_in_round(monkeypatch, FedAvg, stop_at=2)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    monkeypatch.setattr(FedAvg, "run_round", real)
    partial = checkpoint.partial_dir(out)
    return cfg, out, partial, torch.load(partial / checkpoint.CHECKPOINT, weights_only=True)


def test_impossible_and_nonfinite_checkpoints(tiny_data, tmp_path, monkeypatch, caplog):
    """round > engine.rounds published a FINISHED run trained 2 of 8 rounds; NaN weights were resumed forever."""
    import logging

    cfg, out, partial, ckpt = _interrupted(tiny_data, tmp_path, monkeypatch)
    torch.save({**ckpt, "round": 7}, partial / checkpoint.CHECKPOINT)
    with pytest.raises(RunError, match=rf"^{partial / 'checkpoint.pt'}: key 'round' is 7, outside 1\.\.3 \(the job's "
                                       r"rounds/epochs\); the file is damaged or not this job's: remove .* to start afresh$"):
        runner.run_federate(cfg, out)
    assert not out.exists()
    key = next(iter(ckpt["models"][0]))
    ckpt["models"][0][key] = ckpt["models"][0][key].clone().fill_(float("nan"))
    torch.save(ckpt, partial / checkpoint.CHECKPOINT)
    with caplog.at_level(logging.WARNING, logger="fedshift.engine.checkpoint"):
        runner.run_federate(cfg, out)
    msgs = [r.getMessage() for r in caplog.records if "non-finite weights" in r.getMessage()]
    assert len(msgs) == 1 and f"(models[0] {key}): set aside as checkpoint.pt.nonfinite-" in msgs[0]
    assert json.loads((out / "metrics.json").read_text())["timings"]["resumed_after_rounds"] == []  # afresh


def test_plugin_state_not_weights_only_is_one_line_at_the_first_checkpoint(tiny_data, tmp_path, monkeypatch, caplog):
    """A method whose state_dict() holds an arbitrary object checkpointed every round and never resumed."""
    import logging

    from fedshift.methods.fedavg import FedAvg

    class Opaque:
        pass

    real = FedAvg.state_dict
    monkeypatch.setattr(FedAvg, "state_dict", lambda self: {**real(self), "cache": Opaque()})
    with caplog.at_level(logging.WARNING, logger="fedshift.runner"):
        runner.run_federate(_cfg(tiny_data, tmp_path, rounds=3), tmp_path / "run")
    msgs = [r.getMessage() for r in caplog.records if "weights_only" in r.getMessage()]
    assert len(msgs) == 1, caplog.text
    assert msgs[0].startswith("method 'fedavg' (fedavg): state_dict() key 'cache' cannot be loaded with "
                              "torch.load(weights_only=True)") and "goes on without checkpoints (no resume)" in msgs[0]


def test_yaml_alias_bomb_is_refused_and_shorthand_aliases_load(tmp_path):
    from fedshift.experiments import load_yaml

    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert len(bomb.read_bytes()) < 700
    with pytest.raises(ConfigError, match=rf"^{bomb}: YAML aliases expand \d+ values into [\d,]+, more than 100,000"):
        load_yaml(bomb)
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="refers to itself"):
        load_yaml(loop)
    assert load_yaml(REPO / "params/experiments.yaml")["grid"]  # its anchors (shared methods lists) load
    assert load_yaml(REPO / "params/ablations/engine_defaults.yaml")


@pytest.mark.parametrize("exp, message", [
    ({"engine": {"momentum": -5}}, r"momentum must be in \[0, 1\) \(0: plain SGD\), got -5"),
    ({"engine": {"momentum": 1.0}}, r"momentum must be in \[0, 1\)"),
    ({"pretrain": {"momentum": 2}}, r"momentum must be in \[0, 1\)"),
    ({"methods": {"fedmmd": {"min_kernel_scale": 0}}, "m": "fedmmd"}, r"min_kernel_scale must be > 0"),
    ({"engine": {"device": "cpu\n"}}, r"device"),
    ({"variants": {"v\n": {"method": "fedavg"}}, "m": "fedavg"}, r"invalid name 'v\\n'"),
])
def test_ranges_and_full_match_names_in_validate(exp, message):
    from fedshift.experiments import load_experiments

    exp = dict(exp)
    method = exp.pop("m", "fedavg")
    exp["grid"] = [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method], "structures": ["homo_lenet"]}]
    with pytest.raises(ConfigError, match=message):
        load_experiments(exp, {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}})


def test_round_whose_sampled_clients_hold_no_data_warns(caplog):
    import logging

    from fedshift.engine.sampling import round_clients
    from fedshift.testing import synthetic_federation

    fed = synthetic_federation(3, clients_per_round=1)
    for c in fed.clients:
        x, y = c.data.splits["private"]
        c.data.splits["private"] = (x[:0], y[:0])
    with caplog.at_level(logging.WARNING, logger="fedshift.engine.sampling"):
        round_clients(fed, 1)
    assert "round 1: the 1 sampled client(s) (client" in caplog.text and "hold no private data" in caplog.text


def test_full_disk_during_partition_is_one_line(tiny_data, tmp_path, monkeypatch):
    from fedshift.data import build

    def full(*a, **k):
        raise OSError("470400 requested and 266112 written")

    monkeypatch.setattr(store, "save_split", full)
    out = tmp_path / "partitions/rotmnist"
    with pytest.raises(RunError, match=rf"^cannot write partition 'rotmnist' in {tmp_path / 'partitions'}: needs about "
                                       r"[\d,]+ bytes, [\d,]+ bytes free.* \(the write stopped short\); free space"):
        build.partition("rotmnist", {"mnist5k": tiny_data / "datasets/mnist5k"}, out,
                        {"per_class": 20, "alpha": 0.1, "val": 0.1, "test": 0.25})
    assert not out.exists() and not list(out.parent.iterdir())
