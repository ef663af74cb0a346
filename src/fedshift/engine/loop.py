"""The round loop of a federated job, and what it reports while it runs.

:class:`FederateJob` is a job as :func:`fedshift.runner.build_federate` builds it (the typed engine config,
the method, the federation, and what its checkpoints are checked against); :class:`RunLoop` runs its rounds:
evaluations, tuning's early stop, the checkpoint payload and resume from one, the timings. The runner
publishes what the loop gathered (:func:`fedshift.runner.publish_federate`). Also the checks every round
makes (:func:`check_skipped`, :func:`check_metrics`) and the progress line (:class:`Progress`).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from ..errors import NonFiniteError, RunError
from . import checkpoint
from . import selection as tune  # issue 36: early stopping and the validation score of tuning candidates
from .config import EngineConfig
from .federation import Federation, summarise
from .sampling import GlobalEvaluator

if TYPE_CHECKING:
    from ..methods import Method

log = logging.getLogger(__name__)


def check_skipped(fed, eng, run: str, skipped: int, checked: int) -> None:
    """``on_nonfinite: skip_batch`` must not hide divergence: more than ``max_skipped_fraction`` of
    this round's or of the run's batches skipped stops the job (issue 23 case 4); any skip is printed."""
    if not skipped:
        return
    total_s, total_c = fed.skipped_batches, max(fed.checked_batches, 1)
    print(f"[{run}] round {fed.round}: skipped {skipped} of {checked} batches for a non-finite loss "
          f"({total_s} of {total_c} in the run)", flush=True)
    for what, s, c in (("round", skipped, max(checked, 1)), ("run", total_s, total_c)):
        if s / c > eng.max_skipped_fraction:
            raise NonFiniteError(
                f"{run}: {s} of {c} batches of the {what} (up to round {fed.round}) had a non-finite loss, more than "
                f"engine.max_skipped_fraction {eng.max_skipped_fraction}: the run diverged; lower the learning rate")


def check_metrics(fed, metrics: Dict[str, float]) -> None:
    """A non-finite training metric (``<participant>/train/<term>``) stops the job."""
    for key, v in metrics.items():
        if isinstance(v, float) and not math.isfinite(v) and fed.cfg.on_nonfinite == "fail":
            part, _, term = key.partition("/train/")
            raise fed.nonfinite(part if term else "?", term or key)


def _gpu_allocated() -> bool:
    """The scheduler handed this job a GPU (SLURM --gpus, or CUDA_VISIBLE_DEVICES set)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return bool(os.environ.get("SLURM_JOB_GPUS") or os.environ.get("SLURM_GPUS_ON_NODE")
                or (visible and visible not in ("-1", "none", "NoDevFiles")))


def device_note(requested: str, device: torch.device) -> str:
    """The resolved device, and a warning when the job asked for CUDA (``cuda``/``cuda:i``, or
    ``auto`` in a job the scheduler gave a GPU) but runs on the CPU."""
    asked_cuda = requested.startswith("cuda") or (requested == "auto" and _gpu_allocated())
    if device.type == "cpu" and asked_cuda:
        return f"cpu (FELL BACK: asked {requested!r} with a GPU allocated, but torch finds no CUDA device)"
    return str(device)


class Progress:
    """One line per finished round/epoch on stderr (the rules tee stderr to the terminal, so a
    running Snakemake shows it; stdout holds the job's log), with the resolved device."""

    def __init__(self, label: str, total: int, device: str = ""):
        self.label, self.total, self.t0, self.device = label, total, time.time(), device
        if device:
            print(f"[{self.label}] starting {total} steps on {device}", file=sys.stderr, flush=True)

    def __call__(self, step: int, msg: str) -> None:
        el = time.time() - self.t0
        eta = el / max(step, 1) * (self.total - step)
        on = f" on {self.device}" if self.device else ""
        print(f"[{self.label}] {step}/{self.total} {msg} | {el:.0f}s elapsed, ~{eta:.0f}s left{on}",
              file=sys.stderr, flush=True)


