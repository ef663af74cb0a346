"""The narrow tracking interface the engine talks to, an MLflow adapter and a null tracker.

Training code calls ``log_params`` / ``log_metrics(step=...)`` / ``log_artifact`` /
``set_tags`` and never MLflow directly (Lightning's MLflowLogger style). Files written
by the jobs (``metrics.json``, ``rounds.csv``) stay the source of truth; MLflow mirrors
them for browsing. The adapter:

* takes the store from ``MLFLOW_TRACKING_URI``, else ``sqlite:///<root>/mlflow.db`` with
  artifacts under ``<root>/mlartifacts`` (``root`` = the working directory);
* flattens nested params (``engine.lr``) and sends them in batches;
* retries briefly when SQLite is locked by a parallel job;
* marks the run FAILED when the body raises, KILLED when a signal stopped it
  (:class:`Interrupted`);
* continues an existing run (``resume_run_id``: a resumed job keeps one MLflow run)
  and marks runs of the same name left RUNNING by a killed job FAILED;
* never costs results: every MLflow call runs with a time limit
  (``FEDSHIFT_MLFLOW_TIMEOUT`` seconds, default 60, longer than the SQLite lock retries); a call that fails or times out
  (full disk, unreachable server) logs one warning and turns tracking off for the
  rest of the job, whose files stay the source of truth.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Protocol

from .config import flatten

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# An unreachable tracking server must fail in seconds, not after MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")

log = logging.getLogger(__name__)


class Interrupted(BaseException):
    """Raised in the main thread by the SIGTERM/SIGINT handler of a job (see ``fedshift.cli``)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def call_timeout() -> float:
    return float(os.environ.get("FEDSHIFT_MLFLOW_TIMEOUT", "60"))


class _Worker:
    """One daemon thread that runs every MLflow call of a job, so each call can be given up
    after a time limit (a hung call never blocks the job nor its exit)."""

    def __init__(self):
        self.q: "queue.Queue" = queue.Queue()
        threading.Thread(target=self._loop, daemon=True, name="mlflow").start()

    def _loop(self):
        while True:
            fn, box, done = self.q.get()
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller
                box.append((False, exc))
            done.set()

    def call(self, fn, timeout: float):
        box: list = []
        done = threading.Event()
        self.q.put((fn, box, done))
        if not done.wait(timeout):
            raise TimeoutError(f"no answer within {timeout:g} s")
        ok, value = box[0]
        if ok:
            return value
        raise value


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
    """One MLflow run; use through :func:`mlflow_run`. Failures degrade to a warning (see above)."""

    def __init__(self, client, run_id: Optional[str], worker: Optional[_Worker] = None):
        self.client = client
        self.run_id = run_id
        self.worker = worker or _Worker()
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
            self._call("log_params", lambda b=items[i:i + 100]: _retry(self.client.log_batch, self.run_id, params=b))

    def log_metrics(self, metrics, step=None):
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k.replace("@", "_"), float(v), ts, int(step or 0)) for k, v in metrics.items() if v == v]
        for i in range(0, len(items), 1000):
            self._call("log_metrics", lambda b=items[i:i + 1000]: _retry(self.client.log_batch, self.run_id, metrics=b))

    def log_artifact(self, path, artifact_path=None):
        self._call("log_artifact", lambda: _retry(self.client.log_artifact, self.run_id, str(path), artifact_path))

    def set_tags(self, tags):
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        self._call("set_tags", lambda: _retry(self.client.log_batch, self.run_id, tags=items))

    def terminate(self, status: str) -> None:
        self._call(f"marking the run {status}", lambda: _retry(self.client.set_terminated, self.run_id, status))


def _open_run(client, experiment: str, run_name: str, tags: Dict[str, str], root: Path,
              resume_run_id: Optional[str]) -> str:
    """Continue ``resume_run_id`` when it exists, else create a run; mark stale RUNNING runs of the
    same name (left by a SIGKILL) FAILED."""
    exp_id = _retry(_experiment_id, client, experiment, root)
    run_id = None
    if resume_run_id:
        try:
            client.get_run(resume_run_id)
            _retry(client.update_run, resume_run_id, status="RUNNING")
            run_id = resume_run_id
        except Exception:
            run_id = None
    safe_name = run_name.replace("'", "")
    stale = _retry(client.search_runs, [exp_id],
                   filter_string=f"attributes.run_name = '{safe_name}' and attributes.status = 'RUNNING'")
    for r in stale:
        if r.info.run_id != run_id:
            _retry(client.set_terminated, r.info.run_id, "FAILED")
    if run_id is None:
        run_id = _retry(client.create_run, exp_id, run_name=run_name, tags=dict(tags or {})).info.run_id
    return run_id


@contextlib.contextmanager
def mlflow_run(experiment: str, run_name: str, tags: Optional[Dict[str, str]] = None,
               root: Path | None = None, resume_run_id: Optional[str] = None) -> Iterator[MlflowTracker]:
    """Open (or continue) an MLflow run in ``experiment``; FINISHED on success, KILLED when a
    signal stopped the job, FAILED on any other exception. ``tracker.resumed`` says whether
    ``resume_run_id`` was continued."""
    import mlflow

    root = Path(root or os.getcwd()).resolve()
    worker = _Worker()
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
