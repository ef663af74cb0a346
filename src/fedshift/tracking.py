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


REPORT_EXPERIMENT = "report"  # the experiment of the report runs (report_run)


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
    """Create the SQLite store (schema migrations) once, before parallel jobs race to do it,
    and point a moved store's artifact locations at this folder (:func:`relocate_store`)."""
    import mlflow

    uri = default_uri(root)
    mlflow.set_tracking_uri(uri)
    _retry(mlflow.MlflowClient(uri).search_experiments, max_results=1)
    here = Path(root or os.getcwd()).resolve()
    moved = relocate_store(here) if uri == f"sqlite:///{here / 'mlflow.db'}" else 0  # a server's store is left alone
    if moved:
        log.info("MLflow: %d artifact locations pointed at %s (the store was copied or moved)", moved,
                 here / "mlartifacts")
    return uri


# MLflow stores absolute artifact locations (a relative one is made absolute when the experiment
# is created), so a project folder copied elsewhere (`cp -r`, a shared disk, an archive) would
# point its runs at the old folder's mlartifacts/. Every location fedshift creates ends in
# /mlartifacts/<experiment>...: relocation swaps the part before /mlartifacts/ for this folder.
_LOCATION_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                     ("logged_models", "artifact_location"))


def relocate_store(root: Path | None = None) -> int:
    """Rewrite the store's ``file://.../mlartifacts/...`` locations that point outside
    ``root`` (default: the working folder) to ``root/mlartifacts/...``; return how many changed.
    Only the local SQLite store ``root/mlflow.db`` is touched."""
    import sqlite3

    root = Path(root or os.getcwd()).resolve()
    db = root / "mlflow.db"
    if not db.exists():
        return 0
    here = (root / "mlartifacts").as_uri()
    changed = 0
    con = sqlite3.connect(str(db), timeout=30)
    try:
        with con:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
            for table, col in _LOCATION_COLUMNS:
                if table not in tables:
                    continue
                rows = con.execute(f"select rowid, {col} from {table} where {col} like 'file://%/mlartifacts/%'")
                for rowid, loc in rows.fetchall():
                    new = here + loc[loc.rfind("/mlartifacts/") + len("/mlartifacts"):]
                    if new != loc:
                        con.execute(f"update {table} set {col} = ? where rowid = ?", (new, rowid))
                        changed += 1
    finally:
        con.close()
    return changed


def _experiment_id(client, name: str, root: Path) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        eid = client.create_experiment(name, artifact_location=(root / "mlartifacts" / name).as_uri())
    except Exception:  # created meanwhile by a parallel job
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
    if _federated_experiment(name):
        set_headline_view(client, eid)
    describe_experiment(client, eid, name)
    return eid


# MLflow 3 opens on its GenAI home and shows an experiment's GenAI overview (traces) in "GenAI" mode,
# the default of its "GenAI | Model training" switch, which the browser keeps (localStorage
# `mlflow.workflowType`). A URL's `workflowType=machine_learning` selects "Model training" (3.17);
# the experiment tag `mlflow.experimentKind: custom_model_development` is what earlier 3.x UIs read
# (3.17 ignores it while the switch exists; written for them). `mlflow.note.content` is the
# description at the top of the experiment's page, whose first line shows without expanding it.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"


def headline_view_path(experiment_id: str) -> str:
    """The hash route of an experiment's headline view, in "Model training" mode."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={SHARED_VIEW_KEY}&workflowType=machine_learning"


def experiment_description(name: str, experiment_id: str) -> str:
    """The experiment's description (Markdown): what its runs are and how to land on the answer."""
    if name == REPORT_EXPERIMENT:
        return ("fedshift reports: one run per grid, named `report/<report.name>` (`report/main`: the "
                "default grid). Its artifacts hold `report.md`, the tables (CSV) and the figures; the "
                "same files are in `results/report/` (or `results/ablations/<name>/report/`).")
    if name.endswith("-pretrain"):
        return (f"fedshift: SOLO/BASE pretraining runs of scenario `{name[:-len('-pretrain')]}`, one per "
                "participant x architecture x seed (run name `<arch> <participant> s<seed>`); the report's "
                "`base_pretrain` row. The federated runs are in the experiment named after the scenario.")
    return (f"**[Open the headline view]({headline_view_path(experiment_id)})**: the AVG inter / intra of "
            f"every federated run of scenario `{name}`, side by side.\n\n"
            "One run per method x seed x structure x public set (run name `<method> s<seed> <structure> "
            "<public set>`). The headline view: federated runs sorted by name, first columns "
            "`table/AVG_inter` and `table/AVG_intra` (percent, rounded to 0.01: the AVG columns of the "
            "report's tables for that seed), then `time/total_s`, `method`, `structure`; a first chart "
            "section with the headline per method. Per-round curves: `avg/inter/top1`, "
            "`<participant>/inter/top1`. Pretraining runs: experiment "
            f"`{name}-pretrain`; the tables with their intervals: `results/report/report.md`.")


