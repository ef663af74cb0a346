"""The SLURM profile on a real single-node SLURM cluster started on this machine.

Starts munge, MariaDB (accounting storage, so ``sacct`` answers), slurmdbd, slurmctld and
slurmd from Debian's packages with a private configuration in a scratch folder
(``SLURM_CONF`` points every client command at it; ports are picked free), then runs a
tiny grid through ``snakemake --profile workflow/profiles/slurm`` in a scratch copy of
the pipeline (as tests/test_workflow.py does) and checks:

* every job reached COMPLETED in ``sacct``, with the rule's resources (CPUs = threads,
  memory, time limit) and the wildcards in the job comment; the collected table is whole;
* a job killed with ``scancel`` makes the workflow fail and say so (CANCELLED), and a
  rerun completes what is missing;
* memory is enforced (``JobAcctGatherParams=OverMemoryKill``: a job above its request is
  killed) and every job asked for at least 1.25x its MaxRSS in sacct; beside the tiny grid,
  FCCL+ on the authors' Digits architectures at the paper's batches runs through the same
  cluster and completes at its first request (issue 22 point 2);
* then stops every daemon it started.

Needs root and apt-get when the packages are missing (it installs
``munge slurmctld slurmd slurm-client slurmdbd mariadb-server``); skips with a message
saying so otherwise. Takes about 4-5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from helpers import pipeline_copy, run_dir, tiny_data_params, tiny_grid

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
PACKAGES = ["munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "mariadb-server"]
DAEMONS = ["munged", "slurmctld", "slurmd", "slurmdbd", "mariadbd", "sbatch", "sacct", "mariadb-install-db"]

# The one tiny grid (tests/config/tiny.yaml) and its data, with SLURM's methods. One thread per job: the
# 2-CPU test node runs two jobs side by side. fedmd's run is the longest (it trains on the public set
# too): the one the test cancels.
TINY_DATA = tiny_data_params()
TINY_GRID = tiny_grid(methods=["fedprox", "fedavg", "fedmd"], pretrain={"epochs": 1},
                      report={"title": "tiny on SLURM"})
METHODS = {"fedprox", "fedavg", "fedmd"}  # no `base`, no BASE teacher: the grid plans no pretrain job


# --------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------

def _missing() -> list:
    return [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]


def ensure_packages() -> None:
    """Install Debian's SLURM/munge/MariaDB packages when missing (root + apt-get), else skip."""
    if not _missing():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"SLURM test needs the Debian packages {' '.join(PACKAGES)} (missing: {', '.join(_missing())}); "
                    "installing them needs root and apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:  # stale package lists: update once and retry
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0 or _missing():
        pytest.skip(f"SLURM test: could not install {' '.join(PACKAGES)} with apt-get: {res.stderr.strip()[-300:]}")


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _sh(cmd, env=None, check=True, timeout=60, **kw):
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, shell=isinstance(cmd, str), **kw)
    if check and res.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({res.returncode}): {res.stdout[-1500:]} {res.stderr[-1500:]}")
    return res


def _wait(what: str, ok, timeout: float = 60.0, logs=()) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if ok():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}:\n{Path(p).read_text()[-2000:]}" for p in logs if Path(p).exists())
    raise RuntimeError(f"SLURM test cluster: {what} not up after {timeout:.0f} s\n{tails}")


