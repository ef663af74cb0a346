"""Gather run folders into one tidy CSV: one row per (scenario, public, method,
structure, seed, round, participant, evaluated domain).

The run folders' ``rounds.csv`` and ``config.yaml`` are the source of truth; this
only joins them. Written atomically.

``base_pretrain`` rows: the papers' SOLO/BASE row (FCCL+ Tables VIII-IX: each
participant trained alone on its private data for ``pretrain.epochs`` = 50 epochs) comes
from the ``pretrain`` runs, one per participant and architecture, evaluated on every
domain at their last epoch. They are added for every (scenario, public, structure,
seed) of the federated runs whose participants' pretrain runs are given, beside the
federated ``base`` method (the same training without communication, but on the
federated schedule: rounds x local epochs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable

import pandas as pd

from ..config import safe_load_yaml, values_text
from ..data.store import atomic_write_text
from ..errors import ConfigError
from ..provenance import stale
from . import runs_read
from .runs_read import rounds_file  # noqa: F401  (fedshift.archive reads it here)

ID_COLUMNS = ["scenario", "public", "method", "base_method", "structure", "seed"]


def _config(run_dir: Path) -> dict:
    return safe_load_yaml((Path(run_dir) / "config.yaml").read_text(), str(Path(run_dir) / "config.yaml"))


RECORD = "record.json"  # marks an archived record (fedshift.archive): a run folder without its weights
# <run>.partial/diverged/: a seeded run stopped by a non-finite loss or weight, recorded as its outcome
# (fedshift.runner.record_divergence); archived like a finished run, never averaged
DIVERGED = "diverged"


def divergence(run_dir: Path) -> dict:
    """``{}`` for a finished run; for a recorded divergence its ids, round and error (metrics.json
    ``diverged: true``): such a seed has no score, so it is counted beside the means, never in them."""
    run_dir = _folder(Path(run_dir))
    try:
        metrics = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}
    if not (isinstance(metrics, dict) and metrics.get("diverged")):
        return {}
    cfg = _config(run_dir)
    return {**{c: cfg.get(c) for c in ID_COLUMNS}, "round": metrics.get("diverged_round"),
            "error": metrics.get("error", ""), "run_dir": str(run_dir), "code": code_of(run_dir)}


def divergence_text(d: dict) -> str:
    """``fccl_plus on digits_offline, seed 1: round 3, <error>``."""
    return (f"{d['method']} on {d['scenario']}, seed {d['seed']}: round {d['round']}, "
            f"{str(d['error']).removeprefix('fedshift: error: ')}")


def is_record(folder: Path) -> bool:
    return (_folder(folder) / RECORD).exists()


def code_of(run_dir: Path) -> str:
    """The code version a run was made with (inputs.json), for the report's provenance list."""
    from ..provenance import describe_code, read

    rec = read(run_dir)
    return describe_code((rec or {}).get("code")) if rec else "unrecorded code"


