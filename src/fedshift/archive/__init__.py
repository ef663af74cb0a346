"""The committed run archive (issue 52): every finished run's record, so that a quoted number can be
checked and a fresh clone can report without training.

A **record** is what a run folder holds minus its weights: ``config.yaml`` (the resolved config the
run trained with), ``inputs.json`` (the sha256 of the data manifests it read and the code version,
:mod:`fedshift.provenance`), ``metrics.json``, the per-round curves (``rounds.csv``, gzip-compressed
as ``rounds.csv.gz`` when longer than :data:`GZIP_ABOVE`) and ``record.json`` (the run's identity,
:func:`fedshift.provenance.run_identity`, and the folder it was copied from). A tuned run's selection
record is its group's ``chosen.yaml`` (every candidate's validation score), archived beside the runs.

Layout, one folder per grid (its ``report.name``; ``main`` for the default grid)::

    records/<grid>/federate/<scenario>/<public>/<method>/<structure>/seed<k>/   a federated run
    records/<grid>/pretrain/<scenario>/<participant>/<arch>/seed<k>/            a SOLO/BASE run
    records/<grid>/tune/<scenario>/<public>/<method>/<structure>/chosen.yaml     a tuning selection

:func:`record_path` is the one place that maps a run to its record. :func:`archive_grid` (the
``fedshift archive`` verb) writes records; :func:`grid_status` (the workflow, at planning time) says
for every run of a grid whether its record is **current** (the workflow then leaves the run out of its
targets and ``collect`` reads the record), **stale** (listed with the differing keys; the run is
planned again and the record left out) or absent:

* the archived config must equal what the grid asks now on every key both know, leaving out the
  ``paths`` block and the keys that only say how a job executes (threads, device, checkpoint cadence:
  :data:`fedshift.provenance.EXECUTION_SUBKEYS`); a key the archived config lacks counts as equal when
  the grid asks for its code default (:func:`code_default`), so a new engine lever with a default does
  not invalidate every record;
* the data manifests it recorded must have the same sha256 as the current builds, where those are
  built (a fresh clone without data reports from the archive; the report says the data went unchecked);
* a record made by other code is current all the same: the report lists its code version beside it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..config import safe_load_yaml
from ..data.store import atomic_dir, atomic_write_text
from ..errors import ConfigError
from ..provenance import EXECUTION_KEYS, EXECUTION_SUBKEYS, INPUTS, changes, describe_code, run_identity
from ..provenance import read as read_inputs
from ..provenance import stale as data_stale
from ..report.collect import DIVERGED, RECORD, rounds_file

RECORDS = Path("records")
ROUNDS_GZ = "rounds.csv.gz"
COPIED = ("config.yaml", INPUTS, "metrics.json")  # + the rounds file; never models.pt / model.pt
GZIP_ABOVE = 64 * 1024  # bytes of rounds.csv above which the record stores it gzip-compressed
# Keys a record is never compared on: the run's label (it names the folder, which the record path
# already keys on) besides the execution-only keys of the run identity.
LABEL_KEYS = ("run_name", "identity")  # identity: the hash of what is compared (issue 50)
# Top-level keys added after records were made, with the value their absence meant (COORD contract).
TOP_LEVEL_DEFAULTS = {"test_protocol": "clean"}  # issue 47: absent = clean
MISSING = object()


# ----------------------------------------------------------------------------- where a run's record lives
def grid_name(report_name: Optional[str]) -> str:
    return report_name or "main"


def record_path(kind: str, job, report_name: Optional[str], root: Path = RECORDS) -> Path:
    """The record folder of run ``job`` (a :class:`fedshift.experiments.FederateJob` / ``PretrainJob``,
    or its ``path`` string) of grid ``report_name``; ``kind`` is ``federate`` or ``pretrain``. The one
    function that maps a run to its record (issue 50 may rename run folders; records key on the job)."""
    if kind not in ("federate", "pretrain"):
        raise ValueError(f"record kind {kind!r}: federate or pretrain")
    path = job if isinstance(job, str) else job.path
    return Path(root) / grid_name(report_name) / kind / path


def tune_record_path(group_path: str, report_name: Optional[str], root: Path = RECORDS) -> Path:
    """The archived ``chosen.yaml`` of tune group ``group_path`` (``<scenario>/<public>/<method>/<structure>``)."""
    return Path(root) / grid_name(report_name) / "tune" / group_path / "chosen.yaml"


def group_of_chosen_file(path: str) -> str:
    """``results/tune/<group>/chosen.yaml`` -> ``<group>``."""
    parts = Path(path).parts
    i = parts.index("tune")
    return "/".join(parts[i + 1:-1])


def read_config(folder: Path) -> dict:
    path = Path(folder) / "config.yaml"
    return safe_load_yaml(path.read_text(), str(path)) or {}


# ----------------------------------------------------------------------------- comparing configs
def _flat(d: Mapping, prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def comparable(cfg: Mapping) -> Dict[str, Any]:
    """The dotted keys of a resolved config that say what a run computes (module docstring), JSON-normalised
    (tuples as lists, 1e-3 and 0.001 alike)."""
    drop_sub = {f"{block}.{k}" for block, keys in EXECUTION_SUBKEYS.items() for k in keys}
    cfg = json.loads(json.dumps(dict(cfg), default=str))
    return {k: v for k, v in _flat(cfg).items()
            if k.split(".", 1)[0] not in EXECUTION_KEYS + LABEL_KEYS + ("tracking",)
            and not any(k == d or k.startswith(d + ".") for d in drop_sub)}


def code_default(cfg: Mapping, key: str) -> Any:
    """The value the code gives dotted ``key`` of run config ``cfg`` when nothing sets it, or
    :data:`MISSING` when the code names no default (then a record lacking the key is stale)."""
    from ..config import to_dict
    from ..engine.config import EngineConfig, PretrainConfig

    head, _, rest = key.partition(".")
    defaults: Mapping = {}
    if head == "engine":
        defaults = to_dict(EngineConfig())
    elif head == "pretrain":
        defaults = to_dict(PretrainConfig())
    elif head == "method_params" and cfg.get("base_method"):
        from ..methods import resolve_method_params

        try:
            defaults = to_dict(resolve_method_params(str(cfg["base_method"]), {}, cfg.get("scenario")))
        except ConfigError:
            return MISSING
    elif not rest:
        return TOP_LEVEL_DEFAULTS.get(head, MISSING)
    flat = comparable({"x": defaults})
    return flat.get(f"x.{rest}", MISSING)


def config_diff(archived: Mapping, wanted: Mapping) -> List[Tuple[str, Any, Any]]:
    """``(key, archived value, wanted value)`` of every key on which the archived config differs from the
    wanted one: keys both know, and keys only the wanted config has whose value is not the code default
    (archived value shown as ``"absent"``). Keys only the archived config knows are not compared."""
    a, w = comparable(archived), comparable(wanted)
    out = []
    for key, value in w.items():
        if key in a:
            if a[key] != value:
                out.append((key, a[key], value))
            continue
        # a key the record's config lacks, or a block it had empty: equal when the grid asks the code default
        if any(k.startswith(key + ".") for k in a):
            continue
        default = code_default(wanted, key)
        if default is MISSING or default != value:
            out.append((key, "absent", value))
    return out


def describe_diff(diff: Sequence[Tuple[str, Any, Any]], limit: int = 6) -> str:
    """``engine.rounds 3 archived, 5 now; ...`` (at most ``limit`` keys, then how many more)."""
    parts = [f"{k} {_short(a)} archived, {_short(w)} now" for k, a, w in diff[:limit]]
    more = f"; and {len(diff) - limit} more key(s)" if len(diff) > limit else ""
    return "; ".join(parts) + more


def _short(v: Any) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, str) else v
    return text if len(text) <= 60 else text[:57] + "..."


def data_diff(folder: Path, base: Path = Path(".")) -> Tuple[List[str], int]:
    """(one line per recorded data input whose current build has another sha256, number of recorded
    inputs not built here: not checked)."""
    rec = read_inputs(folder)
    if rec is None:
        return [], 0
    diff = changes(rec, base)
    lines = [f"input {name} ({path}) sha256 {old[:12]} archived, {new[:12]} now"
             for name, path, old, new in diff if new != "missing"]
    return lines, sum(1 for d in diff if d[3] == "missing")


# ----------------------------------------------------------------------------- status of a grid's records
@dataclasses.dataclass
class Status:
    """What the archive holds for one run of a grid."""

    kind: str  # federate | pretrain
    job: Any
    path: Path  # the record folder
    state: str  # current | stale | absent
    why: str = ""  # stale: the differing keys / data
    unbuilt: int = 0  # recorded data inputs not built here (not checked)
    code: Optional[dict] = None

    def line(self) -> str:
        return f"{self.path}: stale ({self.why})"


@dataclasses.dataclass
class GridStatus:
    report_name: Optional[str]
    root: Path
    runs: Dict[Tuple[str, Any], Status]  # (kind, job) -> status
    tune: Dict[str, str]  # tune group path -> "current" | "stale: why" | "absent"

    def current(self, kind: str) -> Dict[Any, Status]:
        return {job: s for (k, job), s in self.runs.items() if k == kind and s.state == "current"}

    def stale(self) -> List[Status]:
        return [s for s in self.runs.values() if s.state == "stale"]

    def as_json(self) -> dict:
        """What the report lists (``report.archive``): every record used or left out, with its code."""
        rows = []
        for (kind, job), s in sorted(self.runs.items(), key=lambda kv: (kv[0][0], str(kv[1].path))):
            if s.state == "absent":
                continue
            rows.append({"kind": kind, "run": job.path, "record": str(s.path), "state": s.state, "why": s.why,
                         "unbuilt_inputs": s.unbuilt, "code": describe_code(s.code) if s.code else "unrecorded code",
                         "commit": (s.code or {}).get("commit")})
        return {"grid": grid_name(self.report_name), "records": rows}


def _tune_state(group: str, tune_plan, report_name: Optional[str], root: Path) -> Tuple[str, Optional[dict]]:
    """Whether the archived ``chosen.yaml`` of ``group`` was selected from the candidates and budget the grid
    asks now: (``current`` | ``absent`` | ``stale: why``, its content)."""
    path = tune_record_path(group, report_name, root)
    if not path.exists():
        return "absent", None
    chosen = safe_load_yaml(path.read_text(), str(path)) or {}
    keys = [k for g, ks in tune_plan.groups.items() if g.path == group for k in ks]
    if not keys:
        return "current", chosen  # a shared group whose tuning the grid no longer plans: its values stand
    want = sorted({json.dumps(tune_plan.candidates[k]["tune"]["values"], sort_keys=True) for k in keys})
    have = sorted(json.dumps(c["values"], sort_keys=True) for c in chosen.get("candidates") or [])
    budget = tune_plan.budget
    why = []
    if want != have:
        why.append(f"candidates {len(have)} archived, {len(want)} now (or other values)")
    for key, now in (("metric", tune_plan.metric), ("rounds", budget["rounds"]), ("patience", budget["patience"]),
                     ("seeds", sorted(budget["seeds"]))):
        if chosen.get(key) != now:
            why.append(f"tune {key} {chosen.get(key)} archived, {now} now")
    return ("stale: " + "; ".join(why), chosen) if why else ("current", chosen)


def wanted_config(cfg: Mapping, chosen: Optional[Mapping]) -> dict:
    """The config a run of the grid trains with: for a tuned run, ``cfg`` with its group's chosen values
    applied (as :func:`fedshift.tune.apply_chosen` does when the job starts)."""
    if not cfg.get("tuned") or chosen is None:
        return dict(cfg)
    from ..tune import apply_values

    out = apply_values(dict(cfg), chosen["chosen"], "archived chosen.yaml")
    out["tuned"] = {**cfg["tuned"], "chosen": dict(chosen["chosen"]), "score": chosen["score"],
                    "candidate": chosen["candidate"]}
    return out


def record_state(kind: str, job, cfg: Mapping, folder: Path, chosen: Optional[Mapping] = None,
                 tune_state: str = "current", base: Path = Path(".")) -> Status:
    """The :class:`Status` of the record (or run) folder ``folder`` against the grid's config ``cfg``."""
    folder = Path(folder)
    if not (folder / "metrics.json").exists() or not (folder / "config.yaml").exists():
        return Status(kind, job, folder, "absent")
    rec = read_inputs(folder) or {}
    code = rec.get("code")
    why: List[str] = []
    if cfg.get("tuned"):
        if tune_state != "current":
            why.append(f"its tuning record {tune_state}")
    archived = read_config(folder)
    if not why:
        diff = config_diff(archived, wanted_config(cfg, chosen))
        if diff:
            why.append(describe_diff(diff))
    lines, unbuilt = data_diff(folder, base)
    why += lines
    return Status(kind, job, folder, "stale" if why else "current", "; ".join(why), unbuilt, code)


