"""Tune, then run (issue 36): every method's unstated hyper-parameters searched on a validation
holdout by the same budget, the chosen values published, then the grid's seeded runs.

The protocol is FLGo-Bench's (Wang et al., WwZzz/FLGo, ``tune.py`` / ``run.py``): a grid of
candidates (lr in {0.001 ... 0.1} and each algorithm's own parameters) is trained on each
participant's private data minus a 20 % holdout, scored on that holdout with early stopping,
and the best candidate's values are what the seeded runs use; test data are never read to
choose. Here a grid's ``tune:`` block says what to search::

    tune:
      metric: avg/val/mean/top1            # selection metric on validation (VAL_METRICS)
      budget: {rounds: 8, seeds: [100], patience: 3}
      common: {engine.lr: {log: [0.001, 0.1], num: 3}}   # searched for every tuned method
      methods:                             # method or variant label -> its own search space
        fedavg: {}                         # {} / null: common + the method's declared space
        fedprox: {mu: [0.001, 0.01, 0.1]}  # explicit: replaces the declared space
      scenarios: [mnist5k_shards]          # optional: tune only these scenarios of the grid
      share: {fedmmd: fedavg}              # optional: fedmmd's seeded runs take fedavg's chosen values

A key ``engine.<k>`` sets EngineConfig ``<k>``; any other key a field of the method's Params.
Candidates are the Cartesian product; values are lists or ``{log: [low, high], num: n}``.

* :func:`plan_tune` expands the block over the grid's (scenario, public, method, structure)
  groups into candidate configs (ordinary federate configs with the budget's rounds,
  ``select: best_val`` and a ``tune`` entry) and marks each tuned seeded config with
  ``tuned.file``: the group's ``chosen.yaml``, an input of its jobs.
* A candidate runs as ``fedshift federate`` (checkpointed, resumable, one SLURM job each);
  :func:`run_candidate` records a diverged candidate as diverged instead of failing the workflow.
* :func:`select` (``python -m fedshift.tune select``) writes ``chosen.yaml``: every candidate's
  validation score per seed, diverged ones marked, the best by mean score (first on ties).
* :func:`apply_chosen` puts the chosen values into a seeded run's config before it starts
  (so they are in its config.yaml, its checkpoint hash and its MLflow params).

A method (a plugin too) declares its own search space without editing fedshift: a class
attribute ``search_space = {"mu": [0.001, 0.01, 0.1]}``, or a Params field
``mu: float = field(default=0.01, metadata={"search": [0.001, 0.01, 0.1]})``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

# early stopping and a candidate's score run inside the job (the runner, a lower layer, calls them there)
from .engine.selection import global_metric, global_validation, score, should_stop  # noqa: F401
from .config import values_text
from .errors import ConfigError

# Validation metrics an evaluation writes (engine.selection.validation_acc): the pooled ACC of
# FedH2L, and FCCL+ Eq. 21-22 on validation data (own domain, other domains, their mean).
VAL_METRICS = ("avg/val/mean/top1", "avg/val/inter/top1", "avg/val/intra/top1", "avg/val/acc",
               "global/val/top1")  # the last: the global model on all clients' validation data pooled (FedMMD/FedFusion)
DEFAULT_METRIC = "avg/val/mean/top1"  # FCCL+ tables lead with AVG inter and intra: their mean
DEFAULT_BUDGET = {"rounds": 10, "seeds": [0], "patience": 0, "eval_every": 1}
# At most this many candidate jobs (candidates x tuning seeds, over every tuned group) in one grid, checked before
# any candidate is made (issue 51 R06: a grid of 1,000,000 candidates kept `validate` busy > 10 min at 1.1 GB).
MAX_CANDIDATE_JOBS = 10_000


# ----------------------------------------------------------------------------- search space
def candidate_values(spec: Any, where: str) -> List[Any]:
    """A list of candidate values, or ``{log: [low, high], num: n}``: n log-spaced values, both ends in."""
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: an empty candidate list; give at least one value")
        return list(spec)
    if isinstance(spec, Mapping) and set(spec) == {"log", "num"}:
        lo_hi, num = spec["log"], spec["num"]
        if (not isinstance(lo_hi, list) or len(lo_hi) != 2 or not all(isinstance(v, (int, float)) for v in lo_hi)
                or min(lo_hi) <= 0 or not isinstance(num, int) or num < 1):
            raise ConfigError(f"{where}: {{log: [low, high], num: n}} needs 0 < low, high and an integer n >= 1, "
                              f"got {dict(spec)}")
        if num > MAX_CANDIDATE_JOBS:
            raise ConfigError(f"{where}: num {num:,} values, more than a grid's {MAX_CANDIDATE_JOBS:,} candidate jobs "
                              "(fedshift.tune.MAX_CANDIDATE_JOBS); search fewer values")
        lo, hi = (math.log10(v) for v in lo_hi)
        if num == 1:
            return [float(lo_hi[0])]
        return [float(f"{10 ** (lo + (hi - lo) * i / (num - 1)):.6g}") for i in range(num)]
    raise ConfigError(f"{where}: expected a list of values or {{log: [low, high], num: n}}, got {spec!r}")


def declared_space(cls) -> Dict[str, list]:
    """A method's own search space: ``search_space`` class attribute, else Params fields' ``search`` metadata."""
    space = dict(getattr(cls, "search_space", None) or {})
    if not space and dataclasses.is_dataclass(getattr(cls, "Params", None)):
        for f in dataclasses.fields(cls.Params):
            if "search" in f.metadata:
                space[f.name] = list(f.metadata["search"])
    return space


def method_space(tune: Mapping, label: str, cls) -> Dict[str, List[Any]]:
    """The search space of grid method ``label`` (ordered: common keys first)."""
    entry = (tune.get("methods") or {}).get(label)
    own = dict(entry or {}) or declared_space(cls)
    space = {**(tune.get("common") or {}), **own}
    if not space:
        raise ConfigError(f"tune.methods.{label}: nothing to search: list parameters here or under tune.common, "
                          f"or declare a search_space on method {cls.name!r}")
    return {k: candidate_values(v, f"tune.methods.{label}.{k}") for k, v in space.items()}


def candidates(space: Mapping[str, List[Any]]) -> List[Dict[str, Any]]:
    keys = list(space)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(space[k] for k in keys))]


def check_size(space: Mapping[str, List[Any]], seeds: int, planned: int, where: str) -> int:
    """The candidate jobs of one group (the product of the space's value counts x tuning seeds), counted without
    making them; one line when they bring the grid's ``planned`` ones past :data:`MAX_CANDIDATE_JOBS`."""
    n = math.prod(len(v) for v in space.values()) * seeds
    if planned + n > MAX_CANDIDATE_JOBS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in space.items())
        raise ConfigError(f"{where}: {sizes} x {seeds} tuning seed(s) = {n:,} candidate jobs"
                          + (f" ({planned + n:,} in the grid)" if planned else "")
                          + f", more than {MAX_CANDIDATE_JOBS:,} (fedshift.tune.MAX_CANDIDATE_JOBS); search fewer "
                          "values, or tune in several grids")
    return n