def load_run(run_dir: Path) -> pd.DataFrame:
    run_dir = _folder(run_dir)
    cfg = _config(run_dir)
    df = pd.read_csv(rounds_file(run_dir))
    for col in ID_COLUMNS:
        df[col] = cfg.get(col)
    df["local_epochs"] = (cfg.get("engine") or {}).get("local_epochs")  # the schedule a proxy section states
    # one data draw for every seed, or one per seed, and what it redrew: what the report's intervals cover
    df["data_seed"] = (cfg.get("engine") or {}).get("data_seed", "fixed")
    df["redrawn"] = ", ".join((cfg.get("data_draw") or {}).get("redrawn") or [])
    # how the run was scored (the grid's scoring: block, issue 49; before it, a server-averaging method's
    # params): one protocol per table by construction, and a table mixing them is marked all the same
    sc = cfg.get("scoring") or {k: v for k, v in (cfg.get("method_params") or {}).items()
                                if k in ("eval_models", "weighting")}
    df["protocol"] = ", ".join([f"{k} {sc[k]}" for k in ("eval_models", "weighting") if k in sc]
                               + (["predict prototype"] if sc.get("predict") == "prototype" else []))
    # engine.select: best_val (issue 36): each participant's evaluation with the best validation ACC
    # (metrics.json selected_rounds) is the run's headline in the report, instead of the last-k mean.
    select = (cfg.get("engine") or {}).get("select", "last_k")
    df["select"] = select
    chosen = {}
    if select == "best_val":
        chosen = json.loads((run_dir / "metrics.json").read_text()).get("selected_rounds") or {}
    df["selected_round"] = df["participant"].map(chosen) if chosen else float("nan")
    df["tuned"] = bool(cfg.get("tuned"))  # its values were chosen on validation (fedshift.tune)
    # the chosen values, for the tables' `tuned` column (issue 50): "lr=0.003 beta=0.9"
    chosen_values = (cfg.get("tuned") or {}).get("chosen") or {}
    df["tuned_values"] = values_text(chosen_values)
    df["run_dir"] = str(run_dir)  # the folder read (seed<k>-<identity>: issue 50)
    # issue 52: where the numbers come from: a committed record (its folder) or a run folder (""), and the code
    df["record"] = str(run_dir) if is_record(run_dir) else ""
    df["code"] = code_of(run_dir)
    for key, value in protocol_columns(cfg).items():  # the paper delta's protocol fingerprint (report/protocols.py)
        df[key] = value
    return df


def run_test_protocol(cfg: dict) -> str:
    """The run's test protocol: the scenario key ``test_protocol`` its resolved config records (top level or
    under ``scenario_params``), ``clean`` when absent."""
    for where in (cfg, cfg.get("scenario_params") or {}):
        if isinstance(where, dict) and where.get("test_protocol"):
            return str(where["test_protocol"])
    return "clean"


def protocol_columns(cfg: dict) -> dict:
    """What the paper delta compares with each published table's protocol, from a run's resolved config
    and its partition's manifest: ``public_aug`` (engine.public_aug where the run had a public set, ''
    where it had none), ``test_protocol``, ``image_size`` (the partition's image side) and ``test_sizes``
    (JSON {participant: test images}: the resolution of the run's accuracies). Image size and test sizes
    are left empty when the partition's manifest cannot be read."""
    eng = cfg.get("engine") or {}
    paths = cfg.get("paths") or {}
    out = {"public_aug": str(eng.get("public_aug", "")) if paths.get("public") else "",
           "test_protocol": run_test_protocol(cfg), "image_size": float("nan"), "test_sizes": ""}
    try:
        manifest = json.loads((Path(paths["partition"]) / "manifest.json").read_text())
        out["image_size"] = int(manifest["image_shape"][-1])
        out["test_sizes"] = json.dumps({name: int(info["splits"]["test"]["n"])
                                        for name, info in manifest["participants"].items()
                                        if "test" in info.get("splits", {})}, sort_keys=True)
    except (KeyError, TypeError, ValueError, OSError):
        pass
    return out


PRETRAIN_METHOD = "base_pretrain"


def pretrain_rows(fed_cfgs: Iterable[dict], pretrain_dirs: Iterable[Path]) -> pd.DataFrame:
    """``base_pretrain`` rows (see the module docstring); round = the federated runs' last round."""
    last = {}
    for d in pretrain_dirs:
        d = Path(d)
        if d.name in ("metrics.json", "model.pt"):
            d = d.parent
        cfg = _config(d)
        df = pd.read_csv(rounds_file(d)).assign(record=str(d) if is_record(d) else "", code=code_of(d), run_dir=str(d))
        df = df[df["round"] == df["round"].max()].assign(**protocol_columns(cfg))  # pretrain: no public set
        last[(cfg["scenario"], cfg["participant"], cfg["arch"], int(cfg["seed"]))] = df
    frames, seen = [], set()
    for cfg, final_round in fed_cfgs:
        key = (cfg["scenario"], cfg["public"], cfg["structure"], int(cfg["seed"]))
        parts = [(cfg["scenario"], p, a, int(cfg["seed"])) for p, a in zip(cfg["participants"], cfg["archs"])]
        if key in seen or not all(p in last for p in parts):
            continue
        seen.add(key)
        df = pd.concat([last[p] for p in parts], ignore_index=True).assign(round=final_round)
        for col, val in zip(("scenario", "public", "structure", "seed"), key):
            df[col] = val
        df["method"], df["base_method"] = PRETRAIN_METHOD, "pretrain"
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _folder(d: Path) -> Path:
    d = Path(d)
    return d.parent if d.name in ("metrics.json", "model.pt") else d


