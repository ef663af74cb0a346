"""Cost of every registered model on this machine: parameters, FLOPs, images per second.

Not a test: prints one markdown table with, per model, the parameter count, the
forward FLOPs per image (torch.utils.flop_counter.FlopCounterMode: convolutions and
matrix products, 2 FLOPs per multiply-add; norms, activations and pooling are not
counted), and training / inference throughput at the given batch size with
channels_last memory format off and on. A training step is forward, cross-entropy,
backward and an Adam step (FCCL+'s optimiser); inference runs under
torch.inference_mode in eval mode. Each timing takes the best of ``--repeats`` runs,
after ``--warmup`` untimed steps; a run is ``--iters`` steps, or more until it has
lasted ``--min-time`` seconds (so cheap models are not timed on one 10 ms step). The last column is the machine's
1-minute load average after the row: well above the thread count means other processes
shared the cores and the row's rates are low.

    PYTHONPATH=src python benchmarks/bench_models.py --models resnet10 lenet --batch 64 --iters 2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Callable, Dict, List

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedshift.models import MODELS, create_model


def forward_flops(name: str, size: int, channels: int) -> int:
    model = create_model(name, num_classes=10, in_channels=channels).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(1, channels, size, size))
    return counter.get_total_flops()


def best_rate(step: Callable[[], None], images: int, args: argparse.Namespace) -> float:
    """Images per second of the fastest of ``args.repeats`` timed runs."""
    for _ in range(args.warmup):
        step()
    best = 0.0
    for _ in range(args.repeats):
        n, t0 = 0, time.perf_counter()
        while n < args.iters or time.perf_counter() - t0 < args.min_time:
            step()
            n += 1
        best = max(best, images * n / (time.perf_counter() - t0))
    return best


def throughput(name: str, args: argparse.Namespace, channels_last: bool) -> Dict[str, float]:
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = create_model(name, num_classes=10, in_channels=args.channels).to(memory_format=fmt)
    x = torch.randn(args.batch, args.channels, args.size, args.size).to(memory_format=fmt)
    y = torch.randint(0, 10, (args.batch,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def infer_step() -> None:
        with torch.inference_mode():
            model(x)

    model.train()
    train = best_rate(train_step, args.batch, args)
    model.eval()
    infer = best_rate(infer_step, args.batch, args)
    return {"train": train, "infer": infer}


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS.names(), choices=MODELS.names(), metavar="NAME",
                   help="registered model names (default: all)")
    p.add_argument("--batch", type=int, default=256, help="images per step (FCCL+'s private batch is 256)")
    p.add_argument("--iters", type=int, default=3, help="timed steps per run, at least")
    p.add_argument("--min-time", type=float, default=2.0, help="seconds per timed run, at least")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (oneDNN picks kernels)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs; the fastest is reported")
    p.add_argument("--size", type=int, default=32, help="input height and width")
    p.add_argument("--channels", type=int, default=3, help="input channels")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"# Model cost on CPU\n\ncommand: `{' '.join(['python'] + sys.argv)}`\n")
    shape = f"{args.batch}x{args.channels}x{args.size}x{args.size}"
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, {torch.get_num_threads()} threads; input {shape}, "
          f"runs of >= {args.iters} steps and >= {args.min_time:g} s after {args.warmup} warm-up, "
          f"best of {args.repeats}\n")
    print("| model | params (M) | fwd GFLOPs/img | train img/s | train img/s (CL) "
          "| infer img/s | infer img/s (CL) | load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models:
        params = sum(q.numel() for q in create_model(name, num_classes=10, in_channels=args.channels).parameters())
        flops = forward_flops(name, args.size, args.channels)
        plain, cl = throughput(name, args, False), throughput(name, args, True)
        print(f"| {name} | {params / 1e6:.3f} | {flops / 1e9:.4f} | {plain['train']:.1f} | {cl['train']:.1f} "
              f"| {plain['infer']:.1f} | {cl['infer']:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
