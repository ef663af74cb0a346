# Gather every run into one tidy table, then draw the paper-style tables and figures.


rule collect:
    input:
        FEDERATE_METRICS,
    output:
        "results/collect/runs.csv",
    conda:
        "../../environment.yml"
    log:
        "logs/collect.log",
    params:
        runs=lambda wc, input: " ".join(os.path.dirname(p) for p in input),
    shell:
        "fedshift collect {output} {params.runs} > {log} 2>&1"


rule report:
    input:
        runs="results/collect/runs.csv",
        config="results/configs/report.yaml",
    output:
        directory("results/report"),
    conda:
        "../../environment.yml"
    log:
        "logs/report.log",
    shell:
        "fedshift report {input.runs} {output} --config {input.config} > {log} 2>&1"
