# Load and validate the experiment grid, resolve every job's config, build target lists.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("9.0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# workflow/envs/fedshift.yaml installs fedshift with pip from ${FEDSHIFT_ROOT}: this checkout.
# Set, not read (update() rather than os.environ[...]: the linter takes any subscript for a read
# that would need an `envvars:` assertion).
os.environ.update(FEDSHIFT_ROOT=os.path.abspath(os.path.join(workflow.basedir, "..")))

from fedshift.errors import ConfigError
from fedshift.experiments import WORKFLOW_KEYS, load_experiments, write_configs, write_if_changed, dump_config

DATA_PARAMS = config.get("data_params", "params/data.yaml")
# Execution keys set by a profile or --config (WORKFLOW_KEYS) are not part of the experiment grid.
GRID = {k: v for k, v in config.items() if k not in WORKFLOW_KEYS}
# `--config engine='{rounds: 3}'`: Snakemake parses nested values with YAML's BaseLoader, so every
# scalar arrives as a string ('3'); typed here as a grid file would type it (fedshift.overrides).
# Dotted keys (engine.rounds=3) Snakemake refuses: `fedshift run GRID engine.rounds=3 -- ARGS`.
from fedshift.overrides import check_targets, coerce_cli_strings

_CLI_KEYS = coerce_cli_strings(GRID, {k: v for k, v in (workflow.config_settings.config or {}).items()
                                      if k not in WORKFLOW_KEYS})
try:  # `--config 'methods={fedprox: {mu: 0.1}}'` on a grid without FedProx would change nothing: refused (issue 50)
    check_targets(GRID, _CLI_KEYS)
except ConfigError as exc:
    raise WorkflowError(f"fedshift: error: {exc}") from None
# A user grid (--configfile) reports only what it names: its report block replaces the default's
# instead of being merged into it (else it inherits report.published from params/experiments.yaml).
_USER_FILES = [f for f in workflow.overwrite_configfiles or []
               if os.path.abspath(f) != os.path.abspath("params/experiments.yaml")]
if _USER_FILES:
    from fedshift.experiments import check_grid_file, check_overlays, deep_merge, load_yaml

    _USER_DOCS = [load_yaml(_f) for _f in _USER_FILES]  # each file read once
    try:  # each file's shape (issue 51 A40); an overlay (overlay_of) refuses to plan without the grid it adds to
        for _f, _doc in zip(_USER_FILES, _USER_DOCS):
            check_grid_file(_doc, _f)
        check_overlays(_USER_FILES, _USER_DOCS)
    except ConfigError as exc:
        raise WorkflowError(f"fedshift: error: {exc}") from None

    GRID["report"] = {}
    _OWN = {}
    for _doc in _USER_DOCS:
        GRID["report"] = deep_merge(GRID["report"], _doc.get("report") or {})
        _OWN = deep_merge(_OWN, _doc)
    # the grid's own methods: block outranks the base file's scenario_overrides (said, one line per key)
    from fedshift.experiments import user_methods_win

    _report = GRID.pop("report")
    GRID, _notes = user_methods_win(GRID, _OWN)
    GRID["report"] = _report
    for _note in _notes:
        print(f"fedshift: note: {_note}", file=sys.stderr)
# fedshift's reader bounds what YAML aliases expand to (an alias bomb would exhaust memory in the
# schema check below; issue 38): every grid file passes it first.
from fedshift.experiments import load_yaml as _load_yaml

for _f in ["params/experiments.yaml"] + list(workflow.overwrite_configfiles or []):
    try:
        _load_yaml(_f) if os.path.exists(_f) else None
    except ConfigError as exc:
        raise WorkflowError(f"fedshift: error: {exc}") from None
validate(GRID, schema="../schemas/experiments.schema.yaml")
try:
    PLAN = load_experiments(GRID, DATA_PARAMS)
    from fedshift.tune import plan_tune  # issue 36: the grid's tune block (rules/tune.smk), before the configs

    TUNE = plan_tune(GRID, PLAN)
    # the data already built is the data this grid names (issue 51 R18): else one line, before any job
    from fedshift.experiments import check_built_data

    check_built_data([*PLAN.federate.values(), *PLAN.pretrain.values(), *TUNE.candidates.values()], DATA_PARAMS)
except ConfigError as exc:
    raise WorkflowError(f"fedshift: error: {exc}") from None

