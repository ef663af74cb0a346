"""Issue 51: nothing trained on data it did not ask for, no class predicted because nobody holds it, and
one line for every fault. Each test names its case id (docs/reliability.md) and failed on 3ff206b."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from fedshift import runner
from fedshift.errors import ConfigError, RunError
from fedshift.experiments import load_experiments
from fedshift.methods import create_method
from fedshift.testing import tiny_federation

DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}}


def _cfg(build, tmp_path, method="fedavg", rounds=2, structure="homo_lenet", **engine):
    """The resolved config of one federate job on the tiny data under ``build``."""
    exp = {"engine": {"rounds": rounds, "local_epochs": 1, "local_batch": 32, "device": "cpu", "threads": 1,
                      "eval_batch": 512, "checkpoint_min_s": 0, **engine},
           "grid": [{"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method],
                     "structures": [structure]}]}
    (cfg,) = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(build)).federate.values()
    return cfg


def _without_class(fed, k):
    """Every participant's private split without class ``k`` (the test sets keep it)."""
    for c in fed.clients:
        x, y = c.data.splits["private"]
        keep = y != k
        c.data.splits["private"] = (x[keep], y[keep])
    return fed


# ----------------------------------------------------------------- R31: a class nobody holds
@pytest.mark.parametrize("name", ["fedproto", "fedtgp", "fpl"])
def test_a_class_nobody_holds_gets_no_prototype_and_a_warning(tiny_data, name, caplog):
    """R31: a class no participant holds has no global prototype: nearest-prototype scoring never predicts
    it (FedProto already, as HtFLlib's clientproto.py:87-95; FedTGP's server model made one for every class,
    servertgp.py:153-156, so its untrained prototype could be the nearest), it adds no prototype loss term,
    and one warning names the class (none was printed)."""
    from fedshift.data.loading import normalize

    fed = _without_class(tiny_federation(tiny_data, ("lenet",) * 4, public_aug="none"), 3)
    params = {"server_epochs": 2} if name == "fedtgp" else {}
    m = create_method(name, params)
    m.setup(fed)
    with caplog.at_level(logging.WARNING):
        for r in (1, 2):
            fed.round = r
            m.run_round(fed, r)
    msgs = [rec.getMessage() for rec in caplog.records if "class" in rec.getMessage() and name in rec.getMessage()]
    assert len(msgs) == 1 and "class 3 " in msgs[0] and "no participant" in msgs[0], caplog.text  # once, not per round
    assert m.present.tolist() == [c != 3 for c in range(10)]
    if name == "fpl":  # FPL scores with the classifier; its prototypes: no cluster and no unbiased row for class 3
        assert 3 not in m.owner.tolist() and not m.unbiased[3].any()
        return
    x, y = fed.clients[0].data.get("test")
    with torch.inference_mode():
        for c in fed.clients:
            out = c.model.eval()(normalize(x))
            c.model.train()
            assert torch.isneginf(out[:, 3]).all() and torch.isfinite(out[:, [k for k in range(10) if k != 3]]).all()
            assert (out.argmax(1) != 3).all()


# ----------------------------------------------------------------- R32, R28, R27: participants without images
def _first_empty(fed):
    x, y = fed.clients[0].data.splits["private"]
    fed.clients[0].data.splits["private"] = (x[:0], y[:0])
    return fed


@pytest.mark.parametrize("name", ["fedproto", "fedtgp", "fpl", "fdse"])
def test_participants_without_images_send_nothing_and_are_named_each_round(tiny_data, name, caplog):
    """R32 (FedProto: KeyError 'm0'), R28 (FDSE: stopped at round 2 with "lower the learning rate", and before that
    its fair aggregation took m0's zero update as the min-norm direction: the shared tensors never moved): the
    participant holding no images uploads nothing; one warning per round names it; the others' prototypes or
    aggregate go on (as FedAvg, whose sample weights give it no say)."""
    fed = _first_empty(tiny_federation(tiny_data, ("lenet",) * 4, public_aug="none"))
    m = create_method(name, {"server_epochs": 2} if name == "fedtgp" else {})
    m.setup(fed)
    shared = {k: v.clone() for k, v in m.shared.items()} if name == "fdse" else None
    with caplog.at_level(logging.WARNING):
        for r in (1, 2):
            fed.round = r
            m.run_round(fed, r)
            fed.check_weights()
    named = [rec.getMessage() for rec in caplog.records if "hold no private images" in rec.getMessage()]
    assert [s.split(":")[0] for s in named] == [f"{name} round 1", f"{name} round 2"] and "m0" in named[0], caplog.text
    if name == "fdse":
        moved = [k for k, v in m.shared.items() if "running_" not in k and not torch.equal(v, shared[k])]
        assert moved and any(k.startswith("head") for k in moved)  # the others' updates reach the shared part
    else:
        assert m.present.any()  # prototypes from the three participants with data


