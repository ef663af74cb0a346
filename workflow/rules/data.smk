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


# A grid's test_protocol other than its data file's (issue 47; docs/datasets.md "Test protocols"): the
# scenario drawn under that protocol (e.g. `authors`: the authors' code's whole-folder Office test), with the
# run seed under engine.data_seed: run, else the data file's seed. Not a DVC stage, like partition_seed.
rule partition_protocol:
    input:
        "build/partitions/{scenario}/manifest.json",
    output:
        "build/partitions_{protocol}/{scenario}/seed{seed}/manifest.json",
    wildcard_constraints:
        protocol="clean|authors",
    conda:
        "../envs/fedshift.yaml"
    params:
        data=DATA_PARAMS,
        # the scenario's data-file entry: two grids drawing one folder from different entries (Table 3's
        # authors_code: fccl, Table VIII's fccl_plus) rebuild it instead of reading the other's draw
        entry=lambda wc: repr(sorted((PLAN.data.get(wc.scenario) or ({}, None))[0].items())),
    log:
        "logs/partition_{protocol}/{scenario}/seed{seed}.log",
    shell:
        "fedshift partition {wildcards.scenario} --seed {wildcards.seed} --test-protocol {wildcards.protocol} "
        "--params {params.data} --out $(dirname {output}) > {log} 2>&1"


# engine.data_seed: run: the public subset redrawn with the run seed, as the authors' code redraws its
# 5,000 CIFAR-100 images with every seed (fccl+/datasets/utils/public_dataset.py:70-79). Its own public set
# (from `dvc repro`) is the input only to order the two: the redraw reads build/datasets/.
rule public_seed:
    input:
        "build/public/{public}/manifest.json",
    output:
        "build/public_seeded/{public}/seed{seed}/manifest.json",
    conda:
        "../envs/fedshift.yaml"
    params:
        data=DATA_PARAMS,
    log:
        "logs/public_seed/{public}/seed{seed}.log",
    shell:
        "fedshift public {wildcards.public} --seed {wildcards.seed} --params {params.data} "
        "--out $(dirname {output}) > {log} 2>&1"
