"""Which MLflow run a job logs to, and what it logs at the end: the run's key, short name, tags and
experiment; earlier runs of the same job or grid replaced; software, device, headline numbers and timings."""

from __future__ import annotations

import logging
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from ..config import values_text
from .calls import Worker, call_timeout, default_uri, retry
from .mlflow_adapter import mlflow_run
from .store import REPORT_EXPERIMENT

log = logging.getLogger(__name__)


def git_commit(root: Path | None = None) -> str:
    """The checkout's commit (with '-dirty' when files differ), or 'unknown'."""
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
IDENTITY_TAG = "fedshift.identity"  # what the run computes (fedshift.provenance.run_identity; issue 50)
NAME_ID_CHARS = 6  # the identity's first characters at the end of a run's name


def run_display_name(cfg: Mapping[str, Any]) -> str:
    """Short, unique within its experiment (the scenario: :func:`job_experiment`), what differs
    first so MLflow's name column does not cut it off: 'fccl_plus s0 demo_mixed photo_patches 1a2b3c'
    (federate; the last word: the first characters of the run's identity, so the runs of two grids that set
    a method differently have two names), 'lenet m20 s0 4d5e6f' (pretrain, in ``<scenario>-pretrain``), or
    'tune/fedavgm lr=0.01 beta=0.9 s100 homo_lenet' (a tuning candidate, in ``<scenario>-tune``: its values)."""
    rid = str(cfg.get("identity") or "")[:NAME_ID_CHARS]
    tail = f" {rid}" if rid else ""
    if cfg.get("kind") == "pretrain":
        return f"{cfg['arch']} {cfg['participant']} s{cfg['seed']}{tail}"
    public = cfg.get("public") or "none"
    where = f"{cfg['structure']}" + ("" if public == "none" else f" {public}")
    if cfg.get("tune"):
        return f"tune/{cfg['method']} {values_text(cfg['tune']['values'])} s{cfg['seed']} {where}{tail}"
    return f"{cfg['method']} s{cfg['seed']} {where}{tail}"


def job_kind(cfg: Mapping[str, Any], kind: str) -> str:
    """``tune`` for a tuning candidate (a federated job on the holdout), else ``kind``."""
    return "tune" if kind == "federate" and cfg.get("tune") else kind


def job_tags(cfg: Mapping[str, Any], kind: str) -> Dict[str, str]:
    """Tags for filtering in the UI: every wildcard (bare and as ``wildcard.<name>``), the
    method family, the run key, the run's identity and the commit."""
    wildcards = {k: str(v) for k, v in (cfg.get("wildcards") or {}).items()}
    tags = {"fedshift.kind": job_kind(cfg, kind), RUN_KEY_TAG: str(cfg["run_name"]), "git.commit": git_commit(),
            **wildcards, **{f"wildcard.{k}": v for k, v in wildcards.items()}}
    if cfg.get("identity"):
        tags[IDENTITY_TAG] = str(cfg["identity"])
    if cfg.get("base_method"):
        tags["base_method"] = str(cfg["base_method"])
    return tags


def previous_runs(client, experiment_id: str, run_key: str) -> list:
    """Live runs of the experiment carrying ``run_key`` (newest first)."""
    key = run_key.replace("'", "\\'")
    return retry(client.search_runs, [experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                  order_by=["attributes.start_time DESC"], max_results=100)


def replace_previous_runs(experiment: str, run_key: str, root: Path | None = None,
                          keep: Optional[str] = None) -> list:
    """Delete (soft) the earlier runs of ``run_key`` in ``experiment`` but ``keep`` (the run a
    resumed job continues); return their ids."""
    import mlflow

    root = Path(root or os.getcwd()).resolve()
    client = mlflow.MlflowClient(default_uri(root))
    exp = retry(client.get_experiment_by_name, experiment)
    if exp is None:
        return []
    ids = [r.info.run_id for r in previous_runs(client, exp.experiment_id, run_key) if r.info.run_id != keep]
    for run_id in ids:
        retry(client.delete_run, run_id)
    return ids


def job_experiment(cfg: Mapping[str, Any], kind: str) -> str:
    """Federated runs in ``<scenario>``, pretrain (BASE) runs in ``<scenario>-pretrain``, tuning candidates in
    ``<scenario>-tune``: the experiment MLflow opens on holds only the runs the tables compare (issue 22,
    point 7; issue 50)."""
    kind = job_kind(cfg, kind)
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
        replaced = Worker().call(lambda: replace_previous_runs(experiment, key, root, keep=keep), call_timeout())
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
            from ..data import SCENARIOS

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
    # GNU OpenMP reads these when torch loads; they decide how a job's threads wait at a barrier and so
    # its time on a shared node (README, "Shared nodes"): recorded beside the timings they explain.
    for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        params[f"env.{var.lower()}"] = os.environ.get(var, "unset")
    if device.startswith("cuda"):
        params["env.device_name"] = torch.cuda.get_device_name(torch.device(device))
    tracker.log_params(params)
    tracker.set_tags({"device": device})
