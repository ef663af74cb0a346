"""GPU levers, measured one by one (not a test; prints markdown tables).

Three tables:

1. **FCCL+ Digits round per phase** at the authors' code's sizes on synthetic tensors
   (private 138 / 94 / 9,523 / 2,300, public 5,000, test sets 10,000 / 2,007 / 26,032 /
   2,000 = 40,039 images, 3x32x32, ResNet10 / ResNet12 / EfficientNet-B0 / MobileNetV2,
   local batch 128, public batch 256), one column per engine lever setting, beside the
   H100 reference figures of ``benchmarks/reference/gpu_h100.yaml``. The local phase is
   one epoch of every participant through ``Federation.train_participants`` (so
   ``overlap_participants`` applies); "paper round" = collaborative + 20 local epochs +
   evaluation. The first (warm-up) round's extra time is the compile/capture warm-up.
2. **FedAvg, 100 clients of 600 images** (fedavg_cnn_mnist, C = 0.1 -> 10 clients per
   round, B = 10, E = 2, SGD): rounds/s with the clients trained one after another vs
   fused (``engine/fused.py``), measured alternately (A B A B).
3. **Per-step time, compile vs eager** for small models, alternately.
4. **Packed runs** (``--tables packed``): k copies of table 1's eager round (whole
   processes, start-up and warm-up included) at once on the device, k = 1, 2, 4, 8;
   each job gets ``FEDSHIFT_GPU_SLOT=i`` (docs/gpu.md). Throughput = jobs per hour.

On a CPU-only machine the GPU-only levers are skipped and the tables say so; use
``--quick`` (small sizes) there: the full sizes take hours on 2 cores.

    PYTHONPATH=src python benchmarks/bench_gpu.py --quick
    PYTHONPATH=src python benchmarks/bench_gpu.py --device cuda            # on a GPU node
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedshift.data.loading import ClientData, FederatedData  # noqa: E402
from fedshift.engine.config import EngineConfig  # noqa: E402
from fedshift.engine.federation import Federation, resolve_device  # noqa: E402
from fedshift.engine.fused import (FusedOptimizer, federation_batches, train_clients_fused,  # noqa: E402
                                   weighted_mean_stacked)
from fedshift.runner import build_models  # noqa: E402
from fedshift.methods import create_method  # noqa: E402
from fedshift.engine.averaging import weighted_average  # noqa: E402
from fedshift.models import create_model  # noqa: E402

DIGITS_ARCHS = ["resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2"]
FULL = dict(private=[138, 94, 9523, 2300], test=[10000, 2007, 26032, 2000], public=5000, local_batch=128,
            public_batch=256)
QUICK = dict(private=[40, 30, 96, 64], test=[64, 32, 96, 48], public=128, local_batch=32, public_batch=64)

# Lever settings of table 1: name -> engine overrides; "cuda" marks the GPU-only ones.
LEVERS = {
    "eager": ({}, False),
    "compile": ({"compile": "default"}, False),
    "compile+graphs": ({"compile": "reduce-overhead"}, True),
    "cuda_graphs": ({"cuda_graphs": True}, True),
    "overlap": ({"overlap_participants": True}, True),
    "overlap+compile+graphs": ({"overlap_participants": True, "compile": "reduce-overhead"}, True),
    "amp=auto": ({"amp": "auto"}, True),
    "cudnn_benchmark": ({"cudnn_benchmark": True}, True),
    # every non-compile GPU lever at once (cuda_graphs is ignored under compile)
    "overlap+graphs+amp+cudnn": ({"overlap_participants": True, "cuda_graphs": True, "amp": "auto",
                                  "cudnn_benchmark": True}, True),
    "amp=bf16": ({"amp": "bf16"}, True),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic(sizes: Dict, shape=(3, 32, 32), classes: int = 10, seed: int = 0, public: bool = True) -> FederatedData:
    g = torch.Generator().manual_seed(seed)

    def images(n):
        return torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)

    def labels(n):
        return torch.randint(0, classes, (n,), generator=g)

    clients = []
    for i, (n, t) in enumerate(zip(sizes["private"], sizes["test"])):
        splits = {"private": (images(n), labels(n)), "test": (images(t), labels(t))}
        clients.append(ClientData(f"p{i}", f"d{i}", splits))
    return FederatedData("synthetic", classes, shape, clients, images(sizes["public"]) if public else None,
                         "synthetic" if public else None)


def to_device(data: FederatedData, device: torch.device) -> FederatedData:
    for c in data.clients:
        c.splits = {k: (x.to(device), y.to(device)) for k, (x, y) in c.splits.items()}
    if data.public is not None:
        data.public = data.public.to(device)
    return data


# ------------------------------------------------------------------ table 1
def digits_round(args, levers: Dict, device: torch.device) -> Dict[str, float]:
    sizes = QUICK if args.quick else FULL
    eng = EngineConfig(rounds=40, local_epochs=1, local_batch=sizes["local_batch"], public_batch=sizes["public_batch"],
                       device=str(device), eval_batch=args.eval_batch, **levers)
    data = to_device(synthetic(sizes), device)
    archs = args.archs
    models = build_models(archs, 10, 3, eng.norm, 0)
    fed = Federation(data, models, archs, eng, 0, device)
    fed.round = 1
    method = create_method("fccl_plus", {"corr_every": 0} if "corr_every" in _fields("fccl_plus") else {}, "digits")
    fed.setup(method)

    def local():
        return fed.train_participants(loss_fn=lambda cl, x, y, s: method.local_loss(fed.ctx, cl, x, y, s), epochs=1)

    phases = {"collaborative": lambda: method.collaborate(fed.ctx), "local (1 epoch, all)": local,
              "evaluation": fed.evaluate}
    out: Dict[str, float] = {}
    t0 = time.perf_counter()
    for fn in phases.values():  # warm-up round: compilation, graph capture, autotuning
        fn()
    sync(device)
    warm = time.perf_counter() - t0
    for r in range(args.rounds):
        fed.round = 2 + r
        for name, fn in phases.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            out[name] = out.get(name, 0.0) + (time.perf_counter() - t) / args.rounds
    if args.per_arch:  # each participant's local epoch alone: the lever's effect per architecture
        for c, arch in zip(fed.clients, archs):
            sync(device)
            t = time.perf_counter()
            fed.train_participants(clients=[c], loss_fn=lambda cl, x, y, s: method.local_loss(fed.ctx, cl, x, y, s),
                                   epochs=1)
            sync(device)
            out[f"local, {arch} alone ({c.num_private} images)"] = time.perf_counter() - t
    out["paper round (20 local epochs)"] = out["collaborative"] + 20 * out["local (1 epoch, all)"] + out["evaluation"]
    out["evaluation share of a paper round (%)"] = 100 * out["evaluation"] / out["paper round (20 local epochs)"]
    out["warm-up extra (compile/capture)"] = warm - (out["collaborative"] + out["local (1 epoch, all)"]
                                                     + out["evaluation"])
    if device.type == "cuda":
        out["peak GPU memory (GB)"] = torch.cuda.max_memory_allocated(device) / 1e9
        torch.cuda.reset_peak_memory_stats(device)
    return out


def _fields(method: str):
    from dataclasses import fields

    from fedshift.methods.base import METHODS

    return {f.name for f in fields(METHODS.get(method).Params)}


def table_digits(args, device: torch.device) -> None:
    ref = yaml.safe_load((ROOT / "benchmarks/reference/gpu_h100.yaml").read_text())
    sizes = QUICK if args.quick else FULL
    print(f"## 1. FCCL+ Digits round per phase (s), sizes {'--quick' if args.quick else 'of the authors'}: "
          f"private {sizes['private']}, public {sizes['public']}, test {sizes['test']}, {args.archs}\n")
    cols, results, skipped = [], {}, []
    for name in args.levers:
        overrides, cuda_only = LEVERS[name]
        if cuda_only and device.type != "cuda":
            skipped.append(name)
            continue
        print(f"[running {name}]", file=sys.stderr, flush=True)
        results[name] = digits_round(args, overrides, device)
        cols.append(name)
    rows = list(next(iter(results.values())).keys()) if results else []
    refcols = ["authors' code (H100)", "fedshift before (H100)"] if not args.quick else []
    print("| phase | " + " | ".join(refcols + cols) + " |")
    print("| --- | " + " | ".join("---:" for _ in refcols + cols) + " |")
    for row in rows:
        refs = [str(ref["round"].get(row, {}).get(k, "-")) for k in ("authors", "fedshift_fac1191")] if refcols else []
        print(f"| {row} | " + " | ".join(refs + [f"{results[c][row]:.2f}" for c in cols]) + " |")
    if skipped:
        print(f"\nGPU columns not run ({', '.join(skipped)}): they need a GPU (run with --device cuda on one).")
    print(f"\nReference: {ref['source']}\n")


# ------------------------------------------------------------------ table 2
def fedavg_bench(args, device: torch.device) -> None:
    n_clients, per_client, frac = args.fedavg_clients, 600, args.fedavg_fraction
    sampled = max(1, round(frac * n_clients))
    print(f"## 2. FedAvg rounds/s: {n_clients} clients x {per_client} images, fedavg_cnn_mnist, "
          f"{sampled} clients per round (C = {frac}), B = 10, E = {args.fedavg_epochs}, SGD lr 0.05\n")
    sizes = dict(private=[per_client] * n_clients, test=[1] * n_clients, public=1)
    data = to_device(synthetic(sizes, shape=(1, 28, 28), public=False), device)
    torch.manual_seed(0)
    # one model object for every client (memory): each sampled client loads the global weights
    model = create_model("fedavg_cnn_mnist", num_classes=10, in_channels=1, dropout=args.dropout).to(device)
    eng = EngineConfig(local_epochs=args.fedavg_epochs, local_batch=10, optimizer="sgd", lr=0.05, momentum=0.0,
                       weight_decay=0.0, device=str(device))
    fed = Federation(data, [model] * n_clients, ["fedavg_cnn_mnist"] * n_clients, eng, 0, device)
    fed.round = 1
    pick = torch.Generator().manual_seed(1)
    glob = {k: v.clone() for k, v in model.state_dict().items()}

    def sequential_round():
        nonlocal glob
        chosen = torch.randperm(n_clients, generator=pick)[:sampled].tolist()
        states, weights = [], []
        for i in chosen:
            c = fed.clients[i]
            model.load_state_dict(glob)
            fed.train_local(c)
            states.append({k: v.clone() for k, v in model.state_dict().items()})
            weights.append(c.num_private)
        glob = weighted_average(states, weights)

    def fused_round():
        nonlocal glob
        chosen = [fed.clients[i] for i in torch.randperm(n_clients, generator=pick)[:sampled].tolist()]
        model.load_state_dict(glob)
        params, _ = train_clients_fused(model, [federation_batches(fed, c, eng.local_epochs) for c in chosen],
                                        FusedOptimizer.of(fed.optimizer_settings("local")))
        glob = weighted_mean_stacked(params, [c.num_private for c in chosen])

    runs = {"sequential": sequential_round, "fused": fused_round}
    for fn in runs.values():  # warm-up
        fn()
    times: Dict[str, List[float]] = {k: [] for k in runs}
    for _ in range(args.fedavg_rounds):  # alternate A B A B: the machine's load drifts
        for k, fn in runs.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t)
    print("| clients trained | rounds/s (s per round) | ratio to sequential |")
    print("| --- | ---: | ---: |")
    base = sorted(times["sequential"])[len(times["sequential"]) // 2]
    for k, ts in times.items():
        med = sorted(ts)[len(ts) // 2]
        print(f"| {k} | {1 / med:.3f} ({med:.2f} s) | {base / med:.2f}x |")
    print(f"\nmedian of {args.fedavg_rounds} alternated rounds after 1 warm-up each; per-round times: "
          + "; ".join(f"{k}: " + ", ".join(f"{t:.2f}" for t in ts) for k, ts in times.items()) + "\n")


# ------------------------------------------------------------------ table 3
def step_bench(args, device: torch.device) -> None:
    print(f"## 3. One training step (ms), eager vs torch.compile (mode {args.step_compile_mode}), SGD\n")
    print("| model | batch | eager | compiled | speed-up | compile time (s) | max |grad diff| after 1 step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.step_models:
        arch, batch = spec.split(":")
        batch = int(batch)
        cin, size = (1, 28) if arch in ("lenet", "fedavg_cnn_mnist") else (3, 32)
        torch.manual_seed(0)
        kwargs = {"dropout": 0.0} if arch.startswith("fedavg_cnn") else {}
        eager = create_model(arch, num_classes=10, in_channels=cin, **kwargs).to(device)
        comp = copy.deepcopy(eager)
        from fedshift.engine.levers import EngineLevers

        mode = "default" if args.step_compile_mode == "default" else args.step_compile_mode
        EngineLevers(EngineConfig(compile=mode), device).prepare([comp])
        x = torch.randn(batch, cin, size, size, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        opts = {m: torch.optim.SGD(m.parameters(), lr=0.01) for m in (eager, comp)}

        def step(m):
            if device.type == "cuda" and m is comp and mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            loss = F.cross_entropy(m(x), y)
            opts[m].zero_grad(set_to_none=True)
            loss.backward()
            opts[m].step()

        def grads(m):
            m.zero_grad()
            F.cross_entropy(m(x), y).backward()
            return [p.grad.clone() for p in m.parameters()]

        t = time.perf_counter()
        gc = grads(comp)
        sync(device)
        compile_s = time.perf_counter() - t
        ge = grads(eager)
        gdiff = max((a - b).abs().max().item() for a, b in zip(ge, gc))
        for m in (eager, comp):
            for _ in range(2):
                step(m)
        sync(device)
        times = {eager: [], comp: []}
        for _ in range(args.step_reps):  # alternate
            for m in (eager, comp):
                sync(device)
                t = time.perf_counter()
                for _ in range(args.step_n):
                    step(m)
                sync(device)
                times[m].append((time.perf_counter() - t) / args.step_n * 1e3)
        me, mc = (sorted(times[m])[len(times[m]) // 2] for m in (eager, comp))
        print(f"| {arch} | {batch} | {me:.1f} | {mc:.1f} | {me / mc:.2f}x | {compile_s:.0f} | {gdiff:.1e} |",
              flush=True)
    print()


# ------------------------------------------------------------------ table 4
def packed_bench(args, device: torch.device) -> None:
    print(f"## 4. Packed runs: k processes at once, each one FCCL+ Digits round (eager, {args.rounds} timed "
          f"after a warm-up, {'--quick' if args.quick else 'full'} sizes)\n")
    print("| k | wall (s) | jobs/hour | throughput vs k=1 |")
    print("| --- | ---: | ---: | ---: |")
    base = None
    for k in args.packed:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--tables", "digits", "--levers", "eager",
               "--device", args.device, "--rounds", str(args.rounds), "--archs", *args.archs]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--threads", str(args.threads)] if args.threads else []
        t = time.perf_counter()
        procs = [subprocess.Popen(cmd, env={**os.environ, "FEDSHIFT_GPU_SLOT": str(i)}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for i in range(k)]
        codes = [p.wait() for p in procs]
        wall = time.perf_counter() - t
        if any(codes):
            print(f"| {k} | failed (exit codes {codes}) | - | - |")
            continue
        rate = k / wall * 3600
        base = base or rate
        print(f"| {k} | {wall:.1f} | {rate:.1f} | {rate / base:.2f}x |", flush=True)
    print()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--quick", action="store_true", help="small sizes (CPU)")
    p.add_argument("--tables", nargs="+", default=["digits", "fedavg", "steps"],
                   choices=["digits", "fedavg", "steps", "packed"])
    p.add_argument("--packed", nargs="+", type=int, default=[1, 2, 4, 8], metavar="K", help="jobs at once (table 4)")
    p.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    p.add_argument("--archs", nargs="+", default=DIGITS_ARCHS)
    p.add_argument("--rounds", type=int, default=1, help="timed rounds of table 1 after the warm-up")
    p.add_argument("--eval-batch", type=int, default=2048)
    p.add_argument("--per-arch", action="store_true",
                   help="table 1: also one local epoch of each participant alone (per-architecture rows)")
    p.add_argument("--fedavg-clients", type=int, default=100)
    p.add_argument("--fedavg-fraction", type=float, default=0.1)
    p.add_argument("--fedavg-epochs", type=int, default=2)
    p.add_argument("--fedavg-rounds", type=int, default=3)
    p.add_argument("--dropout", type=float, default=0.5, help="fedavg_cnn_mnist dropout")
    p.add_argument("--step-models", nargs="+", default=["lenet:10", "fedavg_cnn_mnist:10", "simple_cnn:32"],
                   metavar="ARCH:BATCH")
    p.add_argument("--step-compile-mode", default=None, choices=["default", "reduce-overhead"],
                   help="default: reduce-overhead on CUDA, default on CPU")
    p.add_argument("--step-n", type=int, default=20)
    p.add_argument("--step-reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.step_compile_mode is None:
        args.step_compile_mode = "reduce-overhead" if device.type == "cuda" else "default"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    print("# GPU levers benchmark\n")
    print(f"command: `{' '.join(['python'] + sys.argv)}`\n")
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}, device {device} (GPU: {gpu})\n")
    if device.type != "cuda":
        print("No GPU: only the CPU columns run; the GPU columns (CUDA graphs, streams, CUDA amp, cuDNN "
              "autotuning) need a GPU.\n")
    if "digits" in args.tables:
        table_digits(args, device)
    if "fedavg" in args.tables:
        fedavg_bench(args, device)
    if "steps" in args.tables:
        step_bench(args, device)
    if "packed" in args.tables:
        packed_bench(args, device)


if __name__ == "__main__":
    main()
