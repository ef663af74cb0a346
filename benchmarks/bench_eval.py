"""Evaluation levers of fedshift, A/B interleaved in one process (not a test).

The four FCCL+ Digits models of ``bench_vs_reference.py`` (structure ``fcclplus_digits``:
ResNet10, ResNet12, EfficientNet-B0, MobileNetV2, channels_last weights as the engine
defaults give them) evaluated by :func:`fedshift.engine.evaluation.correct_topk` on
``--images`` random uint8 32x32 images each, under each lever setting. The settings
alternate per model (model 1: A B C ..., model 2: A B C ..., then the next repeat), so a
machine whose load changes during the run slows every setting alike; the table gives the
median over repeats of the four models' summed seconds, its spread (min-max), the ratio
to ``baseline`` (median of the per-repeat ratios, and their min-max) and the top-1
agreement with ``baseline`` (share of images whose predicted class is the same).

    baseline    the evaluation before issue 40: float32, NCHW input buffer, BatchNorm
                run as a layer, batch 256
    fold        BatchNorm folded into the convolutions of an inference copy (eval_fold_bn)
    cl          input buffer in the weights' layout, NHWC (eval_channels_last)
    fold_cl     both
    fold_cl_b512 / fold_cl_b128, fold_b512 / fold_b128   eval batch 512 / 128
    bf16        bf16 autocast (engine.bf16), hardware bf16 only
    fold_bf16, fold_cl_bf16, fold_bf16_b128   combinations

``--compile``: also torch.compile (inductor, freezing) of the folded copy, one model at a
time, compilation counted separately (a one-off per model per process and per weights:
the weights change every round, so with freezing it recompiles every evaluation).

To time the AVX2 kind on an AVX-512 machine: ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2`` (torch's and oneDNN's kernels both limited to AVX2).

    PYTHONPATH=src python benchmarks/bench_eval.py --images 512 --repeats 3 --out benchmarks/results/eval_levers_<kind>.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {
    "baseline": dict(fold=False, channels_last=False, batch=256, bf16=False),
    "fold": dict(fold=True, channels_last=False, batch=256, bf16=False),
    "cl": dict(fold=False, channels_last=True, batch=256, bf16=False),
    "fold_cl": dict(fold=True, channels_last=True, batch=256, bf16=False),
    "fold_cl_b512": dict(fold=True, channels_last=True, batch=512, bf16=False),
    "fold_cl_b128": dict(fold=True, channels_last=True, batch=128, bf16=False),
    "fold_b128": dict(fold=True, channels_last=False, batch=128, bf16=False),
    "fold_b512": dict(fold=True, channels_last=False, batch=512, bf16=False),
    "bf16": dict(fold=False, channels_last=False, batch=256, bf16=True),
    "fold_bf16": dict(fold=True, channels_last=False, batch=256, bf16=True),
    "fold_bf16_b128": dict(fold=True, channels_last=False, batch=128, bf16=True),
    "fold_cl_bf16": dict(fold=True, channels_last=True, batch=256, bf16=True),
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512, help="test images per model per timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--compile", action="store_true", help="also time torch.compile of the folded copy")
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)

    import torch

    from fedshift.engine.cpu import autocast, bf16_supported, cpu_kind
    from fedshift.engine.evaluation import correct_topk, inference_copy
    from fedshift.engine.cpu import tune_allocator
    from fedshift.models import create_model, get_structure

    torch.set_num_threads(args.threads)
    tune_allocator(64)  # engine.malloc_tuning: 64, the default
    dev = torch.device("cpu")
    kind = cpu_kind()
    settings = [s for s in args.settings if not SETTINGS[s]["bf16"] or bf16_supported(dev)]
    archs = get_structure("fcclplus_digits").assign(4)
    models = []
    for i, a in enumerate(archs):
        torch.manual_seed(i)
        models.append(create_model(a, num_classes=10, in_channels=3))
    g = torch.Generator().manual_seed(0)
    for m in models:
        m.to(memory_format=torch.channels_last)  # engine.channels_last (the default)
        for b in m.modules():  # trained-looking BatchNorm statistics, so folding changes the weights
            if isinstance(b, torch.nn.BatchNorm2d):
                b.running_mean.normal_(0, 0.1, generator=g)
                b.running_var.uniform_(0.5, 2.0, generator=g)
    x = torch.randint(0, 256, (args.images, 3, 32, 32), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (args.images,), generator=g)

    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    say(f"# Evaluation levers, {kind} ({torch.backends.cpu.get_cpu_capability()}; ATEN_CPU_CAPABILITY="
        f"{os.environ.get('ATEN_CPU_CAPABILITY', '-')}, ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '-')})\n")
    say(f"command: `python {' '.join(sys.argv)}`; torch {torch.__version__}, {args.threads} threads, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start; {args.images} images per model "
        f"(4 models: {', '.join(archs)}), {args.repeats} repeats, settings interleaved per model\n")

    def run(m, s):
        amp = autocast(True, dev) if s["bf16"] else None
        t0 = time.perf_counter()
        hits = correct_topk(m, x, y, ks=(1,), batch=s["batch"], amp=amp, fold=s["fold"],
                            channels_last=s["channels_last"])
        return time.perf_counter() - t0, hits[1]

    def top1(m, s):  # predicted classes, for the agreement column
        run_m = inference_copy(m, s["fold"])
        with torch.inference_mode(), (autocast(True, dev) if s["bf16"] else torch.autocast("cpu", enabled=False)):
            xb = x[:128].float().div_(255)
            if s["channels_last"]:
                xb = xb.contiguous(memory_format=torch.channels_last)
            return run_m.eval()(xb).argmax(1)

    for m in models:  # warm-up: oneDNN primitives, allocator
        run(m, dict(fold=False, channels_last=False, batch=min(256, args.images), bf16=False))
    times = {s: [[0.0] * len(models) for _ in range(args.repeats)] for s in settings}
    for r in range(args.repeats):
        for i, m in enumerate(models):
            order = settings if (r + i) % 2 == 0 else settings[::-1]  # A B C / C B A: no setting always first
            for s in order:
                times[s][r][i] = run(m, SETTINGS[s])[0]
        print(f"  repeat {r + 1}: " + ", ".join(f"{s} {sum(times[s][r]):.1f}s" for s in settings)
              + f", load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    agree = {}
    for s in settings:
        same = [(top1(m, SETTINGS[s]) == top1(m, SETTINGS["baseline"])).float().mean().item() for m in models]
        agree[s] = min(same)

    base = [sum(t) for t in times["baseline"]]
    say("| setting | median s (4 models) | spread min-max s | ratio baseline / setting (median) | ratio min-max "
        "| per model median s (" + " / ".join(archs) + ") | top-1 agreement (worst model) |")
    say("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in settings:
        tot = [sum(t) for t in times[s]]
        ratios = [b / t for b, t in zip(base, tot)]
        per = " / ".join(f"{statistics.median(t[i] for t in times[s]):.2f}" for i in range(len(models)))
        say(f"| {s} | {statistics.median(tot):.2f} | {min(tot):.2f}-{max(tot):.2f} | {statistics.median(ratios):.2f}x "
            f"| {min(ratios):.2f}-{max(ratios):.2f} | {per} | {agree[s]:.4f} |")

    if args.compile:
        import torch._inductor.config as inductor_cfg

        inductor_cfg.freezing = True  # constant weights: conv+bn folded, weights prepacked for oneDNN
        say("\ntorch.compile (inductor, freezing) of the folded copy, fp32, channels_last input, "
            "against eager `fold` interleaved:\n")
        say("| model | compile + first batch s | compiled s | eager fold s | ratio eager / compiled |")
        say("| --- | ---: | ---: | ---: | ---: |")
        s = SETTINGS["fold"]
        for a, m in zip(archs, models):
            cm = inference_copy(m, True).eval()
            xb = x[:256].float().div_(255).contiguous(memory_format=torch.channels_last)
            t0 = time.perf_counter()
            comp = torch.compile(cm)
            with torch.inference_mode():
                comp(xb)
            tc = time.perf_counter() - t0
            te, tcs = [], []
            for _ in range(args.repeats):
                te.append(run(m, s)[0])
                t0 = time.perf_counter()
                with torch.inference_mode():
                    for i in range(0, args.images, 256):
                        xb = x[i:i + 256].float().div_(255).contiguous(memory_format=torch.channels_last)
                        comp(xb)
                tcs.append(time.perf_counter() - t0)
            say(f"| {a} | {tc:.1f} | {statistics.median(tcs):.2f} | {statistics.median(te):.2f} "
                f"| {statistics.median(te) / statistics.median(tcs):.2f}x |")
    say(f"\nload {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} cores; with a load above the threads used, "
        f"absolute seconds are not idle-machine figures; the ratios, measured interleaved, compare)")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