def current_runs(run_dirs: Iterable[Path], kind: str = "run") -> list:
    """The run folders whose recorded inputs (``inputs.json``) still equal the current files; each
    one left out is listed on stderr (issue 38: a result of data that is gone never reaches the
    tables). Folders without ``inputs.json`` (published before it existed) are kept."""
    kept, left = [], []
    for d in run_dirs:
        # an archived record in a clone without the data is kept (its data cannot be checked here; the
        # workflow compared its config and, where built, its data when it planned)
        why = stale(_folder(d), unbuilt_ok=is_record(d))
        (left if why else kept).append(d if not why else why)
    if left:
        print(f"fedshift: warning: collect skips {len(left)} {kind}(s) whose inputs changed since they ran "
              "(rerun them: snakemake reruns them):", file=sys.stderr)
        for why in left:
            print(f"  skipped {why}", file=sys.stderr)
    return kept


def collect(run_dirs: Iterable[Path], out: Path, pretrain_dirs: Iterable[Path] = ()) -> pd.DataFrame:
    run_dirs = current_runs(list(run_dirs), "federated run")
    outcome = [(r, divergence(r)) for r in run_dirs]
    diverged = [d for _, d in outcome if d]
    if diverged:  # outcomes, not scores: listed, and never averaged with the seeds that finished
        print(f"fedshift: collect counts {len(diverged)} diverged run(s) beside the tables, in no mean:",
              file=sys.stderr)
        for d in diverged:
            print(f"  {divergence_text(d)}", file=sys.stderr)
        run_dirs = [r for r, d in outcome if not d]
        if not run_dirs:
            raise ConfigError(f"every federated run given to collect diverged (listed above): no table to make; "
                              "lower the learning rate (or set engine.on_nonfinite: skip_batch) and rerun")
    atomic_write_text(Path(out).with_name("diverged.csv"),
                      pd.DataFrame(diverged, columns=ID_COLUMNS + ["round", "error", "run_dir", "code"]).to_csv(index=False))
    if not run_dirs:
        raise ConfigError("every federated run given to collect was made from inputs that changed since "
                          "(listed above); rerun them (snakemake) before collecting")
    frames = [load_run(Path(d)) for d in run_dirs]
    pretrain_dirs = current_runs(list(pretrain_dirs), "pretrain run")
    if pretrain_dirs:
        cfgs = []
        for d in run_dirs:
            d = Path(d).parent if Path(d).name == "metrics.json" else Path(d)
            cfgs.append((_config(d), int(load_run(d)["round"].max())))
        frames.append(pretrain_rows(cfgs, pretrain_dirs))
    df = pd.concat(frames, ignore_index=True)
    cols = ID_COLUMNS + ["round", "participant", "arch", "domain", "kind", "top1", "top5", "local_epochs", "data_seed",
                         "redrawn", "protocol", "select", "selected_round", "tuned", "tuned_values", "public_aug",
                         "test_protocol", "image_size", "test_sizes", "record", "code", "run_dir"]
    df = df.reindex(columns=list(dict.fromkeys(list(df.columns) + cols)))
    df = df[cols].sort_values(["scenario", "public", "structure", "method", "seed", "round", "participant", "domain"])
    atomic_write_text(Path(out), df.to_csv(index=False))
    # which folders were read, with their identity and the sha256 of the rounds.csv read (issue 50)
    runs_read.write(Path(out), runs_read.record(run_dirs, pretrain_dirs))
    return df