def check_chosen(chosen: Mapping[str, Any], path: Path) -> None:
    """A ``chosen.yaml``'s values are one of the candidates it lists that did not diverge (issue 51 R08: a
    hand-edited value, lr 5.0, that was never a candidate was applied silently); else one line naming the key."""
    values = dict(chosen.get("chosen") or {})
    cands = [c for c in chosen.get("candidates") or [] if isinstance(c, Mapping)]
    if any(dict(c.get("values") or {}) == values and c.get("status", "ok") == "ok" for c in cands):
        return
    fix = f"remove {path} to have the tune's selection (snakemake's tune_select) write it again"
    for key, value in values.items():
        tried = list(dict.fromkeys(dict(c.get("values") or {}).get(key) for c in cands))
        if value not in tried:
            raise ConfigError(f"{path}: chosen {key} {value!r} was never a candidate (candidates: "
                              f"{', '.join(map(repr, tried)) or 'none'}); {fix}")
    raise ConfigError(f"{path}: chosen {values} is not one of its candidates that trained to the end; {fix}")


def candidate_id(values: Mapping[str, Any]) -> str:
    """A stable folder name for a candidate: ``c`` + 8 hex digits of its values (order-free)."""
    text = json.dumps({k: values[k] for k in sorted(values)}, sort_keys=True, default=str)
    return "c" + hashlib.sha256(text.encode()).hexdigest()[:8]


