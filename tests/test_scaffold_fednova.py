"""SCAFFOLD and FedNova (issue 49): their arithmetic against hand values, and two whole rounds in float64
against a loop written from each paper's equations (SCAFFOLD: Karimireddy et al. 2020, Algorithm 1 with
option II; FedNova: Wang et al. 2020, Eq. 6-7 and § 4 with local momentum), plain tensors and autograd,
nothing of fedshift's training loop; with client sampling, unequal local step counts and under both
scoring protocols (the server step runs under each)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedshift.methods import create_method
from fedshift.methods.fednova import effective_steps, fednova_step
from fedshift.methods.scaffold import client_control, control_term, scaffold_server
from fedshift.testing import resumed_round_three, synthetic_federation, tiny_federation
from helpers import reference_batches

DT = torch.float64


def _norm64(x):
    return (x.double() / 255.0 - 0.5) / 0.5


def t(v):
    return torch.tensor(v, dtype=DT)


# ------------------------------------------------------------------ hand values


def test_scaffold_arithmetic_by_hand():
    w = [t([1.0, 2.0]).requires_grad_(), t([3.0]).requires_grad_()]
    corr = [t([0.5, -1.0]), t([2.0])]
    term = control_term(w, corr)
    assert float(term.detach()) == 0.5 * 1 - 1.0 * 2 + 2.0 * 3  # <c - c_i, w>
    term.backward()
    assert w[0].grad.tolist() == [0.5, -1.0] and w[1].grad.tolist() == [2.0]  # the gradient gains c - c_i
    # option II: c_i+ = c_i - c + (x - y) / (K lr) = 1 - 0.5 + (2 - 1) / (4 * 0.25) = 1.5
    new = client_control({"w": t([1.0])}, {"w": t([0.5])}, {"w": t([2.0])}, {"w": t([1.0])}, 4, 0.25)
    assert new["w"].tolist() == [1.5]
    assert client_control({"w": t([1.0])}, {"w": t([0.5])}, {"w": t([2.0])}, {"w": t([1.0])}, 0, 0.25)["w"].tolist() == [1.0]
    # server: x + eta_g (avg - x) = 2 + 0.5 (1 - 2) = 1.5; c + (1/N) sum delta = 0.5 + (1 + 2) / 4 = 1.25
    x, c = scaffold_server({"w": t([2.0]), "n": torch.tensor(3)}, {"w": t([1.0]), "n": torch.tensor(7)},
                           {"w": t([0.5])}, [{"w": t([1.0])}, {"w": t([2.0])}], 0.5, 4)
    assert x["w"].tolist() == [1.5] and int(x["n"]) == 7 and c["w"].tolist() == [1.25]


def test_fednova_arithmetic_by_hand():
    assert effective_steps(5, 0.0) == 5.0
    # momentum rho: ||a||_1 = sum_k (1 - rho^k) / (1 - rho) over k = 1..tau
    rho, tau = 0.9, 4
    assert effective_steps(tau, rho) == pytest.approx(sum((1 - rho ** k) / (1 - rho) for k in range(1, tau + 1)))
    # x = 10; y = (8, 4) with ||a|| = (2, 4), p = (1/4, 3/4): tau_eff = 0.5 + 3 = 3.5;
    # step = 0.25 * 2 / 2 + 0.75 * 6 / 4 = 1.375; x - 3.5 * 1.375 = 5.1875 (FedAvg would give 5.0)
    new = fednova_step({"w": t([10.0])}, [{"w": t([8.0])}, {"w": t([4.0])}], [1.0, 3.0], [2.0, 4.0])
    assert new["w"].tolist() == [5.1875]
    # equal step counts: FedNova is FedAvg
    same = fednova_step({"w": t([10.0])}, [{"w": t([8.0])}, {"w": t([4.0])}], [1.0, 3.0], [3.0, 3.0])
    assert same["w"].tolist() == [pytest.approx(0.25 * 8 + 0.75 * 4)]
    # a client that did not step is left out
    only = fednova_step({"w": t([10.0])}, [{"w": t([8.0])}, {"w": t([10.0])}], [1.0, 3.0], [2.0, 0.0])
    assert only["w"].tolist() == [8.0]


# ------------------------------------------------------------------ loops from the papers' equations


def _setup(monkeypatch, method, scoring, **engine):
    """Five float64 clients of 12-14 samples, three sampled a round, ``method`` set up; and for the loop: a
    copy of the starting model, its parameter names, the global parameters x and the clients' data streams."""
    from fedshift.engine import federation

    monkeypatch.setattr(federation, "normalize", _norm64)
    fed = synthetic_federation(5, per_client=12, server_model=False, local_batch=4, local_epochs=2, lr=0.1,
                               clients_per_round=3, scoring=scoring, **engine)
    fed.setup(method)
    for cl in fed.clients:
        cl.model.double()
    model = copy.deepcopy(fed.clients[0].model)
    x = {n: p.detach().clone() for n, p in model.named_parameters()}
    gens = {cl.name: torch.Generator().set_state(cl.generator.get_state()) for cl in fed.clients}
    return fed, model, list(x), x, gens


