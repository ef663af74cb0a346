"""Tracking: the narrow interface the engine talks to, an MLflow adapter and a null tracker.

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

One idea per module: :mod:`.base` (the protocol, the null tracker, :class:`Interrupted`),
:mod:`.calls` (how every MLflow call is made: the store's URI, retries on a locked SQLite, a time
limit), :mod:`.mlflow_adapter` (one MLflow run as a tracker), :mod:`.store` (the store and what
its UI shows: schema, relocation, experiment descriptions, the headline view), :mod:`.jobs` (which
run a job or a report logs to: names, tags, replacing earlier runs, the job's summary). This
package's namespace is the interface callers use.
"""

from .base import Interrupted, NullTracker, Tracker
from .calls import call_timeout, default_uri
from .jobs import (RUN_KEY_TAG, environment_params, git_commit, headline_metrics, job_experiment, job_run, job_tags,
                   log_job_summary, replace_previous_runs, report_run, run_display_name, timing_metrics)
from .mlflow_adapter import MlflowTracker, mlflow_run
from .store import (REPORT_EXPERIMENT, SHARED_VIEW_KEY, SHARED_VIEW_TAG, headline_view_state, headline_view_urls,
                    init_store, relocate_store)

__all__ = [
    "Interrupted", "NullTracker", "Tracker",
    "call_timeout", "default_uri",
    "MlflowTracker", "mlflow_run",
    "REPORT_EXPERIMENT", "SHARED_VIEW_KEY", "SHARED_VIEW_TAG", "headline_view_state", "headline_view_urls",
    "init_store", "relocate_store",
    "RUN_KEY_TAG", "environment_params", "git_commit", "headline_metrics", "job_experiment", "job_run", "job_tags",
    "log_job_summary", "replace_previous_runs", "report_run", "run_display_name", "timing_metrics",
]
