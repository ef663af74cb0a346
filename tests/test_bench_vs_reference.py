"""benchmarks/bench_vs_reference.py: a ratio only from the same sitting (issue 22 point 11).

The side-by-side run itself needs the authors' repository (fetched by the user, never vendored)
and minutes of both cores: it is a benchmark, not a test. What is tested here is what the
script says before and without it."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks/bench_vs_reference.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_vs_reference as bvr  # noqa: E402


def test_a_path_without_the_authors_code_fails_in_one_line_before_any_run(tmp_path):
    (tmp_path / "models").mkdir()  # a folder that is not the authors' fccl+
    res = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--authors", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "configuration" not in res.stdout + res.stderr  # no run started
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"--authors {tmp_path}") and "fccl+" in last and "git clone" in last


def test_without_authors_no_cross_machine_ratio_is_printed(capsys):
    run = {p: {"wall": 10.0, "user": 9.0, "sys": 1.0, "rss_gb": 1.0} for p in bvr.PHASES + ["whole"]}
    args = type("A", (), {"quick": False})()
    bvr.report({"defaults": [run]}, args)
    out = capsys.readouterr().out
    assert "not this one: no ratio" in out
    assert "faster" not in out and "slower" not in out  # issue 14's figures are another machine's


def test_with_the_authors_run_the_ratio_divides_the_same_sittings_medians(capsys):
    def run(whole):
        return {p: {"wall": whole, "user": 1.0, "sys": 0.0, "rss_gb": 1.0} for p in bvr.PHASES + ["whole"]}

    bvr.report({bvr.AUTHORS_RUN: [run(300.0), run(500.0)], "defaults": [run(100.0)], "before": [run(800.0)]},
               type("A", (), {"quick": False})())
    first_table = capsys.readouterr().out.split("\n\n")[0]  # the wall-time table (then the CPU one)
    rows = {line.split("|")[1].strip(): line for line in first_table.splitlines() if line.startswith("| ")}
    assert rows["defaults"].rstrip(" |").endswith("4.00x faster")  # median(300, 500) / 100
    assert rows["before"].rstrip(" |").endswith("0.50x slower")
    assert "issue 14's machine" not in "".join(rows)


def test_the_header_names_the_cpu_and_its_vector_flags():
    text = bvr.cpu_description()
    assert "(flags: " in text
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    assert ("avx2" in text) == ("avx2" in flags)


def test_busy_processes_run_at_the_asked_niceness_and_are_reaped():
    procs = bvr.start_busy(2, 19)
    try:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)  # running: they load the cores
        assert all(os.getpriority(os.PRIO_PROCESS, p.pid) == 19 for p in procs)
    finally:
        bvr.stop_busy(procs)
    assert all(p.returncode is not None for p in procs)  # killed and waited for: no zombie, no stray load


def test_a_configuration_sets_the_workers_environment_and_threads(monkeypatch):
    seen = []

    class FakeWorker:  # the worker itself is minutes of both cores; its arguments are the point here
        def __init__(self, cmd, env, stdout, stderr, **kw):
            seen.append((json.loads(cmd[-1]), env))
            stdout.write(json.dumps({"process": {"user": 1.0, "sys": 0.0, "rss_gb": 1.5}}) + "\n")
            self.returncode = 0

        def wait(self):
            return self.returncode

    monkeypatch.setattr(bvr.subprocess, "Popen", FakeWorker)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    args = type("A", (), {"quick": True, "threads": 2, "busy": 0, "busy_nice": 0, "copies": 1})()
    bvr.run_one("omp_passive", args)
    assert seen[-1][1]["OMP_WAIT_POLICY"] == "PASSIVE" and seen[-1][0]["threads"] == 2
    bvr.run_one("threads1", args)
    assert "OMP_WAIT_POLICY" not in seen[-1][1] and seen[-1][0]["threads"] == 1
    seen.clear()
    args.copies = 3
    out = bvr.run_one("defaults", args)
    assert len(seen) == 3 and all(spec["threads"] == 2 and spec["config"] == {} for spec, _ in seen)
    assert out["whole"]["rss_gb"] == 4.5  # three jobs on one node: their peaks add up


def test_copies_with_the_authors_run_is_refused_before_any_run(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--copies", "2", "--authors", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--copies 2" in res.stderr and "configuration" not in res.stdout
