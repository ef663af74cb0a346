"""Checkpoints that let an interrupted job resume and end bit-identical to an uninterrupted one.

Where: ``<out_dir>.partial/`` beside the job's output folder (e.g.
``results/federate/rotmnist/.../seed0.partial/``). It is deliberately *not* inside
the output folder: Snakemake deletes a failed job's declared outputs (and files it
marked incomplete) before re-running it, and the final atomic rename of the output
folder would otherwise publish it. The folder holds

* ``checkpoint.pt``: the last complete round/epoch (written to a temporary name, then
  renamed, so a kill while writing leaves the previous checkpoint intact);
* ``job.json``: the config hash and the MLflow run id, written when the job starts,
  so a rerun continues the same MLflow run even if it was killed before its first
  checkpoint.

A checkpoint is only used when the hash of the job's resolved config is unchanged *and*
the sha256 of every input it trained on (the partition's and public set's
``manifest.json``, which hold the sha256 of every data file, plus any BASE checkpoint)
equals the job's current inputs: the config names the partition's *path*, not its
content, so a ``dvc repro`` after a data change would otherwise resume on the old data
(issue 23, case 1). A changed config or input starts afresh, saying why in one line. A successful job
removes the folder after publishing its outputs. Everything is loaded with
``torch.load(weights_only=True)``: only tensors, numbers, strings and containers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import torch

from ..data.store import json_text
from ..errors import RunError

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
JOB = "job.json"
FORMAT = 2  # bump when the checkpoint layout changes (an old checkpoint then starts afresh)


def partial_dir(out_dir: Path) -> Path:
    """``<out_dir>.partial``: the job's checkpoint area (see the module docstring)."""
    out_dir = Path(out_dir)
    return out_dir.parent / f"{out_dir.name}.partial"