class Cluster:
    """munged + mariadbd + slurmdbd + slurmctld + slurmd, all as root, state under ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.pids: list = []
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))
        # The plugin's job step drops SLURM_* variables before its inner `srun`: a wrapper
        # first on PATH points that srun at this cluster's config.
        (root / "bin").mkdir(parents=True, exist_ok=True)
        srun = root / "bin/srun"
        srun.write_text(f'#!/bin/sh\nSLURM_CONF={root / "slurm.conf"} exec {shutil.which("srun")} "$@"\n')
        srun.chmod(0o755)
        self.env["PATH"] = f"{root / 'bin'}:{os.environ['PATH']}"

    # Each daemon writes a pid file; stop() signals exactly those processes.
    def _pidfile(self, name: str) -> Path:
        return self.root / f"{name}.pid"

    def start(self) -> "Cluster":
        r = self.root
        for d in ("state", "spool", "log", "db", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        ctld_port, slurmd_port, dbd_port = _free_ports(3)
        # munge on its default socket (slurmctld's accounting connection ignores AuthInfo);
        # a munged already serving it is reused and left running.
        self.munge_socket = Path("/run/munge/munge.socket.2")
        if _sh(["munge", "-n"], check=False).returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            _sh(["munged", "--force", f"--pid-file={self._pidfile('munged')}", f"--log-file={r / 'log/munged.log'}",
                 f"--seed-file={r / 'munge/munge.seed'}"])
            _wait("munged", lambda: _sh(["munge", "-n"], check=False).returncode == 0, 30, [r / "log/munged.log"])
        # MariaDB on a private socket, no network.
        self.mysql_socket = r / "mysqld.sock"
        _sh(["mariadb-install-db", "--user=root", f"--datadir={r / 'db'}", "--auth-root-authentication-method=socket",
             "--skip-test-db"], timeout=120)
        self.mariadb = subprocess.Popen(["mariadbd", "--user=root", f"--datadir={r / 'db'}", f"--socket={self.mysql_socket}",
                          "--skip-networking", f"--pid-file={self._pidfile('mariadbd')}",
                          f"--log-error={r / 'log/mariadb.log'}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait("mariadb", lambda: self.mysql_socket.exists(), 60, [r / "log/mariadb.log"])
        mem = min(int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20) - 1024, 64000)
        cpus = os.cpu_count() or 1
        common = dict(AuthType="auth/munge")
        (r / "slurmdbd.conf").write_text("\n".join(f"{k}={v}" for k, v in {
            **common, "DbdHost": "localhost", "DbdPort": dbd_port, "SlurmUser": "root",
            "StorageType": "accounting_storage/mysql", "StorageHost": "localhost", "StorageUser": "root",
            "StorageLoc": "slurm_acct_db", "DebugLevel": "info",
            "LogFile": r / "log/slurmdbd.log", "PidFile": self._pidfile("slurmdbd"),
        }.items()) + "\n")
        os.chmod(r / "slurmdbd.conf", 0o600)
        (r / "slurm.conf").write_text("\n".join(f"{k}={v}" for k, v in {
            "ClusterName": "fedshifttest", "SlurmctldHost": self.host, **common,
            "SlurmUser": "root", "SlurmctldPort": ctld_port, "SlurmdPort": slurmd_port,
            "StateSaveLocation": r / "state", "SlurmdSpoolDir": r / "spool",
            "SlurmctldPidFile": self._pidfile("slurmctld"), "SlurmdPidFile": self._pidfile("slurmd"),
            "SlurmctldLogFile": r / "log/slurmctld.log", "SlurmdLogFile": r / "log/slurmd.log",
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core_Memory",
            "DefMemPerCPU": 1000, "MailProg": "/bin/true", "MinJobAge": 300, "ReturnToService": 2,
            "SchedulerParameters": "sched_interval=2", "MessageTimeout": 30,
            "AccountingStorageType": "accounting_storage/slurmdbd", "AccountingStorageHost": "localhost",
            "AccountingStoragePort": dbd_port, "AccountingStoreFlags": "job_comment",
            # Memory enforced as a cluster would: a step above its request is killed (jobacct_gather's
            # OverMemoryKill; cgroup's ConstrainRAMSpace needs task/cgroup, which this container lacks).
            "JobAcctGatherType": "jobacct_gather/linux", "JobAcctGatherFrequency": 1,
            "JobAcctGatherParams": "OverMemoryKill",
            "JobCompType": "jobcomp/none",
        }.items()) + f"\nNodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} State=UNKNOWN\n"
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP\n")
        # slurmdbd reaches MariaDB through MYSQL_UNIX_PORT (the client library's socket).
        dbd_env = dict(self.env, MYSQL_UNIX_PORT=str(self.mysql_socket))
        _sh(["slurmdbd"], env=dbd_env)  # reads slurmdbd.conf beside $SLURM_CONF
        _wait("slurmdbd", lambda: self._pidfile("slurmdbd").exists() and _port_open(dbd_port), 60,
              [r / "log/slurmdbd.log"])
        _sh(["slurmctld", "-f", str(r / "slurm.conf")], env=self.env)
        _wait("slurmctld", lambda: _sh(["scontrol", "ping"], env=self.env, check=False).returncode == 0, 60,
              [r / "log/slurmctld.log"])
        _sh(["slurmd", "-f", str(r / "slurm.conf")], env=self.env)
        _wait("the node", lambda: "idle" in _sh(["sinfo", "-h", "-o", "%T"], env=self.env, check=False).stdout, 60,
              [r / "log/slurmd.log", r / "log/slurmctld.log"])
        _wait("accounting", lambda: _sh(["sacct", "-n", "-X"], env=self.env, check=False).returncode == 0, 60,
              [r / "log/slurmdbd.log"])
        return self

    def stop(self) -> None:
        # Jobs outlive slurmd: cancel this cluster's jobs first (SLURM_CONF: ours only).
        if self._pidfile("slurmctld").exists():
            _sh(["scancel", "--full", "--user", str(os.geteuid())], env=self.env, check=False)
            try:
                _wait("job cleanup", lambda: not _sh(["squeue", "-h"], env=self.env, check=False).stdout.strip(), 60)
            except RuntimeError:
                pass  # stopping the daemons below ends what is left
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
            pf = self._pidfile(name)
            try:
                pid = int(pf.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(40):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.25)
        if getattr(self, "mariadb", None) is not None:
            try:
                self.mariadb.wait(timeout=30)  # reap our child
            except subprocess.TimeoutExpired:
                self.mariadb.kill()

    def sacct(self, fields="JobID,JobName%40,State,AllocCPUS,ReqMem,Timelimit,Comment%90") -> pd.DataFrame:
        out = _sh(["sacct", "-n", "-X", "-P", "--starttime=now-1days", "-o", fields], env=self.env).stdout
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        return pd.DataFrame(rows, columns=[f.split("%")[0] for f in fields.split(",")])


    def memory(self) -> pd.DataFrame:
        """Per job: its requested memory and the largest MaxRSS of its steps, both in MB."""
        out = _sh(["sacct", "-n", "-P", "--starttime=now-1days", "-o", "JobID,ReqMem,MaxRSS,State"], env=self.env).stdout
        rows = []
        for line in out.splitlines():
            if not line.strip():
                continue
            jobid, req, rss, state = line.split("|")
            rows.append({"job": jobid.split(".")[0], "step": jobid, "req_mb": _mb(req), "maxrss_mb": _mb(rss),
                         "state": state})
        df = pd.DataFrame(rows)
        return df.groupby("job").agg(req_mb=("req_mb", "max"), maxrss_mb=("maxrss_mb", "max"),
                                     states=("state", lambda s: ",".join(sorted(set(s)))))


def _mb(text: str) -> float:
    """sacct's sizes (``1536M``, ``812340K``, ``2G``, ``0``) in MB."""
    text = text.strip().rstrip("nc")  # old sacct suffixes: per node / per CPU
    if not text:
        return 0.0
    unit = text[-1].upper()
    scale = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2}
    return float(text[:-1]) * scale[unit] if unit in scale else float(text) / 2**20


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# --------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install snakemake-executor-plugin-slurm")
    ensure_packages()
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def project(tmp_path_factory, cluster, digits_launch):  # the FCCL+ Digits grid runs beside this one
    return make_project(tmp_path_factory.mktemp("project"), cluster)


