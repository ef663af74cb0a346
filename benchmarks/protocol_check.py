"""Which models a homogeneous (FCCL+ Table XV-style) grid scores: run it, print the AVG table
and the protocol checks of issue 21.

    python benchmarks/protocol_check.py benchmarks/grids/table_xv_protocol.yaml --out benchmarks/out/after

Runs every pretrain and federate job of the grid in this process (no Snakemake: a
measurement, not the pipeline), under ``--out``, then prints per method (mean ± sd over
seeds): AVG inter / intra top-1, and the protocol check: max over participants of
|inter_i - mean_{j != i} intra_j|. With one shared model (scoring the global model) that
gap is ~0 (the test sets' sizes aside: the mean of the others' intra accuracies equals
one model's inter accuracy exactly when the test sets are of equal size, as here);
with the participants' own models after local updating (the authors' protocol) it is not.
``--csv`` writes the per-run numbers. Works with any fedshift version that has
``load_experiments`` and ``run_federate`` (PYTHONPATH=<other checkout>/src runs that code).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def gap(metrics: dict, parts: list) -> float:
    """max_i |inter_i - mean_{j != i} intra_j| in points (top-1)."""
    intra = {p: metrics[f"{p}/intra/top1"] for p in parts}
    return max(abs(metrics[f"{p}/inter/top1"] - np.mean([intra[q] for q in parts if q != p])) for p in parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid")
    ap.add_argument("--data-params", default="params/data.yaml")
    ap.add_argument("--out", required=True)
    ap.add_argument("--csv")
    args = ap.parse_args()

    from fedshift import runner
    from fedshift.experiments import load_experiments

    out = Path(args.out)
    plan = load_experiments(Path(args.grid), Path(args.data_params), results=str(out), build="build")
    t0 = time.time()
    for job, cfg in plan.pretrain.items():
        d = out / "pretrain" / plan.folder(job)  # seed<k>-<identity>: the path the federate configs name
        if not (d / "metrics.json").exists():
            runner.run_pretrain(cfg, d)
    rows = []
    for job, cfg in plan.federate.items():
        d = out / "federate" / plan.folder(job)
        if not (d / "metrics.json").exists():
            runner.run_federate(cfg, d)
        m = json.loads((d / "metrics.json").read_text())
        head, final = m["headline"], m["final"]  # headline: mean of the last_k rounds; gap: the last round
        scale = 100.0 if head["avg/inter/top1"] <= 1.0 else 1.0
        rows.append({"scenario": job.scenario, "method": job.method, "seed": job.seed, "inter": head["avg/inter/top1"] * scale,
                     "intra": head["avg/intra/top1"] * scale, "gap": gap(final, cfg["participants"]) * scale})
    print(f"# {args.grid}: {len(plan.federate)} federate + {len(plan.pretrain)} pretrain jobs, "
          f"{time.time() - t0:.0f} s")
    print("| scenario | method | n | AVG inter top-1 | AVG intra top-1 | max_i abs(inter_i - mean others' intra) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for scenario, method in dict.fromkeys((r["scenario"], r["method"]) for r in rows):
        g = [r for r in rows if (r["scenario"], r["method"]) == (scenario, method)]

        def ms(key):
            v = np.array([r[key] for r in g])
            return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}" if len(v) > 1 else f"{v.mean():.2f}"

        print(f"| {scenario} | {method} | {len(g)} | {ms('inter')} | {ms('intra')} | {ms('gap')} |")
    if args.csv:
        import csv

        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
