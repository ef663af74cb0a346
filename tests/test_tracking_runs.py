"""MLflow runs as a researcher browses them: short unique names, a tag per wildcard, a
rerun replaces its run, the tables' headline number logged as a metric, device/timings."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest


def _cfg(method="fccl_plus", structure="demo_mixed", scenario="rotmnist", public="photo_patches", seed=0,
         identity="0123456789ab"):
    wc = {"scenario": scenario, "public": public, "method": method, "structure": structure, "seed": seed}
    return {"kind": "federate", "run_name": f"federate/{scenario}/{public}/{method}/{structure}/seed{seed}-{identity}",
            "scenario": scenario, "public": public, "method": method, "base_method": method.split("_v")[0],
            "structure": structure, "seed": seed, "wildcards": wc, "engine": {"rounds": 3}, "identity": identity}


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    from fedshift.tracking import init_store

    init_store(tmp_path)
    import mlflow

    return tmp_path, mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_display_names_are_short_and_unique_over_a_grid():
    """Unique within an experiment (the scenario), what differs first: MLflow's name column cut
    'fccl_plus demo_mixed rotmnist+photo_patches s0' before the seed (issue 39 point 4)."""
    from fedshift.tracking import run_display_name

    for scenario in ("rotmnist", "digits_offline"):
        grid = itertools.product(["fedavg", "fccl", "fccl_plus"], ["homo_lenet", "demo_mixed"], [scenario],
                                 ["photo_patches", "none"], [0, 1])
        names = [run_display_name(_cfg(*g)) for g in grid]
        assert len(set(names)) == len(names)
        assert max(map(len, names)) <= 47  # 40 before the identity's 6 characters (issue 50)
    assert run_display_name(_cfg()) == "fccl_plus s0 demo_mixed photo_patches 012345"
    assert run_display_name(_cfg(public="none", seed=2, identity="fedcba987654")) == "fccl_plus s2 demo_mixed fedcba"
    pre = {"kind": "pretrain", "arch": "lenet", "participant": "m20", "scenario": "rotmnist", "seed": 1}
    assert run_display_name(pre) == "lenet m20 s1"  # a config planned before run identities: no suffix


def test_experiments_carry_a_description_linking_the_headline_view_and_their_kind(store):
    from fedshift.tracking import job_run, report_run

    root, client = store
    with job_run(_cfg(), "federate", root=root):
        pass
    with job_run({"kind": "pretrain", "arch": "lenet", "participant": "m20", "scenario": "rotmnist", "seed": 0,
                  "run_name": "pretrain/rotmnist/m20/lenet/seed0", "wildcards": {}}, "pretrain", root=root):
        pass
    with report_run("main", root=root):
        pass
    fed, pre, rep = (client.get_experiment_by_name(n) for n in ("rotmnist", "rotmnist-pretrain", "report"))
    for exp in (fed, pre, rep):
        assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow 3: runs, not traces
    note = fed.tags["mlflow.note.content"]
    # the experiments list shows the raw text (plain words first), the runs page its first line rendered (the link)
    first = note.split("\n")[0]
    assert first.startswith("Federated runs of scenario rotmnist. **[Open the headline view]"
                            f"(#/experiments/{fed.experiment_id}/runs?viewStateShareKey=fedshift-headline"
                            "&workflowType=machine_learning)**")
    assert "`table/AVG_inter`" in note and "rotmnist-pretrain" in note and "fedshift.identity" in note
    assert pre.tags["mlflow.note.content"].startswith("SOLO/BASE pretraining runs of scenario rotmnist, ")
    assert rep.tags["mlflow.note.content"].startswith("fedshift reports: one run per grid.")
    assert "report/main" in rep.tags["mlflow.note.content"]


def test_rerun_replaces_the_run_and_tags_every_wildcard(store):
    from fedshift.tracking import job_run

    root, client = store
    cfg, other = _cfg(), _cfg(method="fedavg", structure="homo_lenet")
    for c in (cfg, other, cfg):  # cfg twice: the second run replaces the first
        with job_run(c, "federate", root=root) as t:
            t.log_metrics({"avg/inter/top1": 0.5}, step=1)
    exp = client.get_experiment_by_name("rotmnist")
    live = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in live) == ["fccl_plus s0 demo_mixed photo_patches 012345",
                                                     "fedavg s0 homo_lenet photo_patches 012345"]
    run = next(r for r in live if r.data.tags["method"] == "fccl_plus")
    for k, v in cfg["wildcards"].items():
        assert run.data.tags[k] == str(v) and run.data.tags[f"wildcard.{k}"] == str(v)
    assert run.data.tags["fedshift.run_key"] == cfg["run_name"]
    from mlflow.entities import ViewType

    deleted = client.search_runs([exp.experiment_id], run_view_type=ViewType.DELETED_ONLY)
    assert [r.info.run_id for r in deleted] == [run.data.tags["fedshift.replaces"]]


def test_two_settings_of_one_job_slot_are_two_live_runs_and_candidates_keep_out_of_the_headline_view(store):
    """Issue 50: a second grid's run of the same slot with other settings is another run (its identity), not a
    replacement; tuning candidates are kind `tune`, named with their values, in `<scenario>-tune`."""
    from fedshift.tracking import job_run

    root, client = store
    for cfg in (_cfg(identity="aaaaaaaaaaaa"), _cfg(identity="bbbbbbbbbbbb")):
        with job_run(cfg, "federate", root=root):
            pass
    exp = client.get_experiment_by_name("rotmnist")
    live = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["fedshift.identity"] for r in live) == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    assert sorted(r.info.run_name for r in live) == ["fccl_plus s0 demo_mixed photo_patches aaaaaa",
                                                     "fccl_plus s0 demo_mixed photo_patches bbbbbb"]
    cand = {**_cfg(method="fedavgm", structure="homo_lenet", seed=100, identity="cccccccccccc"),
            "run_name": "tune/rotmnist/photo_patches/fedavgm/homo_lenet/c01234567/seed100-cccccccccccc",
            "tune": {"candidate": "c01234567", "values": {"engine.lr": 0.01, "beta": 0.9}}}
    with job_run(cand, "federate", root=root):  # the rule runs a candidate as `fedshift federate`
        pass
    assert len(client.search_runs([exp.experiment_id])) == 2  # not among the federated runs the tables compare
    tune = client.get_experiment_by_name("rotmnist-tune")
    (run,) = client.search_runs([tune.experiment_id])
    assert run.info.run_name == "tune/fedavgm lr=0.01 beta=0.9 s100 homo_lenet photo_patches cccccc"
    assert run.data.tags["fedshift.kind"] == "tune"
    assert tune.tags["mlflow.note.content"].startswith("Tuning candidates of scenario rotmnist")
    assert "mlflow.sharedViewState.fedshift-headline" not in tune.tags


def test_headline_metric_is_the_report_tables_number():
    """The AVG column of the report's table (one seed) == the `table/AVG_*` metric."""
    import numpy as np

    from fedshift.engine.federation import summarise
    from fedshift.runner import headline
    from fedshift.report.report import headline_frame, paper_table
    from fedshift.tracking import headline_metrics

    rng = np.random.default_rng(0)
    parts, rows, history = ["m0", "m20", "m40"], [], []
    for r in range(0, 6):
        rr = []
        for p in parts:
            for d in parts:
                t1 = float(rng.uniform(0, 0.9))
                rr.append({"round": r, "participant": p, "arch": "lenet", "domain": d,
                           "kind": "intra" if p == d else "inter", "top1": t1, "top5": min(1.0, t1 + 0.1)})
        rows += rr
        if r > 0:
            history.append(summarise(rr))
    metrics = {"headline": headline(history, 3)}
    logged = headline_metrics(metrics, "rotmnist")
    df = pd.DataFrame(rows).assign(scenario="rotmnist", public="photo_patches", structure="homo_lenet",
                                   method="fedavg", seed=0)
    head = headline_frame(df, 3)
    inter, _ = paper_table(head, "inter", "top1")
    intra, _ = paper_table(head, "intra", "top1")
    assert logged["table/AVG_inter"] == pytest.approx(inter.loc["fedavg", "AVG→"], abs=0.006)
    assert logged["table/AVG_intra"] == pytest.approx(intra.loc["fedavg", "AVG↩"], abs=0.006)
    assert logged["headline/avg/inter/top1"] == pytest.approx(logged["table/AVG_inter"] / 100)


