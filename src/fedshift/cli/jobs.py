"""``fedshift pretrain | federate | evaluate``: one job of the workflow in this process.

The one idea: run a job the way a Snakemake rule needs it run: torch threads from the
scheduler's allocation, SIGTERM/SIGINT (and, with ``--die-with-parent``, the parent's death)
stop it with its last checkpoint kept, one job per run folder, the MLflow run continued on a
rerun of the same config; ``evaluate`` re-scores a job's published models.

The fedshift imports stay in the function bodies: the signal handlers and ``prctl`` are in place
before torch (``fedshift.provenance``, ``fedshift.runner``) is imported, so a job stopped during
that second and a half still ends with its one line; and ``fedshift --help`` imports this module
without waiting for torch or MLflow.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("fedshift")


def apply_thread_allocation(cfg: dict, kind: str, threads) -> None:
    """Torch threads follow the scheduler's allocation (``--threads``, the Snakemake rule's
    ``{threads}`` = SLURM's --cpus-per-task) unless the config names a number itself."""
    section = cfg.get("engine" if kind == "federate" else "pretrain")
    if threads and section is not None and not section.get("threads"):
        section["threads"] = int(threads)


def _die_with_parent() -> None:
    """SIGTERM this job when the process that started it dies (Linux prctl PR_SET_PDEATHSIG).

    The Snakemake rules ``exec`` the job, so its parent is Snakemake: after ``kill -9`` of
    Snakemake the job stops like any SIGTERM (checkpoint kept, nothing published) instead of
    finishing and publishing behind a dead workflow whose metadata still marks it incomplete,
    which Snakemake then redid from scratch after ``--unlock`` (issue 23 case 8).
    """
    import ctypes  # only jobs started by the rules pay for it, not `fedshift --help`

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the job simply outlives its parent, as before
        log.warning("--die-with-parent: prctl is not available here; the job outlives its parent")
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _job(kind: str, args) -> None:
    from ..tracking import Interrupted

    def interrupted(signum, frame):
        raise Interrupted(signum)

    # Abandon the current step at once: the last checkpoint (end of the previous round) stays on disk.
    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    if getattr(args, "die_with_parent", False):
        _die_with_parent()
    from ..provenance import run_lock  # torch: imported once the handlers above are in place

    try:
        with run_lock(Path(args.out)):  # one job per run folder: a second one names the PID (issue 38)
            _run_job(kind, args)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run_job(kind: str, args) -> None:
    from .. import runner
    from ..config import flatten
    from ..engine import checkpoint

    cfg = runner.read_run_config(Path(args.config), kind)  # aliases bounded (issue 38); one line if broken (51 Q19)
    apply_thread_allocation(cfg, kind, getattr(args, "threads", None))
    fn: Callable[..., Any] = runner.run_pretrain if kind == "pretrain" else runner.run_federate
    if kind == "federate":  # issue 36: a tuned run takes its chosen values; a candidate records divergence
        from .. import tune

        cfg = tune.apply_chosen(cfg)
        fn = tune.run_candidate if "tune" in cfg else fn
    allow = bool(getattr(args, "resume_across_code_change", False)
                 or os.environ.get("FEDSHIFT_RESUME_ACROSS_CODE_CHANGE", "") not in ("", "0"))
    if allow:
        fn = functools.partial(fn, allow_code_change=True)
    if args.no_tracking or os.environ.get("FEDSHIFT_TRACKING", "mlflow") == "none":
        fn(cfg, Path(args.out))
        return
    from ..tracking import environment_params, job_run, log_job_summary

    # A rerun of the same job (same config hash) continues the MLflow run its checkpoint area names;
    # any other earlier run of the job is replaced (tracking.job_run).
    info = checkpoint.read_job_info(checkpoint.partial_dir(Path(args.out)))
    resume = info.get("mlflow_run_id") if info.get("config_hash") == checkpoint.config_hash(cfg) else None
    with job_run(cfg, kind, resume_run_id=resume) as tracker:
        if not tracker.resumed:
            tracker.log_params(flatten({k: v for k, v in cfg.items() if k not in ("paths",)}))
            tracker.log_params(environment_params())
            if cfg.get("tuned") or cfg.get("tune"):  # issue 36: what was tuned and how, as tags too
                from ..tune import mlflow_tags

                tracker.set_tags(mlflow_tags(cfg))
        t0 = time.time()
        metrics = fn(cfg, Path(args.out), tracker)
        last = (cfg.get("engine") or {}).get("rounds") or (cfg.get("pretrain") or {}).get("epochs")
        try:  # tracking never costs a result: the run's files are already published
            metrics = metrics or {}
            if kind == "federate":  # the keys the method keeps out of MLflow (Method.tracked_metrics)
                metrics = runner.tracked_summary(cfg, metrics)
            log_job_summary(tracker, metrics, cfg["scenario"], time.time() - t0, step=last)
        except Exception as exc:
            log.warning("MLflow job summary not logged (%s: %s)", type(exc).__name__, exc)


def cmd_pretrain(args) -> None:
    _job("pretrain", args)


def cmd_federate(args) -> None:
    _job("federate", args)


def cmd_evaluate(args) -> None:
    from ..runner import evaluate_run, read_run_config

    summary = evaluate_run(Path(args.run_dir), device=args.device, bf16=args.bf16, force=args.force)
    rounds = read_run_config(Path(args.run_dir) / "config.yaml", "federate")["engine"].get("rounds")
    print(f"# {args.run_dir}: the published models.pt = the final models after round {rounds} "
          "(not the best round); re-scored on every domain's test set")
    for key in sorted(summary):
        if key.startswith("avg/"):
            print(f"{key} {summary[key]:.4f}")
