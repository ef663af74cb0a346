"""How the CPU's cores scale: float32 GEMM peak and the engine's evaluation at 1 and 2 threads (not a test).

Issue 48 asks whether the float32 path can reach 3x the authors; this script gives the ceiling the
argument needs, on the machine at hand, idle:

- ``sgemm``: GFLOP/s of a square float32 matrix product (n = 2048, 4096) at 1 and at ``--threads``
  threads: the machine's float32 peak as oneDNN/MKL reach it, and whether the cores are real ones
  (about 2x from 1 to 2 threads) or one core's hyperthreads (about 1x).
- ``eval``: milliseconds per image of :func:`fedshift.engine.evaluation.correct_topk` (the engine's
  evaluation: folded BatchNorm, channels_last weights and input, batch 256) for the four FCCL+ Digits
  models (structure ``fcclplus_digits``) at 1 and at ``--threads`` threads, and the GFLOP/s that is
  (forward FLOPs from ``torch.utils.flop_counter``).
- ``pair``: the same evaluation in two processes at 1 thread each, side by side (the inter-op split):
  each process's ms/image, and the pair's combined rate against one process at ``--threads``.

    PYTHONPATH=src python benchmarks/thread_scaling.py --seconds 4 --out benchmarks/results/thread_scaling_<kind>_<date>.md

Run it on an idle machine: a neighbour's load changes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2")


def _timed(fn, seconds: float) -> float:
    """Seconds per call of ``fn``: two warm-up calls, then as many as fit in ``seconds``."""
    fn()
    fn()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


def sgemm(threads: int, seconds: float) -> dict:
    import torch

    torch.set_num_threads(threads)
    out = {}
    for n in (2048, 4096):
        a, b = torch.randn(n, n), torch.randn(n, n)
        out[n] = 2 * n**3 / _timed(lambda: a @ b, seconds) / 1e9
    return out


def evaluation(threads: int, seconds: float, images: int = 256) -> dict:
    """ms per image and GFLOP/s of the engine's evaluation, per model, at ``threads`` threads."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fedshift.engine.evaluation import correct_topk
    from fedshift.models import create_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8)  # the engine evaluates uint8 tensors
    y = torch.randint(0, 10, (images,))
    out = {}
    for name in MODELS:
        m = create_model(name, 10, 3).to(memory_format=torch.channels_last).eval()
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            m(x[:1].float())
        gflop = fc.get_total_flops() / 1e9
        per_call = _timed(lambda: correct_topk(m, x, y, ks=(1,), batch=256, amp=None, fold=True,
                                               channels_last=True), seconds)
        ms = per_call / images * 1e3
        out[name] = {"ms_per_image": ms, "gflop_per_image": gflop, "gflops": gflop / (ms / 1e3)}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per figure")
    p.add_argument("--out", type=Path, help="write the Markdown table here (stdout always)")
    p.add_argument("--_child", choices=["eval"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:  # one side of the pair: print JSON and leave
        print(json.dumps(evaluation(1, args.seconds)))
        return

    import torch

    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    load = os.getloadavg()[0]
    caps = {k: v for k, v in torch.cpu.get_capabilities().items() if k.startswith(("avx", "amx")) and v} \
        if hasattr(torch.cpu, "get_capabilities") else {}
    say(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, capability flags "
        f"{' '.join(sorted(caps)) or '?'}; load {load:.1f} at start")
    say(f"command: python benchmarks/thread_scaling.py --threads {args.threads} --seconds {args.seconds}")
    say()
    s1, sn = sgemm(1, args.seconds), sgemm(args.threads, args.seconds)
    say(f"| float32 matrix product | 1 thread GFLOP/s | {args.threads} threads GFLOP/s | scaling |")
    say("| --- | ---: | ---: | ---: |")
    for n in s1:
        say(f"| {n} x {n} | {s1[n]:.1f} | {sn[n]:.1f} | {sn[n] / s1[n]:.2f}x |")
    say()
    e1, en = evaluation(1, args.seconds), evaluation(args.threads, args.seconds)
    child = [sys.executable, __file__, "--seconds", str(args.seconds), "--_child", "eval"]
    procs = [subprocess.Popen(child, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    pair = [json.loads(pr.communicate()[0].strip().splitlines()[-1]) for pr in procs]
    peak = max(sn.values())
    say(f"| model (engine evaluation, batch 256) | GFLOP/image | 1 thread ms/img | {args.threads} threads ms/img "
        f"| scaling | {args.threads} threads GFLOP/s | share of the GEMM peak | 2 processes x 1 thread: "
        f"ms/img each | pair's rate / {args.threads} threads |")
    say("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in MODELS:
        a, b = e1[name], en[name]
        each = [q[name]["ms_per_image"] for q in pair]
        pair_rate = sum(1 / t for t in each)  # images per ms of the two processes together
        say(f"| {name} | {a['gflop_per_image']:.3f} | {a['ms_per_image']:.2f} | {b['ms_per_image']:.2f} "
            f"| {a['ms_per_image'] / b['ms_per_image']:.2f}x | {b['gflops']:.0f} | {b['gflops'] / peak:.0%} "
            f"| {each[0]:.2f} / {each[1]:.2f} | {pair_rate * b['ms_per_image']:.2f}x |")
    say()
    say(f"load {os.getloadavg()[0]:.1f} at the end")
    if args.out:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