FED_CONFIGS, PRE_CONFIGS = write_configs(PLAN)

# The main grid reports to results/{collect,report}; a named grid (report.name, e.g. the
# ablation grids in params/ablations/) to results/ablations/<name>/, so grids never
# overwrite each other's tables while sharing every run they have in common.
REPORT_NAME = PLAN.report.get("name")
RESULTS_ROOT = f"results/ablations/{REPORT_NAME}" if REPORT_NAME else "results"
COLLECT_CSV = f"{RESULTS_ROOT}/collect/runs.csv"
REPORT_DIR = f"{RESULTS_ROOT}/report"
REPORT_CONFIG = f"results/configs/report-{REPORT_NAME or 'main'}.yaml"

# The committed archive (issue 52, fedshift.archive): a run whose record in records/<grid>/ is current
# (same settings on every key both know, same data where built) is not planned again; collect reads the
# record. A stale record is listed here with the keys that differ, and the run is planned again.
# `--config records=none` plans every run as if nothing were archived (to rerun a whole grid, or to see
# its full plan once every run is committed); `--config records=<dir>` reads another archive root.
from fedshift.archive import GridStatus, grid_status, plan_targets

RECORDS_ROOT = str(config.get("records", "records"))
if RECORDS_ROOT == "none":
    ARCHIVE = GridStatus(REPORT_NAME, Path("records"), {}, {})
elif not Path(RECORDS_ROOT).is_dir() and RECORDS_ROOT != "records":
    raise WorkflowError(f"fedshift: error: --config records={RECORDS_ROOT}: no such folder; an archive root (default `records`) "
                        "or `none` (plan every run, read no record)")
else:
    ARCHIVE = grid_status(PLAN, TUNE, root=Path(RECORDS_ROOT))
for _s in ARCHIVE.stale():
    print(f"fedshift: archive: {_s.line()}; the run is planned again, the record left out", file=sys.stderr)
TARGETS = plan_targets(PLAN, TUNE, ARCHIVE)
ARCHIVE_STATUS = f"results/configs/archive-{REPORT_NAME or 'main'}.json"
import json as _json

write_if_changed(ARCHIVE_STATUS, _json.dumps(ARCHIVE.as_json(), indent=1) + "\n")  # the report lists them
write_if_changed(REPORT_CONFIG, dump_config(PLAN.report))

SCENARIOS_USED = sorted({j.scenario for j in PLAN.federate})
PUBLIC_USED = sorted({c["public"] for c in PLAN.federate.values() if c["paths"]["public"]})

# Cheap bookkeeping rules run where Snakemake runs, not as cluster jobs.
localrules:
    dvc_repro,
    partition_seed,
    partition_protocol,
    public_seed,
    collect,
    report,


wildcard_constraints:
    seed=r"\d+",
    scenario=r"[a-z0-9_]+",
    public=r"[a-z0-9_]+",
    participant=r"[a-z0-9_]+",
    arch=r"[a-z0-9_]+",
    structure=r"[a-z0-9_]+",
    method=r"[a-z0-9_\-]+",
    rid=r"[0-9a-f]{12}",  # a run's identity (fedshift.provenance.run_identity; issue 50)


def federate_key(wc):
    """The job's run folder under results/federate/ (PLAN.folder): its slot and its identity."""
    return f"{wc.scenario}/{wc.public}/{wc.method}/{wc.structure}/seed{wc.seed}-{wc.rid}"


def federate_inputs(wc):
    cfg = PLAN.federate_config(federate_key(wc))
    inputs = {
        "config": f"results/configs/federate/{federate_key(wc)}.yaml",
        # build/partitions/<scenario> (dvc repro), or its redraw with the run seed (engine.data_seed: run)
        "partition": f"{cfg['paths']['partition']}/manifest.json",
    }
    if cfg["paths"]["public"]:
        inputs["public"] = f"{cfg['paths']['public']}/manifest.json"
    for i, ckpt in enumerate(cfg["paths"]["pretrained"] or []):
        inputs[f"pretrained_{i}"] = ckpt
    if cfg.get("tuned"):  # issue 36: the values chosen on validation (rules/tune.smk)
        inputs["tuned"] = cfg["tuned"]["file"]
    return inputs


