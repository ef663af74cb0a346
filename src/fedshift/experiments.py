"""The experiment grid: validate ``params/experiments.yaml``, expand it into jobs, and
write each job's fully resolved config.

Why one file of ~500 lines: validating a grid and expanding it into jobs are one pass over the
same registries and data params; split, a half-validated grid would travel between modules.

The resolved config of a run (defaults + per-method scenario defaults + YAML
overrides, with the structure's architectures and every input path) is written to
``results/configs/<rule>/...yaml`` only when its content changes, and is an input of
the job, so changing one hyper-parameter re-runs exactly the jobs it affects. The
same file is the run's MLflow artifact.

Every name (scenario, public set, method or variant, structure) is checked against
the registries and against ``params/data.yaml`` before any job starts; errors are
:class:`fedshift.errors.ConfigError` with the key and the valid choices.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from .config import read_yaml_file, resolve, to_dict
from .errors import ConfigError

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "experiments.schema.yaml"
WORKFLOW_CONFIG = Path("params/experiments.yaml")  # the Snakefile's `configfile:` (relative to the run folder)
REPO_WORKFLOW_CONFIG = Path(__file__).resolve().parents[2] / WORKFLOW_CONFIG
NAME = re.compile(r"^[a-z][a-z0-9_-]*$")  # names that become path parts, wildcards and shell words


def check_name(name: Any, where: str) -> None:
    """A variant, grid or report name must be a plain lowercase identifier (it becomes a folder name
    and a word in shell commands: ``../x`` would write outside the results tree)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):  # `$` also matches before a final newline
        raise ConfigError(f"{where}: invalid name {name!r}; use a plain lowercase identifier "
                          "(lowercase letters, digits, '_' or '-', starting with a letter)")


SEEDED_PARTITIONS = "partitions_seeded"  # build/<this>/<scenario>/seed<k>: engine.data_seed: run (not DVC's)
SEEDED_PUBLIC = "public_seeded"  # build/<this>/<public>/seed<k>: the public subset of run seed k (data_seed: run)
PROTOCOL_PARTITIONS = "partitions_{protocol}"  # build/<this>/<scenario>/seed<k>: a grid's test_protocol other
# than the data file's (issue 47), drawn by a Snakemake rule like the seeded ones


@dataclass(frozen=True)
class DataDraw:
    """The data one run reads (issue 47): its partition and public folders, its test protocol and what
    its seed redrew (empty under ``engine.data_seed: fixed``)."""

    partition: str
    public: Optional[str]
    test_protocol: str
    redrawn: Tuple[str, ...]


def data_draw(build: str, scenario: str, entry: Optional[Mapping[str, Any]], protocol: Optional[str], public: str,
              seed: int, data_seed: str, uses_public: bool) -> DataDraw:
    """Where run ``seed`` of ``scenario`` reads its data. ``entry``: the scenario's entry of the data
    file; ``protocol``: the grid's ``test_protocol`` (None: the data file's).

    * the data file's protocol, ``data_seed: fixed``: ``build/partitions/<scenario>`` (DVC);
    * the data file's protocol, ``data_seed: run``: ``build/partitions_seeded/<scenario>/seed<k>``;
    * another protocol: ``build/partitions_<protocol>/<scenario>/seed<k>``, ``k`` the run seed
      (``run``) or the data file's seed (``fixed``);
    * the public set: ``build/public/<name>``, or under ``run`` ``build/public_seeded/<name>/seed<k>``:
      the authors' code redraws its public subset with every seed (fccl+/utils/training.py:85,
      fccl+/datasets/utils/public_dataset.py:70-79 after fccl+/main.py:58-59; fccl/Idea/Ours/FCCL.py:70, 119).
    """
    from .data import SCENARIOS
    from .data.build import protocol_of, public_seed_override, seed_override, split_holdout_key, with_protocol

    spec = SCENARIOS.get(scenario)
    data_over = split_holdout_key(entry)[1]
    where = f"scenarios.{scenario}"
    base = resolve(spec.params, dict(data_over), where) if spec.params else None
    file_protocol = protocol_of(base)
    protocol = protocol or file_protocol
    params = resolve(spec.params, with_protocol(scenario, data_over, protocol), where) if spec.params else None
    if spec.builds_authors() and protocol != file_protocol:
        k = seed_override(scenario, seed if data_seed == "run" else getattr(base, "seed", 0))
        part = f"{build}/{PROTOCOL_PARTITIONS.format(protocol=protocol)}/{scenario}/seed{k}"
    elif data_seed == "run":
        part = f"{build}/{SEEDED_PARTITIONS}/{scenario}/seed{seed_override(scenario, seed)}"
    else:
        part = f"{build}/partitions/{scenario}"
    pub = None
    if public != "none" and uses_public:
        pub = (f"{build}/{SEEDED_PUBLIC}/{public}/seed{public_seed_override(public, seed)}" if data_seed == "run"
               else f"{build}/public/{public}")
    redrawn = ()
    if data_seed == "run":
        redrawn = spec.seeded_splits(params) + (("public set",) if pub else ())
    # the test set the run is scored on: a scenario whose authors' code tests on its clean split (Digits)
    # is scored on clean test images under either name, and says so (params/papers/protocols.yaml: clean)
    tested = protocol if spec.builds_authors() else "clean"
    return DataDraw(part, pub, tested, tuple(redrawn))