def _budget(tune: Mapping) -> Dict[str, Any]:
    b = {**DEFAULT_BUDGET, **(tune.get("budget") or {})}
    for key in ("rounds", "eval_every"):
        if not isinstance(b[key], int) or b[key] < 1:
            raise ConfigError(f"tune.budget.{key}: {b[key]!r} must be an integer >= 1")
    if not isinstance(b["patience"], int) or b["patience"] < 0:
        raise ConfigError(f"tune.budget.patience: {b['patience']!r} must be an integer >= 0 (0: no early stopping)")
    if (not isinstance(b["seeds"], list) or not b["seeds"]
            or not all(isinstance(s, int) and s >= 0 for s in b["seeds"])):
        raise ConfigError(f"tune.budget.seeds: {b['seeds']!r} must be a non-empty list of integers >= 0")
    return b


def apply_values(cfg: dict, values: Mapping[str, Any], where: str) -> dict:
    """``cfg`` (a resolved federate config) with ``values`` set and re-resolved, so a wrong key or
    value fails here in one line naming it (the dataclasses' own checks)."""
    from .config import resolve, to_dict
    from .engine.config import EngineConfig
    from .methods import resolve_method_params

    out = copy.deepcopy(cfg)
    eng, mp = dict(out["engine"]), dict(out["method_params"])
    for key, value in values.items():
        if key.startswith("engine."):
            eng[key[len("engine."):]] = value
        else:
            mp[key] = value
    out["engine"] = to_dict(resolve(EngineConfig, eng, f"{where} engine"))
    out["method_params"] = to_dict(resolve_method_params(out["base_method"], mp, out["scenario"], where))
    return out


# ----------------------------------------------------------------------------- planning
@dataclasses.dataclass(frozen=True)
class TuneGroup:
    scenario: str
    public: str
    method: str
    structure: str

    @property
    def path(self) -> str:
        return f"{self.scenario}/{self.public}/{self.method}/{self.structure}"


@dataclasses.dataclass
class TunePlan:
    metric: str = DEFAULT_METRIC
    budget: Dict[str, Any] = dataclasses.field(default_factory=dict)
    candidates: Dict[str, dict] = dataclasses.field(default_factory=dict)  # "<group>/<cid>/seed<k>-<id>" -> config
    groups: Dict[TuneGroup, List[str]] = dataclasses.field(default_factory=dict)  # group -> its candidate keys
    table: Optional[str] = None  # results/.../tune/tuned.csv (None: the grid tunes nothing)
    # scenario -> {"file": results/tune/<scenario>/leaks.json, "tuning": [draw], "reported": [draw]}: the
    # tune_leaks job's exact count before any candidate of the scenario runs (leak_guard)
    leaks: Dict[str, dict] = dataclasses.field(default_factory=dict)

    def group_id(self, group: TuneGroup) -> str:
        """12 hex digits of the group's candidates' identities (issue 50): two grids that tune one method
        with another search, budget or base settings choose into different ``chosen-<id>.yaml`` files."""
        text = " ".join(sorted(self.candidates[k]["identity"] for k in self.groups[group]))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def chosen_file(self, group: TuneGroup, results: str = "results") -> str:
        return f"{results}/tune/{group.path}/chosen-{self.group_id(group)}.yaml"


