"""What a method's own tests need, importable wherever fedshift is installed (a plugin's tests too).

* :func:`build_tiny_data` - a tiny Rotated MNIST partition (4 participants of 20 images per
  class) and a 256-image public set, built offline with the real DVC stages' code in seconds;
* :func:`tiny_federation` - a federation of LeNets (or any registered architectures) on it;
  :func:`synthetic_federation` - K clients of random images when no data is on disk;
* :func:`resumed_round_three` - the state round-trip check: two rounds, a checkpoint through
  ``torch.save`` / ``torch.load(weights_only=True)``, then round 3 straight on and, in a fresh
  federation, after restoring; the round's metrics and every participant's weights must be
  identical (what a killed and rerun job relies on).

A plugin's test, e.g. ``examples/fedprox_adaptive/test_fedprox_adaptive.py``::

    from fedshift.testing import build_tiny_data, resumed_round_three, tiny_federation

    def test_resumes(tmp_path):
        root = build_tiny_data(tmp_path / "build")

        def build():
            fed, method = tiny_federation(root), MyMethod(MyParams())
            fed.setup(method)  # the method's setup(ctx) with the federation's round context
            return fed, method

        resumed_round_three(build, tmp_path / "ckpt.pt")

docs/extending.md shows it in full.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

import torch

from .data import FetchContext, build
from .data.loading import ClientData, FederatedData, load_federated
from .engine import checkpoint
from .config import resolve
from .engine.config import EngineConfig, ScoringConfig
from .engine.federation import Federation
from .runner import build_models

#: The tiny partition's participants (Rotated MNIST at 0, 20, 40 and 60 degrees).
PARTICIPANTS = ("m0", "m20", "m40", "m60")


def build_tiny_data(root: Path) -> Path:
    """Under ``root``: datasets/mnist5k, datasets/photo_patches (400 images), public/photo_patches
    (256) and partitions/rotmnist (20 images per class, Dirichlet alpha 0.1). Returns ``root``."""
    root = Path(root)
    ctx = FetchContext()
    build.fetch_dataset("mnist5k", root / "datasets/mnist5k", ctx)
    build.fetch_dataset("photo_patches", root / "datasets/photo_patches", ctx, {"n": 400})
    build.build_public("photo_patches", root / "datasets/photo_patches", root / "public/photo_patches", {"n": 256})
    build.partition("rotmnist", {"mnist5k": root / "datasets/mnist5k"}, root / "partitions/rotmnist",
                    {"per_class": 20, "alpha": 0.1, "val": 0.1, "test": 0.25})
    return root


def scoring_of(scoring: Optional[Mapping[str, Any]]) -> ScoringConfig:
    """A grid's ``scoring:`` block (``{"eval_models": "local", "weighting": "uniform"}``) as the engine takes it."""
    return resolve(ScoringConfig, dict(scoring or {}), "scoring")


def tiny_federation(root: Path, archs: Sequence[str] = ("lenet", "lenet"), seed: int = 0,
                    scoring: Optional[Mapping[str, Any]] = None, **engine: Any) -> Federation:
    """A federation of ``len(archs)`` (at most 4) participants on :func:`build_tiny_data`'s data, one
    local epoch of batch 32, on the CPU; ``engine`` overrides any :class:`EngineConfig` field, ``scoring``
    any key of the grid's ``scoring:`` block (:class:`ScoringConfig`: ``eval_models``, ``weighting``, ...)."""
    defaults: dict = dict(rounds=1, local_epochs=1, local_batch=32, public_batch=64, public_epochs=1,
                          device="cpu", eval_batch=512, public_aug="weak")
    defaults.update(engine)
    cfg = EngineConfig(**defaults)
    parts = list(PARTICIPANTS[: len(archs)])
    data = load_federated(Path(root) / "partitions/rotmnist", Path(root) / "public/photo_patches", "cpu", parts)
    models = build_models(list(archs), data.num_classes, data.image_shape[0], cfg.norm, seed)
    fed = Federation(data, models, list(archs), cfg, seed, torch.device("cpu"), scoring_of(scoring))
    fed.round = 1
    return fed