def deep_merge(base: Mapping, over: Mapping) -> dict:
    """``over`` merged into ``base`` as Snakemake merges config files (nested mappings extend,
    every other value, lists included, is replaced)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        elif isinstance(v, Mapping):
            out[k] = deep_merge({}, v)
        else:
            out[k] = v
    return out


def user_methods_win(merged: Mapping, own: Mapping) -> Tuple[dict, List[str]]:
    """A grid file's own ``methods:`` and ``scoring:`` blocks outrank the base file's ``scenario_overrides``
    (issue 34 item 6; issue 49).

    The merge order inside one file is methods < scenario_overrides < variant, so ``params/experiments.yaml``'s
    ``scenario_overrides.rotmnist.methods.fedavg: {eval_models: local}`` silently beat a user grid's
    ``methods: {fedavg: {eval_models: global}}``. Every key the user's files set under ``methods.<m>`` is
    removed from the scenario overrides they do not set themselves; returns the config and one note per
    replaced key (printed by the workflow and by ``fedshift validate``)."""
    out = deep_merge({}, merged)
    own_methods = own.get("methods") or {}
    own_so = own.get("scenario_overrides") or {}
    own_scoring = own.get("scoring") or {}
    notes = []
    for scen, so in (out.get("scenario_overrides") or {}).items():
        # the grid's own scoring: block outranks the base file's per-scenario scoring it does not set itself
        keys = (so or {}).get("scoring") or {}
        theirs = (own_so.get(scen) or {}).get("scoring") or {}
        for k in [k for k in keys if k in own_scoring and k not in theirs]:
            if own_scoring[k] != keys[k]:
                notes.append(f"scoring.{k}: {own_scoring[k]!r} (this grid) replaces the base file's "
                             f"scenario_overrides.{scen}.scoring.{k}: {keys[k]!r}")
            keys.pop(k)
        for m, keys in ((so or {}).get("methods") or {}).items():
            mine = own_methods.get(m) or {}
            theirs = ((own_so.get(scen) or {}).get("methods") or {}).get(m) or {}
            for k in [k for k in (keys or {}) if k in mine and k not in theirs]:
                if mine[k] == keys[k]:  # the same value: nothing to say
                    keys.pop(k)
                    continue
                notes.append(f"methods.{m}.{k}: {mine[k]!r} (this grid) replaces the base file's "
                             f"scenario_overrides.{scen}.methods.{m}.{k}: {keys[k]!r}")
                keys.pop(k)
    return out, notes


def snakemake_config(configfile, workflow_config: Path = WORKFLOW_CONFIG, replace: bool = False,
                     quiet: bool = False) -> dict:
    """The config ``snakemake --configfile <configfile ...>`` runs with: the Snakefile's
    ``params/experiments.yaml`` with each ``configfile`` merged over it in order (``replace``:
    the ``--replace-workflow-config`` flag, the files alone). A file that is an overlay of
    another (``overlay_of``) must come after it (:func:`check_overlays`). ``quiet``: the notes of
    :func:`user_methods_win` are not printed (``fedshift run``: Snakemake prints them when it plans)."""
    files = [Path(configfile)] if isinstance(configfile, (str, Path)) else [Path(f) for f in configfile]
    docs = [load_yaml(f) for f in files]  # each file read once
    for f, doc in zip(files, docs):
        check_grid_file(doc, f)
    check_overlays(files, docs)
    own: dict = {}
    for doc in docs:
        own = deep_merge(own, doc)
    own.pop(OVERLAY_KEY, None)
    same = len(files) == 1 and files[0].resolve() == Path(workflow_config).resolve()
    if replace or same or not Path(workflow_config).exists():
        return own
    merged, notes = user_methods_win(deep_merge(load_yaml(workflow_config), own), own)
    for note in [] if quiet else notes:
        print(f"fedshift: note: {note}", file=sys.stderr)
    merged["report"] = deep_merge({}, own.get("report") or {})  # a user grid reports only what it names
    return merged


# A grid file that only adds to another (a reduced schedule, an extra table on the same engine)
# names it: ``overlay_of: params/papers/fedh2l_table2.yaml``. Alone it would plan with the demo's
# engine block and report the demo schedule under the paper's table name (issue 22 point 4).
OVERLAY_KEY = "overlay_of"


def check_overlays(configfiles: Sequence, docs: Optional[Sequence[Mapping]] = None) -> None:
    """Refuse, in one line, an overlay given without the file it adds to before it.

    ``docs``: the files' contents when the caller has read them already (else read here)."""
    paths = [Path(f) for f in configfiles]
    docs = list(docs) if docs is not None else [load_yaml(p) for p in paths]
    for i, (path, doc) in enumerate(zip(paths, docs)):
        base, shown = doc.get(OVERLAY_KEY), _shown(path)
        if base is None:
            continue
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{shown}: {OVERLAY_KEY}: {base!r} must be the path of the grid file it adds to")
        if not any(p.resolve() == Path(base).resolve() for p in paths[:i]):
            raise ConfigError(f"{shown} only adds to {base} ({OVERLAY_KEY}) and does not plan alone: "
                              f"give both, in this order: --configfile {base} {shown}")


