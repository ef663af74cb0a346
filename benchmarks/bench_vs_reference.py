"""One FCCL+ run of the authors' benchmark workload, per phase, against their code's figures (not a test).

The workload of issue 14, measured side by side with the FCCL+ authors' code on a 2-core
machine of this kind: FCCL+ on Digits-shaped synthetic data (random uint8 pixels,
3x32x32, 10 classes), the authors' architectures (structure ``fcclplus_digits``:
ResNet10, ResNet12, EfficientNet-B0, MobileNetV2), private 138 / 94 / 4,000 / 1,000
images, public 2,000, 1,000 test images per domain; one round of one local epoch,
public batch 256 and local batch 128 (the authors' settings), then one evaluation of
every model on every test set (the authors' code evaluates once; fedshift's
round-0 evaluation is the ``eval_round0`` lever). ``--quick`` runs the same pipeline
on an eighth of the data (under 2 minutes on 2 idle cores); its figures are not
comparable to the authors'.

Each configuration runs in a fresh process (so its peak RSS is its own), the
configurations alternating (A B C A B C ...) ``--repeats`` times; the table gives the
median per phase: wall seconds, and user / system CPU seconds of the process (system
time is the kernel's: page faults on fresh buffers). ``whole`` is the worker process
from start to exit (interpreter, imports, data, models, round, evaluations).

Configurations (``--configs``; each is ``defaults`` with one lever changed, except
``before``):

    defaults      the engine defaults of this version (channels_last, recompute on CPU above
                  recompute_budget_mb 1280, bf16 training forwards of the ResNets and MobileNetV2
                  on the avx512_bf16 CPU kind (bf16_train: auto), malloc_tuning 64 MB,
                  eval_batch 256, one graph; evaluation with BatchNorm
                  folded and, on the avx512_bf16 CPU kind, bf16 autocast: eval_fold_bn / bf16
                  auto, benchmarks/bench_eval.py) and no cross-correlation data (corr_every: 0:
                  the benchmark's tables, like the authors' run, compute no Fig. 8 data)
    before        fedshift before issue 14: stride-1 EfficientNet (efficientnet_b0_s1),
                  eval_batch 2048, glibc allocator untuned, every participant's graph alive
                  in the collaborative step, correlation matrices of 512 samples every
                  round, contiguous layout, no recompute, float32 evaluation without folding
                  (evaluation keeps this version's inference_mode and buffer)
    defaults_v1   the defaults of the first issue-14 version: contiguous layout, no recompute,
                  every freed buffer kept (malloc_tuning: true = 1024 MB): fastest, 7.9 GB
    no_malloc     engine.malloc_tuning: false (glibc's own mmap threshold)
    malloc_1g / malloc_128 / malloc_32   engine.malloc_tuning: true (1024 MB) / 128 / 32
    trim          engine.malloc_trim: true (free heap pages returned at phase boundaries)
    no_cl         engine.channels_last: false
    no_recompute  engine.recompute: false (no activation checkpointing)
    budget_1024 / budget_0   engine.recompute_budget_mb: 1024 / 0 (0: every batch checkpointed, as
                  before issue 40)
    malloc_64     engine.malloc_tuning: 64 (the default, named)
    no_bf16_train engine.bf16_train: false (float32 training on every kind: on the avx512_bf16
                  kind, what the AVX2 kind trains)
    bf16          engine.bf16: true (bf16 autocast in evaluation; needs AVX-512 BF16/AMX)
    no_bf16       engine.bf16: false (float32 evaluation on every CPU kind)
    no_fold       engine.eval_fold_bn: false (BatchNorm run as a layer in evaluation)
    eval_before40 both: the evaluation of fedshift before issue 40
    eval2048      engine.eval_batch: 2048
    eval128       engine.eval_batch: 128
    eff_s1        the earlier stride-1 EfficientNet-B0 (efficientnet_b0_s1)
    eval_round0   engine.eval_round0: true (one more evaluation, before the round)
    corr          fccl_plus.corr_every: sparse (the method's default: Fig. 8 data at the figure's
                  5 rounds, here round 1), the extra cost a Fig. 8 grid pays
    graphs_all    engine.public_graphs: all (every participant's autograd graph alive in the
                  collaborative step: K-1 fewer forward passes, K times the activation memory)
    omp_passive   the worker started with OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep at a
                  barrier instead of spinning; read when torch loads, so it is the process's environment)
    omp_active    the worker started with OMP_WAIT_POLICY=ACTIVE (threads always spin)
    threads1      one torch thread whatever --threads says (two such runs share 2 cores)
    f32_budget_0  float32 training with every batch checkpointed (bf16_train: false,
                  recompute_budget_mb: 0): the budget's effect on the kind that trains in float32
    issue14_settings   this version's code with issue 14's engine settings: float32 training and
                  evaluation, every batch checkpointed, no BatchNorm folding (with corr_every 0: the
                  first issue-14 commit's ``no_corr``), to tell a code change from a machine change
    gomp_spin_10k the worker started with GOMP_SPINCOUNT=10000 (GNU OpenMP's spin before a waiting
                  thread sleeps: 10,000 instead of its default 300,000 iterations)

``--busy N`` runs N CPU-bound processes (a Python busy loop, at ``--busy-nice``) through every
measured run, the authors' included, so that the sitting measures a shared node: the case of
issue 40, where another process on the 2 cores made fedshift's OpenMP threads spin at barriers.

``--authors PATH`` runs the authors' FCCL+ code (a clone of github.com/WenkeHuang/FCCL that
the user fetches; never vendored) on the same synthetic images in the same sitting, as one
more configuration in the alternation (authors, A, B, authors, A, B, ...), unmodified
(benchmarks/authors_fccl_plus.py says how it is driven), and prints the ratio of its whole
process to each configuration's. Without it no ratio is printed: the authors' figures of
issue 14 (AUTHORS below) were measured on another machine, and machines of this kind differ
(AVX2-only or AVX-512 with BF16); the header names this machine's CPU and its vector flags.

    PYTHONPATH=src python benchmarks/bench_vs_reference.py --quick --configs defaults before
    PYTHONPATH=src python benchmarks/bench_vs_reference.py --threads 2 --repeats 2 --configs defaults before
    git clone https://github.com/WenkeHuang/FCCL /tmp/FCCL
    PYTHONPATH=src python benchmarks/bench_vs_reference.py --authors /tmp/FCCL --configs defaults
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]

# The authors' FCCL+ code on this workload, measured on ANOTHER 2-core machine (issue 14), two
# runs: printed for orientation only, never divided into this machine's figures (use --authors).
AUTHORS = {"collab": (458, 425), "local": (100, 97), "eval": (81, 75), "whole": (642, 599), "rss_gb": (17.1, 17.1)}

FULL = {"private": [138, 94, 4000, 1000], "public": 2000, "test": 1000}
QUICK = {"private": [138, 94, 500, 125], "public": 256 * 2, "test": 125}

# corr_every: 0 - the tables of this benchmark (and the authors' run, whose heat-map call is commented out)
# compute no Fig. 8 cross-correlation data; only a grid that asks for Fig. 8 does (configuration `corr`).
DEFAULTS: Dict = {"engine": {}, "method": {"corr_every": 0}, "efficientnet": "efficientnet_b0"}
CONFIGS: Dict[str, Dict] = {
    "defaults": {},
    "before": {"engine": {"eval_batch": 2048, "malloc_tuning": False, "public_graphs": "all", "channels_last": False,
                          "recompute": False, "eval_fold_bn": False, "bf16": False},
               "method": {"corr_every": 1, "corr_samples": 512}, "efficientnet": "efficientnet_b0_s1"},
    "defaults_v1": {"engine": {"channels_last": False, "recompute": False, "malloc_tuning": True, "eval_fold_bn": False,
                               "bf16": False}},
    "no_malloc": {"engine": {"malloc_tuning": False}},
    "malloc_1g": {"engine": {"malloc_tuning": True}},
    "malloc_128": {"engine": {"malloc_tuning": 128}},
    "malloc_32": {"engine": {"malloc_tuning": 32}},
    "malloc_64": {"engine": {"malloc_tuning": 64}},
    "budget_1024": {"engine": {"recompute_budget_mb": 1024}},
    "budget_0": {"engine": {"recompute_budget_mb": 0}},
    "no_bf16_train": {"engine": {"bf16_train": False}},
    "trim": {"engine": {"malloc_trim": True}},
    "no_cl": {"engine": {"channels_last": False}},
    "no_recompute": {"engine": {"recompute": False}},
    "bf16": {"engine": {"bf16": True}},
    "eval2048": {"engine": {"eval_batch": 2048}},
    "eval128": {"engine": {"eval_batch": 128}},
    "eff_s1": {"efficientnet": "efficientnet_b0_s1"},
    "eval_round0": {"engine": {"eval_round0": True}},
    "corr": {"method": {"corr_every": "sparse"}},
    "no_fold": {"engine": {"eval_fold_bn": False}},
    "no_bf16": {"engine": {"bf16": False}},
    "eval_before40": {"engine": {"eval_fold_bn": False, "bf16": False}},
    "graphs_all": {"engine": {"public_graphs": "all"}},
    "omp_passive": {"env": {"OMP_WAIT_POLICY": "PASSIVE"}},
    "omp_active": {"env": {"OMP_WAIT_POLICY": "ACTIVE"}},
    "threads1": {"threads": 1},
    "gomp_spin_10k": {"env": {"GOMP_SPINCOUNT": "10000"}},
    "f32_budget_0": {"engine": {"bf16_train": False, "recompute_budget_mb": 0}},
    "issue14_settings": {"engine": {"bf16_train": False, "recompute_budget_mb": 0, "eval_fold_bn": False,
                                    "bf16": False}},
}
PHASES = ["eval0", "collab", "local", "corr", "eval"]


# ---------------------------------------------------------------------- worker
def synthetic(sizes: Dict, seed: int = 0):
    import torch

    from fedshift.data.loading import ClientData, FederatedData

    g = torch.Generator().manual_seed(seed)

    def images(n):
        return torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)

    def labels(n):
        return torch.randint(0, 10, (n,), generator=g)

    clients = []
    for name, n in zip(("mnist", "usps", "svhn", "syn"), sizes["private"]):
        clients.append(ClientData(name=name, domain=name, splits={
            "private": (images(n), labels(n)), "test": (images(sizes["test"]), labels(sizes["test"]))}))
    return FederatedData(scenario="digits_synthetic", num_classes=10, image_shape=(3, 32, 32), clients=clients,
                         public=images(sizes["public"]), public_name="synthetic")


def worker(spec: Dict) -> Dict:
    import torch

    from fedshift.config import resolve
    from fedshift.engine.config import EngineConfig
    from fedshift.engine.cpu import set_trim
    from fedshift.engine.federation import Federation
    from fedshift.runner import _setup_torch, build_models
    from fedshift.methods import create_method
    from fedshift.models import get_structure

    cfg = {**DEFAULTS, **{k: v for k, v in spec["config"].items() if k in DEFAULTS}}
    eng = {"rounds": 1, "local_epochs": 1, "local_batch": 128, "public_batch": 256, "public_aug": "weak",
           "device": "cpu", "threads": spec["threads"], "eval_round0": False, **cfg["engine"]}
    ecfg = resolve(EngineConfig, eng, "engine")
    device = _setup_torch(ecfg.device, ecfg.threads, malloc_tuning=ecfg.malloc_tuning)
    set_trim(ecfg.malloc_trim)
    data = synthetic(spec["sizes"])
    archs = [cfg["efficientnet"] if a == "efficientnet_b0" else a for a in get_structure("fcclplus_digits").assign(4)]
    models = build_models(archs, 10, 3, ecfg.norm, 0)
    fed = Federation(data, models, archs, ecfg, 0, device)
    method = create_method("fccl_plus", cfg["method"], "digits")
    fed.setup(method)
    out: Dict = {"archs": archs, "threads": torch.get_num_threads()}

    def timed(name, fn):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        fn()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out[name] = {"wall": time.perf_counter() - t0, "user": r1.ru_utime - r0.ru_utime,
                     "sys": r1.ru_stime - r0.ru_stime, "rss_gb": r1.ru_maxrss / 2**20}

    if ecfg.eval_round0:
        timed("eval0", fed.evaluate)
    fed.round = 1
    timed("collab", lambda: method.collaborate(fed.ctx))
    timed("local", lambda: method.local_update(fed.ctx))
    timed("corr", lambda: method.after_round(fed.ctx))
    timed("eval", fed.evaluate)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["process"] = {"wall": time.perf_counter() - T_START, "user": ru.ru_utime, "sys": ru.ru_stime,
                      "rss_gb": ru.ru_maxrss / 2**20}
    return out


# ---------------------------------------------------------------------- parent
AUTHORS_RUN = "authors"  # the configuration name of the authors' code run in this sitting (--authors)


BUSY_LOOP = "while True: pass"


def start_busy(n: int, nice: int) -> List[subprocess.Popen]:
    """``n`` CPU-bound processes at niceness ``nice``: the other tenants of a shared node."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], preexec_fn=lambda: os.nice(nice))
            for _ in range(n)]


