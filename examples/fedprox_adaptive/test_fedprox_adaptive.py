"""The plugin's own tests, as its author writes them: pure functions against independent formulas,
and the state round trip on a tiny federation built by ``fedshift.testing`` (no fedshift checkout
needed, only an installed fedshift). Run with ``pytest examples/fedprox_adaptive``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedshift.testing import build_tiny_data, resumed_round_three, tiny_federation
from fedprox_adaptive import FedProxAdaptive, FedProxAdaptiveParams, next_mu, prox_loss


def test_prox_loss_matches_independent_formula():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(6, 5, generator=g), torch.tensor([0, 1, 2, 3, 4, 0])
    params = [torch.randn(3, 4, generator=g), torch.randn(7, generator=g)]
    anchor = [torch.randn(3, 4, generator=g), torch.randn(7, generator=g)]
    mu = 0.3
    z = logits.double().numpy()
    ce = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(6), y.numpy()])
    prox = sum(((p.double().numpy() - a.double().numpy()) ** 2).sum() for p, a in zip(params, anchor))
    got = prox_loss(logits, y, params, anchor, mu)
    assert got.item() == pytest.approx(ce + 0.5 * mu * prox, rel=1e-5)
    assert prox_loss(logits, y, params, anchor, 0.0).item() == pytest.approx(ce, rel=1e-5)
    w = [p.clone().requires_grad_() for p in params]  # gradient of the prox part: mu * (w - a)
    prox_loss(logits, y, w, anchor, mu).backward()
    assert w[0].grad is not None and torch.allclose(w[0].grad, mu * (params[0] - anchor[0]), atol=1e-5)
    with pytest.raises(ValueError, match="2 parameters but 1 anchors"):
        prox_loss(logits, y, params, anchor[:1], mu)


def test_next_mu_rule():
    nm = lambda mu, loss, prev, streak: next_mu(mu, loss, prev, streak, 0.1, 3, 1.0)  # noqa: E731
    assert nm(0.5, 2.0, 1.0, 2) == pytest.approx((0.6, 0))  # loss rose: up one step, streak restarts
    assert nm(0.5, 1.0, 2.0, 0) == (0.5, 1)  # first decrease: unchanged
    assert nm(0.5, 1.0, 2.0, 2) == pytest.approx((0.4, 0))  # third decrease in a row: down one step
    assert nm(1.0, 2.0, 1.0, 0) == (1.0, 0)  # clipped at mu_max
    assert nm(0.05, 1.0, 2.0, 2) == (0.0, 0)  # clipped at 0
    assert nm(1.0, 5.0, float("inf"), 0) == (1.0, 1)  # round 1: no previous loss


def test_state_round_trip_and_resume(tmp_path):
    """Two rounds, checkpoint, round 3 after a restore into a fresh federation: identical (mu moved)."""
    root = build_tiny_data(tmp_path / "build")

    def fresh():
        federation = tiny_federation(root, ("lenet", "lenet"), public_aug="none", rounds=3)
        m = FedProxAdaptive(FedProxAdaptiveParams(mu=0.5, step=0.2, patience=1))
        federation.setup(m)  # the method's setup(ctx) with the federation's round context
        return federation, m

    (_, m), (_, restored) = resumed_round_three(fresh, tmp_path / "checkpoint.pt")
    assert restored.state_dict() == m.state_dict()
    assert m.mu != 0.5  # the state the round trip carried had moved