@dataclass
class FederateJob:
    """A federated job built from its config: the typed engine config, the method, the federation, and what
    its checkpoints and published folder are checked against (config hash, input hashes, provenance)."""

    cfg: Dict[str, Any]
    out_dir: Path
    eng: EngineConfig
    device: torch.device
    method: "Method"
    fed: Federation
    verify_s: float
    cfg_hash: str
    partial: Path
    inputs: Dict[str, str]
    record: Dict[str, Any]

    @property
    def run_name(self) -> str:
        return self.cfg["run_name"]

    def load_checkpoint(self, allow_code_change: bool) -> Optional[Dict[str, Any]]:
        """This job's checkpoint when one of the same config, inputs and code is on disk (engine.checkpoint_every)."""
        if not self.eng.checkpoint_every:
            return None
        return checkpoint.load(self.partial, self.cfg_hash, self.inputs, code=self.record["code"],
                               allow_code_change=allow_code_change, last_round=self.eng.rounds,
                               models=[c.model for c in self.fed.clients])


class RunLoop:
    """The rounds of a federated job: evaluations, tuning's early stop, checkpoints (their payload) and
    resume from one, and the timings; what it gathers (rows, history...) is what :func:`publish_federate`
    writes and what a checkpoint carries."""

    def __init__(self, job: FederateJob, tracker):
        self.job, self.tracker = job, tracker
        self.fed, self.method, self.eng, self.cfg = job.fed, job.method, job.eng, job.cfg
        self.prog = Progress(job.run_name, self.eng.rounds, device_note(self.eng.device, job.device))
        self.all_rows: List[dict] = []
        self.history: List[Dict[str, float]] = []
        self.timings = {"train_s": 0.0, "eval_s": 0.0, "checkpoint_s": 0.0, "verify_s": job.verify_s}
        self.resumed: List[int] = []
        self.eval_rounds: List[int] = []  # rounds of `history` (model selection: engine.select)
        self.history_g: List[Dict[str, float]] = []  # tuning on the global model: global/val/top1 per global evaluation
        self.rounds_g: List[int] = []
        # the server-side metric (FedMMD/FedFusion); a no-op when engine.global_eval_every is 0
        self.global_eval = GlobalEvaluator(self.fed, self.method, self.eng)
        self.weights_only_checked = False  # a plugin's state_dict() is checked loadable at the first checkpoint
        self.checkpoints_ok = True
        self.last_checkpoint = 0.0

    def evaluate(self, r: int) -> Dict[str, float]:
        """Every participant on every domain's test set (+ the method's evaluation_extras); the summary."""
        fed, method, eng = self.fed, self.method, self.eng
        t = time.time()
        rows = fed.evaluate()
        extra_rows, extra = method.evaluation_extras(fed, rows)  # e.g. pooled WDP/CDP/ACC (+ validation ACC)
        self.timings["eval_s"] += time.time() - t
        rows = rows + extra_rows if eng.pooled_rows else rows
        for row in rows:
            row["round"] = r
        self.all_rows.extend(rows)
        summ = summarise([row for row in rows if row["domain"] not in ("pooled", "val")])
        summ.update(extra)
        self.tracker.log_metrics(method.tracked_metrics(summ, eng), step=r)
        return summ

    def resume(self, ckpt: Dict[str, Any]) -> int:
        """Restore the federation, the method and the gathered results from a checkpoint; the next round."""
        try:
            checkpoint.restore_federation(self.fed, self.method, ckpt)
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # e.g. a method state of another layout
            aside = checkpoint.set_aside(self.job.partial / checkpoint.CHECKPOINT, "unrestorable")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise RunError(f"checkpoint {aside.with_name(checkpoint.CHECKPOINT)} (round {ckpt.get('round')}) could "
                           f"not be restored ({type(exc).__name__}: {first}); set aside as {aside.name}: rerun to "
                           "start afresh") from None
        self.all_rows, self.history = ckpt["rows"], ckpt["history"]
        self.eval_rounds = list(ckpt.get("eval_rounds", []))
        self.history_g, self.rounds_g = list(ckpt.get("history_g", [])), list(ckpt.get("rounds_g", []))
        self.global_eval.curve = [tuple(c) for c in ckpt.get("global_curve", [])]
        self.timings.update({k: v for k, v in ckpt["timings"].items() if k != "verify_s"})
        self.resumed = ckpt["resumed"] + [ckpt["round"]]
        log.info("resuming %s after round %d from %s", self.job.run_name, ckpt["round"], self.job.partial)
        return ckpt["round"] + 1

    def payload(self, r: int, state: Dict[str, Any]) -> Dict[str, Any]:
        """A checkpoint after round ``r``: the job's identity, the federation ``state``, the results so far."""
        job = self.job
        return {"config_hash": job.cfg_hash, "inputs": job.inputs, "round": r,
                "run_id": getattr(self.tracker, "run_id", None), "code": job.record["code"],
                "code_changes": job.record.get("resumed_across_code_change", []), **state,
                "rows": self.all_rows, "history": self.history, "eval_rounds": self.eval_rounds,
                "timings": self.timings, "history_g": self.history_g, "rounds_g": self.rounds_g,
                "global_curve": [list(c) for c in self.global_eval.curve], "resumed": self.resumed}

    def checkpoint_due(self, r: int) -> bool:
        eng = self.eng
        return bool(eng.checkpoint_every and r % eng.checkpoint_every == 0 and r < eng.rounds
                    and time.time() - self.last_checkpoint >= eng.checkpoint_min_s and self.checkpoints_ok)

    def save_checkpoint(self, r: int) -> None:
        t = time.time()
        state = checkpoint.federation_state(self.fed, self.method)
        if not self.weights_only_checked:
            self.weights_only_checked = True
            bad = checkpoint.weights_only_problem(state["method"])
            if bad:  # saving would work; no resume could ever load it (issue 38)
                self.checkpoints_ok = False
                log.warning("method %r (%s): state_dict() key %r cannot be loaded with "
                            "torch.load(weights_only=True) (%s); this run goes on without checkpoints "
                            "(no resume): keep only tensors, numbers, strings and containers there",
                            self.cfg["method"], self.cfg["base_method"], bad[0], bad[1])
                return
        size = checkpoint.save(self.job.partial, self.payload(r, state))
        self.timings["checkpoint_s"] += time.time() - t
        self.timings["checkpoint_bytes"] = size
        self.last_checkpoint = time.time()

    def run(self, ckpt: Optional[Dict[str, Any]] = None) -> None:
        """Rounds from the start, or from the round after ``ckpt``, to engine.rounds (or tuning's early stop)."""
        fed, method, eng, cfg, tracker, prog = self.fed, self.method, self.eng, self.cfg, self.tracker, self.prog
        start = 1
        if ckpt is not None:
            start = self.resume(ckpt)
        else:
            if eng.participant_eval and eng.eval_round0:
                self.evaluate(0)
            self.all_rows.extend(self.global_eval(0, tracker))
        self.last_checkpoint = time.time()  # engine.checkpoint_min_s counts from the start (or resume) of the job
        for r in range(start, eng.rounds + 1):
            fed.round = r
            t = time.time()
            skipped0, checked0 = fed.skipped_batches, fed.checked_batches
            train_metrics = method.run_round(fed, r)
            self.timings["train_s"] += time.time() - t
            check_skipped(fed, eng, cfg["run_name"], fed.skipped_batches - skipped0, fed.checked_batches - checked0)
            check_metrics(fed, train_metrics)
            fed.check_weights()
            tracker.log_metrics(train_metrics, step=r)
            if eng.participant_eval and (r % eng.eval_every == 0 or r == eng.rounds):
                summ = self.evaluate(r)
                self.history.append(summ)
                self.eval_rounds.append(r)
                prog(r, f"inter top1 {summ['avg/inter/top1']:.3f} intra top1 {summ['avg/intra/top1']:.3f}")
                if "tune" in cfg and tune.should_stop(self.history, cfg["tune"]["metric"], cfg["tune"]["patience"]):
                    prog(r, f"early stop: no better {cfg['tune']['metric']} in {cfg['tune']['patience']} evaluations")
                    break  # a tuning candidate (issue 36): its score is the best validation round so far
            g_rows = self.global_eval(r, tracker)
            self.all_rows.extend(g_rows)
            if g_rows and tune.global_metric(cfg):  # a tuning candidate scored by its global model (issue 36)
                self.history_g.append(tune.global_validation(fed, method, eng))
                self.rounds_g.append(r)
                tracker.log_metrics(self.history_g[-1], step=r)
                if tune.should_stop(self.history_g, cfg["tune"]["metric"], cfg["tune"]["patience"]):
                    break
            if g_rows and not eng.participant_eval:
                prog(r, f"global top1 {g_rows[0]['top1']:.3f}")
            if self.checkpoint_due(r):
                self.save_checkpoint(r)
        self.timings["eval_s"] += self.global_eval.seconds