def plan_tune(grid: Mapping, plan, results: str = "results") -> TunePlan:
    """Expand ``grid['tune']`` over ``plan``'s federate jobs (see the module docstring). Adds the
    candidates' pretrain jobs to ``plan`` when a tuned method starts from BASE checkpoints, marks
    the tuned seeded configs with ``tuned`` and records the tuned table in ``plan.report``."""
    from .experiments import PretrainJob
    from .methods import METHODS

    tune = grid.get("tune")
    out = TunePlan()
    if not tune:
        return out
    out.metric = tune.get("metric", DEFAULT_METRIC)
    if out.metric not in VAL_METRICS:
        raise ConfigError(f"tune.metric: {out.metric!r} is not a validation metric; valid: {', '.join(VAL_METRICS)}")
    out.budget = _budget(tune)
    labels = {j.method for j in plan.federate}
    listed = list((tune.get("methods") or {}))
    missing = [m for m in listed if m not in labels]
    if missing:
        raise ConfigError(f"tune.methods: {missing} not run by the grid; valid: {', '.join(sorted(labels))}")
    scenarios = tune.get("scenarios") or sorted({j.scenario for j in plan.federate})
    unknown = [s for s in scenarios if s not in {j.scenario for j in plan.federate}]
    if unknown:
        raise ConfigError(f"tune.scenarios: {unknown} not run by the grid; valid: "
                          f"{', '.join(sorted({j.scenario for j in plan.federate}))}")
    share = dict(tune.get("share") or {})  # method -> the tuned method whose chosen values it takes
    for m, src in share.items():
        if m not in labels or src not in listed or m in listed:
            raise ConfigError(f"tune.share.{m}: {src!r}: maps a grid method that is not tuned itself to a tuned "
                              f"one; tuned: {', '.join(listed) or 'none'}")
    from .experiments import name_run

    b = out.budget
    spaces: Dict[TuneGroup, List[str]] = {}  # group -> its searched parameters
    planned = 0  # candidate jobs so far (MAX_CANDIDATE_JOBS)
    reported = set()  # the tuned methods' reported seeds (docs/tuning.md: keep the tuning seeds apart from them)
    for job, cfg in list(plan.federate.items()):
        if job.scenario not in scenarios:
            continue
        if job.method in share:  # e.g. FedMMD runs at the lr tuned on FedAvg (same scenario and structure)
            reported.add(job.seed)
            continue  # marked below, once every group is planned
        if job.method not in listed:
            continue
        reported.add(job.seed)
        group = TuneGroup(job.scenario, job.public, job.method, job.structure)
        where = f"tune.methods.{job.method} ({job.scenario})"
        if group not in out.groups:
            cls = METHODS.get(cfg["base_method"])
            if out.metric.startswith("global/"):
                if not cfg["engine"].get("global_eval_every"):
                    raise ConfigError(f"{where}: tune.metric {out.metric} scores the global model, but "
                                      "engine.global_eval_every is 0; set it (e.g. 1) or pick a participant metric")
            elif not cfg["engine"].get("participant_eval", True):
                raise ConfigError(f"{where}: engine.participant_eval is false, so the runs evaluate no participant "
                                  "on validation data; use tune.metric: global/val/top1 or participant_eval: true")
            space = method_space(tune, job.method, cls)
            planned += check_size(space, len(b["seeds"]), planned, where)  # before a single candidate is made
            keys = []
            for i, values in enumerate(candidates(space)):
                cid = candidate_id(values)
                for seed in b["seeds"]:
                    c = apply_values(cfg, values, where)
                    eng = c["engine"]
                    eng.update(rounds=b["rounds"], eval_every=b["eval_every"], last_k=min(eng["last_k"], b["rounds"]))
                    if not out.metric.startswith("global/"):
                        eng["select"] = "best_val"  # participants' validation metrics at every evaluation
                    else:
                        eng["global_eval_every"] = min(eng["global_eval_every"], b["eval_every"])
                    slot = f"{group.path}/{cid}/seed{seed}"
                    c.update(seed=seed, wildcards={**job.wildcards, "seed": seed, "candidate": cid},
                             tune={"candidate": cid, "index": i, "values": dict(values), "metric": out.metric,
                                   "patience": b["patience"]})
                    if eng.get("data_seed") == "run":  # the tuning seed's own draw of the partition and public set
                        draw = plan.draw(job.scenario, job.public, seed, "run", bool(c["paths"]["public"]))
                        c["paths"].update(partition=draw.partition, public=draw.public)
                        c["data_draw"] = {"redrawn": list(draw.redrawn)}
                    if c["paths"].get("pretrained"):  # BASE checkpoints of the tuning seed
                        paths, base_runs = [], []
                        for part, arch in zip(c["participants"], c["archs"]):
                            pj = PretrainJob(job.scenario, part, arch, seed)
                            if pj not in plan.pretrain:
                                src = plan.pretrain[PretrainJob(job.scenario, part, arch, job.seed)]
                                plan.pretrain[pj] = {**copy.deepcopy(src), "seed": seed, "wildcards": pj.wildcards}
                                plan.pretrain[pj]["paths"]["partition"] = c["paths"]["partition"]  # same draw
                                name_run(plan.pretrain[pj], "pretrain", pj.path)
                            paths.append(f"{results}/pretrain/{plan.folder(pj)}/model.pt")
                            base_runs.append(plan.pretrain[pj]["identity"])
                        c["paths"]["pretrained"], c["base_runs"] = paths, base_runs
                    name_run(c, "tune", slot)  # run folder results/tune/<group>/<cid>/seed<k>-<identity>
                    key = c["run_name"][len("tune/"):]
                    out.candidates[key] = c
                    keys.append(key)
            out.groups[group] = keys
            spaces[group] = list(space)
    # the seeded runs take the chosen values: their configs name the tune (its file and the identity of its
    # candidates), so they are named again (name_run) once every group is planned
    for job, cfg in list(plan.federate.items()):
        if job.scenario not in scenarios or (job.method not in listed and job.method not in share):
            continue
        group = TuneGroup(job.scenario, job.public, share.get(job.method, job.method), job.structure)
        if group not in out.groups:  # shared from a method the grid does not run on this slot
            raise ConfigError(f"tune.share.{job.method}: {group.method!r} is not tuned on {job.scenario} / "
                              f"{job.public} / {job.structure}, where {job.method} runs")
        cfg["tuned"] = {"file": out.chosen_file(group, results), "group": out.group_id(group),
                        "params": list(spaces[group]), "budget": dict(b), "metric": out.metric,
                        **({"from": group.method} if job.method in share else {})}
        name_run(cfg, "federate", job.path)
    same = sorted(reported & set(b["seeds"]))
    if same:  # issue 51 R05: the values are then chosen on the very draws (init, sampling, data_seed) reported
        print(f"fedshift: warning: tune.budget.seeds {b['seeds']} include the reported seed(s) {same} of the tuned "
              "methods: the values would be chosen on the same draws (model initialisation, client sampling, a "
              "data_seed: run partition) the grid then reports; keep them apart (e.g. seeds: [100], docs/tuning.md)",
              file=sys.stderr)
    out.leaks = leak_guard(plan, out, results)
    name = (plan.report or {}).get("name")
    root = f"{results}/ablations/{name}" if name else results
    out.table = f"{root}/tune/tuned.csv"
    plan.report["tuned"] = {"table": out.table, "budget": dict(b), "metric": out.metric,
                            "methods": sorted({g.method for g in out.groups})}
    return out


