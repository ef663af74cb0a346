"""How every MLflow call is made: the store's URI, a retry when a parallel job holds the SQLite lock,
and a time limit per call (one worker thread), so a hung or failing store never blocks a job."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# An unreachable tracking server must fail in seconds, not after MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def call_timeout() -> float:
    return float(os.environ.get("FEDSHIFT_MLFLOW_TIMEOUT", "60"))


class Worker:
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


def default_uri(root: Path | None = None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = Path(root or os.getcwd()).resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def retry(fn, *args, attempts: int = 8, **kwargs):
    """Call ``fn``; on a 'database is locked' style error wait and retry (parallel jobs)."""
    for k in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # MLflow wraps sqlite3.OperationalError in several types
            if k == attempts - 1 or "locked" not in str(exc).lower():
                raise
            time.sleep(0.2 * 2**k)