def _shown(path: Path) -> str:
    """``path`` as the user would type it: relative to the working folder when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_yaml(path: Path) -> dict:
    path = Path(path)
    data = read_yaml_file(path)  # aliases bounded (issue 38), file:line:column of a syntax error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def validate_schema(data: Mapping[str, Any], schema_path: Path = SCHEMA, where: str = "experiments",
                    partial: bool = False) -> None:
    """``data`` against the grid's JSON schema; one line naming the key, what is wrong and what the key holds.
    ``partial``: one file of several (``grid`` may come from another): the top level's ``required`` is not asked."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    if partial:
        schema.pop("required", None)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        what = e.schema.get("description") if isinstance(e.schema, Mapping) else None
        raise ConfigError(f"{where}: {key}: {e.message}" + (f" ({key}: {what})" if what else ""))


def check_grid_file(doc: Mapping[str, Any], path: Path) -> None:
    """One grid file's shape (the schema's types of the keys it sets), before files are merged: ``methods:
    [fedavg]`` (a list) ended in an AttributeError inside the merge (issue 51 A40)."""
    validate_schema({k: v for k, v in doc.items() if k not in ("gpus_per_job", "threads_per_job")},
                    where=_shown(Path(path)), partial=True)


@dataclass(frozen=True)
class FederateJob:
    scenario: str
    public: str
    method: str  # label: a method or a variant name
    structure: str
    seed: int

    @property
    def wildcards(self) -> Dict[str, Any]:
        return {"scenario": self.scenario, "public": self.public, "method": self.method,
                "structure": self.structure, "seed": self.seed}

    @property
    def path(self) -> str:
        return f"{self.scenario}/{self.public}/{self.method}/{self.structure}/seed{self.seed}"


@dataclass(frozen=True)
class PretrainJob:
    scenario: str
    participant: str
    arch: str
    seed: int

    @property
    def wildcards(self) -> Dict[str, Any]:
        return {"scenario": self.scenario, "participant": self.participant, "arch": self.arch, "seed": self.seed}

    @property
    def path(self) -> str:
        return f"{self.scenario}/{self.participant}/{self.arch}/seed{self.seed}"


def name_run(cfg: dict, kind: str, job_path: str) -> dict:
    """Set ``cfg``'s ``identity`` (:func:`fedshift.provenance.run_identity`) and its ``run_name``
    ``<kind>/<job path>-<identity>``: the run folder under ``results/`` (issue 50). Call it again after
    changing the config (the tune marks seeded configs after planning)."""
    from .provenance import run_folder, run_identity

    cfg["identity"] = run_identity(cfg)
    cfg["run_name"] = f"{kind}/{run_folder(job_path, cfg['identity'])}"
    return cfg


