"""Every benchmark script still imports against the package (a name moved inside fedshift broke
bench_gpu.py's import unnoticed until a GPU session ran it: issue 41's session of 2026-11-27)."""

import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))

LOAD = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('bench_script', sys.argv[1]); "
        "mod = importlib.util.module_from_spec(spec); sys.path.insert(0, str(__import__('pathlib').Path(sys.argv[1]).parent)); "
        "spec.loader.exec_module(mod)")


def test_every_script_is_found():
    assert len(SCRIPTS) >= 10 and ROOT / "benchmarks/bench_gpu.py" in SCRIPTS


def test_every_benchmark_script_imports():
    """Module level only (each script's main() runs under ``if __name__ == "__main__"``), all in one
    interpreter per script; a script that fails names itself and its error."""
    failed = []
    for path in SCRIPTS:
        res = subprocess.run([sys.executable, "-c", LOAD, str(path)], cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
        if res.returncode:
            failed.append(f"{path.name}: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    assert not failed, failed