def federate_data(wc):
    """The content of the data folders the job reads (a `params:` entry: Snakemake's params trigger
    reruns the job when its data was rebuilt, even while it ran; fedshift.provenance, issue 38)."""
    from fedshift.provenance import data_fingerprint

    cfg = PLAN.federate_config(federate_key(wc))
    return data_fingerprint([cfg["paths"]["partition"]] + ([cfg["paths"]["public"]] if cfg["paths"]["public"] else []))


def pretrain_data(wc):
    from fedshift.provenance import data_fingerprint

    return data_fingerprint([pretrain_cfg(wc)["paths"]["partition"]])


FEDERATE_METRICS = [f"results/federate/{PLAN.folder(j)}/metrics.json" for j in TARGETS.federate]
PRETRAIN_METRICS = [f"results/pretrain/{PLAN.folder(j)}/metrics.json" for j in TARGETS.pretrain]
ARCHIVED_METRICS = [f"{p}/metrics.json" for p in TARGETS.archived_federate]  # committed records (issue 52)
ARCHIVED_PRETRAIN = [f"{p}/metrics.json" for p in TARGETS.archived_pretrain]


onstart:
    # Create the MLflow SQLite store (schema migrations) once, before parallel jobs
    # would race to migrate it.
    # Tracking never costs a run: an unreachable server or broken store is a warning here
    # (each job then warns and runs untracked, see fedshift.tracking), not an aborted workflow.
    if os.environ.get("FEDSHIFT_TRACKING", "mlflow") != "none":
        from fedshift.tracking import default_uri, init_store

        try:
            init_store()
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            print(f"fedshift: warning: MLflow tracking at {default_uri()} is unreachable "
                  f"({type(exc).__name__}: {first}); the jobs run and are not tracked", file=sys.stderr)


# ---------------------------------------------------------------------------------------
# Resources of the training rules (pretrain, federate): what SLURM is asked for.
#
# * threads: the config's engine.threads / pretrain.threads when set, else `threads_per_job`
#   (workflow config, default 2). The rules pass {threads} to `fedshift --threads`, so
#   torch's intra-op pool is exactly the allocation (SLURM --cpus-per-task).
# * gpu: `gpus_per_job` (workflow config, default 0): THE one setting that requests a GPU
#   per training job (`--gpus=1` through the SLURM plugin's `gpu` resource). Set it in
#   the profile (`config: {gpus_per_job: 1}`) or on the command line
#   (`--config gpus_per_job=1`). A run uses one device, so only 0 or 1 are valid.
# * mem_mb: fedshift.resources' model of the job: interpreter + torch + MLflow (measured),
#   the job's arrays (read off its data folders), each participant's weights times the copies
#   the method and optimiser keep, and the activations of its largest training phase (counted
#   per architecture at the scenario's image size on torch's meta device, times the batch),
#   fitted to the peak RSS of real jobs (benchmarks/memory_model.py); one shared model under
#   engine.server_model (flat in K), capped at FEDSHIFT_MAX_MEM_MB with a warning; requested at 1.3x the
#   estimate + the Snakemake process inside the allocation (WRAPPER_MB: 900 MB; 0.6-0.8 GB measured in sacct's MaxRSS),
#   >= 1.25x the measured peaks, doubled on each retry (`retries` in the SLURM
#   profile). On a GPU (gpus_per_job: 1) the host holds the CUDA runtime and the data only.
# * runtime (minutes): fedshift.resources' run-time model (slurm_runtime): rounds x epochs x
#   participants at the demo's measured cost on one CPU thread (~4 s per participant-epoch at
#   28x28, scaled by pixels; the stepwise methods FedH2L/AGG/IND: ~0.12 s per round of four
#   LeNets, one step each), at least 15, doubled on each retry. On a GPU the real time is far
#   below: override with `--set-resources federate:runtime=60` when a cluster's queues favour
#   short requests.
# Override any of them without editing rules: `--set-resources federate:mem_mb=64000`.
# ---------------------------------------------------------------------------------------
from fedshift.resources import slurm_mem_mb, slurm_runtime

GPUS_PER_JOB = int(config.get("gpus_per_job", 0))
if GPUS_PER_JOB not in (0, 1):
    raise WorkflowError(f"fedshift: error: gpus_per_job: {GPUS_PER_JOB} is not valid: a run uses one device, "
                        "use 0 (CPU) or 1 (one GPU per job); pack several jobs per GPU as described in "
                        "workflow/profiles/README.md")
THREADS_PER_JOB = int(config.get("threads_per_job", 2))