def _batches(c, gen, batch, epochs):
    return reference_batches(c.data.get("private"), gen, batch, epochs, _norm64)


def _grad(model, params, xb, yb, wd):
    """dL/dw of the cross-entropy at ``params`` (plain tensors), plus wd * w (torch.optim's coupled decay)."""
    leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
    loss = F.cross_entropy(functional_call(model, leaves, (xb,)), yb)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {k: g + wd * params[k] for k, g in zip(leaves, grads)}


@pytest.mark.parametrize("eval_models", ["global", "local"])
def test_scaffold_two_rounds_in_float64_equal_algorithm_1(monkeypatch, eval_models):
    m = create_method("scaffold", {"server_lr": 0.7})
    fed, model, names, x, gens = _setup(monkeypatch, m, {"eval_models": eval_models, "weighting": "uniform"},
                                        momentum=0.0, weight_decay=1e-3)
    c = {n: torch.zeros_like(v) for n, v in x.items()}
    c_i = {cl.name: {n: torch.zeros_like(v) for n, v in x.items()} for cl in fed.clients}
    lr, N = 0.1, len(fed.clients)
    for r in (1, 2):
        fed.run_round(r)
        chosen = [fed.clients[i] for i in fed.sampled[r]]
        dy, dc = [], []
        for cl in chosen:  # Algorithm 1 lines 7-14, one client after another
            y, K = {n: v.clone() for n, v in x.items()}, 0
            for xb, yb in _batches(cl, gens[cl.name], 4, 2):
                g = _grad(model, y, xb, yb, 1e-3)
                y = {n: y[n] - lr * (g[n] - c_i[cl.name][n] + c[n]) for n in names}  # line 10
                K += 1
            assert fed.ctx.steps[cl.name] == K
            new = {n: c_i[cl.name][n] - c[n] + (x[n] - y[n]) / (K * lr) for n in names}  # line 12, option II
            dy.append({n: y[n] - x[n] for n in names})
            dc.append({n: new[n] - c_i[cl.name][n] for n in names})
            c_i[cl.name] = new
        x = {n: x[n] + 0.7 * sum(d[n] for d in dy) / len(chosen) for n in names}  # lines 15-17
        c = {n: c[n] + sum(d[n] for d in dc) / N for n in names}
        for n in names:
            torch.testing.assert_close(m.c[n], c[n], rtol=1e-9, atol=1e-12, msg=f"round {r} c {n}")
            for cl in chosen:
                torch.testing.assert_close(m.c_i[cl.name][n], c_i[cl.name][n], rtol=1e-9, atol=1e-12)
        # the server's model: held by everyone (global) or waiting for the next round's start (local)
        server = fed.clients[0].model.state_dict() if eval_models == "global" else fed.pending[fed.clients[0].name]
        for n in names:
            torch.testing.assert_close(server[n], x[n], rtol=1e-9, atol=1e-12, msg=f"round {r} x {n}")
        if eval_models == "local":  # each scored with its own trained model; the next round starts from x
            assert not torch.equal(fed.clients[0].model.state_dict()[names[0]], server[names[0]])
    assert len({float(sum(v.abs().sum() for v in s.values())) for s in c_i.values()}) > 2  # sampled ones moved


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_two_rounds_in_float64_equal_the_normalised_averaging(monkeypatch, momentum):
    fed, model, names, x, gens = _setup(monkeypatch, create_method("fednova"), {"weighting": "samples"},
                                        momentum=momentum, weight_decay=1e-3)
    lr, taus = 0.1, set()
    for r in (1, 2):
        fed.run_round(r)
        chosen = [fed.clients[i] for i in fed.sampled[r]]
        norms, deltas = [], []
        for cl in chosen:  # local SGD with heavy-ball momentum, the buffer fresh each round
            y, buf, tau = {n: v.clone() for n, v in x.items()}, None, 0
            for xb, yb in _batches(cl, gens[cl.name], 4, 2):
                g = _grad(model, y, xb, yb, 1e-3)
                buf = g if buf is None else {n: momentum * buf[n] + g[n] for n in names}
                y = {n: y[n] - lr * buf[n] for n in names}
                tau += 1
            assert fed.ctx.steps[cl.name] == tau
            taus.add(tau)
            a = sum((1 - momentum ** k) / (1 - momentum) for k in range(1, tau + 1))  # ||a_i||_1 of § 4
            norms.append(a)
            deltas.append({n: x[n] - y[n] for n in names})
        p = [cl.num_private / sum(q.num_private for q in chosen) for cl in chosen]
        tau_eff = sum(pi * a for pi, a in zip(p, norms))
        x = {n: x[n] - tau_eff * sum(pi * d[n] / a for pi, d, a in zip(p, deltas, norms)) for n in names}  # Eq. 7
        for n in names:
            torch.testing.assert_close(fed.clients[0].model.state_dict()[n], x[n], rtol=1e-9, atol=1e-12,
                                       msg=f"round {r} {n}")
    assert len(taus) > 1  # unequal local step counts: the case FedNova exists for


