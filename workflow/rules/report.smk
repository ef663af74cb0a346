# Gather every run into one tidy table, then draw the paper-style tables and figures.
# Paths: results/{collect,report} for the main grid, results/ablations/<name>/ for a
# named grid (report.name), see common.smk.


rule collect:
    input:
        runs=FEDERATE_METRICS,
        # The papers' SOLO/BASE row (base_pretrain) comes from the pretrain runs (50 epochs alone).
        pretrain=PRETRAIN_METRICS,
    output:
        COLLECT_CSV,
    conda:
        "../../environment.yml"
    log:
        f"logs/collect-{REPORT_NAME or 'main'}.log",
    params:
        runs=lambda wc, input: " ".join(os.path.dirname(p) for p in input.runs),
        pretrain=lambda wc, input: " ".join(os.path.dirname(p) for p in input.pretrain),
    shell:
        "fedshift collect {output} {params.runs} --pretrain {params.pretrain} > {log} 2>&1"


rule report:
    input:
        runs=COLLECT_CSV,
        config=REPORT_CONFIG,
    output:
        directory(REPORT_DIR),
    conda:
        "../../environment.yml"
    log:
        f"logs/report-{REPORT_NAME or 'main'}.log",
    shell:
        "fedshift report {input.runs} {output} --config {input.config} > {log} 2>&1"