def config_hash(cfg: Mapping[str, Any]) -> str:
    """sha256 of the resolved config (canonical JSON): equal hashes = the same job."""
    text = json.dumps(cfg, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------- RNG states
def global_rng_state() -> Dict[str, Any]:
    """torch (CPU and every CUDA device), numpy's legacy global and Python's ``random`` states."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": _to_lists(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(_to_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(x):
    return [_to_lists(v) for v in x] if isinstance(x, (list, tuple)) else x


def _to_tuples(x):
    return tuple(_to_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def find_generators(obj: Any, prefix: str, out: Dict[str, Any], depth: int = 3) -> Dict[str, Any]:
    """Every ``torch.Generator`` / ``numpy.random.Generator`` reachable from ``obj``'s attributes,
    dicts and lists (``depth`` levels), keyed by its path (``clients.0.generator``).

    Walking the objects, instead of listing generators by name, includes generators
    that helpers add later (client sampling, dropout streams) without touching this code.
    Modules, tensors and datasets are not entered.
    """
    if isinstance(obj, (torch.Generator, np.random.Generator)):
        out[prefix] = obj
        return out
    if depth < 0 or isinstance(obj, (torch.Tensor, torch.nn.Module, np.ndarray, str, bytes, int, float)):
        return out
    if isinstance(obj, Mapping):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = vars(obj).items()
    else:
        return out
    for k, v in items:
        find_generators(v, f"{prefix}.{k}" if prefix else str(k), out, depth - 1)
    return out


def generator_states(root: Any, skip=("data",)) -> Dict[str, Any]:
    """State of every generator reachable from ``root`` (see :func:`find_generators`)."""
    gens = {}
    for k, v in vars(root).items():
        if k not in skip:
            find_generators(v, k, gens)
    return {k: (g.get_state() if isinstance(g, torch.Generator) else _np_gen_state(g)) for k, g in gens.items()}


def set_generator_states(root: Any, states: Mapping[str, Any], skip=("data",)) -> None:
    gens = {}
    for k, v in vars(root).items():
        if k not in skip:
            find_generators(v, k, gens)
    if set(gens) != set(states):
        raise ValueError(f"checkpoint generators {sorted(states)} differ from the job's {sorted(gens)}")
    for k, g in gens.items():
        if isinstance(g, torch.Generator):
            g.set_state(states[k])
        else:
            g.bit_generator.state = json.loads(states[k])


def _np_gen_state(g: np.random.Generator) -> str:
    return json.dumps(g.bit_generator.state)  # nested dict of ints/strings; JSON keeps big ints exact


# ------------------------------------------------------------------------- files
def write_job_info(partial: Path, cfg_hash: str, run_id: Optional[str]) -> None:
    partial.mkdir(parents=True, exist_ok=True)
    tmp = partial / f".{JOB}.tmp"
    tmp.write_text(json_text({"config_hash": cfg_hash, "mlflow_run_id": run_id}, indent=None))
    os.replace(tmp, partial / JOB)


def read_job_info(partial: Path) -> Dict[str, Any]:
    try:
        return json.loads((Path(partial) / JOB).read_text())
    except (OSError, ValueError):
        return {}


def save(partial: Path, state: Dict[str, Any]) -> int:
    """Write ``state`` to ``partial/checkpoint.pt`` through a temporary name; returns its size in bytes."""
    partial.mkdir(parents=True, exist_ok=True)
    for stale in partial.glob(f".{CHECKPOINT}.tmp-*"):  # left by a job killed while writing
        stale.unlink(missing_ok=True)
    tmp = partial / f".{CHECKPOINT}.tmp-{os.getpid()}"
    try:
        torch.save({"format": FORMAT, **state}, tmp)
    except (OSError, RuntimeError) as exc:  # full disk / ulimit -f: torch says "unexpected pos ..."
        tmp.unlink(missing_ok=True)
        from ..data.store import tensor_bytes, write_failure

        raise write_failure("the checkpoint", partial, tensor_bytes(state), exc) from None
    size = tmp.stat().st_size
    os.replace(tmp, partial / CHECKPOINT)
    return size


def input_hashes(manifests: Mapping[str, str], files: Mapping[str, Path] = ()) -> Dict[str, str]:
    """``name -> sha256`` of every input a job trains on: the data manifests' hashes
    (``FederatedData.manifests``) plus the sha256 of extra files (BASE checkpoints)."""
    out = dict(manifests)
    for name, path in dict(files).items():
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[name] = h.hexdigest()
    return out


def load(partial: Path, cfg_hash: str, inputs: Optional[Mapping[str, str]] = None,
         code: Optional[Mapping[str, Any]] = None, allow_code_change: bool = False,
         last_round: Optional[int] = None, models: Optional[Sequence[torch.nn.Module]] = None) -> Optional[Dict[str, Any]]:
    """The last complete checkpoint of this very job, or None (none yet, or the config or an input changed).

    ``inputs`` (``name -> sha256``, see :func:`input_hashes`) must equal the checkpoint's
    recorded inputs; a difference is logged in one line naming the first changed input.
    ``code`` (:func:`fedshift.provenance.code_version`): a checkpoint written by other code is
    refused with one line (RunError) unless ``allow_code_change``. A ``round`` outside
    ``1..last_round`` is one line (RunError); non-finite weights, and weights that do not fit ``models``
    (the job's models, built: a tensor of another shape, a missing or extra key), set the file aside
    (renamed, one warning) and the job starts afresh: a rerun does not meet the same file again.
    """
    path = Path(partial) / CHECKPOINT
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated by a full disk, or written by an incompatible version
        log.warning("ignoring unreadable checkpoint %s (%s); starting afresh", path, exc)
        return None
    if ckpt.get("format") != FORMAT or ckpt.get("config_hash") != cfg_hash:
        log.warning("checkpoint %s belongs to another config (or format); starting afresh", path)
        return None
    if inputs is not None:
        old = dict(ckpt.get("inputs") or {})
        new = dict(inputs)
        if old != new:
            name = next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)))
            log.warning("checkpoint %s was trained on other data: %s sha256 %s, now %s; starting afresh",
                        path, name, str(old.get(name, "absent"))[:12], str(new.get(name, "absent"))[:12])
            return None
    if last_round is not None:
        r = ckpt.get("round")
        if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= last_round:
            raise RunError(f"{path}: key 'round' is {r!r}, outside 1..{last_round} (the job's rounds/epochs); the "
                           f"file is damaged or not this job's: remove {Path(partial)} to start afresh")
    bad = nonfinite_tensor(ckpt.get("models") or [])
    if bad:
        log.warning("checkpoint %s holds non-finite weights (%s): set aside as %s, starting afresh",
                    path, bad, set_aside(path, "nonfinite").name)
        return None
    misfit = None if models is None else weights_misfit(ckpt.get("models") or [], models)
    if misfit:  # issue 51 Q10: load_state_dict's size-mismatch traceback, the same on every rerun
        log.warning("checkpoint %s does not fit this job's models (%s): set aside as %s, starting afresh",
                    path, misfit, set_aside(path, "misfit").name)
        return None
    if code is not None:
        from ..provenance import describe_code

        old = ckpt.get("code") or {}
        if old.get("files_sha256") != code.get("files_sha256"):
            what = (f"checkpoint {path} (round {ckpt.get('round')}) was written by {describe_code(old)}, "
                    f"this job runs {describe_code(code)}")
            if not allow_code_change:
                raise RunError(f"{what}: resuming would mix two code versions in one run; rerun with "
                               "--resume-across-code-change (or FEDSHIFT_RESUME_ACROSS_CODE_CHANGE=1) to resume "
                               f"anyway, or remove {Path(partial)} to start afresh")
            log.warning("%s; resuming anyway (--resume-across-code-change)", what)
    return ckpt


def set_aside(path: Path, why: str) -> Path:
    """Rename a checkpoint no job can resume to ``<name>.<why>-<time>`` beside it (kept for a post-mortem, never
    met again by a rerun); returns the new path."""
    aside = Path(path).with_name(f"{Path(path).name}.{why}-{int(time.time())}")
    os.replace(path, aside)
    return aside


def weights_misfit(saved: Sequence[Any], models: Sequence[torch.nn.Module]) -> Optional[str]:
    """Where the checkpoint's weights ``saved`` (one state dict per participant, or ``{"same_as": i}``) do not
    fit ``models``: ``models[i] <key>: shape [..] in the checkpoint, [..] in the model`` (or a missing / extra
    key, another count), or None when every tensor would load."""
    if len(saved) != len(models):
        return f"{len(saved)} participants' weights, the job has {len(models)}"
    for i, (sd, m) in enumerate(zip(saved, models)):
        if not isinstance(sd, Mapping) or "same_as" in sd:
            continue
        want = m.state_dict()
        for k in sorted(set(want) ^ set(sd)):
            return f"models[{i}] {k}: {'missing from the checkpoint' if k in want else 'not in the model'}"
        for k, t in sd.items():
            if isinstance(t, torch.Tensor) and tuple(t.shape) != tuple(want[k].shape):
                return f"models[{i}] {k}: shape {list(t.shape)} in the checkpoint, {list(want[k].shape)} in the model"
    return None


def nonfinite_tensor(models) -> Optional[str]:
    """``models[i] <key>`` of the first floating tensor holding NaN/inf in a list of state dicts, or None."""
    for i, sd in enumerate(models):
        for k, t in (sd.items() if isinstance(sd, Mapping) else ()):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"models[{i}] {k}"
    return None


def weights_only_problem(state: Any) -> Optional[tuple]:
    """``(key, error)`` of the first top-level entry of ``state`` that ``torch.load(weights_only=True)``
    cannot read back (a method plugin keeping an arbitrary object in its ``state_dict()``), or None."""
    import io

    items = state.items() if isinstance(state, Mapping) else [("<state_dict>", state)]
    for key, value in items:
        buf = io.BytesIO()
        try:
            torch.save(value, buf)
            buf.seek(0)
            torch.load(buf, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch's message opens with generic advice: keep the unpickler's line
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
            why = next((ln for ln in lines if "Unsupported global" in ln or "Unpickler error" in ln), lines[0])
            return str(key), why[:200]
    return None


def clear(partial: Path) -> None:
    shutil.rmtree(partial, ignore_errors=True)


def to_cpu(obj: Any) -> Any:
    """Detached CPU copies of every tensor in a nested structure (checkpoint payloads)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, Mapping):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_cpu(v) for v in obj]
    return obj


