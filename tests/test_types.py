"""The type checker over the method contract: mypy (pinned in requirements.txt, installed by `make
install`) checks src/fedshift/methods/ and examples/ with the [tool.mypy] settings of pyproject.toml.
A cold run takes about 30 s of CPU (most of it reading torch's annotations); .mypy_cache/ makes the
next one a few seconds."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_methods_and_examples_type_check():
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"mypy (pyproject.toml [tool.mypy]) found:\n{res.stdout[-6000:]}{res.stderr[-2000:]}"
    assert "Success: no issues found" in res.stdout
