"""FPL (issue 37): FINCH and the prototype loss against independent forms, two whole rounds in
float64 against a re-implementation from RethinkFL models/fpl.py, and resume bit-identical."""

from __future__ import annotations

import copy
from collections import defaultdict

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from scipy.sparse.csgraph import connected_components

from fedshift.methods import create_method
from fedshift.methods import prototypes as P
from fedshift.engine.participants import steps_per_epoch

from fedshift.testing import resumed_round_three, synthetic_federation, tiny_federation

DT = torch.float64


def finch_ref(x):
    """FINCH as its paper states it (Sarfraz et al. 2019, Eq. 1): A(i, j) = 1 if j = k_i or k_j = i or
    k_i = k_j, clusters = connected components; recurse on the clusters' means until one cluster is
    left or nothing merges; the last partition with more than one cluster (or the first) is returned."""
    def partition(m):
        n = len(m)
        mn = m / np.linalg.norm(m, axis=1, keepdims=True)
        d = 1 - mn @ mn.T
        np.fill_diagonal(d, np.inf)
        k = d.argmin(1)
        a = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                if i != j and (k[i] == j or k[j] == i or k[i] == k[j]):
                    a[i, j] = 1
        return connected_components(sp.csr_matrix(a), directed=False)[1]

    c = partition(x)
    while True:
        means = np.stack([x[c == j].mean(0) for j in range(c.max() + 1)])
        if len(means) == 1:
            return c
        merged = partition(means)[c]
        if merged.max() == 0 or merged.max() >= c.max():
            return c
        c = merged


def same_partition(a, b):
    a, b = list(a), list(b)
    return all((a[i] == a[j]) == (b[i] == b[j]) for i in range(len(a)) for j in range(len(a)))


def test_finch_hand_example_and_against_the_papers_definition():
    # two tight pairs in opposite directions + a lone point near the first pair: {0, 1, 4}, {2, 3}
    x = torch.tensor([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.0], [-1.0, -0.1], [1.0, 0.3]], dtype=DT)
    assert P.finch_partition(x).tolist() == [0, 0, 1, 1, 0]
    assert P.finch_partition(x[:1]).tolist() == [0]
    assert P.finch_partition(x[:2]).tolist() == [0, 0]  # each the other's neighbour: one cluster
    rng = np.random.default_rng(0)
    multi = 0
    for trial in range(40):
        n = int(rng.integers(2, 14))
        centres = rng.normal(size=(int(rng.integers(1, 4)), 6)) * 3
        pts = centres[rng.integers(0, len(centres), n)] + rng.normal(size=(n, 6)) * 0.5
        got = P.finch_partition(torch.tensor(pts)).numpy()
        assert same_partition(got, finch_ref(pts)), trial
        multi += got.max() > 0
    assert multi > 5  # the examples reach multi-cluster partitions, several of them after a merge step


def test_fpl_prototype_loss_against_the_official_per_sample_loop():
    rng = np.random.default_rng(1)
    f = rng.normal(size=(5, 4))
    y = np.array([0, 2, 1, 2, 3])
    clusters = {0: rng.normal(size=(2, 4)), 2: rng.normal(size=(1, 4)), 3: rng.normal(size=(3, 4))}  # class 1 absent
    tau = 0.3
    all_f = np.concatenate([clusters[c] for c in sorted(clusters)])

    def cos(a, b):
        return a @ b / np.linalg.norm(a) / np.linalg.norm(b)

    total = 0.0
    for i in range(5):  # fpl.py:171-181: a sum over samples with prototypes, divided by every sample
        if y[i] not in clusters:
            continue
        pos = np.exp([cos(f[i], p) / tau for p in clusters[y[i]]]).sum()
        every = np.exp([cos(f[i], p) / tau for p in all_f]).sum()
        total += -np.log(pos / every) + np.mean((f[i] - clusters[y[i]].mean(0)) ** 2)
    owner = torch.tensor([c for c in sorted(clusters) for _ in clusters[c]])
    unbiased = torch.zeros(4, 4, dtype=DT)
    for c, v in clusters.items():
        unbiased[c] = torch.tensor(v.mean(0))
    present = torch.tensor([c in clusters for c in range(4)])
    ft = torch.tensor(f, requires_grad=True)
    got = P.fpl_prototype_loss(ft, torch.tensor(y), torch.tensor(all_f), owner, unbiased, present, tau)
    assert got.item() == pytest.approx(total / 5, rel=1e-12)
    got.backward()
    assert torch.isfinite(ft.grad).all() and torch.all(ft.grad[2] == 0)  # class 1 has no prototype: no gradient


def test_steps_per_epoch_matches_the_engine_batches():
    fed = synthetic_federation(3, per_client=11, server_model=False, local_batch=5)
    for c in fed.clients:  # 11, 12, 13 images in batches of 5: 2 (+1 dropped), 3, 3
        assert steps_per_epoch(c.num_private, 5) == len(list(fed.private_batches(c)))


# ------------------------------------------------- one whole round in float64 vs a re-implementation


def _norm64(x):
    return (x.double() / 255.0 - 0.5) / 0.5