@dataclass
class Plan:
    federate: Dict[FederateJob, dict] = field(default_factory=dict)  # job -> resolved config
    pretrain: Dict[PretrainJob, dict] = field(default_factory=dict)
    report: dict = field(default_factory=dict)
    partitions: Dict[Tuple[str, int], str] = field(default_factory=dict)  # (scenario, seed) -> folder it reads
    build: str = "build"
    # scenario -> (its data-file entry, the grid's test_protocol or None): data_draw's inputs
    data: Dict[str, Tuple[dict, Optional[str]]] = field(default_factory=dict)

    def draw(self, scenario: str, public: str, seed: int, data_seed: str, uses_public: bool = True) -> DataDraw:
        """:func:`data_draw` of ``scenario`` as this grid reads it (tuning seeds: fedshift.tune)."""
        entry, protocol = self.data[scenario]
        return data_draw(self.build, scenario, entry, protocol, public, seed, data_seed, uses_public)

    def draw_params(self, scenario: str, seed: int, data_seed: str) -> dict:
        """The scenario's overrides (``holdout`` included) that :meth:`draw`'s partition is drawn with."""
        from .data.build import with_protocol

        entry, _ = self.data[scenario]
        over = {**dict(entry or {}), **({"seed": seed} if data_seed == "run" else {})}
        return with_protocol(scenario, over, self.draw(scenario, "none", seed, data_seed).test_protocol)

    def needed_pretrain(self) -> Dict[PretrainJob, dict]:
        """The pretrain jobs the workflow runs: every participant x architecture of the grid's
        scenarios whose methods include ``base`` or start from / distil the BASE checkpoints, both
        as those checkpoints and as the report's ``base_pretrain`` row (the collect rule takes them
        all as inputs)."""
        return dict(self.pretrain)

    def folder(self, job) -> str:
        """The job's run folder under ``results/federate/`` or ``results/pretrain/``: ``<job path>-<identity>``
        (``rotmnist/photo_patches/fedavg/homo_lenet/seed0-1a2b3c4d5e6f``), so two grids that set a method
        differently never share one (issue 50)."""
        from .provenance import run_folder

        cfg = self.federate[job] if isinstance(job, FederateJob) else self.pretrain[job]
        return run_folder(job.path, cfg["identity"])

    def federate_config(self, folder: str) -> dict:
        """The config of the federated job whose run folder is ``folder`` (:meth:`folder`)."""
        for job, cfg in self.federate.items():
            if self.folder(job) == folder:
                return cfg
        raise KeyError(folder)

    def pretrain_config(self, folder: str) -> dict:
        for job, cfg in self.pretrain.items():
            if self.folder(job) == folder:
                return cfg
        raise KeyError(folder)


def _merge(*dicts: Optional[Mapping]) -> dict:
    out: dict = {}
    for d in dicts:
        out.update(d or {})
    return out


def scoring_for(exp: Mapping[str, Any], scenario: str):
    """The scoring protocol of a scenario's runs (issue 49): the grid's ``scoring:`` block, overridden by
    ``scenario_overrides.<scenario>.scoring``; never per method or variant, so every row of a report table
    (one scenario, public set and structure) is scored alike by construction. Metric names are checked
    against the scoring registry (:data:`fedshift.scoring.SCORERS`)."""
    from .engine.config import ScoringConfig
    from .scoring import SCORERS

    so = ((exp.get("scenario_overrides") or {}).get(scenario) or {}).get("scoring")
    where = f"scoring ({scenario})" if so else "scoring"
    scoring = resolve(ScoringConfig, _merge(exp.get("scoring"), so), where)
    for name in scoring.metrics:
        SCORERS.get(name, key=f"{where}.metrics")
    return scoring


def _check_engine_for(method, eng, scoring, n_participants: int, where: str) -> None:
    """What a job asks of its method and scenario, checked in `fedshift validate` instead of at
    its first round: the method's declared capabilities (class attributes ``supports_sampling``,
    ``supports_server_model``, a ``global_model`` method; see engine.sampling.check_engine) under the
    scoring protocol, and ``clients_per_round`` against the scenario's participants (issue 23 case 9)."""
    from .engine.sampling import check_engine

    if eng.clients_per_round > n_participants:
        raise ConfigError(f"{where}.clients_per_round: {eng.clients_per_round} exceeds the scenario's "
                          f"{n_participants} participants; use 1..{n_participants} (or 0: all)")
    try:
        check_engine(method, eng, scoring)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if scoring.predict == "prototype" and not method.has_prototypes():
        raise ConfigError(f"scoring.predict: prototype: method {method.name!r} has no prototypes to predict by "
                          "(no prototype_scores); a table of it scores every row by its classifier: predict: head")


def check_published(names) -> None:
    """``report.published`` names tables of params/papers/published/ (did-you-mean otherwise),
    so a typo stops `fedshift validate` / planning rather than the report job at the end."""
    import difflib

    from .report.published import published_dir

    folder = published_dir()
    known = sorted(p.stem for p in folder.glob("*.csv"))
    for entry in names if isinstance(names, (list, tuple)) else [names]:
        name = entry.get("name") if isinstance(entry, Mapping) else entry  # `{name: ..., structures: [...]}` too
        if str(name) not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"report.published: no published table {name!r}{hint}; known ({folder}): "
                              f"{', '.join(known)}")


# Keys of the merged workflow config that steer execution (a profile's or --config's), not the experiment
# grid: the Snakefile (rules/common.smk) and the CLI's planners (plan_grid) drop the same ones.
WORKFLOW_KEYS = ("data_params", "gpus_per_job", "threads_per_job", "overlay_of", "records")