def synthetic_federation(num_clients: int, per_client: int = 12, arch: str = "lenet", seed: int = 0,
                         server_model: bool = True, test: int = 4, scoring: Optional[Mapping[str, Any]] = None,
                         **engine: Any) -> Federation:
    """K clients of random 1x28x28 images and labels (no partition on disk), for many-client tests.

    With ``server_model`` every client shares one model object, as the runner builds it; ``scoring`` as
    for :func:`tiny_federation`.
    """
    g = torch.Generator().manual_seed(1000 + seed)
    clients = []
    for i in range(num_clients):
        n = per_client + i % 3  # unequal sizes, so sample weighting matters
        x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 10, (n,), generator=g)
        name = f"client{i:03d}"
        clients.append(ClientData(name, name, {"private": (x, y), "test": (x[:test], y[:test])}))
    data = FederatedData("synthetic", 10, (1, 28, 28), clients, None, None)
    defaults: dict = dict(rounds=3, local_epochs=1, local_batch=5, optimizer="sgd", lr=0.05, weight_decay=0.0,
                          device="cpu", eval_batch=512, server_model=server_model)
    defaults.update(engine)
    cfg = EngineConfig(**defaults)
    archs = [arch] * num_clients
    models = build_models(archs[:1] if server_model else archs, 10, 1, cfg.norm, seed)
    if server_model:
        models = models * num_clients
    fed = Federation(data, models, archs, cfg, seed, torch.device("cpu"), scoring_of(scoring))
    fed.round = 1
    return fed


def copy_engine_state(fed_a: Federation, fed_b: Federation) -> None:
    """What the engine restores itself on resume: the participants' weights, the random streams and the
    server's delivery waiting for the next round (``scoring.eval_models: local``)."""
    for ca, cb in zip(fed_a.clients, fed_b.clients):
        cb.model.load_state_dict(ca.model.state_dict())
        cb.generator.set_state(ca.generator.get_state())
    fed_b.public_gen.set_state(fed_a.public_gen.get_state())
    fed_b.aug_gen.set_state(fed_a.aug_gen.get_state())
    fed_b.pending = checkpoint.restore_pending(checkpoint.pending_state(fed_a.pending), fed_b.device)


def resumed_round_three(build: Callable[[], Tuple[Federation, Any]], path: Path) -> Tuple[Tuple[Federation, Any], Tuple[Federation, Any]]:
    """Two rounds, a checkpoint through ``torch.save`` / ``torch.load(weights_only=True)`` at ``path``, then
    round 3 straight on and, in a fresh ``build()`` (a ``(federation, method)`` pair, the method set up by
    ``fed.setup(method)``) moved one round away first, round 3 after restoring it. Asserts the round's metrics and every
    participant's weights are identical; returns ``(fed, method), (restored_fed, restored_method)`` for
    the method's own state checks."""
    fed, method = build()
    for r in (1, 2):
        fed.run_round(r)
    torch.save(checkpoint.federation_state(fed, method), path)
    straight = fed.run_round(3)

    fed2, method2 = build()
    fed2.run_round(1)  # move every state away from the restored one first
    checkpoint.restore_federation(fed2, method2, torch.load(path, weights_only=True))
    resumed = fed2.run_round(3)
    assert resumed == straight, f"{method.name}: round 3's metrics differ after a restore: {resumed} != {straight}"
    for c1, c2 in zip(fed.clients, fed2.clients):
        s1, s2 = c1.model.state_dict(), c2.model.state_dict()
        differ = [k for k in s1 if not torch.equal(s1[k], s2[k])]
        assert not differ, f"{method.name}: {c1.name}'s {differ[:3]} differ after a restore"
    return (fed, method), (fed2, method2)
