"""Test helpers beyond fedshift.testing (which builds the tiny federations and holds the resume
check a plugin's own tests use too)."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from fedshift.testing import tiny_federation


def saved_bytes(fn):
    """(bytes of the tensors autograd keeps for backward while ``fn`` runs, ``fn``'s result): independent
    of the allocator."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


def client_params(fed, i=0):
    """Participant ``i``'s parameters, flattened (to compare two runs' weights)."""
    return torch.cat([p.detach().flatten() for p in fed.clients[i].model.parameters()])


def run_method(root, params, method, rounds, archs, **engine):
    """Set ``method`` up on a tiny federation (no public augmentation) and run ``rounds`` rounds."""
    from fedshift.methods import create_method

    fed = tiny_federation(root, archs, public_aug="none", **engine)
    m = create_method(method, params)
    fed.setup(m)
    for r in range(1, rounds + 1):
        fed.round = r
        fed.run_round(r)
    return fed, m


def reference_batches(data, generator, batch, epochs, normalize):
    """The minibatches of ``data`` (images, labels) as fedshift's private_batches draws them, for the tests'
    loop re-implementations: one ``randperm`` of ``generator`` per epoch, a one-sample remainder dropped."""
    x, y = data
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for s in range(0, len(y), batch):
            idx = order[s:s + batch]
            if len(idx) < 2:
                continue
            yield normalize(x[idx]), y[idx]


TINY = Path(__file__).resolve().parent / "config"


def tiny_data_params() -> dict:
    """The tiny grid's data params (tests/config/tiny_data.yaml), a fresh dict."""
    return yaml.safe_load((TINY / "tiny_data.yaml").read_text())


def tiny_grid(methods=None, method_params=None, **sections) -> dict:
    """The one tiny grid (tests/config/tiny.yaml), a fresh dict; ``methods`` replaces the grid's methods,
    ``method_params`` is merged into its ``methods:`` block, and each of ``sections`` (``engine``,
    ``pretrain``, ``report``) is merged into that section."""
    grid = yaml.safe_load((TINY / "tiny.yaml").read_text())
    if methods is not None:
        grid["grid"][0]["methods"] = list(methods)
    grid["methods"] = {**grid.get("methods", {}), **(method_params or {})}
    for key, changes in sections.items():
        grid[key] = {**grid.get(key, {}), **changes}
    return grid


def pipeline_copy(root, data=None, grid=None, link_src=False):
    """A scratch copy of the pipeline files in ``root`` (created): dvc.yaml, .dvcignore, environment.yml,
    workflow/, and params/data.yaml + params/experiments.yaml holding ``data`` and ``grid`` (default: the
    tiny grid and its data, tests/config/). ``link_src``: src/fedshift linked in (dvc.yaml's stages depend
    on src/fedshift/data) and an empty data/, for a test that runs ``dvc repro`` there."""
    import os
    import shutil

    repo = Path(__file__).resolve().parents[1]
    root = Path(root)
    root.mkdir()
    for name in ("dvc.yaml", ".dvcignore", "environment.yml"):
        shutil.copy(repo / name, root / name)
    shutil.copytree(repo / "workflow", root / "workflow", ignore=shutil.ignore_patterns(".snakemake"))
    (root / "params").mkdir()
    (root / "params/data.yaml").write_text(yaml.safe_dump(tiny_data_params() if data is None else data))
    (root / "params/experiments.yaml").write_text(yaml.safe_dump(tiny_grid() if grid is None else grid))
    if link_src:
        (root / "src").mkdir()
        os.symlink(repo / "src/fedshift", root / "src/fedshift")
        (root / "data").mkdir()
    return root


def run_dir(root, slot, kind="federate"):
    """The one finished-or-running run folder of ``slot`` (``rotmnist/photo_patches/fedavg/homo_lenet/seed0``)
    under ``root/results/<kind>/``: ``<slot>-<identity>`` (issue 50); its ``.partial`` area is not counted."""
    found = sorted(p for p in Path(root, "results", kind).glob(f"{slot}-*") if not p.name.endswith(".partial"))
    assert len(found) == 1, f"{slot}: {found}"
    return found[0]


def planned_dir(root, slot, kind="federate", configfiles=()):
    """``results/<kind>/<slot>-<identity>`` (relative) as the project in ``root`` plans it: its
    params/experiments.yaml with ``configfiles`` merged over it as ``snakemake --configfile`` does, tune included
    (a Snakemake target before the run; in-process, so the grid's methods must be registered here)."""
    import os

    from fedshift.experiments import load_experiments, snakemake_config
    from fedshift.tune import plan_tune

    root = Path(root)
    here = os.getcwd()
    os.chdir(root)  # the grid's relative paths (data params, results/) are the project's
    try:
        files = [root / "params/experiments.yaml", *(root / f for f in configfiles)]
        exp = snakemake_config(files, workflow_config=root / "params/experiments.yaml", quiet=True)
        data = exp.pop("data_params", None) or "params/data.yaml"
        plan = load_experiments({k: v for k, v in exp.items() if k not in ("gpus_per_job", "threads_per_job")}, data)
        plan_tune(exp, plan)
    finally:
        os.chdir(here)
    jobs = plan.federate if kind == "federate" else plan.pretrain
    (job,) = [j for j in jobs if j.path == slot]
    return f"results/{kind}/{plan.folder(job)}"


def dry_run_dirs(root, env=None, args=""):
    """The federate run folders (``results/federate/<slot>-<identity>``) ``snakemake -n`` plans in ``root`` with
    ``env`` (a plugin's methods registered in that environment only) and ``args``."""
    import re
    import subprocess

    res = subprocess.run(f"snakemake -n --cores 1 {args}", cwd=root, env=env, shell=True, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return sorted(set(re.findall(r"(results/federate/\S+?)/metrics\.json", res.stdout)))
