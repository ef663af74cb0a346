# One federated run per scenario x public set x method x structure x seed.


rule federate:
    input:
        unpack(federate_inputs),
    output:
        metrics="results/federate/{scenario}/{public}/{method}/{structure}/seed{seed}/metrics.json",
        rounds="results/federate/{scenario}/{public}/{method}/{structure}/seed{seed}/rounds.csv",
    conda:
        "../../environment.yml"
    log:
        "logs/federate/{scenario}/{public}/{method}/{structure}/seed{seed}.log",
    resources:
        gpu=0,
    shell:
        "fedshift federate {input.config} $(dirname {output.metrics}) > {log} 2>&1"