def grid_status(plan, tune_plan=None, root: Path = RECORDS, base: Path = Path(".")) -> GridStatus:
    """Every run of ``plan`` (and its tuning, ``tune_plan``) against the records of its grid (module docstring)."""
    name = (plan.report or {}).get("name")
    tune: Dict[str, str] = {}
    chosen: Dict[str, Optional[dict]] = {}
    runs: Dict[Tuple[str, Any], Status] = {}
    for job, cfg in plan.federate.items():
        c, state = None, "current"
        if cfg.get("tuned"):
            group = group_of_chosen_file(cfg["tuned"]["file"])
            if group not in tune:
                tune[group], chosen[group] = _tune_state(group, tune_plan, name, root)
            c, state = chosen[group], tune[group]
        runs[("federate", job)] = record_state("federate", job, cfg, record_path("federate", job, name, root),
                                               c, state, base)
    for job, cfg in plan.pretrain.items():
        runs[("pretrain", job)] = record_state("pretrain", job, cfg, record_path("pretrain", job, name, root),
                                               base=base)
    return GridStatus(name, Path(root), runs, tune)


@dataclasses.dataclass
class Targets:
    """What the workflow plans for a grid once its current records are set aside."""

    federate: List[Any]  # jobs to run (their results/ folder is collected)
    pretrain: List[Any]
    archived_federate: List[Path]  # record folders collect reads instead
    archived_pretrain: List[Path]
    tune_groups: List[str]  # tune groups whose candidates must run (a seeded run that runs needs them)
    chosen_files: Dict[str, str]  # tune group -> the chosen.yaml the tuned table reads (results/ or records/)


