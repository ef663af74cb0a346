# Data comes from DVC (dvc.yaml): this rule only runs `dvc repro` of the partitions and public sets
# the grid needs (partition@<scenario>, public@<set>), and only when they are missing, so whichever
# of `dvc repro` and `snakemake` runs second finds the data up to date. After editing params/data.yaml run `dvc repro`:
# changed partitions get new manifests, which re-runs the jobs that read them.


rule dvc_repro:
    output:
        expand("build/partitions/{scenario}/manifest.json", scenario=SCENARIOS_USED),
        expand("build/public/{public}/manifest.json", public=PUBLIC_USED),
    conda:
        "../envs/fedshift.yaml"
    params:
        # the grid's data file (its `data_params` key, or --config data_params=...): DVC builds from
        # params/data.yaml only, so a grid naming another file stops here with one line (issue 22 pt 4)
        data=DATA_PARAMS,
        # only the stages this grid reads (and, through dvc.yaml's dependencies, the datasets they are
        # drawn from): a grid of two scenarios fetches and partitions two, whatever params/data.yaml lists
        targets=" ".join([f"partition@{s}" for s in SCENARIOS_USED] + [f"public@{p}" for p in PUBLIC_USED]),
    log:
        "logs/dvc_repro.log",
    shell:
        # fedshift dvc-repro: the checks' error lines live in Python, not in this printed command (issue 50)
        "fedshift dvc-repro --data {params.data} --log {log} --expect {output} -- {params.targets}"


# engine.data_seed: run: the partition redrawn with the run seed, from the datasets `dvc repro` fetched
# (its own partition is the input only to order the two: the redraw reads build/datasets/). Not a DVC
# stage: which seeds a grid needs is the grid's business; the manifest records the seed and every sha256.
rule partition_seed:
    input:
        "build/partitions/{scenario}/manifest.json",
    output:
        "build/partitions_seeded/{scenario}/seed{seed}/manifest.json",
    conda:
        "../envs/fedshift.yaml"
    params:
        data=DATA_PARAMS,
    log:
        "logs/partition_seed/{scenario}/seed{seed}.log",
    shell:
        "fedshift partition {wildcards.scenario} --seed {wildcards.seed} --params {params.data} "
        "--out $(dirname {output}) > {log} 2>&1"