def test_summary_logs_timings_device_and_environment(store, monkeypatch):
    from fedshift.tracking import environment_params, job_run, log_job_summary

    root, client = store
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # how the job's OpenMP threads waited: explains its times
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with job_run(_cfg(), "federate", root=root) as t:
        t.log_params(environment_params())
        log_job_summary(t, {"headline": {"avg/inter/top1": 0.4, "avg/intra/top1": 0.585694442},
                            "timings": {"train_s": 6.0, "eval_s": 1.0}, "device": "cpu"}, "rotmnist", 10.04, step=3)
    run = client.search_runs([client.get_experiment_by_name("rotmnist").experiment_id])[0]
    m, p = run.data.metrics, run.data.params
    assert m["time/total_s"] == 10.0 and m["time/train_s"] == 6.0 and m["time/setup_s"] == pytest.approx(3.0)
    assert m["table/AVG_inter"] == pytest.approx(40.0) and m["headline/avg/intra/top1"] == 0.5857
    assert m["table/AVG_intra"] == 58.57  # rounded as the tables print it, not 58.5694442...
    import torch

    assert p["env.torch"] == torch.__version__ and p["env.device"] == "cpu" and run.data.tags["device"] == "cpu"
    assert p["env.cuda_available"] == str(torch.cuda.is_available())
    assert p["env.omp_wait_policy"] == "PASSIVE" and p["env.gomp_spincount"] == "unset"