def _ref_round(global_state, model, clients, sampled, weights, glob, tau, epochs, batch, lr):
    """RethinkFL fpl.py:123-197 + federated_model.py:81-114 with loops (plain SGD)."""
    states, local_protos = [], []
    for c, gen in sampled:
        model.load_state_dict(global_state)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        x, y = c.data.get("private")
        for ep in range(epochs):
            lists = defaultdict(list)
            order = torch.randperm(len(y), generator=gen)
            for s in range(0, len(y), batch):
                idx = order[s:s + batch]
                if len(idx) < 2:
                    continue
                xb, yb = _norm64(x[idx]), y[idx]
                f = model.features(xb)
                loss = F.cross_entropy(model.classifier(f), yb)
                if glob is not None:
                    clusters, mean_f = glob
                    extra = 0.0
                    for i, lab in enumerate(yb.tolist()):
                        if lab not in clusters:
                            continue
                        every = torch.cat([clusters[k] for k in sorted(clusters)])
                        sims = torch.cosine_similarity(f[i:i + 1], every, dim=1) / tau
                        pos = torch.cosine_similarity(f[i:i + 1], clusters[lab], dim=1) / tau
                        extra = extra - torch.log(torch.exp(pos).sum() / torch.exp(sims).sum())
                        extra = extra + ((f[i] - mean_f[lab]) ** 2).mean()
                    loss = loss + extra / len(yb)
                if ep == epochs - 1:
                    for i, lab in enumerate(yb.tolist()):
                        lists[lab].append(f[i].detach())
                opt.zero_grad()
                loss.backward()
                opt.step()
        local_protos.append({k: sum(v) / len(v) for k, v in lists.items()})
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    total = sum(weights)
    avg = {k: sum(s[k] * (w / total) for s, w in zip(states, weights)) for k in states[0]}
    clusters, mean_f = {}, {}
    for k in range(10):
        rows = [p[k] for p in local_protos if k in p]
        if not rows:
            continue
        lab = finch_ref(torch.stack(rows).numpy()) if len(rows) > 1 else np.zeros(1, dtype=int)
        clusters[k] = torch.stack([torch.stack([r for r, l in zip(rows, lab) if l == j]).mean(0)
                                   for j in range(lab.max() + 1)])
        mean_f[k] = clusters[k].mean(0)
    return avg, (clusters, mean_f)


@pytest.mark.parametrize("sampled", [0, 5], ids=["all", "sampled"])
def test_two_rounds_in_float64_equal_the_reimplementation(monkeypatch, sampled):
    from fedshift.engine import federation
    monkeypatch.setattr(federation, "normalize", _norm64)
    fed = synthetic_federation(8, per_client=12, server_model=False, local_batch=5, local_epochs=2, lr=0.05,
                               momentum=0.0, clients_per_round=sampled)
    m = create_method("fpl", {"tau": 0.5})
    fed.setup(m)
    for c in fed.clients:
        c.model.double()
    model = copy.deepcopy(fed.clients[0].model)
    gens = [torch.Generator().set_state(c.generator.get_state()) for c in fed.clients]
    global_state = {k: v.clone() for k, v in fed.clients[0].model.state_dict().items()}
    glob, most = None, 0
    for r in (1, 2):
        fed.round = r
        fed.run_round(r)
        chosen = fed.sampled.get(r, range(8))
        assert len(chosen) == (sampled or 8)
        sel = [(fed.clients[i], gens[i]) for i in chosen]
        global_state, glob = _ref_round(global_state, model, fed.clients, sel, [c.num_private for c, _ in sel], glob,
                                        0.5, 2, 5, 0.05)
        for c in fed.clients:
            for k, v in c.model.state_dict().items():
                torch.testing.assert_close(v, global_state[k], rtol=1e-9, atol=1e-12, msg=f"round {r} {c.name} {k}")
        clusters, mean_f = glob
        assert m.present.tolist() == [k in clusters for k in range(10)]
        assert m.owner.tolist() == [k for k in sorted(clusters) for _ in clusters[k]]
        for k in clusters:
            got = m.clusters[m.owner == k]
            torch.testing.assert_close(got, clusters[k], rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(m.unbiased[k], mean_f[k], rtol=1e-9, atol=1e-12)
        most = max([most] + [len(v) for v in clusters.values()])
    assert most > 1  # the example reaches a class whose uploads FINCH splits into several clusters


# ------------------------------------------------------------------ resume


@pytest.mark.parametrize("scoring,engine", [({}, {}), ({"eval_models": "local", "weighting": "uniform"}, {}),
                                            ({}, {"clients_per_round": 1})], ids=["global", "local", "sampled"])
def test_restored_from_state_dict_round_three_is_bit_identical(tiny_data, tmp_path, scoring, engine):
    def build():
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), rounds=3, public_aug="none", scoring=scoring, **engine)
        method = create_method("fpl")
        fed.setup(method)
        return fed, method

    (_, method), (_, method2) = resumed_round_three(build, tmp_path / "state.pt")
    for k in ("clusters", "owner", "unbiased", "present"):
        assert torch.equal(getattr(method, k), getattr(method2, k)), k
