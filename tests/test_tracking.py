"""The MLflow adapter on a real SQLite store: flattened params, per-step metrics,
artifacts, FAILED status on an exception."""

from __future__ import annotations

import pytest


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    from fedshift.tracking import init_store

    init_store(tmp_path)
    import mlflow

    return tmp_path, mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_run_logs_params_metrics_artifacts(store):
    from fedshift.tracking import mlflow_run

    root, client = store
    art = root / "metrics.json"
    art.write_text("{}")
    with mlflow_run("scen", "federate/x", {"wildcard.method": "m"}, root=root) as t:
        t.log_params({"engine": {"lr": 0.001, "rounds": 3}, "method": "m", "list": [1, 2]})
        for step in range(3):
            t.log_metrics({"avg/inter/top1": 0.1 * step, "nan": float("nan")}, step=step)
        t.log_artifact(art)
    run = client.search_runs([client.get_experiment_by_name("scen").experiment_id])[0]
    assert run.info.status == "FINISHED"
    assert run.data.params == {"engine.lr": "0.001", "engine.rounds": "3", "method": "m", "list": "[1, 2]"}
    hist = client.get_metric_history(run.info.run_id, "avg/inter/top1")
    assert [(m.step, round(m.value, 6)) for m in hist] == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert "nan" not in run.data.metrics  # NaN values are dropped, not stored
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["metrics.json"]


def test_run_marked_failed_on_exception(store):
    from fedshift.tracking import mlflow_run

    root, client = store
    with pytest.raises(RuntimeError):
        with mlflow_run("scen", "boom", root=root):
            raise RuntimeError("job died")
    run = client.search_runs([client.get_experiment_by_name("scen").experiment_id])[0]
    assert run.info.status == "FAILED"


def test_null_tracker_accepts_everything(tmp_path):
    from fedshift.tracking import NullTracker

    t = NullTracker()
    t.log_params({"a": 1})
    t.log_metrics({"x": 1.0}, step=1)
    t.log_artifact(tmp_path)
    t.set_tags({"a": "b"})