def test_pretrain_runs_have_their_own_experiment(store):
    """Issue 22 point 7: BASE pretrain runs do not mix with the federated runs MLflow opens on."""
    from fedshift.tracking import job_run

    root, client = store
    pre = {"kind": "pretrain", "arch": "lenet", "participant": "m20", "scenario": "rotmnist", "seed": 1,
           "run_name": "pretrain/rotmnist/m20/lenet/seed1",
           "wildcards": {"scenario": "rotmnist", "participant": "m20", "arch": "lenet", "seed": 1}}
    with job_run(pre, "pretrain", root=root) as t:
        t.log_metrics({"inter/top1": 0.4}, step=1)
    with job_run(_cfg(), "federate", root=root) as t:
        t.log_metrics({"avg/inter/top1": 0.5}, step=1)
    fed = client.search_runs([client.get_experiment_by_name("rotmnist").experiment_id])
    pretrain = client.search_runs([client.get_experiment_by_name("rotmnist-pretrain").experiment_id])
    assert [r.data.tags["fedshift.kind"] for r in fed] == ["federate"]
    assert [r.data.tags["fedshift.kind"] for r in pretrain] == ["pretrain"]


def test_report_runs_are_named_by_grid_and_replaced_on_rerun(store):
    """Two reports of one grid leave one live run named report/<grid>; another grid keeps its own."""
    from mlflow.entities import ViewType

    from fedshift.tracking import report_run

    root, client = store
    for grid in ("fedh2l_table2", None, "fedh2l_table2"):  # None: the main grid (no report.name)
        with report_run(grid, root=root) as t:
            t.log_metrics({"n": 1.0})
    exp = client.get_experiment_by_name("report")
    live = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in live) == ["report/fedh2l_table2", "report/main"]
    deleted = client.search_runs([exp.experiment_id], run_view_type=ViewType.DELETED_ONLY)
    assert [r.info.run_name for r in deleted] == ["report/fedh2l_table2"]
    newest = next(r for r in live if r.info.run_name == "report/fedh2l_table2")
    assert newest.data.tags["fedshift.replaces"] == deleted[0].info.run_id


def test_pooled_metrics_exist_only_where_the_grid_asks_for_them(tiny_data, tmp_path):
    """Issue 49: a FedAvg run of a default grid computes no WDP/CDP/ACC (FedH2L's scoring): neither its
    metrics.json headline nor MLflow carries them, and no pooled row reaches rounds.csv; the same run in a
    grid whose scoring asks for them (scoring.metrics: [pooled], FedH2L's best_val selection) has them
    in all three."""
    import json

    import pandas as pd

    from fedshift import runner
    from fedshift.experiments import load_experiments
    from fedshift.scoring.pooled import is_pooled_key
    from fedshift.tracking import NullTracker

    class Recording(NullTracker):
        def __init__(self):
            self.keys = set()

        def log_metrics(self, metrics, step=None):
            self.keys |= set(metrics)

    logged, headline, kinds = {}, {}, {}
    for name, engine, scoring in (("plain", {}, {}),
                                  ("h2l", {"select": "best_val", "eval_every": 1}, {"metrics": ["pooled"]})):
        exp = {"engine": {"rounds": 1, "device": "cpu", "local_batch": 64, **engine}, "scoring": scoring,
               "grid": [{"scenarios": ["rotmnist"], "methods": ["fedavg"], "structures": ["homo_lenet"]}]}
        plan = load_experiments(exp, {"scenarios": {"rotmnist": {}}}, results=str(tmp_path / name), build=str(tiny_data))
        cfg = next(iter(plan.federate.values()))
        tracker = Recording()
        runner.run_federate(cfg, tmp_path / name / "run", tracker)
        logged[name] = tracker.keys
        headline[name] = json.loads((tmp_path / name / "run/metrics.json").read_text())["headline"]
        kinds[name] = set(pd.read_csv(tmp_path / name / "run/rounds.csv")["kind"])
    assert not any(is_pooled_key(k) for k in logged["plain"] | set(headline["plain"])), sorted(headline["plain"])
    assert "avg/inter/top1" in logged["plain"] and "avg/inter/top1" in headline["plain"]
    assert kinds["plain"] == {"intra", "inter"}
    assert {"avg/wdp", "avg/cdp", "avg/acc", "avg/val/acc", "m0/wdp"} <= logged["h2l"] & set(headline["h2l"])
    assert kinds["h2l"] == {"intra", "inter", "wdp", "cdp", "acc", "val_acc"}