# ----------------------------------------------------------------------------- leak guard (issue 47)
def _draws(plan, cfgs: Sequence[dict]) -> List[dict]:
    """One entry per partition folder the configs read: the folder and the overrides it is drawn with."""
    out: Dict[str, dict] = {}
    for c in cfgs:
        folder = c["paths"]["partition"]
        if folder not in out:
            data_seed = c["engine"].get("data_seed", "fixed")
            out[folder] = {"scenario": c["scenario"], "folder": folder, "seed": int(c["seed"]),
                           "overrides": plan.draw_params(c["scenario"], int(c["seed"]), data_seed)}
    return list(out.values())


FIX = "tune with engine.data_seed: fixed and test_protocol: clean, or tune another scenario"


def _leak_line(s: str, n: Optional[int], t_seeds, r_seeds, why: str) -> str:
    if n is None:
        return (f"tune: scenario {s!r}: validation images of tuning seed(s) {t_seeds} can be test images of reported "
                f"seed(s) {r_seeds} ({why}; the count needs its data: dvc repro); {FIX}")
    return (f"tune: scenario {s!r}: {n} validation image(s) of tuning seed(s) {t_seeds} are test images of reported "
            f"seed(s) {r_seeds} ({why}; by source row or pixel hash); {FIX}")


def _as_draws(entries: Sequence[dict]):
    from .data.leaks import Draw

    return [Draw(d["scenario"], d["folder"], d["overrides"]) for d in entries]