def make_project(root: Path, cluster, data: dict = TINY_DATA, grid: dict = TINY_GRID) -> Path:
    root = pipeline_copy(root / "p", data, grid, link_src=True)
    env = _env(cluster)
    _sh("git init -q . && dvc init -q && dvc config core.analytics false && dvc repro", env=env, cwd=root, timeout=600)
    return root


def _env(cluster) -> dict:
    env = dict(cluster.env, PATH=f"{cluster.root / 'bin'}:{BIN}:{os.environ['PATH']}", MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("FEDSHIFT_TRACKING", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def snakemake(project, cluster, *args, timeout=900, wait=True):
    # Always under a timeout: a status query that never answers would hang the workflow.
    cmd = ["timeout", "-s", "KILL", str(timeout), str(BIN / "snakemake"), "--profile", "workflow/profiles/slurm",
           "--slurm-init-seconds-before-status-checks", "5", "--latency-wait", "5", *args]
    p = subprocess.Popen(cmd, cwd=project, env=_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    if not wait:
        return p
    out, _ = p.communicate()
    return p.returncode, out


@pytest.fixture(scope="module")
def first_run(project, cluster):
    return run_and_cancel(project, cluster)


def run_and_cancel(project, cluster):
    """Run the grid; cancel fedmd's job while it runs; the workflow must report it (no
    retries here, else the profile's `retries: 1` would resubmit it at once)."""
    p = snakemake(project, cluster, "--retries", "0", wait=False)
    victim = None
    t0 = time.time()
    while time.time() - t0 < 300 and p.poll() is None:
        q = _sh(["squeue", "-h", "-o", "%i|%T|%k"], env=cluster.env, check=False).stdout
        for line in q.splitlines():
            jobid, state, comment = line.split("|", 2)
            if "rule_federate" in comment and "_fedmd_" in comment and state == "RUNNING":
                victim = jobid
        if victim:
            _sh(["scancel", victim], env=cluster.env)
            break
        time.sleep(1)
    out, _ = p.communicate(timeout=960)
    # Whether the cancelled job had written a round's checkpoint: then its rerun must resume from
    # it (the tiny job may be cancelled before its first round ends).
    checkpointed = any(p.exists() for p in (project / "results/federate/rotmnist/photo_patches/fedmd/homo_lenet")
                       .glob("seed0-*.partial/checkpoint.pt"))
    return p.returncode, out, victim, checkpointed


@pytest.fixture(scope="module")
def rerun(first_run, project, cluster):
    if first_run[0] in (-9, 137):  # the first run hit its time limit: release its lock
        snakemake(project, cluster, "--unlock")
    return snakemake(project, cluster)


def test_cancelled_job_is_reported(first_run, cluster):
    rc, out, victim, _ = first_run
    assert victim is not None, f"fedmd's SLURM job was never seen RUNNING:\n{out[-3000:]}"
    assert rc not in (0, -9, 137), f"rc {rc}: " + out[-3000:]  # failed, not killed by the time limit
    assert "CANCELLED" in out, out[-3000:]
    assert "federate" in out and "fedmd" in out
    acct = cluster.sacct()
    assert acct.set_index("JobID").loc[victim, "State"].startswith("CANCELLED")


def test_rerun_completes_and_every_job_completed_in_sacct(rerun, first_run, cluster, project):
    rc, out = rerun
    assert rc == 0, out[-4000:]
    acct = cluster.sacct()
    print("\n" + acct.to_string(index=False))  # the sacct lines of the run (pytest -s shows them)
    (project / "sacct.txt").write_text(acct.to_string(index=False))
    victim = first_run[2]
    acct = acct[acct["Comment"].str.contains("_rotmnist_")]  # this grid's jobs (the Digits grid runs beside it)
    done = acct[acct["JobID"] != victim]
    assert (done["State"] == "COMPLETED").all(), acct.to_string()
    rules = done["Comment"].str.extract(r"^rule_(\w+?)_wildcards")[0]
    # BASE-free methods: no pretrain; 3 federated runs, fedmd twice (cancelled, then rerun).
    assert sorted(rules) == ["federate"] * 3, acct.to_string()
    # The resources the rules declare reached SLURM: one CPU (threads: 1), memory, time limit.
    assert set(done["AllocCPUS"]) == {"1"}
    assert all(1000 <= _mb(m) <= 4096 for m in done["ReqMem"]), done["ReqMem"].tolist()  # e.g. 2560M, 2.50G
    assert set(done["Timelimit"]) == {"00:15:00"}
    _assert_memory_held(cluster, done["JobID"])
    # Job names carry the profile's prefix, comments the wildcards.
    assert done["JobName"].str.startswith("fedshift_").all()
    for m in METHODS:
        assert done["Comment"].str.contains(f"wildcards_rotmnist_photo_patches_{m}_homo_lenet_0").sum() == 1, m
    # The cancelled job's rerun resumed from its checkpoint (kept beside the output folder,
    # which Snakemake's clean-up of the failed job does not touch) when it had one.
    (log,) = [p.read_text() for p in (project / "logs/federate/rotmnist/photo_patches/fedmd/homo_lenet").glob("seed0-*.log")]
    assert (re.search(r"resuming federate/rotmnist/photo_patches/fedmd/homo_lenet/seed0-[0-9a-f]{12} after round", log)
            is not None) == first_run[3], log[-2000:]


def _assert_memory_held(cluster, jobids) -> None:
    """Every job asked for at least 1.25x the largest MaxRSS of its steps (issue 22 point 2)."""
    mem = cluster.memory().loc[list(jobids)]
    print("\n" + mem.to_string())
    assert (mem["maxrss_mb"] > 100).all(), mem.to_string()  # accounting sampled the jobs
    assert (mem["req_mb"] >= 1.25 * mem["maxrss_mb"]).all(), mem.to_string()


def test_memory_is_enforced(cluster, tmp_path):
    """The cluster kills a job above its request, so the memory assertions mean something."""
    script = tmp_path / "hog.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import time; x = bytearray(700 * 2**20); "
                      "x[::4096] = b\"1\" * len(x[::4096]); time.sleep(15)'\n")
    script.chmod(0o755)
    res = _sh(["sbatch", "--parsable", "--mem=200M", "-t", "2", "-o", str(tmp_path / "hog.out"), str(script)],
              env=cluster.env)
    jobid = res.stdout.strip().split(";")[0]
    _wait("the over-memory job to end", lambda: not _sh(["squeue", "-h", "-j", jobid], env=cluster.env,
                                                        check=False).stdout.strip(), 60)
    # slurmdbd records the ended job a moment after squeue drops it (seconds on a loaded machine)
    states = {}

    def recorded() -> bool:
        states.update(cluster.sacct().set_index("JobID")["State"].to_dict())
        return states.get(jobid, "PENDING").split()[0] not in ("PENDING", "RUNNING", "COMPLETING")

    _wait(f"the accounting record of job {jobid}", recorded, 60)
    state = states[jobid]
    assert state in ("OUT_OF_MEMORY", "FAILED", "CANCELLED"), state
    assert (tmp_path / "hog.out").exists()
    assert "memory" in (tmp_path / "hog.out").read_text().lower() or state == "OUT_OF_MEMORY"


def test_collected_table_is_whole(rerun, project):
    assert rerun[0] == 0
    df = pd.read_csv(project / "results/collect/runs.csv")
    assert set(df["method"]) == METHODS
    assert (df.groupby("method").size() == 4 * 4 * 4).all()  # 4 participants x 4 domains x rounds 0..3
    assert (project / "results/report/report.md").exists()


def test_torch_threads_follow_allocation(rerun, project):
    cfg = yaml.safe_load((run_dir(project, "rotmnist/photo_patches/fedavg/homo_lenet/seed0") / "config.yaml")
                         .read_text())
    assert cfg["engine"]["threads"] == 1


# --------------------------------------------------------------------------------------
# FCCL+ on the authors' Digits architectures: memory that fits (issue 22 point 2)
# --------------------------------------------------------------------------------------

# The Digits stand-in (3x32x32, four domains) at a test's size; FCCL+'s batches (§ 4.1: 256
# private, 512 public: the public set holds one full batch) and Table VI's architectures
# (ResNet10, ResNet12, EfficientNet-B0, MobileNetV2). One job: FCCL+ needs no BASE checkpoint
# (local_distill: fntd); pretraining jobs' requests are checked in tests/test_memory_model.py.
DIGITS_DATA = {
    "mirror": None,
    "datasets": ["mnist5k", "photo_patches", "uci_digits"],
    "dataset_params": {"photo_patches": {"n": 1000, "size": 32, "seed": 0}},
    "public": {"photo_patches": {"n": 512, "seed": 0}},
    "scenarios": {"digits_offline": {"private": [40, 40, 40, 40], "test": [20, 20, 20, 20], "seed": 0}},
}
DIGITS_GRID = {
    "engine": {"rounds": 1, "local_epochs": 1, "local_batch": 256, "public_batch": 512, "device": "cpu",
               "checkpoint_min_s": 0, "threads": 1, "eval_round0": False},
    "pretrain": {"epochs": 1, "batch": 256, "eval_every": 1, "device": "cpu", "threads": 1},
    "grid": [{"name": "digits", "scenarios": ["digits_offline"], "public": ["photo_patches"],
              "methods": ["fccl_plus"], "structures": ["fcclplus_digits"], "seeds": [0]}],
    "report": {"title": "FCCL+ Digits architectures on SLURM"},
}


@pytest.fixture(scope="module")
def digits_launch(tmp_path_factory, cluster):
    """Started before the tiny grid and left running beside it (the suite's time): its own project,
    its own Snakemake, the same cluster. No retry allowed: it must fit at the first request."""
    project = make_project(tmp_path_factory.mktemp("digits"), cluster, DIGITS_DATA, DIGITS_GRID)
    log = open(project / "snakemake.out", "w")
    cmd = ["timeout", "-s", "KILL", "1500", str(BIN / "snakemake"), "--profile", "workflow/profiles/slurm",
           "--slurm-init-seconds-before-status-checks", "5", "--latency-wait", "5", "--retries", "0"]
    p = subprocess.Popen(cmd, cwd=project, env=_env(cluster), stdout=log, stderr=subprocess.STDOUT, text=True)
    yield project, p
    if p.poll() is None:
        p.kill()
    log.close()


@pytest.fixture(scope="module")
def digits_run(digits_launch):
    project, p = digits_launch
    p.wait(timeout=1600)
    return project, p.returncode, (project / "snakemake.out").read_text()


def test_fccl_plus_digits_grid_fits_its_memory_without_retry(digits_run, cluster):
    project, rc, out = digits_run
    assert rc == 0, out[-4000:]
    acct = cluster.sacct()
    mine = acct[acct["Comment"].str.contains("digits_offline")]
    (project / "sacct.txt").write_text(mine.to_string(index=False))
    rules = sorted(mine["Comment"].str.extract(r"^rule_(\w+?)_wildcards")[0])
    assert rules == ["federate"], mine.to_string()  # once: no retry
    assert (mine["State"] == "COMPLETED").all(), mine.to_string()
    _assert_memory_held(cluster, mine["JobID"])
    runs = pd.read_csv(project / "results/collect/runs.csv")
    assert set(runs["method"]) == {"fccl_plus"}