def plan_grid(exp: Mapping, default_data: Path | str = "params/data.yaml") -> Tuple["Plan", Path]:
    """(plan, data params file) of a merged workflow config ``exp`` (:func:`snakemake_config`, overrides
    applied), planned as the Snakefile plans it: the grid without :data:`WORKFLOW_KEYS`, on the grid's own
    ``data_params`` file, else ``default_data``. ``fedshift validate | run | archive`` and the generated docs
    blocks plan through here, so none of them can drop a different set of keys than the workflow does."""
    data_params = Path(exp.get("data_params") or default_data)
    return load_experiments({k: v for k, v in exp.items() if k not in WORKFLOW_KEYS}, data_params), data_params


def load_experiments(experiments: Path | Mapping, data_params: Path | Mapping,
                     results: str = "results", build: str = "build") -> Plan:
    """Validate the grid and resolve every job; raises ConfigError on the first problem."""
    from .data import DATASETS, PUBLIC_SETS, SCENARIOS
    from .engine.config import EngineConfig, PretrainConfig
    from .methods import METHODS, resolve_method_params
    from .methods.base import check_requirements
    from .models.structures import STRUCTURES

    exp = load_yaml(experiments) if not isinstance(experiments, Mapping) else dict(experiments)
    data = load_yaml(data_params) if not isinstance(data_params, Mapping) else dict(data_params)
    validate_schema(exp)
    enabled_scen = data.get("scenarios") or {}
    enabled_pub = data.get("public") or {}
    # params/data.yaml keys become words of DVC's shell commands (`fedshift partition ${key}`):
    # only registered names pass.
    for d in data.get("datasets") or []:
        DATASETS.get(d, key="params/data.yaml datasets")
    for s in enabled_scen:
        SCENARIOS.get(s, key="params/data.yaml scenarios")
    for pub in enabled_pub:
        PUBLIC_SETS.get(pub, key="params/data.yaml public")
    for s in exp.get("scenario_overrides") or {}:
        SCENARIOS.get(s, key="scenario_overrides")
    if (exp.get("report") or {}).get("name") is not None:
        check_name(exp["report"]["name"], "report.name")
    check_published((exp.get("report") or {}).get("published") or [])
    for b, block in enumerate(exp["grid"]):
        if "name" in block:
            check_name(block["name"], f"grid[{b}].name")
    variants = exp.get("variants") or {}
    for vname, v in variants.items():
        check_name(vname, f"variants.{vname}")
        # A variant may carry its own method's name only to give that method engine/params overrides.
        if vname in METHODS and v["method"] != vname:
            raise ConfigError(f"variants.{vname}: a variant may not reuse the method name {vname!r}")
        METHODS.get(v["method"], key=f"variants.{vname}.method")
    for mname in exp.get("methods") or {}:
        METHODS.get(mname, key="methods")
    plan = Plan(report=dict(exp.get("report") or {}), build=build)  # the grid's block stays as written; the plan adds to its copy
    for b, block in enumerate(exp["grid"]):
        where = f"grid[{b}]"
        for s in block["scenarios"]:
            spec = SCENARIOS.get(s, key=f"{where}.scenarios")
            if s not in enabled_scen:
                raise ConfigError(f"{where}.scenarios: scenario {s!r} is registered but not built: add it under "
                                  f"`scenarios:` in params/data.yaml (built now: {', '.join(enabled_scen) or 'none'})")
        for pub in block.get("public", ["none"]):
            if pub != "none":
                PUBLIC_SETS.get(pub, key=f"{where}.public")
                if pub not in enabled_pub:
                    raise ConfigError(f"{where}.public: public set {pub!r} is registered but not built: add it under "
                                      f"`public:` in params/data.yaml (built now: {', '.join(enabled_pub) or 'none'})")
        for st in block["structures"]:
            STRUCTURES.get(st, key=f"{where}.structures")
        for m in block["methods"]:
            if m not in variants:
                if m not in METHODS:
                    METHODS.get(m, key=f"{where}.methods")  # raises, listing the valid names
        for s, pub, m, st, seed in itertools.product(block["scenarios"], block.get("public", ["none"]),
                                                     block["methods"], block["structures"], block.get("seeds", [0])):
            job = FederateJob(s, pub, m, st, seed)
            if job in plan.federate:
                continue
            spec = SCENARIOS.get(s)
            from .data.build import split_holdout_key  # `holdout` is the partition stage's key (issue 36)

            so = (exp.get("scenario_overrides") or {}).get(s, {})
            # the grid's test protocol (issue 47): scenario_overrides.<s>.test_protocol, else the grid's, else
            # the data file's (absent: clean)
            plan.data[s] = (dict(enabled_scen.get(s) or {}), so.get("test_protocol", exp.get("test_protocol")))
            scen_params = (resolve(spec.params, split_holdout_key(enabled_scen.get(s))[1], f"scenarios.{s}")
                           if spec.params else None)
            participants = list(spec.participants_for(scen_params))
            if pub != "none":
                # A labeled dataset both partitioned (private/test) and sampled as public data could
                # put test images into training; unlabeled texture sources (photo_patches) cannot.
                pub_src = PUBLIC_SETS.get(pub).dataset
                if pub_src in spec.datasets_for(scen_params) and DATASETS.get(pub_src).num_classes > 0:
                    raise ConfigError(
                        f"{where}: public set {pub!r} samples dataset {pub_src!r}, which scenario {s!r} also "
                        "partitions into private/test data: test images could leak into training; pick another "
                        f"public set ({', '.join(n for n in enabled_pub if n != pub) or 'none built'})")
            structure = STRUCTURES.get(st)
            archs = structure.assign(len(participants))
            variant = variants.get(m, {})
            base_method = variant.get("method", m)
            cls = METHODS.get(base_method)
            if cls.requires_homogeneous and len(set(archs)) > 1:
                raise ConfigError(f"{where}: method {m!r} averages parameters and needs a homogeneous structure, "
                                  f"but {st!r} assigns {archs}; use a homo_<model> structure")
            overrides = _merge((exp.get("methods") or {}).get(base_method), (so.get("methods") or {}).get(base_method),
                               variant.get("params"))
            mparams = resolve_method_params(base_method, overrides, s, f"methods.{m}")
            method = cls(mparams)
            uses_public = method.uses_public  # a method's params may switch the public set off (FedMD seed)
            scoring = scoring_for(exp, s)
            if getattr(mparams, "homogeneous_averaging", "auto") in ("before_local", "after_local") and len(set(archs)) > 1:
                raise ConfigError(f"methods.{m}.homogeneous_averaging: {mparams.homogeneous_averaging!r} averages "
                                  f"parameters, but {st!r} assigns {archs}; use 'auto' or 'none', or a homo_<model> structure")
            eng = resolve(EngineConfig, _merge(exp.get("engine"), so.get("engine"), variant.get("engine")),
                          f"engine ({m} on {s})")
            pre = resolve(PretrainConfig, _merge(exp.get("pretrain"), so.get("pretrain")), f"pretrain ({s})")
            try:  # what the method declares it needs (optimiser, public data, BASE checkpoints), one line
                check_requirements(m, method.requirements(), eng, pub, (eng.norm, pre.norm))
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            _check_engine_for(method, eng, scoring, len(participants), f"engine ({m} on {s})")
            last_k = _merge(exp.get("engine"), so.get("engine"), variant.get("engine")).get("last_k")
            if last_k is not None and last_k > eng.rounds:  # metrics.json said 50 while averaging 4 rounds
                raise ConfigError(f"engine ({m} on {s}).last_k: {last_k} exceeds rounds ({eng.rounds}); "
                                  f"use 1..{eng.rounds}")
            from .engine.fused import plan_check  # engine.fused_clients: on refuses here, before any job

            plan_check(method, archs, eng.norm, eng.fused_clients, eng.device, eng.on_nonfinite)
            if os.environ.get("FEDSHIFT_SKIP_CUDA_CHECK", "0") != "1":
                from .engine.config import check_cuda

                for what, dev in ((f"engine ({m} on {s})", eng.device), (f"pretrain ({s})", pre.device)):
                    try:
                        check_cuda(dev)
                    except ValueError as exc:
                        raise ConfigError(f"{what}.{exc}") from None
            # engine.data_seed: run redraws the partition (and the public subset) with the run seed, a test
            # protocol other than the data file's draws its own partition (Snakemake rules build both from the
            # datasets `dvc repro` fetched); otherwise the run reads what `dvc repro` built. One scenario and seed
            # read one partition: the pretrain runs (BASE) are shared by every method of the grid.
            draw = plan.draw(s, pub, seed, eng.data_seed, uses_public)
            part_dir = draw.partition
            other = plan.partitions.setdefault((s, seed), part_dir)
            if other != part_dir:
                raise ConfigError(f"engine ({m} on {s}).data_seed: {eng.data_seed!r} makes seed {seed} read {part_dir}, "
                                  f"but another method of the grid reads {other}: set data_seed once for the scenario "
                                  "(engine: or scenario_overrides.<scenario>.engine:), not per method or variant")
            pretrained = None
            # Pretrain runs serve the BASE checkpoints of methods that start from or distil them,
            # and the report's base_pretrain row beside the grid's `base` row: grids with neither
            # (e.g. 100-client FedAvg/FedMMD) plan none.
            wants_pretrain = base_method == "base" or cls.needs_base(mparams)
            for part, arch in zip(participants, archs):
                pj = PretrainJob(s, part, arch, seed)
                if wants_pretrain and pj not in plan.pretrain:
                    # data_seed: which partition the run reads (paths are left out of its identity)
                    plan.pretrain[pj] = name_run({
                        "kind": "pretrain", "scenario": s, "participant": part,
                        "arch": arch, "seed": seed, "data_seed": eng.data_seed, "pretrain": to_dict(pre),
                        **({"test_protocol": draw.test_protocol} if draw.test_protocol != "clean" else {}),
                        "paths": {"partition": part_dir}, "wildcards": pj.wildcards,
                    }, "pretrain", pj.path)
            base_runs = None
            if cls.needs_base(mparams):
                pjs = [PretrainJob(s, p, a, seed) for p, a in zip(participants, archs)]
                pretrained = [f"{results}/pretrain/{plan.folder(pj)}/model.pt" for pj in pjs]
                base_runs = [plan.pretrain[pj]["identity"] for pj in pjs]  # what its BASE checkpoints are
            cfg = {
                "kind": "federate", "scenario": s, "public": pub,
                "method": m, "base_method": base_method, "structure": st, "seed": seed,
                "participants": participants, "archs": list(archs),
                "method_params": to_dict(mparams), "engine": to_dict(eng), "scoring": to_dict(scoring),
            }
            if base_runs:
                cfg["base_runs"] = base_runs
            if draw.test_protocol != "clean":  # absent = clean (the shared contract of issue 47)
                cfg["test_protocol"] = draw.test_protocol
            if draw.redrawn:  # what this seed drew anew: the report's "what the intervals cover"
                cfg["data_draw"] = {"redrawn": list(draw.redrawn)}
            cfg["paths"] = {"partition": part_dir, "public": draw.public, "pretrained": pretrained}
            cfg["wildcards"] = job.wildcards
            plan.federate[job] = name_run(cfg, "federate", job.path)
    ran = {j.method for j in plan.federate} | {"base_pretrain"}  # base_pretrain: the collect rule's SOLO/BASE row
    for i, spec in enumerate((exp.get("report") or {}).get("tables") or []):
        unknown = [m for m in (spec or {}).get("methods", []) if m not in ran]
        if unknown:  # the report silently dropped such a row
            raise ConfigError(f"report.tables[{i}].methods: {unknown} not run by the grid; "
                              f"valid: {', '.join(sorted(ran))}")
    renamed = (exp.get("report") or {}).get("published_methods") or {}
    unknown = sorted(m for m in renamed if m not in ran)
    if unknown:  # a mapping that matches no run would compare nothing, silently
        raise ConfigError(f"report.published_methods: {unknown} not run by the grid; valid: {', '.join(sorted(ran))}")
    from .report.frames import published_method_names

    published_method_names(exp.get("report"))  # two of ours onto one published row: refused before any job
    check_comparison(exp.get("report") or {}, ran, {j.scenario for j in plan.federate})
    # the grid's methods in its order: the report's table rows and figure colours (report/palette.py)
    plan.report["method_order"] = list(dict.fromkeys(j.method for j in plan.federate))
    return plan


