# Gather every run into one tidy table, then draw the paper-style tables and figures.
# Paths: results/{collect,report} for the main grid, results/ablations/<name>/ for a
# named grid (report.name), see common.smk. The report also compares with the published
# tables the grid names (report.published) and evaluates the papers' claims, so both are inputs.
# `snakemake --report report.html` bundles the tables and figures with the captions of
# workflow/report/ (one entry per file of the report folder, grouped by kind; report.html and
# claims.html show report.md and claims.csv inline, the .md/.csv download), and report.md,
# the paper delta (delta__<table>.csv/.png, delta_summary.csv), the claims (claims.csv) and the
# flagged published values as their own items, with captions that say what the ± is.

report: "../report/workflow.rst"

PUBLISHED_CSVS = [
    f"params/papers/published/{e if isinstance(e, str) else e['name']}.csv"
    for e in PLAN.report.get("published", []) or []
]
CLAIMS = [p for p in ["params/papers/claims.yaml"] if os.path.exists(p)]
# the grid's own claims (report.claims) when they live in a file: a change reruns the report
GRID_CLAIMS = [PLAN.report["claims"]] if isinstance(PLAN.report.get("claims"), str) else []


rule collect:
    input:
        runs=FEDERATE_METRICS,
        # The papers' SOLO/BASE row (base_pretrain) comes from the pretrain runs (50 epochs alone).
        pretrain=PRETRAIN_METRICS,
        # issue 52: runs whose committed record (records/<grid>/) is current are read from it, not rerun
        archived=ARCHIVED_METRICS,
        archived_pretrain=ARCHIVED_PRETRAIN,
    output:
        report(COLLECT_CSV, caption="../report/runs.rst", category="Runs", labels={"table": "runs.csv"}),
    conda:
        "../envs/fedshift.yaml"
    log:
        f"logs/collect-{REPORT_NAME or 'main'}.log",
    params:
        runs=lambda wc, input: " ".join(os.path.dirname(p) for p in input.runs + input.archived),
        pretrain=lambda wc, input: " ".join(os.path.dirname(p) for p in input.pretrain + input.archived_pretrain),
    shell:
        # stderr also to the terminal: the runs collect leaves out (inputs changed since; issue 38)
        "fedshift collect {output} {params.runs} --pretrain {params.pretrain} > {log} 2> >(tee -a {log} >&2)"


rule report:
    input:
        runs=COLLECT_CSV,
        config=REPORT_CONFIG,
        published=PUBLISHED_CSVS,
        claims=CLAIMS,
        grid_claims=GRID_CLAIMS,
        tuned=TUNED_TABLE,  # issue 36: the tuned table (rules/tune.smk), [] when the grid tunes nothing
        archive=ARCHIVE_STATUS,  # issue 52: the committed records read or left out (stale), with their code
    output:
        report(
            directory(REPORT_DIR),
            # ext is a label too: delta__<table>.png and .csv are two items, not one (a category
            # listed 4 entries for 8 files); report.html / claims.html are the inline views.
            patterns=[
                "{kind,[a-z0-9]+(?:_[a-z0-9]+)*}__{group}.{ext,png|csv}",
                "{kind,report|claims|delta_summary|published_flags|h2l_selected|tuned|comparison|grid_claims|tables}"
                ".{ext,md|csv|html|tex}",
            ],
            caption="../report/results.rst",
            category="{kind}",
            labels=report_labels,
        ),
    conda:
        "../envs/fedshift.yaml"
    log:
        f"logs/report-{REPORT_NAME or 'main'}.log",
    shell:
        "fedshift report {input.runs} {output} --config {input.config} --archive {input.archive} > {log} 2>&1"
