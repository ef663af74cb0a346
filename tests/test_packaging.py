"""environment.yml and the pip requirements pin the same packages and versions."""

from __future__ import annotations

import re

import yaml

from conftest import REPO


def _pins(lines):
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        assert m, f"not an exact pin: {line!r}"
        out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_environment_yml_matches_requirements():
    req = _pins((REPO / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    own = [line for line in pip_section if line.split("#")[0].strip() == "-e ."]
    assert own, "environment.yml must install fedshift itself (pip line '-e .')"
    assert _pins(line for line in pip_section if line not in own) == req
    assert "python=3.11" in env["dependencies"]


def test_lock_contains_every_requirement_at_the_same_version():
    req = _pins((REPO / "requirements.txt").read_text().splitlines())
    lock = _pins(l for l in (REPO / "requirements.lock").read_text().splitlines())
    for name, version in req.items():
        assert lock.get(name) == version, name
    assert lock["torch"] == "2.13.0" and lock["torchvision"] == "0.28.0"
    assert not any(v.endswith("+cpu") for v in lock.values())


def test_pyproject_matches_pins():
    import tomllib

    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = {re.split(r"[<>=!~ ]", d)[0].lower() for d in proj["dependencies"]}
    req = _pins((REPO / "requirements.txt").read_text().splitlines())
    assert deps <= set(req), deps - set(req)
    assert proj["scripts"]["fedshift"] == "fedshift.cli:main"


def test_installed_torch_pair():
    import torch
    import torchvision

    assert torch.__version__.split("+")[0] == "2.13.0"
    assert torchvision.__version__.split("+")[0] == "0.28.0"
    from torchvision.ops import nms  # compiled ops load (fails with a mismatched torch build)

    boxes = torch.tensor([[0.0, 0, 1, 1], [0, 0, 1, 1.01]])
    assert nms(boxes, torch.tensor([0.9, 0.8]), 0.5).tolist() == [0]
