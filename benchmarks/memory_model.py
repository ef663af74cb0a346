"""Peak RSS of real jobs against the memory model that sizes their SLURM requests.

Builds a small data folder with the real stages (rotmnist 1x28x28 and the Digits stand-in
digits_offline 3x32x32, public set photo_patches), plans jobs with the real planner
(fedshift.experiments.load_experiments: the configs Snakemake would run), runs each job as
``fedshift federate|pretrain`` in its own process with MLflow tracking on (a scratch SQLite
store, as a workflow job) and reads that process's peak RSS (VmHWM, polled while it runs). Beside it: the
model's estimate and the request (fedshift.resources), and whether the request holds the
peak with >= 25 % headroom.

    python benchmarks/memory_model.py [--only NAME ...] [--out benchmarks/results/memory_model.md]

The jobs (``JOBS``) span the methods' memory shapes: averaging (fedavg, moon with its two
extra models), public-set distillation (fedmd, feddf), FCCL+ with every participant's graph
in the collaborative step, FedH2L's mutual step on every peer's batch, BASE pretraining;
LeNet-sized models and the authors' Digits architectures (fcclplus_digits: ResNet10,
ResNet12, EfficientNet-B0, MobileNetV2) at the FCCL+ paper's batches (256 / 512).
One round, one local epoch: the peak is reached in the first round (the allocator keeps
what it once held; later rounds reuse it).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fedshift import resources  # noqa: E402
from fedshift.experiments import load_experiments  # noqa: E402

DATA = {
    "datasets": ["mnist5k", "photo_patches", "uci_digits"],
    "dataset_params": {"photo_patches": {"n": 2000, "size": 32, "seed": 0}},
    "public": {"photo_patches": {"n": 600, "seed": 0}},
    "scenarios": {"rotmnist": {"source": "mnist5k", "per_class": 20, "alpha": 0.1, "val": 0.1, "test": 0.25, "seed": 0},
                  "digits_offline": {}, "mnist5k_shards": {}},
}
PAPER = {"local_batch": 256, "public_batch": 512}  # FCCL+ § 4.1 (params/papers/fccl_plus_table8.yaml)
SMALL = {"local_batch": 64, "public_batch": 256}  # the offline grids (params/experiments.yaml)
# The FedMMD offline twin's many-client job (params/papers/fedmmd_offline.yaml): 20 shard clients,
# 10 sampled per round, one shared working model (engine.server_model), global evaluation only.
SHARDS = {"local_batch": 10, "public_batch": 256, "optimizer": "sgd", "lr": 0.03, "momentum": 0.9,
          "clients_per_round": 10, "server_model": True, "participant_eval": False, "global_eval_every": 1}

# name -> (scenario, method, structure, engine overrides); "pretrain:<arch>" runs BASE pretraining.
JOBS = {
    "fedavg_lenet": ("rotmnist", "fedavg", "homo_lenet", SMALL),
    "moon_lenet": ("rotmnist", "moon", "homo_lenet", SMALL),
    "fedmd_mixed": ("rotmnist", "fedmd", "demo_mixed", SMALL),
    "fedh2l_lenet": ("rotmnist", "fedh2l", "fedh2l_rotmnist", SMALL),
    "fccl_plus_mixed": ("rotmnist", "fccl_plus", "demo_mixed", SMALL),
    "feddf_digits": ("digits_offline", "feddf", "fcclplus_digits", PAPER),
    "fccl_plus_digits": ("digits_offline", "fccl_plus", "fcclplus_digits", PAPER),
    "fccl_plus_digits_small": ("digits_offline", "fccl_plus", "fcclplus_digits", SMALL),
    "fedavg_shards": ("mnist5k_shards", "fedavg", "homo_lenet", SHARDS),
    "fedmmd_shards": ("mnist5k_shards", "fedmmd", "homo_lenet", SHARDS),
    # FedMMD's CIFAR-10 CNN at the paper grid's batches (B = 128, eval 2048: clamped to the 1,000 pooled
    # test images here) on the 3x32x32 Digits stand-in, every client each round, one shared model
    "fedavg_cifar_cnn": ("digits_offline", "fedavg", "homo_fedavg_cnn_cifar",
                         {**SHARDS, "local_batch": 128, "eval_batch": 2048, "clients_per_round": 0, "lr": 0.002}),
    "pretrain_efficientnet": ("digits_offline", "pretrain:efficientnet_b0", "fcclplus_digits", PAPER),
}


def build_data(root: Path) -> None:
    from fedshift.data import FetchContext, build

    ctx = FetchContext()
    for name, params in (("mnist5k", {}), ("uci_digits", {}), ("photo_patches", DATA["dataset_params"]["photo_patches"])):
        if not (root / "datasets" / name / "manifest.json").exists():
            build.fetch_dataset(name, root / "datasets" / name, ctx, params)
    if not (root / "public/photo_patches/manifest.json").exists():
        build.build_public("photo_patches", root / "datasets/photo_patches", root / "public/photo_patches",
                           DATA["public"]["photo_patches"])
    srcs = {n: root / "datasets" / n for n in ("mnist5k", "uci_digits", "photo_patches")}
    for scen, params in DATA["scenarios"].items():
        if not (root / "partitions" / scen / "manifest.json").exists():
            build.partition(scen, srcs, root / "partitions" / scen, params)


def plan_job(name: str, root: Path, threads: int) -> dict:
    scenario, method, structure, batches = JOBS[name]
    pretrain = method.startswith("pretrain:")
    eng = {"rounds": 1, "local_epochs": 1, "device": "cpu", "checkpoint_min_s": 0, "threads": threads, **batches}
    public = [] if eng.get("server_model") else ["photo_patches"]  # the server-averaging jobs use no public set
    exp = {"engine": eng,
           "pretrain": {"epochs": 1, "batch": batches["local_batch"], "eval_every": 1, "device": "cpu", "threads": threads},
           "grid": [{"name": name, "scenarios": [scenario], **({"public": public} if public else {}),
                     "methods": ["base" if pretrain else method], "structures": [structure], "seeds": [0]}]}
    plan = load_experiments(exp, DATA, results=str(root / "results" / name), build=str(root))
    if pretrain:
        arch = method.split(":", 1)[1]
        return next(c for c in plan.pretrain.values() if c["arch"] == arch)
    return next(iter(plan.federate.values()))


def _vm_hwm_kb(pid: int) -> int:
    """VmHWM of a live process (kB): the peak RSS of its own address space since its exec.

    Not ``wait4``'s ru_maxrss: Linux carries a parent's high-water mark into a child across
    fork + exec, so a job started from a large process (pytest after a thousand tests: 1.6 GB)
    would read the parent's peak, not its own."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(cfg: dict, workdir: Path, threads: int) -> dict:
    """Run the job in its own process (tracking on) and return its peak RSS (MB) and wall time."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", FEDSHIFT_TRACKING="mlflow",
               MLFLOW_TRACKING_URI=f"sqlite:///{workdir / 'mlflow.db'}",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "fedshift.cli", cfg["kind"], "--threads", str(threads),
           str(workdir / "config.yaml"), str(workdir / "out")]
    t0 = time.time()
    with open(workdir / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=err)
        peak_kb = 0
        while proc.poll() is None:  # the job's own high-water mark, read while it lives
            peak_kb = max(peak_kb, _vm_hwm_kb(proc.pid))
            time.sleep(0.05)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{(workdir / 'stderr.txt').read_text()[-2000:]}")
    est = resources.job_estimate(cfg, root=Path("/"))
    return {"peak_mb": peak_kb / 1024, "wall_s": time.time() - t0, "estimate": est,
            "request_mb": est.request_mb()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(JOBS), help="run only these jobs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", type=Path, help="reuse this data folder (built when missing)")
    ap.add_argument("--out", type=Path, help="write the table as Markdown here")
    args = ap.parse_args(argv)
    names = args.only or list(JOBS)
    with tempfile.TemporaryDirectory(prefix="fedshift-mem-") as tmp:
        root = (args.data or Path(tmp) / "build").resolve()
        build_data(root)
        rows = []
        for name in names:
            cfg = plan_job(name, root, args.threads)
            r = measure(cfg, Path(tmp) / "jobs" / name, args.threads)
            ok = r["request_mb"] >= 1.25 * r["peak_mb"]
            rows.append((name, cfg, r, ok))
            print(f"{name}: peak {r['peak_mb']:.0f} MB in {r['wall_s']:.0f} s; model {r['estimate'].describe()}; "
                  f"request {r['request_mb']} MB = {r['request_mb'] / r['peak_mb']:.2f}x peak {'ok' if ok else 'SHORT'}",
                  flush=True)
    import torch

    lines = [f"# Peak RSS of real jobs vs the memory model (fedshift.resources)", "",
             f"command: `python benchmarks/memory_model.py --threads {args.threads}`", "",
             f"machine: {platform.machine()}, torch {torch.__version__}, {os.cpu_count()} cores, "
             f"CPU capability {torch.backends.cpu.get_cpu_capability()}; one process per job, MLflow tracking on, "
             "1 round x 1 local epoch", "",
             "| job | scenario | method | structure | batches (local / public) | peak RSS (MB) | model estimate (MB) "
             "| base / data / weights / activations | request (MB) | request / peak |",
             "| --- | --- | --- | --- | --- | ---: | ---: | --- | ---: | ---: |"]
    for name, cfg, r, ok in rows:
        e = r["estimate"]
        sc, method, structure, b = JOBS[name]
        lines.append(f"| {name} | {sc} | {method} | {structure} | {b['local_batch']} / {b['public_batch']} | "
                     f"{r['peak_mb']:.0f} | {e.total:.0f} | {e.base:.0f} / {e.data:.0f} / {e.weights:.0f} / "
                     f"{e.activations:.0f} | {r['request_mb']} | {r['request_mb'] / r['peak_mb']:.2f}"
                     f"{'' if ok else ' (< 1.25)'} |")
    lines += ["", f"Requests here are the job's alone; under SLURM the workflow adds {resources.WRAPPER_MB:.0f} MB "
              "for the Snakemake process inside the allocation (resources.WRAPPER_MB; 0.6-0.8 GB measured in sacct's MaxRSS, tests/test_slurm.py)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
