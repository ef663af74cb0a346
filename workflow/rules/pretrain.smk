# SOLO/BASE: each participant's model trained on its private data alone; the checkpoint
# is the starting point of methods whose `init` is "base", the teacher theta* of FCCL+
# without FNTD, and the report's base_pretrain row. A job checkpoints itself every epoch
# into results/pretrain/.../seed<k>-<rid>.partial/ (not a declared output): a rerun resumes.


rule pretrain:
    input:
        unpack(pretrain_inputs),
    output:
        model="results/pretrain/{scenario}/{participant}/{arch}/seed{seed}-{rid}/model.pt",
        metrics="results/pretrain/{scenario}/{participant}/{arch}/seed{seed}-{rid}/metrics.json",
        rounds="results/pretrain/{scenario}/{participant}/{arch}/seed{seed}-{rid}/rounds.csv",
    params:
        # the content of its data (dvc.lock's hash, else the manifest's sha256): a rebuilt partition
        # reruns the job even when file times say it is newer (data rebuilt while it ran; issue 38)
        data=pretrain_data,
    conda:
        "../envs/fedshift.yaml"
    log:
        "logs/pretrain/{scenario}/{participant}/{arch}/seed{seed}-{rid}.log",
    # BASE checkpoints gate the methods that start from them: schedule them first so those
    # runs do not end up alone on the critical path.
    priority: 10
    threads: pretrain_threads
    resources:
        mem_mb=pretrain_mem_mb,
        runtime=pretrain_runtime,
        gpu=GPUS_PER_JOB,
    shell:
        # exec: the job's parent is Snakemake, so it stops (checkpoint kept, nothing published)
        # when Snakemake is killed (fedshift --die-with-parent; issue 23 case 8).
        # stdout (the job's log lines) goes to the log; stderr (one progress line per finished
        # round with the device, warnings, errors) goes to the log and to Snakemake's terminal.
        ": > {log}; exec fedshift pretrain --die-with-parent --threads {threads} {input.config} $(dirname {output.model}) >> {log} 2> >(tee -a {log} >&2)"