def stop_busy(procs: List[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def run_one(name: str, args) -> Dict:
    config = CONFIGS.get(name, {})
    spec = {"config": config, "threads": config.get("threads", args.threads),
            "sizes": QUICK if args.quick else FULL}
    if name == AUTHORS_RUN:
        spec["authors"] = str(args.authors)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **config.get("env", {}))
    busy = start_busy(args.busy, args.busy_nice)
    copies = args.copies
    # Each copy writes to its own files: N pipes read one after the other could fill and stall a copy.
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(copies)]
    try:
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], env=env, text=True,
                                  stdout=out, stderr=err) for out, err in files]
        for proc in procs:
            proc.wait()
        wall = time.perf_counter() - t0  # until the last copy ends: N jobs of a grid on one node
    finally:
        stop_busy(busy)
    outs = []
    for out, err in files:
        out.seek(0), err.seek(0)
        outs.append((out.read(), err.read()))
        out.close(), err.close()
    for proc, (_, err) in zip(procs, outs):
        if proc.returncode:
            why = " (killed: out of memory?)" if proc.returncode == -9 else ""
            raise SystemExit(f"configuration {name!r} failed, exit status {proc.returncode}{why}:\n{err[-3000:]}")
    out = json.loads(outs[0][0].strip().splitlines()[-1])  # the phases: the first copy's
    out["whole"] = {"wall": wall, **{k: out["process"][k] for k in ("user", "sys", "rss_gb")}}
    if copies > 1:
        out["whole"]["rss_gb"] = sum(json.loads(o.strip().splitlines()[-1])["process"]["rss_gb"] for o, _ in outs)
    return out