def plan_targets(plan, tune_plan, status: GridStatus, results: str = "results") -> Targets:
    """Leave out every run whose record is current; keep the pretrain runs a planned job still needs
    (BASE checkpoints) and the tunings a planned seeded run still needs."""
    cur_fed, cur_pre = status.current("federate"), status.current("pretrain")
    fed = [j for j in plan.federate if j not in cur_fed]
    need_groups = {group_of_chosen_file(plan.federate[j]["tuned"]["file"]) for j in fed if plan.federate[j].get("tuned")}
    models = {m for j in fed for m in plan.federate[j]["paths"].get("pretrained") or []}
    if tune_plan is not None:
        for g, keys in tune_plan.groups.items():
            if g.path in need_groups:
                models |= {m for k in keys for m in tune_plan.candidates[k]["paths"].get("pretrained") or []}
    pre = [j for j in plan.pretrain if j not in cur_pre or f"{results}/pretrain/{plan.folder(j)}/model.pt" in models]
    chosen_files = {}
    for g in (tune_plan.groups if tune_plan is not None else {}):
        archived = status.tune.get(g.path) == "current" and g.path not in need_groups
        chosen_files[g.path] = (str(tune_record_path(g.path, status.report_name, status.root)) if archived
                                else tune_plan.chosen_file(g, results))
    return Targets(fed, pre, [cur_fed[j].path for j in plan.federate if j in cur_fed],
                   [cur_pre[j].path for j in plan.pretrain if j in cur_pre and j not in pre],
                   sorted(need_groups), chosen_files)


