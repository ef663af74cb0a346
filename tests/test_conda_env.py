"""Issue 22 point 5: the conda environment every rule names works under `snakemake --sdm conda`,
which copies the file into .snakemake/conda/ (where environment.yml's `-e .` names that folder,
not the project). The rules' env installs fedshift from ${FEDSHIFT_ROOT}, set by common.smk."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO
from test_packaging import _pins

RULES = sorted((REPO / "workflow" / "rules").glob("*.smk"))


def _conda_files():
    """(rule file, env file) for each `conda:` directive, resolved as Snakemake does: relative
    to the file that names it."""
    out = []
    for smk in RULES:
        for m in re.finditer(r'^\s*conda:\s*\n\s*"([^"]+)"', smk.read_text(), re.M):
            out.append((smk, (smk.parent / m.group(1)).resolve()))
    return out


def _pip(env):
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def test_every_rule_env_installs_fedshift_from_the_workflow_root():
    found = _conda_files()
    assert {smk.name for smk, _ in found} >= {"data.smk", "pretrain.smk", "federate.smk", "report.smk"}
    for smk, env_file in found:
        env = yaml.safe_load(env_file.read_text())
        lines = [line.split("#")[0].strip() for line in _pip(env)]
        own = [line for line in lines if line.startswith("-e")]
        assert own == ["-e ${FEDSHIFT_ROOT}"], f"{smk.name}: {env_file} installs fedshift with {own}"
        # nothing relative to the folder Snakemake copies the file into
        assert not [line for line in lines if line.startswith((".", "-e .", "-r", "file:"))]
        main_env = yaml.safe_load((REPO / "environment.yml").read_text())
        assert _pins(l for l in lines if l not in own) == _pins(
            l for l in _pip(main_env) if l.split("#")[0].strip() != "-e .")
        assert env["dependencies"][:1] == main_env["dependencies"][:1]  # same python
    common = (REPO / "workflow/rules/common.smk").read_text()
    assert "FEDSHIFT_ROOT=os.path.abspath(os.path.join(workflow.basedir, \"..\"))" in common
    assert (REPO / "workflow" / "Snakefile").is_file() and (REPO / "pyproject.toml").is_file()


def test_pip_section_resolves_from_snakemakes_copy(tmp_path):
    """Hand pip what conda hands it (the pip lines as a requirements file in the copy's folder,
    .snakemake/conda/) and check it finds fedshift, and that the old `-e .` would not."""
    _, env_file = _conda_files()[0]
    copy_dir = tmp_path / ".snakemake" / "conda"
    copy_dir.mkdir(parents=True)
    own = [l for l in _pip(yaml.safe_load(env_file.read_text())) if l.startswith("-e")]
    (copy_dir / "requirements.txt").write_text("\n".join(own) + "\n")
    env = {**os.environ, "FEDSHIFT_ROOT": str(REPO), "PIP_FIND_LINKS": ""}
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "--no-index",
           "-r", "requirements.txt"]
    res = subprocess.run(cmd, cwd=copy_dir, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-1500:]
    assert "Would install fedshift-" in res.stdout
    (copy_dir / "requirements.txt").write_text("-e .\n")
    old = subprocess.run(cmd, cwd=copy_dir, env=env, capture_output=True, text=True, timeout=120)
    assert old.returncode != 0 and "does not appear to be a Python project" in old.stderr