def federate_cfg(wc):
    return PLAN.federate_config(federate_key(wc))


def federate_threads(wc):
    return int(federate_cfg(wc)["engine"].get("threads") or THREADS_PER_JOB)


def federate_mem_mb(wc, attempt):
    return slurm_mem_mb(federate_cfg(wc), attempt, gpus=GPUS_PER_JOB)


def federate_runtime(wc, attempt):
    return slurm_runtime(federate_cfg(wc), attempt, threads=federate_threads(wc))


def pretrain_key(wc):
    return f"{wc.scenario}/{wc.participant}/{wc.arch}/seed{wc.seed}-{wc.rid}"


def pretrain_cfg(wc):
    return PLAN.pretrain_config(pretrain_key(wc))


def pretrain_inputs(wc):
    return {
        "config": f"results/configs/pretrain/{pretrain_key(wc)}.yaml",
        "partition": f"{pretrain_cfg(wc)['paths']['partition']}/manifest.json",
    }


def pretrain_threads(wc):
    return int(pretrain_cfg(wc)["pretrain"].get("threads") or THREADS_PER_JOB)


def pretrain_mem_mb(wc, attempt):
    return slurm_mem_mb(pretrain_cfg(wc), attempt, gpus=GPUS_PER_JOB)


def pretrain_runtime(wc, attempt):
    return slurm_runtime(pretrain_cfg(wc), attempt, threads=pretrain_threads(wc))


def report_labels(wc):
    """HTML report labels: the kind, the group (scenario__public__structure) and the file type
    (labels must differ within a category: delta__<table>.png and .csv are both listed)."""
    group = getattr(wc, "group", None)
    if group:
        return {"kind": wc.kind, "group": group, "file": wc.ext}
    return {"kind": wc.kind, "file": f"{wc.kind}.{wc.ext}"}


# ---------------------------------------------------------------------------------------
# Tune, then run (issue 36, rules/tune.smk): candidate configs, inputs and resources (as federate's).
# ---------------------------------------------------------------------------------------
from fedshift.tune import write_candidate_configs, write_leak_specs

TUNE_CONFIGS = write_candidate_configs(TUNE)
TUNE_LEAK_SPECS = write_leak_specs(TUNE)  # issue 47: the leak guard's count on the built partitions
TUNED_TABLE = [TUNE.table] if TUNE.table else []


def tune_key(wc):
    return f"{wc.scenario}/{wc.public}/{wc.method}/{wc.structure}/{wc.candidate}/seed{wc.seed}-{wc.rid}"


def tune_cfg(wc):
    return TUNE.candidates[tune_key(wc)]


def tune_inputs(wc):
    cfg = tune_cfg(wc)
    inputs = {"config": TUNE_CONFIGS[tune_key(wc)], "partition": f"{cfg['paths']['partition']}/manifest.json",
              "leaks": TUNE.leaks[wc.scenario]["file"]}  # no candidate runs before its scenario's leak count
    if cfg["paths"]["public"]:
        inputs["public"] = f"{cfg['paths']['public']}/manifest.json"
    for i, ckpt in enumerate(cfg["paths"]["pretrained"] or []):
        inputs[f"pretrained_{i}"] = ckpt
    return inputs


def tune_threads(wc):
    return int(tune_cfg(wc)["engine"].get("threads") or THREADS_PER_JOB)


def tune_mem_mb(wc, attempt):
    return slurm_mem_mb(tune_cfg(wc), attempt, gpus=GPUS_PER_JOB)


def tune_runtime(wc, attempt):
    return slurm_runtime(tune_cfg(wc), attempt, threads=tune_threads(wc))


def tune_leak_inputs(wc):
    """The partitions the leak count reads: every tuning seed's and every reported seed's."""
    job = TUNE.leaks[wc.scenario]
    folders = dict.fromkeys(d["folder"] for d in job["tuning"] + job["reported"])
    return {"spec": TUNE_LEAK_SPECS[wc.scenario], **{f"partition_{i}": f"{f}/manifest.json" for i, f in enumerate(folders)}}


def tune_group_metrics(wc):
    group = f"{wc.scenario}/{wc.public}/{wc.method}/{wc.structure}"
    return [f"results/tune/{k}/metrics.json" for g, keys in TUNE.groups.items()
            if g.path == group and TUNE.group_id(g) == wc.gid for k in keys]
