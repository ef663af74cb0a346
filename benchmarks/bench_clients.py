"""Rounds per second of the 100-client pathological split (not a test).

FedMMD § 4.2 / McMahan et al.: 100 clients of 600 MNIST-shaped images, C = 0.1 (10 clients
per round), B = 10, E = 2, so a round is 10 x 120 = 1,200 SGD steps of batch 10: tiny batches,
where per-step Python overhead matters. Synthetic uint8 tensors stand in for MNIST (speed does
not depend on the pixels); every client holds two classes, as in the shards split. Runs in
server-model mode (one working model shared by the clients, plus the frozen global copy for
FedMMD), times ``--rounds`` rounds after one warm-up round, and prints rounds/s and steps/s.

    PYTHONPATH=src python benchmarks/bench_clients.py --methods fedavg fedmmd --model fedavg_cnn_mnist
    PYTHONPATH=src python benchmarks/bench_clients.py --device cuda
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedshift.data.loading import ClientData, FederatedData  # noqa: E402
from fedshift.engine.config import EngineConfig  # noqa: E402
from fedshift.engine.federation import Federation, resolve_device  # noqa: E402
from fedshift.runner import build_models  # noqa: E402
from fedshift.methods import create_method  # noqa: E402


def synthetic_shards(clients: int, per_client: int, device, seed: int = 0) -> FederatedData:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(clients):
        labels = torch.tensor([(2 * i) % 10, (2 * i + 1) % 10]).repeat_interleave(per_client // 2)
        x = torch.randint(0, 256, (len(labels), 1, 28, 28), generator=g, dtype=torch.uint8)
        name = f"client{i:03d}"
        out.append(ClientData(name, name, {"private": (x.to(device), labels.to(device)),
                                           "test": (x[:10].to(device), labels[:10].to(device))}))
    return FederatedData("synthetic_shards", 10, (1, 28, 28), out, None, None)


def bench(method: str, args, device) -> dict:
    cfg = EngineConfig(rounds=args.rounds + 1, local_epochs=args.epochs, local_batch=args.batch, optimizer="sgd",
                       lr=0.01, weight_decay=0.0, client_fraction=args.fraction, server_model=True,
                       participant_eval=False, global_eval_every=1, device=str(device),
                       channels_last=args.channels_last)
    data = synthetic_shards(args.clients, args.per_client, device)
    models = build_models([args.model], 10, 1, cfg.norm, 0) * args.clients
    fed = Federation(data, models, [args.model] * args.clients, cfg, 0, device)
    m = create_method(method)
    m.setup(fed)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    fed.round = 1
    m.run_round(fed, 1)  # warm-up (allocator, kernels)
    sync()
    t = time.perf_counter()
    for r in range(2, args.rounds + 2):
        fed.round = r
        m.run_round(fed, r)
    sync()
    dt = time.perf_counter() - t
    m_per_round = max(int(args.fraction * args.clients + 0.5), 1)
    steps = args.rounds * m_per_round * args.epochs * -(-args.per_client // args.batch)
    return {"method": method, "s_per_round": dt / args.rounds, "rounds_per_s": args.rounds / dt,
            "steps_per_s": steps / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "fedmmd"])
    ap.add_argument("--model", default="fedavg_cnn_mnist")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-client", type=int, default=600)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (after one warm-up round)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--channels-last", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"# {args.clients} clients x {args.per_client} images, C = {args.fraction}, B = {args.batch}, "
          f"E = {args.epochs}, model {args.model}, {device} ({name}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| method | s / round | rounds / s | SGD steps / s |")
    print("|---|---:|---:|---:|")
    for method in args.methods:
        r = bench(method, args, device)
        print(f"| {r['method']} | {r['s_per_round']:.2f} | {r['rounds_per_s']:.3f} | {r['steps_per_s']:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