def leak_guard(plan, tp: TunePlan, results: str = "results", datasets: Optional[str] = None) -> Dict[str, dict]:
    """Refuse a tune whose validation images (any tuning seed) can be test images of a reported seed of the
    grid, in one line naming the scenario and the count (fedshift.data.leaks). The scenario's construction
    decides first (:func:`fedshift.data.leaks.structural`): where the test holds training images
    (``test_protocol: authors``) or the seed redraws it, the images are counted from the built partitions
    or the fetched datasets and any count (or no data to count on) is refused; a clean test the seed does
    not redraw passes here, and the returned tune_leaks job counts by row and by pixel hash on the built
    partitions before any candidate of the scenario runs."""
    from .config import resolve
    from .data import SCENARIOS
    from .data.build import split_holdout_key
    from .data.leaks import count_leaks, structural

    datasets = datasets or f"{plan.build}/datasets"
    jobs: Dict[str, dict] = {}
    for s in sorted({c["scenario"] for c in tp.candidates.values()}):
        tuning = _draws(plan, [c for c in tp.candidates.values() if c["scenario"] == s])
        reported = _draws(plan, [c for c in plan.federate.values() if c["scenario"] == s])
        t_seeds = sorted({d["seed"] for d in tuning})
        r_seeds = sorted({int(c["seed"]) for c in plan.federate.values() if c["scenario"] == s})
        same = [d["folder"] for d in tuning] == [d["folder"] for d in reported]
        spec = SCENARIOS.get(s)
        params = (resolve(spec.params, split_holdout_key(tuning[0]["overrides"])[1], f"scenarios.{s}")
                  if spec.params else None)
        kind = structural(s, params, same)
        if kind != "none":
            n = count_leaks(_as_draws(tuning), _as_draws(reported), Path(datasets))
            why = ("its test_protocol authors tests on training images" if kind == "certain"
                   else "its seed redraws the test split")
            if n != 0:
                raise ConfigError(_leak_line(s, n, t_seeds, r_seeds, why))
        jobs[s] = {"file": f"{results}/tune/{s}/leaks.json", "scenario": s, "tuning": tuning, "reported": reported,
                   "tuning_seeds": t_seeds, "reported_seeds": r_seeds}
    return jobs


def check_leaks(out: Path, spec_file: Path, datasets: Path = Path("build/datasets")) -> dict:
    """The tune_leaks job: :func:`leak_guard`'s count by row and by pixel hash on the built partitions;
    writes ``out`` (the count and the folders) when it is 0, else raises the guard's one line."""
    from .data.leaks import count_leaks
    from .data.store import atomic_write_text

    spec = yaml.safe_load(Path(spec_file).read_text())
    n = count_leaks(_as_draws(spec["tuning"]), _as_draws(spec["reported"]), Path(datasets))
    if n != 0:
        raise ConfigError(_leak_line(spec["scenario"], n, spec["tuning_seeds"], spec["reported_seeds"],
                                     "counted on the built partitions"))
    result = {"scenario": spec["scenario"], "leaks": 0, "tuning": [d["folder"] for d in spec["tuning"]],
              "reported": [d["folder"] for d in spec["reported"]]}
    atomic_write_text(Path(out), json.dumps(result, indent=1) + "\n")
    return result


def write_leak_specs(tp: TunePlan, results: str = "results") -> Dict[str, str]:
    """Each tuned scenario's tune_leaks input (``results/configs/tune/leaks/<scenario>.yaml``)."""
    from .experiments import dump_config, write_if_changed

    paths = {}
    for s, job in tp.leaks.items():
        p = f"{results}/configs/tune/leaks/{s}.yaml"
        write_if_changed(Path(p), dump_config({k: v for k, v in job.items() if k != "file"}))
        paths[s] = p
    return paths


def write_candidate_configs(tp: TunePlan, results: str = "results") -> Dict[str, str]:
    from .experiments import dump_config, write_if_changed

    paths = {}
    for key, cfg in tp.candidates.items():
        p = f"{results}/configs/tune/{key}.yaml"
        write_if_changed(Path(p), dump_config(cfg))
        paths[key] = p
    return paths


# ----------------------------------------------------------------------------- running
def run_candidate(cfg: Dict[str, Any], out_dir: Path, tracker=None, **kwargs) -> Dict[str, Any]:
    """A tuning candidate: an ordinary federated run; a non-finite loss or weight is recorded as
    ``diverged`` in its metrics.json (the workflow goes on; :func:`select` lists it as diverged)."""
    from . import runner
    from .data.store import atomic_write_text, json_text
    from .engine import checkpoint
    from .errors import NonFiniteError

    try:
        return runner.run_federate(cfg, out_dir, tracker, **kwargs)
    except NonFiniteError as exc:
        out_dir = Path(out_dir)
        metrics = {"run": cfg["run_name"], "diverged": True, "error": str(exc).splitlines()[0],
                   "tune": {"score": None, "best_round": None}}
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_dir / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))
        atomic_write_text(out_dir / "metrics.json", json_text(metrics, indent=1))
        checkpoint.clear(checkpoint.partial_dir(out_dir))
        if tracker is not None:
            try:
                tracker.set_tags({"tune.diverged": "true"})
            except Exception:  # tracking never costs a result
                pass
        print(f"[{cfg['run_name']}] diverged: {metrics['error']} (recorded; tuning goes on)", file=sys.stderr)
        return metrics