# ----------------------------------------------------------------------------- writing records
def _rounds_bytes(src: Path) -> Tuple[str, bytes]:
    data = src.read_bytes()
    if src.name.endswith(".gz") or len(data) <= GZIP_ABOVE:
        return src.name, data
    return ROUNDS_GZ, gzip.compress(data, mtime=0)  # mtime 0: the same run archives to the same bytes


def write_record(run_dir: Path, dest: Path, cfg: Mapping) -> bool:
    """Copy run folder ``run_dir``'s record into ``dest`` (atomically: a temporary folder, then a rename).
    Returns False when ``dest`` already holds exactly this record (nothing written)."""
    run_dir, dest = Path(run_dir), Path(dest)
    files: Dict[str, bytes] = {}
    for name in COPIED:
        if (run_dir / name).exists():
            files[name] = (run_dir / name).read_bytes()
    rname, rdata = _rounds_bytes(rounds_file(run_dir))
    files[rname] = rdata
    files[RECORD] = (json.dumps({"identity": run_identity(cfg), "run_folder": str(run_dir),
                                 "files": sorted(files)}, indent=2, sort_keys=True) + "\n").encode()
    if dest.is_dir() and sorted(p.name for p in dest.iterdir()) == sorted(files) and all(
            (dest / n).read_bytes() == b for n, b in files.items()):
        return False
    with atomic_dir(dest) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
    return True