def results_root(report_cfg: Optional[Mapping], results: str = "results") -> str:
    """Where a grid's collect and report land: ``results`` for the main grid, ``results/ablations/<name>``
    for a named one (``report.name``)."""
    name = (report_cfg or {}).get("name")
    return f"{results}/ablations/{name}" if name else results


def planned_folders(plan: Plan, results: str = "results") -> set:
    """Every run folder the grid asks for: ``results/federate/<folder>`` and ``results/pretrain/<folder>``."""
    return ({f"{results}/federate/{plan.folder(j)}" for j in plan.federate}
            | {f"{results}/pretrain/{plan.folder(j)}" for j in plan.pretrain})


def check_comparison(report: Mapping, ran, scenarios) -> None:
    """``report.reference``, ``report.compare`` and the terms of ``report.claims`` name methods the grid runs
    (one-line error with did-you-mean and the valid names), before any job starts."""
    import difflib

    from .report.grid_claims import check_grid_claims

    valid = sorted(ran)
    cmp = report.get("compare") or {}
    named = [("report.reference", report.get("reference")), ("report.compare.method", cmp.get("method"))]
    named += [("report.compare.against", m) for m in cmp.get("against") or []]
    for key, name in named:
        if name is not None and name not in ran:
            close = difflib.get_close_matches(str(name), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{key}: {name!r} is not run by the grid{hint}; valid: {', '.join(valid)}")
    if cmp.get("method") is not None and cmp["method"] in (cmp.get("against") or []):
        raise ConfigError(f"report.compare.against: {cmp['method']!r} is the compared method itself; list its "
                          "baselines")
    check_grid_claims(report, ran, scenarios)


def _drawn_with(folder: Path) -> Tuple[Optional[int], Optional[str]]:
    """(seed, test protocol) a workflow rule drew ``folder`` with, read off its path (:func:`data_draw`);
    (None, None) for DVC's folders."""
    kind = folder.parent.parent.name
    if not folder.name.startswith("seed") or not folder.name[4:].isdigit():
        return None, None
    if kind in (SEEDED_PARTITIONS, SEEDED_PUBLIC):
        return int(folder.name[4:]), None
    for protocol in ("clean", "authors"):
        if kind == PROTOCOL_PARTITIONS.format(protocol=protocol):
            return int(folder.name[4:]), protocol
    return None, None


def redrawn_from(folder) -> Optional[Tuple[str, Path]]:
    """(workflow rule, DVC's folder) of a folder a workflow rule draws per seed or per test protocol
    (workflow/rules/data.smk: ``partition_seed``, ``partition_protocol``, ``public_seed``, each drawn from DVC's
    folder of the same scenario or public set, which `dvc repro` must build first); None for DVC's own folders."""
    folder = Path(folder)
    seed, protocol = _drawn_with(folder)
    if seed is None:
        return None
    if folder.parent.parent.name == SEEDED_PUBLIC:
        return "public_seed", folder.parents[2] / "public" / folder.parent.name
    return ("partition_protocol" if protocol else "partition_seed"), folder.parents[2] / "partitions" / folder.parent.name


def check_built_data(configs, data_params: Path | Mapping, build: str = "build") -> None:
    """The data the jobs will read is the data their grid names (issue 51 R18): every partition, public set
    and dataset already built under ``build`` that a job of ``configs`` (resolved federate / pretrain /
    tuning-candidate configs) reads must have been built with the parameters ``data_params`` asks for, else
    one :class:`ConfigError` naming the key, the built value, the asked one and how to rebuild. Data not
    built yet passes (the workflow's dvc_repro / partition_seed jobs build it from the right file or stop).

    Without it a grid whose ``data_params`` (or an edited ``params/data.yaml`` not yet rebuilt) disagreed
    with ``build/`` trained on the built data, silently: Snakemake builds data only when a manifest is
    missing."""
    import json

    from .data.build import built_disagreement

    data = load_yaml(data_params) if not isinstance(data_params, Mapping) else dict(data_params)
    shown = _shown(Path(data_params)) if not isinstance(data_params, Mapping) else "the data params"
    folders: Dict[str, Tuple[Optional[int], Optional[str]]] = {}  # folder -> (seed, test protocol) it was drawn
    # with, (None, None) for DVC's; a redraw's folder names both (data_draw): build/partitions_seeded/<s>/seed<k>,
    # build/partitions_<protocol>/<s>/seed<k>, build/public_seeded/<p>/seed<k>
    for cfg in configs:
        paths = cfg.get("paths") or {}
        for folder in (paths.get("partition"), paths.get("public")):
            if folder:
                folders.setdefault(folder, _drawn_with(Path(folder)))
    drawn_from = set()  # the datasets the built partitions and public sets were drawn from
    for folder in folders:
        try:
            man = json.loads((Path(folder) / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        drawn_from |= set(man.get("datasets") or {}) | ({man["dataset"]} if isinstance(man.get("dataset"), str) else set())
    checks = [(f"{build}/datasets/{d}", (None, None)) for d in sorted(drawn_from)]
    checks += sorted(folders.items(), key=lambda kv: (kv[1] != (None, None), kv[0]))  # DVC's folders before redraws
    for folder, (seed, protocol) in checks:
        diff = built_disagreement(Path(folder), data, seed, protocol)
        if diff is None:
            continue
        key, built, asked = diff
        redraw = redrawn_from(folder)
        if redraw:
            fix = f"remove {folder}: the workflow's {redraw[0]} rule redraws it from {shown}"
        elif shown == "params/data.yaml":
            fix = "run `dvc repro` to rebuild it"
        else:
            fix = (f"copy {shown} over params/data.yaml and run `dvc repro` (DVC builds from that file only), "
                   "or name the file it was built from")
        raise ConfigError(f"{shown}: {key} is {asked!r}, but {folder} was built with {built!r} "
                          f"({folder}/manifest.json): the jobs would train on data their grid does not name; {fix}")


def dump_config(cfg: dict) -> str:
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` (atomically) only when it differs; keeps the mtime otherwise."""
    from .data.store import atomic_write_text

    path = Path(path)
    if path.exists() and path.read_text() == text:
        return False
    atomic_write_text(path, text)
    return True


def write_configs(plan: Plan, results: str = "results") -> Tuple[Dict[FederateJob, str], Dict[PretrainJob, str]]:
    """Write every resolved config under ``<results>/configs``; return job -> path."""
    fed, pre = {}, {}
    for job, cfg in plan.pretrain.items():
        p = f"{results}/configs/pretrain/{plan.folder(job)}.yaml"
        write_if_changed(Path(p), dump_config(cfg))
        pre[job] = p
    for job, cfg in plan.federate.items():
        p = f"{results}/configs/federate/{plan.folder(job)}.yaml"
        write_if_changed(Path(p), dump_config(cfg))
        fed[job] = p
    return fed, pre
