"""FedH2L's readings as switches (issue 21 item 6): local_data, mutual_forward, global_weight_decay."""

from __future__ import annotations

import pytest
import torch

from fedshift.errors import ConfigError
from fedshift.methods import create_method
from fedshift.runner import build_models
from fedshift.testing import tiny_federation
from helpers import client_params, run_method

LENET4 = ("lenet",) * 4


def _params(fed, i=0):
    return client_params(fed, i)


def _run(tiny_data, params, method="fedh2l", rounds=3, **engine):
    return run_method(tiny_data, params, method, rounds, LENET4, **engine)


def _peer_logits(model, xs):
    model.train()
    per_peer = torch.stack([model(x) for x in xs])
    concat = model(torch.cat(xs)).view(len(xs), xs[0].shape[0], -1)
    return per_peer, concat


@pytest.mark.parametrize("norm,equal", [("none", True), ("batch", False)])
def test_one_concatenated_pass_equals_per_peer_passes_only_without_batchnorm(norm, equal):
    torch.manual_seed(0)
    model = build_models(["lenet"], 10, 1, norm, 0)[0].double()
    xs = [torch.randn(8, 1, 28, 28, dtype=torch.float64) + k for k in range(3)]  # peers' batches differ in mean
    per_peer, concat = _peer_logits(model, xs)
    g1 = torch.autograd.grad(per_peer.logsumexp(-1).sum(), list(model.parameters()))
    g2 = torch.autograd.grad(concat.logsumexp(-1).sum(), list(model.parameters()))
    flat1, flat2 = torch.cat([g.flatten() for g in g1]), torch.cat([g.flatten() for g in g2])
    if equal:
        torch.testing.assert_close(per_peer, concat)
        torch.testing.assert_close(flat1, flat2)
    else:
        assert not torch.allclose(per_peer, concat, atol=1e-3)
        assert float(torch.nn.functional.cosine_similarity(flat1, flat2, dim=0)) < 0.999


def _float64_batches(monkeypatch):
    """The nodes' batches normalised in float64 (data.loading.normalize's arithmetic): with the models doubled
    before setup, two paths that differ only in float32 summation order cannot drift apart through AMSGrad's
    division by near-zero second moments, by an amount that depends on the CPU's kernels (AVX2 vs AVX-512)."""
    from fedshift.methods import fedh2l, stepwise

    to64 = lambda x: (x.double() / 255.0 - 0.5) / 0.5  # noqa: E731
    monkeypatch.setattr(stepwise, "normalize", to64)
    monkeypatch.setattr(fedh2l, "normalize", to64)


def _run64(tiny_data, params, monkeypatch, rounds=3):
    """As :func:`_run`, in float64 (:func:`_float64_batches`)."""
    _float64_batches(monkeypatch)
    fed = tiny_federation(tiny_data, LENET4, public_aug="none", norm="none")
    for c in fed.clients:
        c.model.double()
    m = create_method("fedh2l", params)
    fed.setup(m)
    for r in range(1, rounds + 1):
        fed.round = r
        fed.run_round(r)
    return fed


def test_concat_and_per_peer_train_the_same_lenet(tiny_data, monkeypatch):
    a = _run64(tiny_data, {"mutual_forward": "per_peer"}, monkeypatch)
    b = _run64(tiny_data, {"mutual_forward": "concat"}, monkeypatch)
    for i in range(4):
        assert _params(a, i).dtype == torch.float64
        torch.testing.assert_close(_params(a, i), _params(b, i), rtol=1e-9, atol=1e-11)


def test_concat_is_refused_for_a_batchnorm_model(tiny_data):
    fed = tiny_federation(tiny_data, LENET4, public_aug="none", norm="batch")
    with pytest.raises(ConfigError, match=r"mutual_forward: concat .* BatchNorm at 'conv.1'; use per_peer"):
        fed.setup(create_method("fedh2l", {"mutual_forward": "concat"}))
    fed.setup(create_method("fedh2l"))  # per_peer (default) runs