def archive_grid(plan, tune_plan=None, root: Path = RECORDS, results: str = "results",
                 out=sys.stdout) -> Dict[str, int]:
    """``fedshift archive``: copy the record of every finished run of ``plan`` (and the selection record of
    every tuning its runs used) into ``root/<grid>/``; each run left out gets one line saying why.
    Returns counts: archived, unchanged, skipped."""
    name = (plan.report or {}).get("name")
    counts = {"archived": 0, "unchanged": 0, "skipped": 0}

    def skip(what: str, why: str) -> None:
        counts["skipped"] += 1
        print(f"skipped {what}: {why}", file=out)

    jobs = [("federate", j, c) for j, c in plan.federate.items()] + [("pretrain", j, c) for j, c in plan.pretrain.items()]
    for kind, job, cfg in jobs:
        run_dir = Path(results) / kind / plan.folder(job)  # <slot>-<identity> (issue 50)
        what = f"{kind}/{job.path}"
        partial = run_dir.parent / f"{run_dir.name}.partial"
        if not (run_dir / "metrics.json").exists() and (partial / DIVERGED / "metrics.json").exists():
            run_dir = partial / DIVERGED  # its recorded divergence is its outcome (fedshift.runner.record_divergence)
            what += " (diverged)"
        if not (run_dir / "metrics.json").exists():
            skip(what, "not finished (no metrics.json" + (f"; a checkpoint waits in {partial}" if partial.exists()
                                                           else "; not started here") + ")")
            continue
        run_cfg = read_config(run_dir)
        chosen = None
        if cfg.get("tuned"):
            chosen_file = Path(cfg["tuned"]["file"])
            if not chosen_file.exists():
                skip(what, f"tuned, but its selection record {chosen_file} is missing")
                continue
            chosen = safe_load_yaml(chosen_file.read_text(), str(chosen_file))
            if (run_cfg.get("tuned") or {}).get("chosen") != chosen.get("chosen"):
                skip(what, f"trained with tuned values {(run_cfg.get('tuned') or {}).get('chosen')}, but "
                           f"{chosen_file} now chooses {chosen.get('chosen')}")
                continue
        diff = config_diff(run_cfg, wanted_config(cfg, chosen))
        if diff:
            skip(what, f"ran with other settings than the grid asks ({describe_diff(diff)})")
            continue
        why = data_stale(run_dir)
        if why:
            skip(what, f"its data changed since it ran ({why})")
            continue
        if chosen is not None:
            group = group_of_chosen_file(cfg["tuned"]["file"])
            dest = tune_record_path(group, name, root)
            text = Path(cfg["tuned"]["file"]).read_text()
            if not dest.exists() or dest.read_text() != text:
                atomic_write_text(dest, text)
                print(f"archived tune/{group}/chosen.yaml -> {dest}", file=out)
        dest = record_path(kind, job, name, root)
        if write_record(run_dir, dest, run_cfg):
            counts["archived"] += 1
            print(f"archived {what} -> {dest}", file=out)
        else:
            counts["unchanged"] += 1
    return counts
