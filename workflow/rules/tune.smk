# Tune, then run (issue 36, docs/tuning.md): a grid's `tune:` block fans every candidate of every
# tuned (scenario, public, method, structure) out as an ordinary federated job on the validation
# holdout (checkpointed and resumable like `federate`, one SLURM job each), `tune_select` keeps the
# best candidate by validation score, and the group's seeded runs take chosen.yaml as an input.
# threads/mem_mb/runtime/gpu: as the federate rule's (common.smk), read off the candidate's config.

from fedshift.tune import write_candidate_configs

TUNE_CONFIGS = write_candidate_configs(TUNE)
TUNED_TABLE = [TUNE.table] if TUNE.table else []


def tune_key(wc):
    return f"{wc.scenario}/{wc.public}/{wc.method}/{wc.structure}/{wc.candidate}/seed{wc.seed}"


def tune_cfg(wc):
    return TUNE.candidates[tune_key(wc)]


def tune_inputs(wc):
    cfg = tune_cfg(wc)
    inputs = {"config": TUNE_CONFIGS[tune_key(wc)], "partition": f"build/partitions/{wc.scenario}/manifest.json"}
    if cfg["paths"]["public"]:
        inputs["public"] = f"{cfg['paths']['public']}/manifest.json"
    for i, ckpt in enumerate(cfg["paths"]["pretrained"] or []):
        inputs[f"pretrained_{i}"] = ckpt
    return inputs


def tune_threads(wc):
    return int(tune_cfg(wc)["engine"].get("threads") or THREADS_PER_JOB)


def tune_mem_mb(wc, attempt):
    from fedshift.resources import slurm_mem_mb

    return slurm_mem_mb(tune_cfg(wc), attempt, gpus=GPUS_PER_JOB)


def tune_runtime(wc, attempt):
    cfg = tune_cfg(wc)
    e = cfg["engine"]
    scale = len(cfg["archs"]) * _pixel_scale(wc.scenario) / tune_threads(wc) ** 0.5
    per_round = STEP_MINUTES / 4 if _stepwise(cfg["base_method"]) else (e["local_epochs"] + e.get("public_epochs", 1)) * EPOCH_MINUTES
    return int(max(15, math.ceil(2 * e["rounds"] * per_round * scale)) * 2 ** (attempt - 1))


def tune_group_metrics(wc):
    group = f"{wc.scenario}/{wc.public}/{wc.method}/{wc.structure}"
    return [f"results/tune/{k}/metrics.json" for g, keys in TUNE.groups.items() if g.path == group for k in keys]


# Rules only where the grid tunes something (no empty-output rule otherwise).
if TUNE.groups:

    localrules:
        tune_select,
        tune_table,

    wildcard_constraints:
        candidate=r"c[0-9a-f]{8}",


    rule tune_candidate:
        input:
            unpack(tune_inputs),
        output:
            metrics="results/tune/{scenario}/{public}/{method}/{structure}/{candidate}/seed{seed}/metrics.json",
        conda:
            "../envs/fedshift.yaml"
        log:
            "logs/tune/{scenario}/{public}/{method}/{structure}/{candidate}/seed{seed}.log",
        threads: tune_threads
        resources:
            mem_mb=tune_mem_mb,
            runtime=tune_runtime,
            gpu=GPUS_PER_JOB,
        shell:
            # The federate rule's command: a candidate config carries `tune`, so a diverged candidate is
            # recorded (metrics.json: diverged) instead of failing the workflow.
            ": > {log}; exec fedshift federate --die-with-parent --threads {threads} {input.config} $(dirname {output.metrics}) >> {log} 2> >(tee -a {log} >&2)"


    rule tune_select:
        input:
            tune_group_metrics,
        output:
            "results/tune/{scenario}/{public}/{method}/{structure}/chosen.yaml",
        conda:
            "../envs/fedshift.yaml"
        log:
            "logs/tune/{scenario}/{public}/{method}/{structure}/select.log",
        shell:
            "python -m fedshift.tune select {output} {input} > {log} 2>&1"


    rule tune_table:
        input:
            [TUNE.chosen_file(g) for g in TUNE.groups],
        output:
            TUNED_TABLE,
        conda:
            "../envs/fedshift.yaml"
        log:
            f"logs/tune-table-{REPORT_NAME or 'main'}.log",
        shell:
            "python -m fedshift.tune table {output} {input} > {log} 2>&1"
