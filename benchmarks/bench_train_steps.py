"""One training step per architecture, float32 against bf16 autocast, with and without recompute (not a test).

The measurement behind ``engine.bf16_train: auto`` (engine/cpu.py ``KIND_LEVERS``, ``train_bf16``) and
``engine.recompute_budget_mb`` (issue 40): for each architecture and batch, one forward + backward +
Adam step of a channels_last model in training mode on random 3x32x32 (or 1x28x28 for the MNIST
models) inputs, each setting in a fresh process (so its peak RSS is its own), the settings of one
architecture alternating ``--repeats`` times; the table gives the median milliseconds per step (after
two warm-up steps, mean of ``--steps``), the peak RSS of the process, and the speed-up of each setting
over float32 without recompute. The header names the CPU, its vector flags and the allocator setting
(glibc keeps freed blocks up to ``--malloc`` MB, the engine's ``malloc_tuning``).

    PYTHONPATH=src python benchmarks/bench_train_steps.py
    PYTHONPATH=src python benchmarks/bench_train_steps.py --archs mobilenet_v2 --batches 128 256 --repeats 3

Settings: ``fp32`` (float32), ``fp32_rc`` (float32, every block checkpointed), ``bf16`` (bf16 autocast
of the feature extractor, as ``FedModel.train_bf16``), ``bf16_rc``. A bf16 figure from a CPU without
hardware bf16 measures emulation (10x slower), not the lever: the header says which kind ran.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("fp32", "fp32_rc", "bf16", "bf16_rc")
MNIST_SHAPED = {"lenet", "fedavg_cnn_mnist"}


def worker(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from fedshift.engine.cpu import tune_allocator
    from fedshift.models import create_model

    torch.set_num_threads(spec["threads"])
    if spec["malloc"]:
        tune_allocator(spec["malloc"])
    shape = (1, 28, 28) if spec["arch"] in MNIST_SHAPED else (3, 32, 32)
    torch.manual_seed(0)
    m = create_model(spec["arch"], num_classes=10, in_channels=shape[0]).to(memory_format=torch.channels_last)
    m.train()
    m.recompute = spec["setting"].endswith("_rc")
    m.train_bf16 = spec["setting"].startswith("bf16")
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    x = torch.randn(spec["batch"], *shape).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (spec["batch"],))

    def step():
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(spec["steps"]):
        step()
    return {"ms": (time.perf_counter() - t0) / spec["steps"] * 1000,
            "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=["resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2"])
    ap.add_argument("--batches", nargs="+", type=int, default=[128, 256])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--malloc", type=int, default=64, help="MB of freed blocks glibc keeps (engine.malloc_tuning)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_vs_reference import cpu_description

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"machine: {cpu_description()}, {args.threads} threads, malloc_tuning {args.malloc} MB, "
          f"{args.steps} steps after 2 warm-up, median of {args.repeats} process(es) per setting, alternating\n")
    print("| arch | batch | " + " | ".join(f"{s} ms (GB)" for s in args.settings) + " | " +
          " | ".join(f"{s} speed-up" for s in args.settings[1:]) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in args.settings) + " | " +
          " | ".join("---:" for _ in args.settings[1:]) + " |")
    for arch in args.archs:
        for batch in args.batches:
            runs: dict = {s: [] for s in args.settings}
            for _ in range(args.repeats):
                for s in args.settings:
                    spec = {"arch": arch, "batch": batch, "setting": s, "threads": args.threads,
                            "malloc": args.malloc, "steps": args.steps}
                    res = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                                         capture_output=True, text=True)
                    if res.returncode:
                        raise SystemExit(f"{arch} batch {batch} {s} failed:\n{res.stderr[-2000:]}")
                    runs[s].append(json.loads(res.stdout.strip().splitlines()[-1]))
            ms = {s: statistics.median(r["ms"] for r in runs[s]) for s in args.settings}
            gb = {s: max(r["rss_gb"] for r in runs[s]) for s in args.settings}
            base = ms[args.settings[0]]
            print(f"| {arch} | {batch} | " + " | ".join(f"{ms[s]:.0f} ({gb[s]:.2f})" for s in args.settings) + " | " +
                  " | ".join(f"{base / ms[s]:.2f}x" for s in args.settings[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
