"""What bf16 evaluation (``engine.bf16``) changes in the demo's accuracies (not a test).

``engine.bf16`` runs evaluation under bf16 autocast; training is unchanged, so its whole
effect on a run's numbers is the re-scoring of the same weights. For every finished run
folder given (default: the demo grid's runs under results/federate/rotmnist/photo_patches),
this re-scores ``models.pt`` in float32 and in bf16 (``fedshift evaluate --no-bf16/--bf16``
in one process) and prints the per-run and mean differences of the headline accuracies, in
points. Needs hardware bf16 (AVX-512 BF16, AMX or CUDA); refused otherwise.

    .venv/bin/python benchmarks/bf16_accuracy.py [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("avg/intra/top1", "avg/inter/top1")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", type=Path)
    args = p.parse_args(argv)
    runs = args.runs or sorted(ROOT.glob("results/federate/rotmnist/photo_patches/*/*/seed*"))
    runs = [r for r in runs if (r / "models.pt").exists()]
    if not runs:
        raise SystemExit("bf16_accuracy.py: no finished run folder (models.pt) found; run the demo grid first")
    import torch

    from fedshift.engine import cpu
    from fedshift.runner import evaluate_run

    if not cpu.bf16_supported(torch.device("cpu")):
        raise SystemExit("bf16_accuracy.py: this CPU has no hardware bf16 (AVX-512 BF16 or AMX)")
    print(f"# bf16 vs float32 evaluation of the same weights, {len(runs)} runs\n")
    print("| run | " + " | ".join(f"{k} fp32 | bf16 - fp32 (points)" for k in KEYS) + " | s fp32 / bf16 |")
    print("|---|" + "---:|---:|" * len(KEYS) + "---:|")
    diffs = {k: [] for k in KEYS}
    for run in runs:
        t0 = time.perf_counter()
        full = evaluate_run(run, bf16=False)
        t1 = time.perf_counter()
        low = evaluate_run(run, bf16=True)
        t2 = time.perf_counter()
        cells = []
        for k in KEYS:
            d = 100 * (low[k] - full[k])
            diffs[k].append(d)
            cells.append(f"{100 * full[k]:.2f} | {d:+.2f}")
        name = "/".join(run.parts[-3:])
        print(f"| {name} | " + " | ".join(cells) + f" | {t1 - t0:.1f} / {t2 - t1:.1f} |", flush=True)
    print()
    for k in KEYS:
        d = diffs[k]
        sd = statistics.stdev(d) if len(d) > 1 else 0.0
        print(f"{k}: bf16 - fp32 = {statistics.mean(d):+.3f} +- {sd:.3f} points (mean +- std over {len(d)} runs), "
              f"largest |diff| {max(map(abs, d)):.2f}")


if __name__ == "__main__":
    sys.exit(main())
