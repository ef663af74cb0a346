"""The MLflow adapter: one MLflow run as a :class:`~fedshift.tracking.base.Tracker`, opened (or continued)
by :func:`mlflow_run`, ended FINISHED, FAILED or KILLED; a failing call turns tracking off with one warning."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from ..config import flatten
from .base import Interrupted
from .calls import Worker, call_timeout, default_uri, retry
from .store import experiment_id

log = logging.getLogger(__name__)


class MlflowTracker:
    """One MLflow run; use through :func:`mlflow_run`. Failures degrade to a warning (see above)."""

    def __init__(self, client, run_id: Optional[str], worker: Optional[Worker] = None):
        self.client = client
        self.run_id = run_id
        self.worker = worker or Worker()
        self.disabled = run_id is None

    def _call(self, what: str, fn) -> Any:
        if self.disabled:
            return None
        try:
            return self.worker.call(fn, call_timeout())
        except Exception as exc:
            self.disabled = True
            log.warning("MLflow %s failed (%s: %s); tracking is off for the rest of this job, its files "
                        "(metrics.json, rounds.csv) stay the results", what, type(exc).__name__,
                        str(exc).splitlines()[0][:200] if str(exc) else "")
            return None

    def log_params(self, params):
        from mlflow.entities import Param

        flat = {k: ("" if v is None else str(v))[:6000] for k, v in flatten(dict(params)).items()}
        items = [Param(k, v) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            self._call("log_params", lambda b=items[i:i + 100]: retry(self.client.log_batch, self.run_id, params=b))

    def log_metrics(self, metrics, step=None):
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k.replace("@", "_"), float(v), ts, int(step or 0)) for k, v in metrics.items() if v == v]
        for i in range(0, len(items), 1000):
            self._call("log_metrics", lambda b=items[i:i + 1000]: retry(self.client.log_batch, self.run_id, metrics=b))

    def log_artifact(self, path, artifact_path=None):
        self._call("log_artifact", lambda: retry(self.client.log_artifact, self.run_id, str(path), artifact_path))

    def set_tags(self, tags):
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        self._call("set_tags", lambda: retry(self.client.log_batch, self.run_id, tags=items))

    def terminate(self, status: str) -> None:
        self._call(f"marking the run {status}", lambda: retry(self.client.set_terminated, self.run_id, status))


def _open_run(client, experiment: str, run_name: str, tags: Dict[str, str], root: Path,
              resume_run_id: Optional[str]) -> str:
    """Continue ``resume_run_id`` when it exists, else create a run; mark stale RUNNING runs of the
    same name (left by a SIGKILL) FAILED."""
    exp_id = retry(experiment_id, client, experiment, root)
    run_id = None
    if resume_run_id:
        try:
            client.get_run(resume_run_id)
            retry(client.update_run, resume_run_id, status="RUNNING")
            run_id = resume_run_id
        except Exception:
            run_id = None
    safe_name = run_name.replace("'", "")
    stale = retry(client.search_runs, [exp_id],
                   filter_string=f"attributes.run_name = '{safe_name}' and attributes.status = 'RUNNING'")
    for r in stale:
        if r.info.run_id != run_id:
            retry(client.set_terminated, r.info.run_id, "FAILED")
    if run_id is None:
        run_id = retry(client.create_run, exp_id, run_name=run_name, tags=dict(tags or {})).info.run_id
    return run_id


@contextlib.contextmanager
def mlflow_run(experiment: str, run_name: str, tags: Optional[Dict[str, str]] = None,
               root: Path | None = None, resume_run_id: Optional[str] = None) -> Iterator[MlflowTracker]:
    """Open (or continue) an MLflow run in ``experiment``; FINISHED on success, KILLED when a
    signal stopped the job, FAILED on any other exception. ``tracker.resumed`` says whether
    ``resume_run_id`` was continued."""
    import mlflow

    root = Path(root or os.getcwd()).resolve()
    worker = Worker()
    tracker = MlflowTracker(None, None, worker)
    try:
        client = worker.call(lambda: mlflow.MlflowClient(default_uri(root)), call_timeout())
        run_id = worker.call(lambda: _open_run(client, experiment, run_name, tags or {}, root, resume_run_id),
                             call_timeout())
        tracker = MlflowTracker(client, run_id, worker)
    except Exception as exc:
        log.warning("MLflow unavailable (%s: %s); running without tracking, the run's files stay the results",
                    type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    tracker.resumed = bool(resume_run_id) and tracker.run_id == resume_run_id
    try:
        yield tracker
    except Interrupted:
        tracker.terminate("KILLED")
        raise
    except BaseException:
        tracker.terminate("FAILED")
        raise
    tracker.terminate("FINISHED")