def median(runs: List[Dict], phase: str, key: str) -> float:
    vals = [r[phase][key] for r in runs if phase in r]
    return statistics.median(vals) if vals else float("nan")


def fmt(v: float, unit: str = "") -> str:
    return "-" if v != v else f"{v:.1f}{unit}"


def cpu_description() -> str:
    """This machine's CPU model and the vector flags that decide the speed of these kernels."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return f"{model} (flags: {' '.join(shown) or 'no AVX2/AVX-512 flags listed'})"


def report(results: Dict[str, List[Dict]], args) -> None:
    cols = PHASES + ["whole"]
    here = AUTHORS_RUN in results
    print("| configuration | " + " | ".join(f"{c} (s)" for c in cols) + " | user / sys CPU s | peak RSS (GB) "
          "| authors' whole / this whole (same sitting) |")
    print("| --- | " + " | ".join("---:" for _ in cols) + " | ---: | ---: | ---: |")
    if not args.quick and not here:
        a = AUTHORS
        print(f"| authors' code, issue 14's machine (not this one: no ratio) | - | {a['collab'][0]} / {a['collab'][1]} "
              f"| {a['local'][0]} / {a['local'][1]} | - | {a['eval'][0]} / {a['eval'][1]} | {a['whole'][0]} / "
              f"{a['whole'][1]} | - | {a['rss_gb'][0]} | - |")
    authors_whole = median(results[AUTHORS_RUN], "whole", "wall") if here else float("nan")
    for name, runs in results.items():
        cells = " | ".join(fmt(median(runs, c, "wall")) for c in cols)
        whole = median(runs, "whole", "wall")
        ratio = "-" if not here else ("1.00x (reference)" if name == AUTHORS_RUN else
                                      f"{authors_whole / whole:.2f}x" + (" faster" if authors_whole > whole else " slower"))
        print(f"| {name} | {cells} | {median(runs, 'whole', 'user'):.0f} / {median(runs, 'whole', 'sys'):.0f} "
              f"| {median(runs, 'whole', 'rss_gb'):.2f} | {ratio} |")
    print("\nPer phase, user / sys CPU seconds (median):\n")
    print("| configuration | " + " | ".join(PHASES) + " |")
    print("| --- | " + " | ".join("---:" for _ in PHASES) + " |")
    for name, runs in results.items():
        cells = " | ".join("-" if not any(p in r for r in runs) else
                           f"{median(runs, p, 'user'):.1f} / {median(runs, p, 'sys'):.1f}" for p in PHASES)
        print(f"| {name} | {cells} |")


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--quick", action="store_true", help="an eighth of the data (< 2 min on 2 idle cores)")
    p.add_argument("--configs", nargs="+", default=["defaults", "before"], choices=sorted(CONFIGS), metavar="NAME",
                   help="configurations to compare (default: defaults before); see the list above")
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration, alternating (median reported)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the authors' figures: 2 cores)")
    p.add_argument("--json", type=Path, default=None, help="also write every run's figures to this JSON file")
    p.add_argument("--authors", type=Path, default=None, metavar="PATH",
                   help="a clone of github.com/WenkeHuang/FCCL (or its fccl+ folder): run the authors' FCCL+ code "
                        "on the same data in this sitting and print the ratio")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="N CPU-bound processes beside every measured run (a shared node; default 0: idle)")
    p.add_argument("--busy-nice", type=int, default=0, metavar="K", help="their niceness (default 0; 19: lowest)")
    p.add_argument("--copies", type=int, default=1, metavar="N",
                   help="N copies of each configuration at once (N jobs of a grid on one node); `whole` is then the "
                        "time until the last ends and peak RSS the sum; not with --authors (2 x 16 GB)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        if "authors" in spec:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from authors_fccl_plus import worker as authors_worker

            print(json.dumps(authors_worker(spec, synthetic)))
        else:
            print(json.dumps(worker(spec)))
        return
    if args.copies < 1 or (args.copies > 1 and args.authors is not None):
        p.error(f"--copies {args.copies}: must be 1 or more, and 1 with --authors (each authors' run takes 16 GB)")
    if args.authors is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from authors_fccl_plus import fccl_plus_folder

        args.authors = fccl_plus_folder(args.authors)  # a bad path fails here, before any run
        args.configs = [AUTHORS_RUN] + [c for c in args.configs if c != AUTHORS_RUN]
    import torch

    print(f"# FCCL+ on the authors' benchmark workload{' (quick: 1/8 of the data)' if args.quick else ''}\n")
    print(f"command: `{' '.join(['python'] + sys.argv)}`\n")
    print(f"machine: {cpu_description()}, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{args.threads} threads, load {os.getloadavg()[0]:.1f} at start; median of {args.repeats} run(s) "
          f"per configuration, alternating\n", flush=True)
    if args.copies > 1:
        print(f"{args.copies} copies of each configuration side by side: `whole` is the time until the last ends "
              "(jobs per hour = copies x 3600 / whole), peak RSS their sum; the phases are the first copy's\n",
              flush=True)
    if args.busy:
        print(f"shared node: {args.busy} busy-loop process(es) at nice {args.busy_nice} beside every run "
              "(the authors' included)\n", flush=True)
    if args.authors is not None:
        from fedshift.tracking import git_commit  # '-dirty' would show that their checkout was modified

        print(f"authors' code: {args.authors} (git {git_commit(args.authors)}), run unmodified in this sitting\n")
    results: Dict[str, List[Dict]] = {n: [] for n in args.configs}
    for _ in range(args.repeats):
        for name in args.configs:
            results[name].append(run_one(name, args))
            r = results[name][-1]
            print(f"  {name}: " + ", ".join(f"{k} {r[k]['wall']:.1f}s ({r[k]['user']:.1f}u {r[k]['sys']:.1f}s)"
                                            for k in PHASES + ["whole"] if k in r)
                  + f", rss {r['whole']['rss_gb']:.2f} GB, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
            if args.json:  # after every run, so an interrupted comparison keeps what it measured
                tmp = args.json.with_suffix(args.json.suffix + ".tmp")
                tmp.write_text(json.dumps(results, indent=1))
                tmp.replace(args.json)
    print(f"load {os.getloadavg()[0]:.1f} at the end\n")
    report(results, args)


if __name__ == "__main__":
    main()
