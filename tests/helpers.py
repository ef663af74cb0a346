"""Build small federations for method tests (real data from the tiny_data fixture)."""

from __future__ import annotations

import torch

from fedshift.data.loading import load_federated
from fedshift.engine.config import EngineConfig
from fedshift.engine.federation import Federation
from fedshift.engine.runner import build_models


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
