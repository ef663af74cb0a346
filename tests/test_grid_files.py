"""Issue 22 point 4: a paper grid names its own data file, and that file reaches the planned
`dvc_repro` job, which stops with one line instead of building from another file."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedshift.cli import main

ROOT = Path(__file__).resolve().parents[1]
FCCL_PLUS_REAL = ["fccl_plus_table8", "fccl_plus_table15"]


@pytest.mark.parametrize("grid", FCCL_PLUS_REAL)
def test_real_data_grid_names_its_data_file_and_validates_alone(grid, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = yaml.safe_load((ROOT / f"params/papers/{grid}.yaml").read_text())
    assert (ROOT / cfg["data_params"]).is_file()
    assert main(["validate", "--experiments", f"params/papers/{grid}.yaml"]) == 0  # no --data-params
    assert capsys.readouterr().out.startswith("ok: ")


def test_dvc_repro_job_carries_the_grids_data_file(tmp_path):
    snakemake = Path(sys.executable).with_name("snakemake")
    res = subprocess.run([str(snakemake), "-n", "-p", "--configfile", "params/papers/fccl_plus_table8.yaml",
                          "--until", "dvc_repro"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    text = res.stdout + res.stderr
    shell = text.split("rule dvc_repro:", 1)[1].split("Shell command:", 1)[1]
    shell = shell.split("\nReasons:", 1)[0].split("\nJob stats", 1)[0]
    assert 'cmp -s "params/papers/fccl_plus_data.yaml" params/data.yaml' in shell
    # run the planned command where params/data.yaml is the demo's: one line naming both files, no dvc run
    (tmp_path / "params/papers").mkdir(parents=True)
    shutil.copy(ROOT / "params/data.yaml", tmp_path / "params/data.yaml")
    shutil.copy(ROOT / "params/papers/fccl_plus_data.yaml", tmp_path / "params/papers/fccl_plus_data.yaml")
    (tmp_path / "logs").mkdir()
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], cwd=tmp_path, capture_output=True,
                         text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})  # no dvc on PATH: must not get there
    assert run.returncode == 1
    err = run.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedshift: error: this grid needs the data of "
                                               "params/papers/fccl_plus_data.yaml")
    assert "cp params/papers/fccl_plus_data.yaml params/data.yaml" in err[0]
