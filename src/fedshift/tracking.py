"""The narrow tracking interface the engine talks to, an MLflow adapter and a null tracker.

Training code calls ``log_params`` / ``log_metrics(step=...)`` / ``log_artifact`` /
``set_tags`` and never MLflow directly (Lightning's MLflowLogger style). Files written
by the jobs (``metrics.json``, ``rounds.csv``) stay the source of truth; MLflow mirrors
them for browsing. The adapter:

* takes the store from ``MLFLOW_TRACKING_URI``, else ``sqlite:///<root>/mlflow.db`` with
  artifacts under ``<root>/mlartifacts`` (``root`` = the working directory);
* flattens nested params (``engine.lr``) and sends them in batches;
* retries briefly when SQLite is locked by a parallel job;
* marks the run FAILED when the body raises.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Protocol

from .config import flatten

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


class Tracker(Protocol):
    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None: ...
    def log_artifact(self, path: Path, artifact_path: Optional[str] = None) -> None: ...
    def set_tags(self, tags: Mapping[str, str]) -> None: ...


class NullTracker:
    """Discards everything (tests, benchmarks, ``tracking: none``)."""

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step=None):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def set_tags(self, tags):
        pass


def default_uri(root: Path | None = None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = Path(root or os.getcwd()).resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def _retry(fn, *args, attempts: int = 8, **kwargs):
    """Call ``fn``; on a 'database is locked' style error wait and retry (parallel jobs)."""
    for k in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # MLflow wraps sqlite3.OperationalError in several types
            if k == attempts - 1 or "locked" not in str(exc).lower():
                raise
            time.sleep(0.2 * 2**k)


def init_store(root: Path | None = None) -> str:
    """Create the SQLite store (schema migrations) once, before parallel jobs race to do it."""
    import mlflow

    uri = default_uri(root)
    mlflow.set_tracking_uri(uri)
    _retry(mlflow.MlflowClient(uri).search_experiments, max_results=1)
    return uri


def _experiment_id(client, name: str, root: Path) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=(root / "mlartifacts" / name).as_uri())
    except Exception:  # created meanwhile by a parallel job
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


class MlflowTracker:
    """One MLflow run; use through :func:`mlflow_run`."""

    def __init__(self, client, run_id: str):
        self.client = client
        self.run_id = run_id

    def log_params(self, params):
        from mlflow.entities import Param

        flat = {k: ("" if v is None else str(v))[:6000] for k, v in flatten(dict(params)).items()}
        items = [Param(k, v) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            _retry(self.client.log_batch, self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics, step=None):
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k.replace("@", "_"), float(v), ts, int(step or 0)) for k, v in metrics.items() if v == v]
        for i in range(0, len(items), 1000):
            _retry(self.client.log_batch, self.run_id, metrics=items[i:i + 1000])

    def log_artifact(self, path, artifact_path=None):
        _retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def set_tags(self, tags):
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        _retry(self.client.log_batch, self.run_id, tags=items)


@contextlib.contextmanager
def mlflow_run(experiment: str, run_name: str, tags: Optional[Dict[str, str]] = None,
               root: Path | None = None) -> Iterator[MlflowTracker]:
    """Open an MLflow run in ``experiment``; FINISHED on success, FAILED on an exception."""
    import mlflow

    root = Path(root or os.getcwd()).resolve()
    client = mlflow.MlflowClient(default_uri(root))
    exp_id = _retry(_experiment_id, client, experiment, root)
    run = _retry(client.create_run, exp_id, run_name=run_name, tags=dict(tags or {}))
    tracker = MlflowTracker(client, run.info.run_id)
    try:
        yield tracker
    except BaseException:
        _retry(client.set_terminated, run.info.run_id, "FAILED")
        raise
    _retry(client.set_terminated, run.info.run_id, "FINISHED")


def git_commit(root: Path | None = None) -> str:
    """The checkout's commit (with '-dirty' when files differ), or 'unknown'."""
    import subprocess

    try:
        cwd = str(root or os.getcwd())
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"