def test_fdse_similarity_of_a_zero_tensor_is_finite():
    """R27: a personalised tensor that is zero for some participant (a DSE BatchNorm bias after a zero update)
    gave NaN weights (cosine over a zero norm); now its cosine with every tensor is 0: hand values."""
    from fedshift.methods.fdse import similarity_aggregate

    a, z = torch.tensor([3.0, 4.0], dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    b = torch.tensor([4.0, 3.0], dtype=torch.float64)
    out = similarity_aggregate([a, z, b], tau=0.5)
    # row of z: cosines (0, 0, 0) -> uniform weights -> the mean of a, z, b
    torch.testing.assert_close(out[1], (a + b) / 3, rtol=0, atol=1e-15)
    # row of a: cosines (1, 0, 24/25) / 0.5 -> softmax weights over (a, z, b)
    w = torch.softmax(torch.tensor([2.0, 0.0, 48 / 25], dtype=torch.float64), 0)
    torch.testing.assert_close(out[0], w[0] * a + w[2] * b, rtol=0, atol=1e-15)
    assert all(torch.isfinite(t).all() for t in out)


# ----------------------------------------------------------------- R26: strict JSON
def _strict(text):
    def refuse(name):
        raise ValueError(f"bare {name} in JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_files_are_strict_with_null_and_a_note(tiny_data, tmp_path):
    """R26: FDSE (FPL, FedHEAL, FedAvg alike) with one participant wrote bare NaN into metrics.json (inter-domain
    accuracy has no other domain), which strict parsers refuse, with no note. Now null, listed under
    `nonfinite` with what it was, and a note saying why; inputs.json is strict too."""
    from fedshift.data.store import json_text

    cfg = _cfg(tiny_data, tmp_path, "fdse", rounds=1)
    cfg["participants"], cfg["archs"] = ["m0"], ["lenet"]
    out = tmp_path / "one"
    runner.run_federate(cfg, out)
    m = _strict((out / "metrics.json").read_text())
    assert m["headline"]["avg/inter/top1"] is None and 0 <= m["headline"]["avg/intra/top1"] <= 1
    assert m["nonfinite"]["headline.avg/inter/top1"] == "NaN" and "final.m0/inter/top1" in m["nonfinite"]
    assert any("undefined with one domain" in n for n in m["notes"])
    _strict((out / "inputs.json").read_text())
    got = _strict(json_text({"a": [1.5, float("inf")], "b": {"c": float("-inf")}, "d": float("nan")}))
    assert got == {"a": [1.5, None], "b": {"c": None}, "d": None,
                   "nonfinite": {"a.1": "inf", "b.c": "-inf", "d": "NaN"}}


# ----------------------------------------------------------------- E1 / E3: full or read-only results folder
@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs mounted in ``tmp_path`` (root only; skipped elsewhere), unmounted afterwards."""
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_full_or_read_only_results_folder_is_one_line_before_the_lock(tiny_data, tmp_path, tmpfs, fault, capsys):
    """E1 / E3 (regressions of issue 38's run lock, which ran before the writability check): `fedshift federate`
    into a full or read-only results folder ended in run_lock's OSError traceback; now rc 2 and one line."""
    import subprocess

    import yaml

    from fedshift.cli import main

    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tiny_data, tmp_path)))
    (tmpfs / "results").mkdir()
    if fault == "full":
        with open(tmpfs / "filler", "wb") as f:
            try:
                f.write(b"\0" * (2 << 20))
            except OSError:
                pass
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    assert main(["federate", str(cfg), str(tmpfs / "results" / "run"), "--no-tracking"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    why = "No space left on device" if fault == "full" else "Read-only file system"
    assert err == [f"fedshift: error: results folder {tmpfs / 'results'} is not writable ({why}); fix its "
                   "permissions or free space before running the job"]


# ----------------------------------------------------------------- A40: a grid section of the wrong type
def test_methods_given_as_a_list_is_one_line(tmp_path, monkeypatch, capsys):
    """A40: `methods: [fedavg]` (a list, not a mapping) ended in an AttributeError traceback inside the merge of
    the grid files; each file's shape is checked before the merge now (the Snakefile's merge too)."""
    from fedshift.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.yaml").write_text("methods: [fedavg]\ngrid:\n  - {scenarios: [rotmnist], methods: [fedavg], "
                                     "structures: [homo_lenet]}\n")
    assert main(["validate", "--experiments", "g.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fedshift: error: g.yaml: methods: ['fedavg'] is not of type 'object' (methods: per-method "
                   "overrides of the method's Params dataclass)"]


# ----------------------------------------------------------------- B0: dvc repro right after make install
@pytest.mark.slow
def test_dvc_repro_runs_right_after_make_install(tmp_path):
    """B0: on a fresh clone `make install` then `dvc repro` failed (`[Errno 2] No such file or directory: .../data`:
    the fetch stages depend on data.dvc's folder, which git cannot keep empty) until `mkdir data`. `make install`
    creates it now (here with an up-to-date install stamp, so make runs no pip)."""
    import os
    import shutil
    import subprocess
    import sys
    import time

    from conftest import REPO
    from helpers import pipeline_copy

    root = pipeline_copy(tmp_path / "clone", link_src=True)
    shutil.rmtree(root / "data")  # what a clone holds: no data/
    for name in ("Makefile", "requirements.lock", "pyproject.toml", "data.dvc"):
        shutil.copy(REPO / name, root / name)
    (root / ".venv").mkdir()
    (root / ".venv/.installed").touch()  # the install itself is done
    later = time.time() + 10
    os.utime(root / ".venv/.installed", (later, later))  # newer than requirements.lock and pyproject.toml
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    sh = lambda cmd: subprocess.run(cmd, shell=True, cwd=root, env=env, capture_output=True, text=True)  # noqa: E731
    assert sh("git init -q . && dvc init -q && dvc config core.analytics false").returncode == 0
    before = sh("dvc repro --dry fetch@mnist5k")
    assert "No such file or directory" in before.stdout + before.stderr  # what a fresh clone met
    res = sh("make install")
    assert res.returncode == 0 and "pip" not in res.stdout, res.stdout + res.stderr
    res = sh("dvc repro --dry fetch@mnist5k")
    assert res.returncode == 0 and "fedshift fetch --dvc-stage" in res.stdout, res.stdout + res.stderr


# ----------------------------------------------------------------- Q10: a checkpoint that does not fit
def _interrupted(monkeypatch, cfg, out, stop_at=2):
    """Run ``cfg`` into ``out`` until it is interrupted inside round ``stop_at`` (round ``stop_at - 1`` checkpointed)."""
    from fedshift.methods.fedavg import FedAvg

    real = FedAvg.run_round

    def run_round(self, fed, r):
        if r == stop_at:
            raise KeyboardInterrupt
        return real(self, fed, r)

    monkeypatch.setattr(FedAvg, "run_round", run_round)
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    monkeypatch.setattr(FedAvg, "run_round", real)


def test_checkpoint_that_does_not_fit_is_set_aside(tiny_data, tmp_path, monkeypatch, caplog):
    """Q10: a checkpoint tensor of another shape gave load_state_dict's `size mismatch` traceback on every rerun.
    Now the checkpoint is set aside (renamed) with one warning naming the tensor and both shapes, and the job
    starts afresh; a method state that cannot be restored is one line and set aside too, so the rerun starts
    afresh instead of meeting the same file."""
    from fedshift.engine import checkpoint

    cfg = _cfg(tiny_data, tmp_path, rounds=3, checkpoint_every=1)
    out = tmp_path / "out"
    path = checkpoint.partial_dir(out) / checkpoint.CHECKPOINT
    _interrupted(monkeypatch, cfg, out)
    ck = torch.load(path, weights_only=True)
    key = next(iter(ck["models"][1]))
    want = list(ck["models"][1][key].shape)
    ck["models"][1][key] = torch.zeros(3, 3)
    torch.save(ck, path)
    with caplog.at_level(logging.WARNING, logger="fedshift.engine.checkpoint"):
        metrics = runner.run_federate(cfg, out)
    msgs = [r.getMessage() for r in caplog.records if "does not fit" in r.getMessage()]
    assert len(msgs) == 1 and f"models[1] {key}: shape [3, 3] in the checkpoint, {want} in the model" in msgs[0]
    assert "set aside as checkpoint.pt.misfit-" in msgs[0] and "starting afresh" in msgs[0]
    assert metrics["timings"]["resumed_after_rounds"] == [] and (out / "metrics.json").exists()
    # a method state of another layout: one line (RunError), the file set aside; the rerun starts afresh
    out2 = tmp_path / "out2"
    path2 = checkpoint.partial_dir(out2) / checkpoint.CHECKPOINT
    _interrupted(monkeypatch, cfg, out2)
    ck = torch.load(path2, weights_only=True)
    ck["method"] = {"bogus": torch.zeros(1)}
    torch.save(ck, path2)
    with pytest.raises(RunError, match=r"could not be restored \(ValueError: method 'fedavg' keeps .*set aside as "
                                       r"checkpoint.pt.unrestorable-\d+: rerun to start afresh") as e:
        runner.run_federate(cfg, out2)
    assert "\n" not in str(e.value) and not path2.exists()
    assert runner.run_federate(cfg, out2)["timings"]["resumed_after_rounds"] == []


# ----------------------------------------------------------------- Q19: a run folder's config.yaml
@pytest.mark.parametrize("text, message", [
    ("kind: federate\nrun_name: r\nscenario: rotmnist\nmethod: fedavg\nbase_method: fedavg\nseed: 0\narchs: [lenet]\n"
     "method_params: {}\npaths: {partition: build/partitions/rotmnist}\n", "config.yaml: missing key 'engine'"),
    ("engine: {rounds: 2\nseed: 0\n", "config.yaml:2:5: invalid YAML: expected ',' or '}', but got ':'"),
], ids=["no-engine", "invalid-yaml"])
def test_run_folder_config_without_engine_or_invalid_is_one_line(tmp_path, capsys, text, message):
    """Q19: `fedshift evaluate` of a run folder whose config.yaml lacks `engine:` ended in KeyError: 'engine'
    (runner.py:205), an invalid one in a yaml ParserError traceback; `fedshift federate` of such a config too."""
    from fedshift.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(text)
    (run / "models.pt").write_bytes(b"")
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"fedshift: error: {run}/{message}" in err[0], err
    assert err[0].endswith(f"rerun the job that published {run}")
    assert main(["federate", str(run / "config.yaml"), str(tmp_path / "out"), "--no-tracking"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"fedshift: error: {run}/{message}" in err[0], err


# ----------------------------------------------------------------- R21, R23, R39: what a run folder records
def test_evaluate_refuses_a_record_without_a_partition(tiny_data, tmp_path, capsys):
    """R21: `fedshift evaluate` of a run whose inputs.json records no partition entry scored the current partition
    with rc 0 (nothing recorded = nothing compared); now it is refused as a run without inputs.json is, --force
    scores it with a warning."""
    from fedshift import provenance
    from fedshift.cli import main

    out = tmp_path / "run"
    runner.run_federate(_cfg(tiny_data, tmp_path, rounds=1), out)
    rec = json.loads((out / provenance.INPUTS).read_text())
    for key in [k for k in rec["inputs"] if k.startswith("partition/")]:
        rec["inputs"].pop(key), rec["paths"].pop(key)
    (out / provenance.INPUTS).write_text(json.dumps(rec))
    capsys.readouterr()  # the run's progress lines
    assert main(["evaluate", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out}/inputs.json records no partition (no 'partition/<name>' among its inputs)" in err[0]
    assert err[0].endswith("; rerun the job, or pass --force to score it anyway")
    assert main(["evaluate", str(out), "--force"]) == 0
    assert "scoring anyway (--force)" in capsys.readouterr().err


def test_base_checkpoints_made_by_other_code_are_said_and_recorded(tiny_data, tmp_path, caplog):
    """R23: a federate run starting from BASE checkpoints made by other code (or by code that recorded nothing) ran
    silently. Now one warning names the first, inputs.json records the code of each (`base_code`), and a BASE
    trained on another partition than the run reads is refused in one line."""
    from fedshift import provenance
    from fedshift.data import store

    exp = {"engine": {"rounds": 1, "local_epochs": 1, "local_batch": 32, "device": "cpu", "threads": 1},
           "methods": {"fedavg": {"init": "base"}},
           "grid": [{"scenarios": ["rotmnist"], "methods": ["fedavg"], "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data)).federate.values()
    part = Path(cfg["paths"]["partition"]) / "manifest.json"
    mine = provenance.code_version()
    other = {"files_sha256": "e" * 64, "commit": None, "dirty": None}
    ckpts = [Path(p) for p in cfg["paths"]["pretrained"]]
    models = runner.build_models(cfg["archs"], 10, 1, cfg["engine"]["norm"], 0)
    for i, (path, model, arch) in enumerate(zip(ckpts, models, cfg["archs"])):  # as the pretrain jobs publish them
        path.parent.mkdir(parents=True)
        torch.save({"arch": arch, "state_dict": model.state_dict()}, path)
        if i < 3:  # base/3: no inputs.json (made by code that records nothing)
            rec = provenance.record({"partition/rotmnist": store.sha256_file(part)}, {"partition/rotmnist": part}, "x")
            provenance.write(path.parent, {**rec, "code": other if i < 2 else mine})
    with caplog.at_level(logging.WARNING, logger="fedshift.provenance"):
        runner.run_federate(cfg, tmp_path / "fed")
    msgs = [r.getMessage() for r in caplog.records if "BASE checkpoint" in r.getMessage()]
    assert len(msgs) == 1 and f"{ckpts[0]} (base/0) was made by code eeeeeeeeeeee (no git), this job runs " \
        f"{provenance.describe_code(mine)} (and 2 more): the run mixes two code versions" in msgs[0]
    rec = provenance.read(tmp_path / "fed")
    assert rec["base_code"] == {"base/0": other, "base/1": other, "base/2": mine, "base/3": None}
    stale = provenance.read(ckpts[1].parent)
    stale["inputs"]["partition/rotmnist"] = "0" * 64
    provenance.write(ckpts[1].parent, stale)
    with pytest.raises(ConfigError, match=rf"BASE checkpoint {ckpts[1]} \(base/1\) was trained on partition/rotmnist "
                                          r"sha256 000000000000, this job reads sha256 \w{12}: its training images"):
        runner.run_federate(cfg, tmp_path / "fed2")


def test_resume_forced_across_a_code_change_is_recorded(tiny_data, tmp_path, monkeypatch):
    """R39: a resume forced with --resume-across-code-change left no trace in the run folder (only a log line);
    inputs.json now lists it: the round it resumed after and the code that ran before."""
    from fedshift import provenance

    cfg = _cfg(tiny_data, tmp_path, rounds=3, checkpoint_every=1)
    out = tmp_path / "run"
    _interrupted(monkeypatch, cfg, out)
    before = provenance.code_version()
    edited = dict(before, files_sha256="f" * 64, dirty=True)
    monkeypatch.setattr(provenance, "code_version", lambda root=None: dict(edited))
    runner.run_federate(cfg, out, allow_code_change=True)
    rec = provenance.read(out)
    assert rec["code"] == edited and rec["resumed_across_code_change"] == [{"after_round": 1, "code": before}]
    plain = tmp_path / "plain"
    runner.run_federate(cfg, plain)
    assert "resumed_across_code_change" not in provenance.read(plain)


# ----------------------------------------------------------------- R05, R06, R08: tuning
TUNE_DATA = {"scenarios": {"mnist5k_shards": {}}}


def _tune_grid(tune, seeds=(0,)):
    return {"engine": {"rounds": 4, "device": "cpu"},
            "grid": [{"scenarios": ["mnist5k_shards"], "methods": ["fedavg"], "structures": ["homo_lenet"],
                      "seeds": list(seeds)}],
            "tune": tune}


def test_tuning_seeds_equal_to_reported_seeds_warn(tmp_path, capsys):
    """R05: tuning seeds equal to the reported seeds planned silently, though docs/tuning.md says to keep them apart."""
    from fedshift.tune import plan_tune

    for seeds, warned in (([0, 1], True), ([100], False)):
        grid = _tune_grid({"budget": {"rounds": 2, "seeds": seeds}, "methods": {"fedavg": {"engine.lr": [0.01]}}},
                          seeds=(1, 2))
        plan_tune(grid, load_experiments(grid, TUNE_DATA, results=str(tmp_path)), results=str(tmp_path))
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ([f"fedshift: warning: tune.budget.seeds {seeds} include the reported seed(s) [1] of the tuned "
                        "methods: the values would be chosen on the same draws (model initialisation, client sampling, "
                        "a data_seed: run partition) the grid then reports; keep them apart (e.g. seeds: [100], "
                        "docs/tuning.md)"] if warned else [])


def test_a_tune_grid_too_large_is_refused_before_it_is_expanded(tmp_path):
    """R06: no cap on a tune grid's size: 1,000,000 candidates kept `validate` busy > 10 min at 1.1 GB. The count is
    a product of list lengths, checked before one candidate is made (here 10^6 x 2 seeds: at once)."""
    from fedshift.tune import MAX_CANDIDATE_JOBS, plan_tune

    big = {"engine.lr": list(range(1, 101)), "engine.weight_decay": list(range(100)),
           "engine.momentum": [i / 100 for i in range(100)]}
    grid = _tune_grid({"budget": {"rounds": 2, "seeds": [100, 101]}, "methods": {"fedavg": big}})
    with pytest.raises(ConfigError) as e:
        plan_tune(grid, load_experiments(grid, TUNE_DATA, results=str(tmp_path)), results=str(tmp_path))
    assert str(e.value) == ("tune.methods.fedavg (mnist5k_shards): 100 engine.lr x 100 engine.weight_decay x 100 "
                            "engine.momentum x 2 tuning seed(s) = 2,000,000 candidate jobs, more than "
                            f"{MAX_CANDIDATE_JOBS:,} (fedshift.tune.MAX_CANDIDATE_JOBS); search fewer values, or tune "
                            "in several grids")
    grid = _tune_grid({"budget": {"rounds": 2, "seeds": [100]},
                       "methods": {"fedavg": {"engine.lr": {"log": [1e-4, 1], "num": 10 ** 9}}}})
    with pytest.raises(ConfigError, match=r"tune.methods.fedavg.engine.lr: num 1,000,000,000 values, more than"):
        plan_tune(grid, load_experiments(grid, TUNE_DATA, results=str(tmp_path)), results=str(tmp_path))


def test_a_chosen_value_that_was_never_a_candidate_is_refused(tmp_path):
    """R08: a hand-edited chosen.yaml with a value that was never a candidate (lr 5.0) was applied silently."""
    import yaml

    from fedshift import tune

    grid = _tune_grid({"budget": {"rounds": 2, "seeds": [100]}, "methods": {"fedavg": {"engine.lr": [0.001, 0.01]}}})
    plan = load_experiments(grid, TUNE_DATA, results=str(tmp_path))
    tune.plan_tune(grid, plan, results=str(tmp_path))
    (seeded,) = plan.federate.values()
    path = Path(seeded["tuned"]["file"])
    chosen = {"chosen": {"engine.lr": 0.01}, "score": 0.5, "candidate": "cb",
              "candidates": [{"id": "ca", "values": {"engine.lr": 0.001}, "status": "ok"},
                             {"id": "cb", "values": {"engine.lr": 0.01}, "status": "ok"}]}
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(chosen))
    assert tune.apply_chosen(seeded)["engine"]["lr"] == 0.01
    path.write_text(yaml.safe_dump({**chosen, "chosen": {"engine.lr": 5.0}}))
    with pytest.raises(ConfigError) as e:
        tune.apply_chosen(seeded)
    assert str(e.value) == (f"{path}: chosen engine.lr 5.0 was never a candidate (candidates: 0.001, 0.01); remove "
                            f"{path} to have the tune's selection (snakemake's tune_select) write it again")


# ----------------------------------------------------------------- R17: an alias bomb on the command line
def test_alias_bomb_as_a_run_override_is_one_line(monkeypatch, capsys):
    """R17: `fedshift run engine.rounds=<alias bomb>` ended in a MemoryError traceback after 232 s (the alias bound
    covered files, not override values); anchors and aliases in a command-line value are refused at once.
    (Run in the project folder: the override is refused before anything is planned or written.)"""
    from conftest import REPO

    from fedshift.cli import main

    levels = ["&a0 [x, x, x, x, x, x, x, x, x]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = "[" + ", ".join(levels) + "]"  # 9^9 = 387,420,489 values when expanded
    monkeypatch.chdir(REPO)
    assert main(["run", f"engine.rounds={bomb}", "--", "-n"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedshift: error: override engine.rounds: value '[&a0 [x, x, x")
    assert err[0].endswith("YAML anchors and aliases (&name, *name) are not taken in a command-line value; write the "
                           "values out")


# ----------------------------------------------------------------- R19: how to build a missing seeded partition
def test_a_missing_seeded_partition_names_what_builds_it(tiny_data, tmp_path):
    """R19: a job reading a per-seed partition (engine.data_seed: run) that is not drawn yet said "run `dvc repro`",
    which never draws one (the workflow's partition_seed rule does); the line now names the command."""
    cfg = _cfg(tiny_data, tmp_path, rounds=1, data_seed="run")
    folder = Path(cfg["paths"]["partition"])
    assert folder == tiny_data / "partitions_seeded/rotmnist/seed0" and not folder.exists()
    with pytest.raises(ConfigError) as e:
        runner.run_federate(cfg, tmp_path / "run")
    assert str(e.value) == (f"missing {folder}/manifest.json; build it with `fedshift partition rotmnist --seed 0 "
                            f"--out {folder}` (what the workflow's partition_seed rule runs; `dvc repro` does not draw "
                            "per-seed partitions)")
    from fedshift.data.store import rebuild_hint

    assert rebuild_hint(tiny_data / "partitions/rotmnist/m0/private_images.npy") == "rebuild it with `dvc repro`"


# ----------------------------------------------------------------- R18 in-process: every data key
def test_built_data_that_disagree_with_the_data_params_are_named(tiny_data, tmp_path):
    """R18 (the real Snakemake/DVC path: tests/test_workflow.py): planning compares what is built with what the grid's
    data params ask, for the partition, the public set, the datasets they are drawn from and a per-seed redraw."""
    import os

    import yaml

    from fedshift.data import build
    from fedshift.experiments import check_built_data
    from helpers import tiny_data_params

    root = tmp_path / "build"
    root.mkdir()
    for sub in ("datasets", "public", "partitions"):
        os.symlink(tiny_data / sub, root / sub)
    data = tiny_data_params()
    seeded = _cfg(root, tmp_path, rounds=1, data_seed="run")
    build.partition("rotmnist", {"mnist5k": root / "datasets/mnist5k"}, Path(seeded["paths"]["partition"]),
                    {**data["scenarios"]["rotmnist"], "seed": 0})
    configs = [_cfg(root, tmp_path, rounds=1, method="fedmd"), seeded]
    check_built_data(configs, data, build=str(root))  # as built: nothing to say

    def refused(change, section, name):
        asked = yaml.safe_load(yaml.safe_dump(data))
        asked[section][name].update(change)
        with pytest.raises(ConfigError) as e:
            check_built_data(configs, asked, build=str(root))
        return str(e.value)

    msg = refused({"per_class": 30}, "scenarios", "rotmnist")
    assert msg.startswith(f"the data params: scenarios.rotmnist.per_class is 30, but {root}/partitions/rotmnist was "
                          "built with 20")
    assert "scenarios.rotmnist.seed is 3, but" in refused({"seed": 3}, "scenarios", "rotmnist")  # DVC's folder first
    assert f"public.photo_patches.n is 200, but {root}/public/photo_patches was built with 256" in \
        refused({"n": 200}, "public", "photo_patches")
    assert f"dataset_params.photo_patches.n is 500, but {root}/datasets/photo_patches was built with 400" in \
        refused({"n": 500}, "dataset_params", "photo_patches")
    os.unlink(root / "partitions")  # the DVC partition gone: the redraw is compared on its own
    (root / "partitions").mkdir()
    msg = refused({"test": 0.3}, "scenarios", "rotmnist")
    assert f"scenarios.rotmnist.test is 0.3, but {seeded['paths']['partition']} was built with 0.25" in msg
    assert msg.endswith(f"remove {seeded['paths']['partition']}: the workflow's partition_seed rule redraws it from "
                        "the data params")
