# Data comes from DVC (dvc.yaml): this rule only runs `dvc repro` when the partitions or
# public sets the grid needs are missing, so whichever of `dvc repro` and `snakemake`
# runs second finds the data up to date. After editing params/data.yaml run `dvc repro`:
# changed partitions get new manifests, which re-runs the jobs that read them.


rule dvc_repro:
    output:
        expand("build/partitions/{scenario}/manifest.json", scenario=SCENARIOS_USED),
        expand("build/public/{public}/manifest.json", public=PUBLIC_USED),
    conda:
        "../../environment.yml"
    log:
        "logs/dvc_repro.log",
    shell:
        "mkdir -p data && dvc repro > {log} 2>&1"
