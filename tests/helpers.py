"""Build small federations for method tests (real data from the tiny_data fixture)."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from fedshift.data.loading import load_federated
from fedshift.engine.config import EngineConfig
from fedshift.engine.federation import Federation
from fedshift.runner import build_models


def tiny_federation(root, archs=("lenet", "lenet"), seed=0, **engine):
    defaults = dict(rounds=1, local_epochs=1, local_batch=32, public_batch=64, public_epochs=1,
                    device="cpu", eval_batch=512, public_aug="weak")
    defaults.update(engine)
    cfg = EngineConfig(**defaults)
    parts = ["m0", "m20", "m40", "m60"][: len(archs)]
    data = load_federated(root / "partitions/rotmnist", root / "public/photo_patches", "cpu", parts)
    models = build_models(list(archs), data.num_classes, data.image_shape[0], cfg.norm, seed)
    fed = Federation(data, models, list(archs), cfg, seed, torch.device("cpu"))
    fed.round = 1
    return fed


def synthetic_federation(num_clients, per_client=12, arch="lenet", seed=0, server_model=True, test=4, **engine):
    """K clients of random 1x28x28 images and labels (no partition on disk), for many-client tests.

    With ``server_model`` every client shares one model object, as the runner builds it.
    """
    from fedshift.data.loading import ClientData, FederatedData

    g = torch.Generator().manual_seed(1000 + seed)
    clients = []
    for i in range(num_clients):
        n = per_client + i % 3  # unequal sizes, so sample weighting matters
        x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 10, (n,), generator=g)
        name = f"client{i:03d}"
        clients.append(ClientData(name, name, {"private": (x, y), "test": (x[:test], y[:test])}))
    data = FederatedData("synthetic", 10, (1, 28, 28), clients, None, None)
    defaults = dict(rounds=3, local_epochs=1, local_batch=5, optimizer="sgd", lr=0.05, weight_decay=0.0,
                    device="cpu", eval_batch=512, server_model=server_model)
    defaults.update(engine)
    cfg = EngineConfig(**defaults)
    archs = [arch] * num_clients
    models = build_models(archs[:1] if server_model else archs, 10, 1, cfg.norm, seed)
    if server_model:
        models = models * num_clients
    fed = Federation(data, models, archs, cfg, seed, torch.device("cpu"))
    fed.round = 1
    return fed


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


def copy_engine_state(fed_a, fed_b):
    """What the engine restores itself on resume: the participants' weights and the random streams."""
    for ca, cb in zip(fed_a.clients, fed_b.clients):
        cb.model.load_state_dict(ca.model.state_dict())
        cb.generator.set_state(ca.generator.get_state())
    fed_b.public_gen.set_state(fed_a.public_gen.get_state())
    fed_b.aug_gen.set_state(fed_a.aug_gen.get_state())


def resumed_round_three(build, path):
    """Two rounds, a checkpoint through ``torch.save`` / ``torch.load(weights_only=True)`` at ``path``, then
    round 3 straight on and, in a fresh ``build()`` moved one round away first, round 3 after restoring it.
    Asserts the round's metrics and every participant's weights are identical; returns
    ``(fed, method), (restored_fed, restored_method)`` for the method's own state checks."""
    from fedshift.engine import checkpoint

    fed, method = build()
    for r in (1, 2):
        fed.round = r
        method.run_round(fed, r)
    torch.save(checkpoint.federation_state(fed, method), path)
    fed.round = 3
    straight = method.run_round(fed, 3)

    fed2, method2 = build()
    fed2.round = 1
    method2.run_round(fed2, 1)  # move every state away from the restored one first
    checkpoint.restore_federation(fed2, method2, torch.load(path, weights_only=True))
    fed2.round = 3
    assert method2.run_round(fed2, 3) == straight
    for c1, c2 in zip(fed.clients, fed2.clients):
        s1, s2 = c1.model.state_dict(), c2.model.state_dict()
        assert all(torch.equal(s1[k], s2[k]) for k in s1), (method.name, c1.name)
    return (fed, method), (fed2, method2)


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