def module_state(m: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}


def federation_state(fed, method) -> Dict[str, Any]:
    """Everything a federated round depends on: participants' weights, the method's state
    (:meth:`Method.state_dict`), every RNG state and the skipped-batch count."""
    # Participants sharing one model object (engine.server_model) are saved once, not once per client.
    first: Dict[int, int] = {}
    for i, c in enumerate(fed.clients):
        first.setdefault(id(c.model), i)
    return {"models": [module_state(c.model) if first[id(c.model)] == i else {"same_as": first[id(c.model)]}
                       for i, c in enumerate(fed.clients)],
            "method": to_cpu(method.state_dict()),
            "rng": {"federation": fed.rng_state(), "global": global_rng_state()},
            "skipped_batches": fed.skipped_batches, "checked_batches": fed.checked_batches,
            "sampled": {int(r): [int(i) for i in idx] for r, idx in getattr(fed, "sampled", {}).items()}}


def restore_federation(fed, method, state: Mapping[str, Any]) -> None:
    """Inverse of :func:`federation_state`, on a federation built and ``setup`` as the original."""
    for c, sd in zip(fed.clients, state["models"]):
        if "same_as" not in sd:
            c.model.load_state_dict(sd)
    method.load_state_dict(state["method"])
    fed.set_rng_state(state["rng"]["federation"])
    set_global_rng_state(state["rng"]["global"])
    fed.skipped_batches = state["skipped_batches"]
    fed.checked_batches = state.get("checked_batches", 0)
    fed.sampled = {int(r): list(idx) for r, idx in state.get("sampled", {}).items()}  # sampled.csv covers every round