def test_fednova_differs_from_fedavg_with_unequal_steps_and_equals_it_with_equal_ones(monkeypatch):
    def run(name, per_client):
        from fedshift.engine import federation

        monkeypatch.setattr(federation, "normalize", _norm64)
        fed = synthetic_federation(3, per_client=per_client, server_model=False, local_batch=4, local_epochs=1,
                                   lr=0.1, momentum=0.0)
        for cl in fed.clients:
            cl.model.double()
        fed.setup(create_method(name))
        fed.run_round(1)
        return fed.clients[0].model.state_dict()

    nova, avg = run("fednova", 12), run("fedavg", 12)  # 12, 13, 14 samples: 3, 3, 4 steps
    assert any(not torch.allclose(nova[k], avg[k], rtol=1e-9, atol=1e-12) for k in nova)


@pytest.mark.parametrize("name,eval_models", [("scaffold", "global"), ("scaffold", "local"), ("fednova", "local")])
def test_restored_round_three_is_bit_identical(tiny_data, tmp_path, name, eval_models):
    def build():
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), rounds=3, public_aug="none", optimizer="sgd",
                              momentum=0.0, lr=0.05, scoring={"eval_models": eval_models})
        m = create_method(name)
        fed.setup(m)
        return fed, m

    (fed, m), (fed2, m2) = resumed_round_three(build, tmp_path / "state.pt")
    if name == "scaffold":
        assert all(torch.equal(m.c[k], m2.c[k]) for k in m.c)
        assert all(torch.equal(v, m2.c_i[n][k]) for n in m.c_i for k, v in m.c_i[n].items())
