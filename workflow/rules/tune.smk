# Tune, then run (issue 36, docs/tuning.md): a grid's `tune:` block fans every candidate of every
# tuned (scenario, public, method, structure) out as an ordinary federated job on the validation
# holdout (checkpointed and resumable like `federate`, one SLURM job each), `tune_select` keeps the
# best candidate by validation score (chosen-<group id>.yaml: another search, another file), and the
# group's seeded runs take it as an input.
# threads/mem_mb/runtime/gpu: as the federate rule's (common.smk), read off the candidate's config.
# The helper functions and TUNE_CONFIGS / TUNED_TABLE are in common.smk (the linter's layout).

# Rules only where the grid tunes something (no empty-output rule otherwise).
if TUNE.groups:

    localrules:
        tune_leaks,
        tune_select,
        tune_table,

    wildcard_constraints:
        candidate=r"c[0-9a-f]{8}",
        gid=r"[0-9a-f]{12}",


    # Issue 47: no validation image of a tuning seed may be a test image of a reported seed. The plan already
    # refused what the scenario's construction cannot rule out (fedshift.tune.leak_guard); this job counts by
    # source row and by pixel hash on the built partitions and fails in one line on any overlap, before any
    # candidate of the scenario runs.
    rule tune_leaks:
        input:
            unpack(tune_leak_inputs),
        output:
            "results/tune/{scenario}/leaks.json",
        conda:
            "../envs/fedshift.yaml"
        log:
            "logs/tune/{scenario}/leaks.log",
        shell:
            "python -m fedshift.tune leaks {output} {input.spec} > {log} 2> >(tee -a {log} >&2)"


    rule tune_candidate:
        input:
            unpack(tune_inputs),
        output:
            metrics="results/tune/{scenario}/{public}/{method}/{structure}/{candidate}/seed{seed}-{rid}/metrics.json",
        conda:
            "../envs/fedshift.yaml"
        log:
            "logs/tune/{scenario}/{public}/{method}/{structure}/{candidate}/seed{seed}-{rid}.log",
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
            "results/tune/{scenario}/{public}/{method}/{structure}/chosen-{gid}.yaml",
        conda:
            "../envs/fedshift.yaml"
        log:
            "logs/tune/{scenario}/{public}/{method}/{structure}/select-{gid}.log",
        shell:
            "python -m fedshift.tune select {output} {input} > {log} 2>&1"


    rule tune_table:
        input:
            # each group's selection: results/tune/... when its seeded runs run, else its committed record
            list(TARGETS.chosen_files.values()),
        output:
            TUNED_TABLE,
        conda:
            "../envs/fedshift.yaml"
        log:
            f"logs/tune-table-{REPORT_NAME or 'main'}.log",
        shell:
            "python -m fedshift.tune table {output} {input} > {log} 2>&1"