def test_pooled_key_names():
    from fedshift.scoring.pooled import is_pooled_key

    assert all(map(is_pooled_key, ["m0/wdp", "avg/cdp", "avg/acc", "m20/val/acc", "avg/val/acc"]))
    assert not any(map(is_pooled_key, ["avg/inter/top1", "m0/intra/top5", "train/acc", "m0/train/acc", "global/acc"]))


def test_a_copied_store_finds_its_artifacts_after_the_old_folder_is_gone(tmp_path, monkeypatch):
    """MLflow makes artifact locations absolute: a project folder copied elsewhere would read its
    artifacts from the old folder. init_store (every workflow start) points them at the copy."""
    import shutil

    import mlflow

    from fedshift.tracking import init_store, job_run

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    init_store(old)
    (old / "note.txt").write_text("the run's artifact")
    with job_run(_cfg(), "federate", root=old) as t:
        t.log_artifact(old / "note.txt")
    shutil.copytree(old, new)
    shutil.rmtree(old)
    client = mlflow.MlflowClient(f"sqlite:///{new / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("rotmnist").experiment_id])[0]
    assert str(old) in run.info.artifact_uri  # before: the vanished folder
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # a fresh process in the copy (set_tracking_uri sets it)
    init_store(new)
    run = client.get_run(run.info.run_id)
    assert run.info.artifact_uri.startswith((new / "mlartifacts").as_uri())
    assert client.get_experiment_by_name("rotmnist").artifact_location.startswith((new / "mlartifacts").as_uri())
    got = client.download_artifacts(run.info.run_id, "note.txt", str(tmp_path))
    assert open(got).read() == "the run's artifact"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert init_store(new) and client.get_run(run.info.run_id).info.artifact_uri == run.info.artifact_uri  # idempotent


def test_federated_experiments_carry_the_headline_view_mlflow_opens_by_url(store, capsys, monkeypatch):
    """The view (AVG inter first) is an experiment tag MLflow 3's UI reads through
    ?viewStateShareKey=<key>; pretrain and report experiments carry none; `fedshift ui-url`
    prints the URL with the experiment's id."""
    import json

    from fedshift.cli import main
    from fedshift.tracking import SHARED_VIEW_KEY, SHARED_VIEW_TAG, job_run, report_run

    root, client = store
    with job_run(_cfg(), "federate", root=root):
        pass
    with job_run({"kind": "pretrain", "run_name": "pretrain/x", "scenario": "rotmnist", "arch": "lenet",
                  "participant": "m0", "seed": 0, "wildcards": {}}, "pretrain", root=root):
        pass
    with report_run("main", root=root):
        pass
    exp = client.get_experiment_by_name("rotmnist")
    state = json.loads(exp.tags[SHARED_VIEW_TAG + SHARED_VIEW_KEY])
    assert state["selectedColumns"][:2] == ["metrics.`table/AVG_inter`", "metrics.`table/AVG_intra`"]
    assert state["searchFilter"] == "tags.`fedshift.kind` = 'federate'"
    for other in ("rotmnist-pretrain", "report"):
        assert SHARED_VIEW_TAG + SHARED_VIEW_KEY not in client.get_experiment_by_name(other).tags
    monkeypatch.chdir(root)
    assert main(["ui-url"]) in (0, None)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"rotmnist\thttp://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?"
                   f"viewStateShareKey={SHARED_VIEW_KEY}&workflowType=machine_learning"]
