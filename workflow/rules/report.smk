# Gather every run into one tidy table, then draw the paper-style tables and figures.
# Paths: results/{collect,report} for the main grid, results/ablations/<name>/ for a
# named grid (report.name), see common.smk.
# `snakemake --report report.html` bundles the tables and figures with the captions of
# workflow/report/ (one entry per file of the report folder, grouped by kind).

report: "../report/workflow.rst"


rule collect:
    input:
        FEDERATE_METRICS,
    output:
        report(COLLECT_CSV, caption="../report/runs.rst", category="Runs", labels={"table": "runs.csv"}),
    conda:
        "../../environment.yml"
    log:
        f"logs/collect-{REPORT_NAME or 'main'}.log",
    params:
        runs=lambda wc, input: " ".join(os.path.dirname(p) for p in input),
    shell:
        "fedshift collect {output} {params.runs} > {log} 2>&1"


rule report:
    input:
        runs=COLLECT_CSV,
        config=REPORT_CONFIG,
    output:
        report(
            directory(REPORT_DIR),
            patterns=["{kind,[a-z0-9]+(?:_[a-z0-9]+)*}__{group}.png", "{kind,[a-z0-9]+(?:_[a-z0-9]+)*}__{group}.csv"],
            caption="../report/results.rst",
            category="{kind}",
            labels={"kind": "{kind}", "group": "{group}"},
        ),
    conda:
        "../../environment.yml"
    log:
        f"logs/report-{REPORT_NAME or 'main'}.log",
    shell:
        "fedshift report {input.runs} {output} --config {input.config} > {log} 2>&1"
