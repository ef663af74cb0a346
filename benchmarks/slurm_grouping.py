"""Plain vs grouped SLURM submission of the demo-sized grid, on a real single-node cluster (not a test).

Starts the SLURM cluster of ``tests/test_slurm.py`` (munge, MariaDB, slurmdbd, slurmctld,
slurmd from Debian's packages, private configuration in a scratch folder), builds two
identical scratch copies of the pipeline on the test's tiny data, and runs the embedded
default grid (``params/experiments.yaml``: 9 federated runs, the BASE pretrainings they
need) with 1 round and 1 pretraining epoch, once per submission mode:

    plain     snakemake --profile workflow/profiles/slurm
    grouped   ... --groups federate=fed pretrain=pre --group-components fed=9 pre=4
              --cores <CPUs> --resources mem_mb=<MB>

Each mode starts from a fresh copy (nothing cached); with ``--repeats`` the modes
alternate. Prints the wall time of the ``snakemake`` command and the number of SLURM
jobs it submitted (from ``sacct``). Needs root and Debian's SLURM packages (installed when
missing, as the test does). Run it on an idle machine: the figures are wall times.

    .venv/bin/python benchmarks/slurm_grouping.py [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_slurm import Cluster, ensure_packages, make_project, snakemake  # noqa: E402

MODES = {
    "plain": [],
    "grouped": ["--groups", "federate=fed", "pretrain=pre", "--group-components", "fed=9", "pre=4"],
}


def demo_grid() -> dict:
    """params/experiments.yaml at 1 round / 1 pretraining epoch, one thread per job, no published tables."""
    grid = yaml.safe_load((ROOT / "params/experiments.yaml").read_text())
    grid["engine"].update(rounds=1, device="cpu", threads=1, checkpoint_min_s=0)
    grid["pretrain"].update(epochs=1, eval_every=1, device="cpu", threads=1)
    grid["report"] = {"title": "demo grid on SLURM (grouping benchmark)"}
    return grid


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=1, help="runs per mode, alternating")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("slurm_grouping.py: needs root (it starts SLURM's daemons)")
    ensure_packages()
    scratch = Path(tempfile.mkdtemp(prefix="fedshift_grouping_"))
    cluster = Cluster(scratch / "slurm")
    cpus = os.cpu_count() or 1
    mem_mb = min(int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20) - 1024, 64000)
    limits = ["--cores", str(cpus), "--resources", f"mem_mb={mem_mb // 2}"]
    rows = []
    try:
        cluster.start()
        (scratch / "template").mkdir()
        template = make_project(scratch / "template", cluster)  # dvc repro once: data are not what is timed
        (template / "params/experiments.yaml").write_text(yaml.safe_dump(demo_grid()))
        print(f"# SLURM grouping on the demo grid: 1 node, {cpus} CPUs, load {os.getloadavg()[0]:.1f} at start\n",
              flush=True)
        for rep in range(args.repeats):
            for mode, extra in MODES.items():
                project = scratch / f"{mode}_{rep}"
                shutil.copytree(template, project, symlinks=True)
                before = len(cluster.sacct())
                t0 = time.perf_counter()
                rc, out = snakemake(project, cluster, *extra, *(limits if extra else []), timeout=3600)
                wall = time.perf_counter() - t0
                if rc:
                    raise SystemExit(f"{mode}: snakemake exit status {rc}:\n{out[-3000:]}")
                jobs = len(cluster.sacct()) - before
                rows.append((mode, jobs, wall, os.getloadavg()[0]))
                print(f"  {mode} (run {rep + 1}): {jobs} SLURM jobs, {wall:.1f} s, load {rows[-1][3]:.1f}", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n| submission | SLURM jobs | wall time (s) |\n|---|---:|---:|")
    for mode in MODES:
        walls = sorted(r[2] for r in rows if r[0] == mode)
        jobs = {r[1] for r in rows if r[0] == mode}
        print(f"| {mode}{' `' + ' '.join(MODES[mode] + limits) + '`' if MODES[mode] else ''} | "
              f"{'/'.join(map(str, sorted(jobs)))} | {walls[len(walls) // 2]:.1f} |")


if __name__ == "__main__":
    main()