# ----------------------------------------------------------------------------- selection
def select(metrics_files: Sequence[Path]) -> dict:
    """The chosen values of one (scenario, public, method, structure) from its candidates' run
    folders: mean validation score over tuning seeds, highest first, first candidate on ties; a
    candidate that diverged on any seed is ``diverged`` and never chosen."""
    cands: Dict[str, dict] = {}
    head: dict = {}
    for f in metrics_files:
        f = Path(f)
        cfg = yaml.safe_load((f.parent / "config.yaml").read_text())
        m = json.loads(f.read_text())
        t = cfg["tune"]
        head = {k: cfg[k] for k in ("scenario", "public", "method", "structure")}
        head.update(metric=t["metric"], rounds=cfg["engine"]["rounds"], patience=t["patience"])
        c = cands.setdefault(t["candidate"], {"id": t["candidate"], "index": t["index"], "values": t["values"],
                                              "per_seed": {}, "status": "ok"})
        s = (m.get("tune") or {}).get("score")
        c["per_seed"][int(cfg["seed"])] = s
        if m.get("diverged") or s is None:
            c["status"] = "diverged"
            c.setdefault("errors", []).append(m.get("error", "no finite validation score"))
        else:
            c.setdefault("best_round", {})[int(cfg["seed"])] = m["tune"]["best_round"]
    rows = sorted(cands.values(), key=lambda c: c["index"])
    for c in rows:
        c["score"] = (sum(c["per_seed"].values()) / len(c["per_seed"])) if c["status"] == "ok" else None
    ok = [c for c in rows if c["status"] == "ok"]
    if not ok:
        raise ConfigError(f"tune {head.get('method')} on {head.get('scenario')}: every candidate diverged "
                          f"({', '.join(str(c['values']) for c in rows)}); widen tune.methods.{head.get('method')}")
    best = max(ok, key=lambda c: (c["score"], -c["index"]))
    seeds = sorted({s for c in rows for s in c["per_seed"]})
    return {**head, "seeds": seeds, "chosen": dict(best["values"]), "score": best["score"], "candidate": best["id"],
            "candidates": [{k: v for k, v in c.items() if k != "index"} for c in rows]}


