"""Test helpers beyond fedshift.testing (which builds the tiny federations and holds the resume
check a plugin's own tests use too)."""

from __future__ import annotations

import torch

from fedshift.testing import tiny_federation


def client_params(fed, i=0):
    """Participant ``i``'s parameters, flattened (to compare two runs' weights)."""
    return torch.cat([p.detach().flatten() for p in fed.clients[i].model.parameters()])


def run_method(root, params, method, rounds, archs, **engine):
    """Set ``method`` up on a tiny federation (no public augmentation) and run ``rounds`` rounds."""
    from fedshift.methods import create_method

    fed = tiny_federation(root, archs, public_aug="none", **engine)
    m = create_method(method, params)
    m.setup(fed)
    for r in range(1, rounds + 1):
        fed.round = r
        m.run_round(fed, r)
    return fed, m


def pipeline_copy(root, data, grid):
    """A scratch copy of the pipeline files in ``root`` (created): dvc.yaml, .dvcignore, environment.yml,
    workflow/, and params/data.yaml + params/experiments.yaml holding ``data`` and ``grid``."""
    import shutil
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[1]
    root = Path(root)
    root.mkdir()
    for name in ("dvc.yaml", ".dvcignore", "environment.yml"):
        shutil.copy(repo / name, root / name)
    shutil.copytree(repo / "workflow", root / "workflow", ignore=shutil.ignore_patterns(".snakemake"))
    (root / "params").mkdir()
    (root / "params/data.yaml").write_text(yaml.safe_dump(data))
    (root / "params/experiments.yaml").write_text(yaml.safe_dump(grid))
    return root