def describe_experiment(client, experiment_id: str, name: str) -> None:
    """Write the description and the experiment kind (also into a store made before they existed)."""
    _retry(client.set_experiment_tag, experiment_id, DESCRIPTION_TAG, experiment_description(name, experiment_id))
    _retry(client.set_experiment_tag, experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


# ---------------------------------------------------------------------------------------
# The view MLflow opens on. MLflow 3 keeps an experiment page's columns, order and charts in
# the browser (localStorage); a "shared view" is the same state stored server-side as the
# experiment tag `mlflow.sharedViewState.<key>` and opened by `?viewStateShareKey=<key>` in the
# URL. fedshift writes one per federated experiment: federated runs by name, the report
# table's AVG inter / intra as the first columns, a first chart section with the headline.

SHARED_VIEW_TAG = "mlflow.sharedViewState."
SHARED_VIEW_KEY = "fedshift-headline"


def _federated_experiment(name: str) -> bool:
    """Experiments of federated runs: not MLflow's Default, the reports' or ``<scenario>-pretrain``
    (the names :func:`job_experiment` and :func:`report_run` give)."""
    return name not in (REPORT_EXPERIMENT, "Default") and not name.endswith("-pretrain")


def headline_view_state(metric: str = "table/AVG_inter",
                        kind_filter: str = "tags.`fedshift.kind` = 'federate'") -> Dict[str, Any]:
    """The experiment page's view state (keys as MLflow 3.x writes them; unknown keys are
    ignored and missing ones defaulted by the UI)."""
    section = "fedshift-headline"
    line = {"lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear", "range": {},
            "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [],
            "ignoreOutliers": False, "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}
    chart = {"metricSectionId": section, "deleted": False, "isGenerated": False, "runsCountToCompare": 50}
    return {
        "searchFilter": kind_filter, "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
        "startTime": "ALL", "lifecycleFilter": "Active",
        "selectedColumns": [f"metrics.`{metric}`", "metrics.`table/AVG_intra`", "metrics.`time/total_s`",
                            "params.`method`", "params.`structure`"],
        "compareRunCharts": [
            {**chart, "uuid": "fedshift-headline-bar", "type": "BAR", "metricKey": metric, "displayName": metric},
            {**chart, **line, "uuid": "fedshift-acc-line", "type": "LINE", "metricKey": "avg/inter/top1",
             "displayName": "avg/inter/top1"},
            {**chart, "uuid": "fedshift-time-bar", "type": "BAR", "metricKey": "time/total_s",
             "displayName": "time/total_s"},
        ],
        "compareRunSections": [{"uuid": section, "name": "fedshift: headline per method", "display": True,
                                "isReordered": True, "deleted": False, "isGenerated": False}],
        "isAccordionReordered": True, "runListHidden": False, "hideEmptyCharts": True, "chartsSearchFilter": "",
        "viewMaximized": False,
    }


def set_headline_view(client, experiment_id: str) -> None:
    import json

    _retry(client.set_experiment_tag, experiment_id, SHARED_VIEW_TAG + SHARED_VIEW_KEY,
           json.dumps(headline_view_state(), separators=(",", ":")))


def headline_view_urls(root: Path | None = None, base: str = "http://127.0.0.1:5000") -> Dict[str, str]:
    """Experiment name -> the URL of its headline view, for every federated experiment of the
    store (the view tag is written where an older store lacks it)."""
    import mlflow

    client = mlflow.MlflowClient(default_uri(root))
    out = {}
    for exp in _retry(client.search_experiments):
        if not _federated_experiment(exp.name):
            continue
        if SHARED_VIEW_TAG + SHARED_VIEW_KEY not in exp.tags:
            set_headline_view(client, exp.experiment_id)
        if DESCRIPTION_TAG not in exp.tags:
            describe_experiment(client, exp.experiment_id, exp.name)
        out[exp.name] = f"{base}/{headline_view_path(exp.experiment_id)}"
    return out


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


# ---------------------------------------------------------------------------------------
# Run naming, tags, headline metrics, device and timings (one MLflow run per job)
# ---------------------------------------------------------------------------------------
# The run's identity is its key (``cfg["run_name"]``: federate/<scenario>/<public>/...);
# the name shown in the UI is short and names what differs between runs. A rerun of the
# same job (changed config, --forcerun) replaces the earlier run: it is deleted (MLflow's
# soft delete; ``mlflow gc`` purges it) and the new run carries ``fedshift.replaces``.

RUN_KEY_TAG = "fedshift.run_key"


def run_display_name(cfg: Mapping[str, Any]) -> str:
    """Short, unique within its experiment (the scenario: :func:`job_experiment`), what differs
    first so MLflow's name column does not cut it off: 'fccl_plus s0 demo_mixed photo_patches'
    (federate) or 'lenet m20 s0' (pretrain, in ``<scenario>-pretrain``)."""
    if cfg.get("kind") == "pretrain":
        return f"{cfg['arch']} {cfg['participant']} s{cfg['seed']}"
    public = cfg.get("public") or "none"
    return f"{cfg['method']} s{cfg['seed']} {cfg['structure']}" + ("" if public == "none" else f" {public}")


def job_tags(cfg: Mapping[str, Any], kind: str) -> Dict[str, str]:
    """Tags for filtering in the UI: every wildcard (bare and as ``wildcard.<name>``), the
    method family, the run key and the commit."""
    wildcards = {k: str(v) for k, v in (cfg.get("wildcards") or {}).items()}
    tags = {"fedshift.kind": kind, RUN_KEY_TAG: str(cfg["run_name"]), "git.commit": git_commit(), **wildcards,
            **{f"wildcard.{k}": v for k, v in wildcards.items()}}
    if cfg.get("base_method"):
        tags["base_method"] = str(cfg["base_method"])
    return tags


def previous_runs(client, experiment_id: str, run_key: str) -> list:
    """Live runs of the experiment carrying ``run_key`` (newest first)."""
    key = run_key.replace("'", "\\'")
    return _retry(client.search_runs, [experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                  order_by=["attributes.start_time DESC"], max_results=100)


def replace_previous_runs(experiment: str, run_key: str, root: Path | None = None,
                          keep: Optional[str] = None) -> list:
    """Delete (soft) the earlier runs of ``run_key`` in ``experiment`` but ``keep`` (the run a
    resumed job continues); return their ids."""
    import mlflow

    root = Path(root or os.getcwd()).resolve()
    client = mlflow.MlflowClient(default_uri(root))
    exp = _retry(client.get_experiment_by_name, experiment)
    if exp is None:
        return []
    ids = [r.info.run_id for r in previous_runs(client, exp.experiment_id, run_key) if r.info.run_id != keep]
    for run_id in ids:
        _retry(client.delete_run, run_id)
    return ids


def job_experiment(cfg: Mapping[str, Any], kind: str) -> str:
    """Federated runs in ``<scenario>``, pretrain (BASE) runs in ``<scenario>-pretrain``: the
    experiment MLflow opens on holds only the runs the tables compare (issue 22, point 7)."""
    return str(cfg["scenario"]) if kind == "federate" else f"{cfg['scenario']}-{kind}"


def job_run(cfg: Mapping[str, Any], kind: str, root: Path | None = None, resume_run_id: Optional[str] = None):
    """The MLflow run of one pretrain/federate job: short name, wildcard tags, earlier runs
    of the same job replaced, except ``resume_run_id``: the unfinished run a resumed job
    continues (its checkpoint names it). Time-limited like every MLflow call: an unreachable
    store costs a warning, not the job."""
    tags = job_tags(cfg, kind)
    experiment = job_experiment(cfg, kind)
    _replace_earlier(experiment, tags, root, keep=resume_run_id)
    return mlflow_run(experiment, run_display_name(cfg), tags, root=root, resume_run_id=resume_run_id)


def _replace_earlier(experiment: str, tags: Dict[str, str], root: Path | None, keep: Optional[str] = None) -> None:
    """Delete the earlier runs carrying ``tags``' run key (time-limited: an unreachable store
    costs a warning) and name them in ``tags["fedshift.replaces"]``."""
    key = tags[RUN_KEY_TAG]
    try:
        replaced = _Worker().call(lambda: replace_previous_runs(experiment, key, root, keep=keep), call_timeout())
    except Exception as exc:
        log.warning("MLflow: could not replace earlier runs of %s (%s)", key, type(exc).__name__)
        replaced = []
    if replaced:
        tags["fedshift.replaces"] = ",".join(replaced)


def report_run(grid: Optional[str], root: Path | None = None):
    """The MLflow run of one grid's report: named ``report/<grid>`` (``report.name``, ``main``
    for the main grid), tagged with that key, and replacing the grid's earlier report run, so
    the "report" experiment holds one live run per grid instead of a pile of ``report/report``."""
    key = f"report/{grid or 'main'}"
    tags = {RUN_KEY_TAG: key, "fedshift.kind": "report", "git.commit": git_commit()}
    _replace_earlier(REPORT_EXPERIMENT, tags, root)
    return mlflow_run(REPORT_EXPERIMENT, key, tags, root=root)


def environment_params() -> Dict[str, str]:
    """Software and hardware the job ran on (``env.*`` params)."""
    import platform
    import socket

    import torch

    out = {"env.torch": torch.__version__, "env.python": platform.python_version(),
           "env.host": socket.gethostname(), "env.cpu_count": str(os.cpu_count()),
           "env.cuda_available": str(torch.cuda.is_available())}
    if torch.cuda.is_available():
        out["env.cuda"] = str(torch.version.cuda)
        out["env.gpu_count"] = str(torch.cuda.device_count())
        out["env.gpu_name"] = torch.cuda.get_device_name(0)
    for var in ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION", "CUDA_VISIBLE_DEVICES"):
        if os.environ.get(var):
            out[f"env.{var.lower()}"] = os.environ[var]
    return out


def headline_metrics(metrics: Mapping[str, Any], scenario: Optional[str] = None) -> Dict[str, float]:
    """The tables' numbers as MLflow metrics: ``headline/<key>`` (mean of the last k
    evaluated rounds, fractions) and ``table/AVG_inter``/``table/AVG_intra`` (percent, the
    scenario's headline top-k: the AVG column of the report's tables for this seed)."""
    head = {k: round(float(v), 4) for k, v in (metrics.get("headline") or {}).items()}  # MLflow shows all digits
    out = {f"headline/{k}": v for k, v in head.items()}
    topk = 1
    if scenario:
        try:
            from .data import SCENARIOS

            topk = SCENARIOS.get(scenario).headline_topk
        except Exception:
            topk = 1
    for kind in ("inter", "intra"):
        key = f"avg/{kind}/top{topk}"
        if key in head:
            out[f"table/AVG_{kind}"] = round(100.0 * head[key], 2)  # the tables' precision
    return out


def timing_metrics(metrics: Mapping[str, Any], wall_s: float) -> Dict[str, float]:
    """Wall time per phase (seconds): total, training, evaluation, and the rest (setup:
    data loading, models, writing outputs)."""
    out = {"time/total_s": round(float(wall_s), 1)}
    # Phase seconds only (``*_s``): timings also carry checkpoint bytes and the resumed rounds.
    phases = {k: float(v) for k, v in (metrics.get("timings") or {}).items()
              if k.endswith("_s") and isinstance(v, (int, float)) and not isinstance(v, bool)}
    for k, v in phases.items():
        out[f"time/{k}"] = round(v, 1)
    if phases:
        out["time/setup_s"] = round(max(0.0, float(wall_s) - sum(phases.values())), 1)
    return out


def log_job_summary(tracker, metrics: Mapping[str, Any], scenario: str, wall_s: float,
                    step: Optional[int] = None) -> None:
    """Headline metrics, timings and the device actually used, after the job ran."""
    tracker.log_metrics({**headline_metrics(metrics, scenario), **timing_metrics(metrics, wall_s)}, step=step)
    device = str(metrics.get("device", ""))
    import torch

    params = {"env.device": device, "env.torch_threads": str(torch.get_num_threads())}
    if device.startswith("cuda"):
        params["env.device_name"] = torch.cuda.get_device_name(torch.device(device))
    tracker.log_params(params)
    tracker.set_tags({"device": device})