def apply_chosen(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """A seeded run's config with its group's chosen values (``cfg['tuned']['file']``) applied."""
    t = cfg.get("tuned")
    if not t:
        return cfg
    path = Path(t["file"])
    if not path.exists():
        raise ConfigError(f"{path}: the tuned values of {cfg['run_name']} are missing; run the tune "
                          "(snakemake builds it before the seeded runs)")
    chosen = yaml.safe_load(path.read_text())
    check_chosen(chosen, path)
    out = apply_values(cfg, chosen["chosen"], f"{path} chosen")
    out["tuned"] = {**t, "chosen": dict(chosen["chosen"]), "score": chosen["score"], "candidate": chosen["candidate"]}
    return out


def mlflow_tags(cfg: Mapping[str, Any]) -> Dict[str, str]:
    """MLflow tags of a tuned seeded run (``tuned.<param>`` = chosen value, the budget) or of a candidate."""
    if cfg.get("tuned"):
        t = cfg["tuned"]
        b = t.get("budget") or {}
        tags = {f"tuned.{k}": str(v) for k, v in (t.get("chosen") or {}).items()}
        tags.update({"tuned": "true", "tuned.metric": str(t.get("metric")), "tuned.val_score": str(t.get("score")),
                     "tuned.budget": f"rounds={b.get('rounds')} seeds={b.get('seeds')} patience={b.get('patience')}"})
        return tags
    t = cfg["tune"]
    return {"tune.candidate": t["candidate"], **{f"tune.{k}": str(v) for k, v in t["values"].items()},
            "tune.values": values_text(t["values"])}


# ----------------------------------------------------------------------------- the tuned table
def _outcome(c: Mapping) -> Any:
    return "diverged" if c["status"] == "diverged" or c.get("score") is None else c["score"]


def tied_values(cands: Sequence[Mapping], param: str) -> int:
    """How many values of ``param`` the best-scoring candidates hold (exact scores): 1 = ``param`` was not
    tied, whatever ties another parameter made (FedAvgM's lr read "tie of 2" where only beta was tied)."""
    ok = [c for c in cands if _outcome(c) != "diverged"]
    if not ok:
        return 0
    best = max(c["score"] for c in ok)
    return len({json.dumps(c["values"][param], default=str) for c in ok if c["score"] == best})


def no_effect(cands: Sequence[Mapping], param: str) -> bool:
    """Whether ``param`` changed no candidate's outcome (score, or diverged): every group of candidates that
    agree on the other parameters has one outcome, and some group holds two values of ``param``."""
    groups: Dict[str, list] = {}
    for c in cands:
        rest = json.dumps({k: v for k, v in c["values"].items() if k != param}, sort_keys=True, default=str)
        groups.setdefault(rest, []).append(c)
    varied = [g for g in groups.values() if len({json.dumps(c["values"][param], default=str) for c in g}) > 1]
    return bool(varied) and all(len({json.dumps(_outcome(c)) for c in g}) == 1 for g in varied)


def table_rows(chosen_files: Sequence[Path]) -> List[dict]:
    """One row per (scenario, public, method, structure, parameter): its candidates, the chosen value
    and the validation score of the chosen candidate, with the budget (``budget``: candidates x rounds x
    tuning seeds, in rounds); ``tied_values``: how many of this parameter's values share the best score
    (1: not tied); ``no_effect``: the parameter changed no candidate's score; ``scores``: every candidate's
    values and validation score (%), ``diverged`` where it diverged."""
    rows = []
    for f in chosen_files:
        c = yaml.safe_load(Path(f).read_text())
        diverged = sum(1 for x in c["candidates"] if x["status"] == "diverged")
        for param, value in c["chosen"].items():
            cands = list(dict.fromkeys(x["values"][param] for x in c["candidates"]))
            rows.append({"scenario": c["scenario"], "public": c["public"], "method": c["method"],
                         "structure": c["structure"], "parameter": param,
                         "candidates": " ".join(str(v) for v in cands), "chosen": str(value),  # 2 stays 2, not 2.0
                         "val_score": round(100 * c["score"], 2), "metric": c["metric"],
                         "n_candidates": len(c["candidates"]), "diverged": diverged,
                         "budget": len(c["candidates"]) * c["rounds"] * len(c["seeds"]),
                         "tied_values": tied_values(c["candidates"], param),
                         "no_effect": no_effect(c["candidates"], param),
                         "rounds": c["rounds"], "seeds": " ".join(map(str, c["seeds"])), "patience": c["patience"],
                         "scores": "; ".join(",".join(f"{k.replace('engine.', '')}={v}" for k, v in x["values"].items())
                                             + ": " + ("diverged" if x["score"] is None else f"{100 * x['score']:.2f}")
                                             for x in c["candidates"])})
    return rows


def write_table(out: Path, chosen_files: Sequence[Path]) -> None:
    import pandas as pd

    from .data.store import atomic_write_text

    cols = ["scenario", "public", "method", "structure", "parameter", "candidates", "chosen", "val_score", "metric",
            "n_candidates", "diverged", "budget", "tied_values", "no_effect", "rounds", "seeds", "patience", "scores"]
    atomic_write_text(Path(out), pd.DataFrame(table_rows(chosen_files), columns=cols).to_csv(index=False))


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m fedshift.tune select OUT METRICS...`` | ``table OUT CHOSEN...`` | ``leaks OUT SPEC``
    (the tune rules)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(argv) < 3 or argv[0] not in ("select", "table", "leaks"):
            raise ConfigError("usage: python -m fedshift.tune {select OUT METRICS.json... | table OUT CHOSEN.yaml... "
                              "| leaks OUT SPEC.yaml}")
        verb, out, files = argv[0], Path(argv[1]), [Path(f) for f in argv[2:]]
        if verb == "leaks":
            check_leaks(out, files[0])
        elif verb == "select":
            from .data.store import atomic_write_text

            atomic_write_text(out, yaml.safe_dump(select(files), sort_keys=False))
        else:
            write_table(out, files)
    except ConfigError as exc:
        print(f"fedshift: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
