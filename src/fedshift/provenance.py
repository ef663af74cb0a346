"""What a published run was made from, and whether that still holds (issue 38).

Every pretrain and federate job writes ``inputs.json`` into its run folder:

* ``inputs``: ``name -> sha256`` of each input it read: the partition's and public set's
  ``manifest.json`` (which hold the sha256 of every data file) and each BASE checkpoint;
* ``paths``: where each input was read (as the config names it, relative to the project);
* ``config_sha256``: the hash of the resolved config (:func:`fedshift.engine.checkpoint.config_hash`);
* ``code``: the code version: ``files_sha256`` (the fedshift package's ``.py`` files, what
  really ran), and the git ``commit`` + ``dirty`` flag of the checkout holding them when there
  is one (``null`` for an installed package without git).

Before publishing, a job re-hashes its inputs (:func:`recheck`) and refuses to publish when
one changed during the run (e.g. ``dvc repro`` after an edit of ``params/data.yaml`` while a
long workflow ran): its result would belong to data that no longer exists. ``collect`` skips
runs whose recorded inputs differ from the current files (:func:`stale`), ``fedshift evaluate``
refuses them, and a checkpoint written by other code is not resumed silently.

This module also holds the run-folder lock (:func:`run_lock`): one job per run folder.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from .config import safe_load_yaml
from .data.store import atomic_write_text, check_writable, json_text, sha256_file
from .errors import ConfigError, RunError

INPUTS = "inputs.json"
LOCK = ".lock"


# ------------------------------------------------------------------------- code version
def package_dir() -> Path:
    return Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _code_version(root: str) -> Dict[str, object]:
    root_p = Path(root)
    h = hashlib.sha256()
    for p in sorted(root_p.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(str(p.relative_to(root_p)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    commit, dirty = None, None
    try:
        run = functools.partial(subprocess.run, cwd=root, capture_output=True, text=True, timeout=20)
        res = run(["git", "rev-parse", "HEAD"])
        if res.returncode == 0:
            commit = res.stdout.strip()
            # tracked files that differ from the commit, in the whole checkout (as `git.commit`'s -dirty)
            status = run(["git", "status", "--porcelain", "--untracked-files=no"])
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"files_sha256": h.hexdigest(), "commit": commit, "dirty": dirty}


def code_version(root: Optional[Path] = None) -> Dict[str, object]:
    """``{"files_sha256", "commit", "dirty"}`` of the fedshift package that runs (see the module
    docstring); computed once per process."""
    return dict(_code_version(str(Path(root or package_dir()).resolve())))


def describe_code(code: Optional[Mapping[str, object]]) -> str:
    """``code 1a2b3c4d5e6f (commit 0123abcd, dirty)``, for one-line messages."""
    if not code:
        return "unrecorded code"
    commit = code.get("commit")
    where = f"commit {str(commit)[:8]}{', dirty' if code.get('dirty') else ''}" if commit else "no git"
    return f"code {str(code.get('files_sha256'))[:12]} ({where})"


def tags(code: Mapping[str, object]) -> Dict[str, str]:
    """MLflow tags of the code version; ``git.commit`` ends in ``-dirty`` when the checkout is."""
    out = {"code.sha256": str(code["files_sha256"]), "git.dirty": str(code.get("dirty")).lower()}
    if code.get("commit"):
        out["git.commit"] = str(code["commit"]) + ("-dirty" if code.get("dirty") else "")
    return out


# ------------------------------------------------------------------------- run identity
# Keys of a resolved run config that only say how or where the job executes, not what it computes (the COORD
# contract): left out of the identity, and out of the archive's comparison of a record with what a grid asks
# now (fedshift.archive). ``paths``: where inputs are read (the project folder, build/ or results/ roots; the
# data's content is named by other keys: the scenario, engine.data_seed, the BASE runs' identities).
EXECUTION_KEYS = ("paths",)
EXECUTION_SUBKEYS = {"engine": ("threads", "device", "checkpoint_every", "checkpoint_min_s", "tracking"),
                     "pretrain": ("threads", "device", "checkpoint_every", "tracking")}
# Names derived from the settings (issue 50): the run's label, its Snakemake wildcards, its identity.
NAMING_KEYS = ("run_name", "wildcards", "identity", "tracking")
# a tuned run's config gets its chosen values at run time (fedshift.tune.apply_chosen); the tune that chooses
# them (tuned.group: the identities of its candidates) names them, so the values and these records are left out
TUNED_RUNTIME_KEYS = ("file", "chosen", "score", "candidate")
IDENTITY_CHARS = 12


def identity_config(cfg: Mapping[str, object]) -> Dict[str, object]:
    """What :func:`run_identity` hashes: ``cfg`` without :data:`EXECUTION_KEYS`, :data:`NAMING_KEYS` and the
    execution-only keys of its ``engine`` / ``pretrain`` block (:data:`EXECUTION_SUBKEYS`: threads, device,
    checkpoint cadence, tracking); for a tuned run without the values of the tuned parameters (``tuned.params``)
    and the records :func:`fedshift.tune.apply_chosen` adds; for a tuning candidate without its position in
    its list (``tune.index``)."""
    import copy

    out = copy.deepcopy({k: v for k, v in dict(cfg).items() if k not in EXECUTION_KEYS + NAMING_KEYS})
    for block, keys in EXECUTION_SUBKEYS.items():
        if isinstance(out.get(block), Mapping):
            out[block] = {k: v for k, v in dict(out[block]).items() if k not in keys}
    tuned = out.get("tuned")
    if isinstance(tuned, dict):
        for key in TUNED_RUNTIME_KEYS:
            tuned.pop(key, None)
        for param in tuned.get("params") or []:
            param = str(param)
            block, key = ("engine", param[len("engine."):]) if param.startswith("engine.") else ("method_params", param)
            if isinstance(out.get(block), dict):
                out[block].pop(key, None)
    if isinstance(out.get("tune"), dict):
        out["tune"].pop("index", None)
    return out


def run_identity(resolved_cfg: Mapping[str, object]) -> str:
    """12 hex characters naming what a run computes: sha256 of the canonical JSON (sorted keys) of
    :func:`identity_config` of its resolved config. Two configs with equal identities run the same thing; the
    run folder (``seed<k>-<identity>``) and the MLflow run (tag ``fedshift.identity``) carry it, so two grids
    that set a method differently never share a folder.

    A tuned run (``tuned``) is named by its tune, not by the values the tune chose, so the published
    config.yaml (chosen values applied) has the identity its folder was planned with."""
    text = json.dumps(identity_config(resolved_cfg), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:IDENTITY_CHARS]


def run_folder(job_path: str, identity: str) -> str:
    """``<scenario>/.../seed<k>-<identity>``: a job's run folder under ``results/<kind>/`` (the job's slot
    ``.../seed<k>`` and what it computes; see :func:`run_identity`)."""
    return f"{job_path}-{identity}"


# ------------------------------------------------------------------------- inputs
def record(manifests: Mapping[str, str], paths: Mapping[str, Path], cfg_hash: str,
           files: Mapping[str, str] = ()) -> Dict[str, object]:
    """The ``inputs.json`` content: ``manifests`` (``name -> sha256``, ``FederatedData.manifests``),
    ``files`` (``name -> sha256`` of other inputs, e.g. BASE checkpoints), ``paths`` (``name -> file``)."""
    inputs = {**dict(manifests), **dict(files)}
    missing = sorted(set(inputs) - set(paths))
    if missing:
        raise ValueError(f"no path for inputs {missing}")
    return {"inputs": inputs, "paths": {k: str(paths[k]) for k in inputs}, "config_sha256": cfg_hash,
            "code": code_version()}


def current(rec: Mapping[str, object], base: Optional[Path] = None) -> Dict[str, str]:
    """``name -> sha256`` of each recorded input as it is now (``"missing"`` when gone).
    Relative paths are taken from ``base`` (default: the working folder, the project root)."""
    out = {}
    for name, path in dict(rec.get("paths") or {}).items():
        p = Path(path)
        if base is not None and not p.is_absolute():
            p = Path(base) / p
        try:
            out[name] = sha256_file(p)
        except OSError:
            out[name] = "missing"
    return out


def changes(rec: Mapping[str, object], base: Optional[Path] = None) -> List[Tuple[str, str, str, str]]:
    """``(name, path, recorded sha256, current sha256)`` of every recorded input that differs now."""
    now = current(rec, base)
    paths = dict(rec.get("paths") or {})
    return [(name, str(paths.get(name)), str(old), now.get(name, "missing"))
            for name, old in sorted(dict(rec.get("inputs") or {}).items()) if now.get(name, "missing") != old]


def recheck(rec: Mapping[str, object], run: str, rerun: str) -> None:
    """Refuse to publish when an input changed during the run (one line: input, both hashes,
    what to rerun)."""
    diff = changes(rec)
    if diff:
        name, path, old, new = diff[0]
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        raise RunError(f"{run}: input {name} ({path}) changed during the run: sha256 {old[:12]} when the job "
                       f"started, {new[:12]} now{more}; nothing published, the result would belong to data that "
                       f"is gone: rerun {rerun}")


def note_code_change(rec: Dict[str, object], ckpt: Mapping[str, object]) -> None:
    """A job that resumed a checkpoint written by other code (``--resume-across-code-change``) says so in its
    ``inputs.json``: ``resumed_across_code_change`` lists, per such resume, the round it resumed after and the code
    that ran before (earlier ones carried by the checkpoint), beside ``code`` (the code of the last rounds).
    Issue 51 R39: the forced resume left no trace in the run folder."""
    earlier = list(ckpt.get("code_changes") or [])
    old = ckpt.get("code") or {}
    if isinstance(old, Mapping) and old.get("files_sha256") != dict(rec["code"]).get("files_sha256"):
        earlier.append({"after_round": ckpt.get("round"), "code": dict(old)})
    if earlier:
        rec["resumed_across_code_change"] = earlier


def base_origins(rec: Dict[str, object], base_files: Mapping[str, Path]) -> None:
    """Where each BASE checkpoint a federate job starts from (or distils) came from, checked against the job
    (issue 51 R23: BASE checkpoints made by other code passed silently): ``rec['base_code']`` records the code
    that made each (its pretrain folder's ``inputs.json``; null when it records none), one warning names the
    first made by other or unrecorded code, and a BASE trained on another partition than the job reads is
    refused (its training images may be in this partition's test sets)."""
    if not base_files:
        return
    mine = dict(rec["code"])
    parts = {k: v for k, v in dict(rec["inputs"]).items() if str(k).startswith("partition/")}
    codes: Dict[str, object] = {}
    other = []
    for name, path in base_files.items():
        base = read(Path(path).parent)
        code = (base or {}).get("code")
        codes[name] = code if isinstance(code, Mapping) else None
        if not isinstance(code, Mapping) or code.get("files_sha256") != mine.get("files_sha256"):
            other.append((name, path, code))
        for key, digest in ((base or {}).get("inputs") or {}).items():
            if key in parts and digest != parts[key]:
                raise ConfigError(f"BASE checkpoint {path} ({name}) was trained on {key} sha256 {str(digest)[:12]}, "
                                  f"this job reads sha256 {str(parts[key])[:12]}: its training images may be in the "
                                  "test sets; rerun its pretrain job (snakemake reruns it)")
    rec["base_code"] = codes
    if other:
        name, path, code = other[0]
        more = f" (and {len(other) - 1} more)" if len(other) > 1 else ""
        logging.getLogger(__name__).warning(
            "BASE checkpoint %s (%s) was made by %s, this job runs %s%s: the run mixes two code versions "
            "(recorded in its inputs.json, base_code); rerun the pretrain jobs to make them with this code",
            path, name, describe_code(code if isinstance(code, Mapping) else None), describe_code(mine), more)


def write(run_dir: Path, rec: Mapping[str, object]) -> None:
    atomic_write_text(Path(run_dir) / INPUTS, json_text(rec))


def read(run_dir: Path) -> Optional[Dict[str, object]]:
    """The run folder's ``inputs.json``, or None when it has none (published before issue 38)."""
    path = Path(run_dir) / INPUTS
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); rerun the job that published {run_dir}") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("inputs"), dict) or not isinstance(rec.get("paths"), dict):
        raise ConfigError(f"{path}: expected keys 'inputs' and 'paths' (objects); rerun the job that published {run_dir}")
    return rec


def stale(run_dir: Path, base: Optional[Path] = None, unbuilt_ok: bool = False) -> Optional[str]:
    """Why ``run_dir``'s result no longer matches its inputs (one line), or None when it does.
    A run folder without ``inputs.json`` is not judged (None). ``unbuilt_ok``: an input that is not
    there at all (a fresh clone reading an archived record, :mod:`fedshift.archive`) is not checked."""
    rec = read(run_dir)
    if rec is None:
        return None
    diff = [d for d in changes(rec, base) if not (unbuilt_ok and d[3] == "missing")]
    if not diff:
        return None
    name, path, old, new = diff[0]
    more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
    return f"{run_dir}: input {name} ({path}) sha256 {old[:12]} when it ran, {new[:12]} now{more}"


# ------------------------------------------------------------------------- one job per run folder
@contextlib.contextmanager
def run_lock(out_dir: Path) -> Iterator[Path]:
    """Hold ``<out_dir>.partial/.lock`` (``flock``) while a job writes ``out_dir``; a second job on
    the same folder fails at once with one line naming the PID that holds it. The kernel drops the
    lock when its holder dies, so a killed job never leaves it held."""
    import fcntl

    out_dir = Path(out_dir)
    check_writable(out_dir)  # a full or read-only results folder: one line, not the lock's OSError (issue 51 E1/E3)
    partial = out_dir.parent / f"{out_dir.name}.partial"
    path = partial / LOCK
    try:
        partial.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise ConfigError(f"cannot create the run lock {path} ({exc.strerror}); fix the permissions of {partial} "
                          "or free space there before running the job") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RunError(f"{out_dir} is being written by another fedshift job (PID {holder}, lock {path}); "
                           "wait for it to end or stop it, then rerun") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the flock


# ------------------------------------------------------------------------- Snakemake rerun trigger
@functools.lru_cache(maxsize=4)
def _dvc_outs(lock: str, mtime_ns: int) -> Dict[str, str]:
    import yaml

    try:
        doc = safe_load_yaml(Path(lock).read_text(), lock) or {}
    except (OSError, yaml.YAMLError, ConfigError):
        return {}
    outs = {}
    for stage in (doc.get("stages") or {}).values() if isinstance(doc, dict) else ():
        for out in (stage or {}).get("outs") or []:
            if isinstance(out, dict) and out.get("path") and out.get("md5"):
                outs[str(out["path"]).rstrip("/")] = str(out["md5"])
    return outs


def data_fingerprint(folders, lock: Path = Path("dvc.lock")) -> str:
    """One string naming the content of each data folder a job reads, for a Snakemake ``params:``
    entry (its ``params`` rerun trigger reruns a job whose data changed, even when the files'
    times say otherwise, e.g. data rebuilt while the job ran).

    Per folder: DVC's recorded hash of it (``dvc.lock``: present before ``dvc repro`` runs in a
    fresh clone, so the value is the same before and after the data is built), else the sha256
    of its ``manifest.json``, else ``absent``. Cheap: one read of ``dvc.lock`` per change of it."""
    lock = Path(lock)
    try:
        outs = _dvc_outs(str(lock.resolve()), lock.stat().st_mtime_ns)
    except OSError:
        outs = {}
    parts = []
    for folder in folders:
        key = str(folder).rstrip("/")
        if key in outs:
            parts.append(f"{key}=dvc:{outs[key]}")
            continue
        # engine.data_seed: run: build/partitions_seeded/<scenario>/seed<k> is drawn from the datasets of DVC's
        # build/partitions/<scenario> with seed k, so that folder's DVC hash and k name it before it is built
        # (its manifest's sha256 would change the value once the partition_seed rule has run: a rerun)
        head, _, tail = key.rpartition("/")
        root, _, scen = head.rpartition("/")
        if root.endswith("partitions_seeded") and tail.startswith("seed"):
            src = f"{root[:-len('partitions_seeded')]}partitions/{scen}"
            if src in outs:
                parts.append(f"{key}=dvc:{outs[src]}+{tail}")
                continue
        manifest = Path(folder) / "manifest.json"
        try:
            parts.append(f"{key}=sha256:{sha256_file(manifest)}")
        except OSError:
            parts.append(f"{key}=absent")
    return " ".join(parts)
