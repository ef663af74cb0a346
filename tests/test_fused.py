"""Fused clients (engine/fused.py): one vmapped model equals training the clients one by one."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshift.config import resolve
from fedshift.engine.config import EngineConfig
from fedshift.engine.fused import (FusedOptimizer, check_fusable, masked_cross_entropy, train_clients_fused, unstack,
                                   use_fused, weighted_mean_stacked)
from fedshift.engine.averaging import weighted_average
from fedshift.testing import tiny_federation


def tiny_cnn(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Dropout(dropout), nn.Linear(4 * 4 * 4, 5)).double()


def client_data(sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 5, (n,), generator=g))
            for n in sizes]


def batches_of(data, batch, epochs=1):
    x, y = data
    return [(x[i:i + batch], y[i:i + batch]) for _ in range(epochs) for i in range(0, len(y), batch)]


def sequential(model, batches, cfg: FusedOptimizer):
    m = copy.deepcopy(model)
    m.train()
    if cfg.kind == "sgd":
        opt = torch.optim.SGD(m.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(m.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return dict(m.named_parameters()), sum(losses) / len(losses)


@pytest.mark.parametrize("cfg", [FusedOptimizer("sgd", lr=0.1, momentum=0.9, weight_decay=1e-3),
                                 FusedOptimizer("sgd", lr=0.1),
                                 FusedOptimizer("adam", lr=0.01, weight_decay=1e-3)],
                         ids=["sgd-momentum", "sgd", "adam"])
def test_fused_equals_sequential_in_float64(cfg):
    # Unequal client sizes: partial last batches (7 = 4 + 3) and a client that finishes early (5 < 12).
    model = tiny_cnn()
    data = client_data([7, 5, 12])
    per_client = [batches_of(d, 4, epochs=2) for d in data]
    stacked, losses = train_clients_fused(model, per_client, cfg)
    for c, batches in enumerate(per_client):
        ref, ref_loss = sequential(model, batches, cfg)
        got = unstack(stacked, c)
        for name, p in ref.items():
            torch.testing.assert_close(got[name], p.detach(), rtol=1e-10, atol=1e-12)
        assert losses[c].item() == pytest.approx(ref_loss, rel=1e-6)
    # the clients really trained, and differently
    assert not torch.allclose(stacked["0.weight"][0], model[0].weight)
    assert not torch.allclose(stacked["0.weight"][0], stacked["0.weight"][2])


def test_fused_from_per_client_initial_weights():
    model = tiny_cnn()
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1)
    cfg = FusedOptimizer("sgd", lr=0.05)
    data = client_data([6, 6])
    per_client = [batches_of(d, 3) for d in data]
    stacked, _ = train_clients_fused(model, per_client, cfg,
                                     init=[dict(model.named_parameters()), dict(other.named_parameters())])
    ref, _ = sequential(other, per_client[1], cfg)
    torch.testing.assert_close(unstack(stacked, 1)["5.weight"], ref["5.weight"].detach(), rtol=1e-10, atol=1e-12)


def test_dropout_masks_differ_between_clients():
    # Same start, same data: only the per-client dropout masks (randomness="different") can separate them.
    model = tiny_cnn(dropout=0.5)
    d = client_data([8])[0]
    stacked, _ = train_clients_fused(model, [batches_of(d, 8)] * 2, FusedOptimizer("sgd", lr=0.5))
    assert not torch.allclose(stacked["5.weight"][0], stacked["5.weight"][1])
    # without dropout the two are identical
    stacked, _ = train_clients_fused(tiny_cnn(0.0), [batches_of(d, 8)] * 2, FusedOptimizer("sgd", lr=0.5))
    torch.testing.assert_close(stacked["5.weight"][0], stacked["5.weight"][1])


def test_batchnorm_model_refused_with_a_clear_message():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    with pytest.raises(ValueError, match="BN-free.*BatchNorm at '1'"):
        check_fusable(model)


def test_weighted_mean_stacked_equals_fedavg_average():
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)} for _ in range(3)]
    stacked = {k: torch.stack([s[k] for s in states]) for k in states[0]}
    got = weighted_mean_stacked(stacked, [1.0, 2.0, 5.0])
    ref = weighted_average(states, [1.0, 2.0, 5.0])
    for k in ref:
        torch.testing.assert_close(got[k], ref[k])


def test_engine_switch_values():
    assert resolve(EngineConfig, {"fused_clients": False}, "engine").fused_clients == "off"
    assert resolve(EngineConfig, {"fused_clients": True}, "engine").fused_clients == "on"
    with pytest.raises(Exception, match="fused_clients"):
        resolve(EngineConfig, {"fused_clients": "always"}, "engine")


def test_fused_local_update_matches_train_local(tiny_data):
    """Through the engine: same batches (the clients' own generators), same optimiser, float32 tolerance."""
    kw = dict(local_epochs=1, local_batch=16, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4)
    seq = tiny_federation(tiny_data, ("lenet", "lenet"), **kw)
    fus = tiny_federation(tiny_data, ("lenet", "lenet"), fused_clients="on", **kw)
    assert use_fused(fus, fus.clients) and not use_fused(seq, seq.clients)
    start = [p.detach().clone() for p in fus.clients[0].model.parameters()]
    ref = seq.ctx.train_participants(seq.clients)  # the round context's helper: one path or the other
    got = fus.ctx.train_participants(fus.clients, objective=masked_cross_entropy)
    assert fus.fused_rounds == 1 and not hasattr(seq, "fused_rounds")
    assert fus.ctx.steps == seq.ctx.steps and min(seq.ctx.steps.values()) > 0  # the steps each took, alike
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k] == pytest.approx(ref[k], rel=1e-4)
    for a, b in zip(seq.clients, fus.clients):
        for (n, p), q in zip(a.model.named_parameters(), b.model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=n)
    assert any(not torch.equal(p, s) for p, s in zip(fus.clients[0].model.parameters(), start))


def test_use_fused_auto_on_cpu_follows_model_size(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"), fused_clients="auto")
    assert use_fused(fed, fed.clients)  # measured: LeNet gains on CPU (benchmarks/results/clients_fused_cpu.md)
    big = tiny_federation(tiny_data, ("simple_cnn", "simple_cnn"), fused_clients="auto", norm="group")
    n = sum(p.numel() for p in big.clients[0].model.parameters())
    assert use_fused(big, big.clients) == (n <= 200_000)
    mixed = tiny_federation(tiny_data, ("lenet", "simple_cnn"), fused_clients="auto")
    assert not use_fused(mixed, mixed.clients)