@pytest.mark.parametrize("method", ["fedh2l", "ind"])
def test_local_data_private_plus_seed(tiny_data, method):
    fed, m = _run(tiny_data, {}, method=method, rounds=0)
    fed2, m2 = _run(tiny_data, {"local_data": "private+seed"}, method=method, rounds=0)
    n_priv = len(fed.clients[1].data.get("private")[1])
    own = len(fed.clients[1].data.get("public")[1])
    every = sum(len(c.data.get("public")[1]) for c in fed.clients)
    assert len(m.nodes[1].y) == n_priv
    # FedH2L: every domain's seed split (§ IV-E 2); IND: its own domain's (§ IV-A "independent of alpha")
    assert len(m2.nodes[1].y) == n_priv + (every if method == "fedh2l" else own)
    a, _ = _run(tiny_data, {}, method=method)
    b, _ = _run(tiny_data, {"local_data": "private+seed"}, method=method)
    assert not torch.allclose(_params(a), _params(b))


def test_private_plus_seed_needs_labeled_seed_data():
    with pytest.raises(Exception, match="local_data: private\\+seed .* public_labels is false"):
        create_method("fedh2l", {"local_data": "private+seed", "public_labels": False})


def test_global_weight_decay_switch(tiny_data):
    _, m = _run(tiny_data, {}, rounds=0)
    _, m2 = _run(tiny_data, {"global_weight_decay": False}, rounds=0)
    assert m.nodes[0].opt_global.param_groups[0]["weight_decay"] == m.p.weight_decay > 0  # applied twice
    assert m2.nodes[0].opt_global.param_groups[0]["weight_decay"] == 0.0
    assert m2.nodes[0].opt_local.param_groups[0]["weight_decay"] == m.p.weight_decay
    a, _ = _run(tiny_data, {})
    b, _ = _run(tiny_data, {"global_weight_decay": False})
    assert not torch.allclose(_params(a), _params(b))


@pytest.mark.parametrize("method,params", [
    ("fedh2l", {}), ("ind", {}), ("agg", {}),
    ("fedh2l", {"g_loc": "param_change", "local_data": "private+seed"}),
    ("fedh2l", {"peers": "random_pairs", "projection": "pcgrad", "kl": False}),
])
def test_fused_steps_of_the_nodes_equal_sequential(tiny_data, method, params, monkeypatch):
    """Local step (all three) and FedH2L's teaching forwards + mutual step: one vmapped call each.

    Compared in float64: in float32 one vmapped call and four calls sum in different orders, and
    AMSGrad divides by sqrt(v) with v near zero for rarely-touched weights, so a last-bit difference
    grows to ~3e-5 in 4 steps and the size depends on the CPU's kernels (AVX2 vs AVX-512). In float64
    the same paths agree to ~1e-12, so a real divergence (a wrong peer, a missed step) cannot hide in
    the tolerance.
    """
    from fedshift.engine import fused

    _float64_batches(monkeypatch)

    def run(mode):
        fed = tiny_federation(tiny_data, LENET4, public_aug="none", norm="none", fused_clients=mode)
        for c in fed.clients:  # before setup: the flat gradient buffers and AMSGrad states follow the dtype
            c.model.double()
        m = create_method(method, {"log_every": 2, **params})
        fed.setup(m)
        fused.decide_for_run(fed, m)
        logs = {}
        for r in range(1, 5):
            fed.round = r
            logs.update(fed.run_round(r))
        return fed, m, logs

    seq, ms, ls = run("off")
    fus, mf, lf = run("on")
    assert fus.fused_rounds == 4 and not hasattr(seq, "fused_rounds")
    assert getattr(fus, "fused_mutual_rounds", 0) == (4 if method == "fedh2l" else 0)  # the fused mutual step ran
    assert not hasattr(seq, "fused_mutual_rounds")
    assert ls.keys() == lf.keys() and ls
    for k in ls:
        assert lf[k] == pytest.approx(ls[k], rel=1e-6), k  # the logged sums are kept in float32
    for i in range(4):
        assert _params(seq, i).dtype == torch.float64
        torch.testing.assert_close(_params(fus, i), _params(seq, i), rtol=1e-9, atol=1e-11)
        assert not torch.equal(_params(fus, i), _params(tiny_federation(tiny_data, LENET4, norm="none"), i))
    # checkpoints are the sequential path's: the optimiser states load across paths
    mf.load_state_dict(ms.state_dict())
