"""FedMMD: MMD^2 against an explicit double loop, the L2 two-stream term, the local loss and
resumption from state_dict()."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedshift.losses import MMD_BANDWIDTH_MULTIPLIERS, mmd2_rbf, two_stream_l2
from fedshift.methods import create_method

from fedshift.testing import synthetic_federation

torch.set_num_threads(1)


def mmd2_loop(x: np.ndarray, y: np.ndarray, multipliers, min_scale: float = 0.0) -> float:
    """Eq. 2 written out: pooled mean squared distance over distinct pairs sets the widths."""
    z = np.concatenate([x, y])
    n = len(z)
    s = sum(((z[i] - z[j]) ** 2).sum() for i in range(n) for j in range(n) if i != j) / (n * n - n)
    s = max(s, min_scale)

    def k(a, b):
        d2 = ((a - b) ** 2).sum()
        return sum(np.exp(-d2 / (m * s)) for m in multipliers)

    kxx = np.mean([k(a, b) for a in x for b in x])
    kyy = np.mean([k(a, b) for a in y for b in y])
    kxy = np.mean([k(a, b) for a in x for b in y])
    return kxx + kyy - 2 * kxy


@pytest.mark.parametrize("n,m,d", [(6, 6, 3), (5, 7, 10)])
def test_mmd2_matches_double_loop(n, m, d):
    rng = np.random.default_rng(n + d)
    x, y = rng.normal(size=(n, d)), rng.normal(loc=0.7, size=(m, d))
    got = mmd2_rbf(torch.tensor(x), torch.tensor(y)).item()
    assert got == pytest.approx(mmd2_loop(x, y, MMD_BANDWIDTH_MULTIPLIERS), rel=1e-9)
    assert mmd2_rbf(torch.tensor(x), torch.tensor(y), (1.0,)).item() == pytest.approx(mmd2_loop(x, y, (1.0,)), rel=1e-9)
    small_x, small_y = 0.01 * x, 0.01 * y  # spread below the floor: the floor sets the widths
    got = mmd2_rbf(torch.tensor(small_x), torch.tensor(small_y), min_scale=1.0).item()
    assert got == pytest.approx(mmd2_loop(small_x, small_y, MMD_BANDWIDTH_MULTIPLIERS, 1.0), rel=1e-9)
    assert got < mmd2_rbf(torch.tensor(small_x), torch.tensor(small_y)).item()


def test_mmd2_zero_on_equal_samples_positive_otherwise_and_differentiable():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 10, generator=g, dtype=torch.float64)
    assert mmd2_rbf(x, x.clone()).abs().item() < 1e-12
    y = (x + 2.0).requires_grad_(True)
    val = mmd2_rbf(x, y)
    assert val.item() > 0
    val.backward()
    assert torch.isfinite(y.grad).all() and y.grad.abs().sum() > 0
    # gradient is finite where local == global (the first step of every round)
    z = x.clone().requires_grad_(True)
    mmd2_rbf(x, z).backward()
    assert torch.isfinite(z.grad).all()


def test_two_stream_l2():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    expected = np.mean([((x[i] - y[i]) ** 2).sum() for i in range(4)])
    assert two_stream_l2(torch.tensor(x), torch.tensor(y)).item() == pytest.approx(expected)


def test_params_defaults_and_l2_variant():
    assert create_method("fedmmd").p.lam == 0.1 and create_method("fedmmd").p.constraint == "mmd"
    l2 = create_method("fedmmd_l2")
    assert l2.p.constraint == "l2" and l2.p.lam == 0.01
    assert create_method("fedmmd", {"constraint": "l2", "lam": 0.001}).p.lam == 0.001


@pytest.mark.parametrize("name,penalty", [("fedmmd", lambda a, b: mmd2_rbf(a, b, min_scale=1.0)),
                                          ("fedmmd_l2", two_stream_l2)])
def test_local_loss_is_ce_plus_lambda_penalty_against_frozen_global(name, penalty):
    fed = synthetic_federation(3)
    m = create_method(name, {"lam": 0.5})
    fed.setup(m)
    g_state = {k: v.clone() for k, v in fed.clients[0].model.state_dict().items()}
    m.begin_round(fed.ctx, g_state)
    c = fed.clients[0]
    with torch.no_grad():  # move the local model away from the global one
        for p in c.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x, y = next(fed.private_batches(c))
    c.model.eval()  # no dropout, so both sides see the same forward
    loss = m.local_loss(fed.ctx, c, x, y, 0)
    local = c.model(x)
    glob = torch.func.functional_call(c.model, g_state, (x,))
    expected = F.cross_entropy(local, y) + 0.5 * penalty(glob, local)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(p.grad is None for p in m.global_net.parameters())  # the global stream is frozen
    assert m.state_dict() == {}


def _snapshot(fed):
    return {"w": {k: v.clone() for k, v in fed.clients[0].model.state_dict().items()},
            "gens": [c.generator.get_state() for c in fed.clients] + [fed.sample_gen.get_state()],
            "sampled": dict(fed.sampled)}


def _restore(fed, snap):
    fed.clients[0].model.load_state_dict(snap["w"])
    for c, s in zip(fed.clients, snap["gens"]):
        c.generator.set_state(s)
    fed.sample_gen.set_state(snap["gens"][-1])
    fed.sampled.update(snap["sampled"])


@pytest.mark.parametrize("name", ["fedmmd", "fedmmd_l2"])
def test_state_dict_round_trip_resumes_identically(name):
    """Weights + RNG streams + method.state_dict() after round 1 give the same round 2."""
    fed = synthetic_federation(6, clients_per_round=2)
    m = create_method(name)
    fed.setup(m)
    fed.round = 1
    fed.run_round(1)
    snap, state = _snapshot(fed), m.state_dict()
    fed2 = synthetic_federation(6, clients_per_round=2)
    m2 = create_method(name)
    fed2.setup(m2)
    m2.load_state_dict(state)
    _restore(fed2, snap)
    for f, meth in ((fed, m), (fed2, m2)):
        f.round = 2
        f.run_round(2)
    assert fed.sampled[2] == fed2.sampled[2]
    for k, v in fed.clients[0].model.state_dict().items():
        assert torch.equal(v, fed2.clients[0].model.state_dict()[k]), k
