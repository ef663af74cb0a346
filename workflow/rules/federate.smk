# One federated run per scenario x public set x method x structure x seed; the folder's {rid} is the run's
# identity (fedshift.provenance.run_identity: a hash of its settings), so grids that set a method differently
# never share a folder.
# A job checkpoints itself into results/federate/.../seed<k>-<rid>.partial/ (not a declared output,
# so Snakemake's clean-up of a failed job leaves it): rerunning the job resumes there.
# threads/mem_mb/runtime/gpu: see the resource notes at the end of common.smk.


rule federate:
    input:
        unpack(federate_inputs),
    output:
        metrics="results/federate/{scenario}/{public}/{method}/{structure}/seed{seed}-{rid}/metrics.json",
        rounds="results/federate/{scenario}/{public}/{method}/{structure}/seed{seed}-{rid}/rounds.csv",
        # every participant's final weights: `fedshift evaluate <run folder>` re-scores them
        models="results/federate/{scenario}/{public}/{method}/{structure}/seed{seed}-{rid}/models.pt",
    params:
        # the content of its data (dvc.lock's hash, else the manifest's sha256): a rebuilt partition
        # reruns the job even when file times say it is newer (data rebuilt while it ran; issue 38)
        data=federate_data,
    conda:
        "../envs/fedshift.yaml"
    log:
        "logs/federate/{scenario}/{public}/{method}/{structure}/seed{seed}-{rid}.log",
    threads: federate_threads
    resources:
        mem_mb=federate_mem_mb,
        runtime=federate_runtime,
        gpu=GPUS_PER_JOB,
    shell:
        # exec: the job's parent is Snakemake, so it stops (checkpoint kept, nothing published)
        # when Snakemake is killed (fedshift --die-with-parent; issue 23 case 8).
        # stdout (the job's log lines) goes to the log; stderr (one progress line per finished
        # round with the device, warnings, errors) goes to the log and to Snakemake's terminal.
        ": > {log}; exec fedshift federate --die-with-parent --threads {threads} {input.config} $(dirname {output.metrics}) >> {log} 2> >(tee -a {log} >&2)"
