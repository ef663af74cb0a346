# Load and validate the experiment grid, resolve every job's config, build target lists.
import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("9.0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from fedshift.errors import ConfigError
from fedshift.experiments import load_experiments, write_configs, write_if_changed, dump_config

DATA_PARAMS = config.get("data_params", "params/data.yaml")
validate({k: v for k, v in config.items() if k != "data_params"}, schema="../schemas/experiments.schema.yaml")
try:
    PLAN = load_experiments({k: v for k, v in config.items() if k != "data_params"}, DATA_PARAMS)
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
write_if_changed(REPORT_CONFIG, dump_config(PLAN.report))

SCENARIOS_USED = sorted({j.scenario for j in PLAN.federate})
PUBLIC_USED = sorted({c["public"] for c in PLAN.federate.values() if c["paths"]["public"]})

# Cheap bookkeeping rules run where Snakemake runs, not as cluster jobs.
localrules:
    dvc_repro,
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


def federate_key(wc):
    return f"{wc.scenario}/{wc.public}/{wc.method}/{wc.structure}/seed{wc.seed}"


def federate_inputs(wc):
    cfg = PLAN.federate_config(federate_key(wc))
    inputs = {
        "config": f"results/configs/federate/{federate_key(wc)}.yaml",
        "partition": f"build/partitions/{wc.scenario}/manifest.json",
    }
    if cfg["paths"]["public"]:
        inputs["public"] = f"{cfg['paths']['public']}/manifest.json"
    for i, ckpt in enumerate(cfg["paths"]["pretrained"] or []):
        inputs[f"pretrained_{i}"] = ckpt
    return inputs


FEDERATE_METRICS = [f"results/federate/{j.path}/metrics.json" for j in PLAN.federate]
PRETRAIN_METRICS = [f"results/pretrain/{j.path}/metrics.json" for j in PLAN.pretrain]


onstart:
    # Create the MLflow SQLite store (schema migrations) once, before parallel jobs
    # would race to migrate it.
    if os.environ.get("FEDSHIFT_TRACKING", "mlflow") != "none":
        from fedshift.tracking import init_store

        init_store()
