"""FedProto and FedTGP (issue 37): their losses against explicit loops, one whole round
in float64 against a small re-implementation written from the official code
(HtFLlib clientproto.py / serverproto.py, FedTGP clienttgp.py / servertgp.py), and
resume bit-identical after an interruption."""

from __future__ import annotations

import copy
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedshift.methods import create_method
from fedshift.methods import prototypes as P

from fedshift.testing import resumed_round_three, synthetic_federation, tiny_federation

DT = torch.float64


# ------------------------------------------------------------------ losses


def test_proto_mse_loss_as_the_official_code_computes_it():
    """MSELoss(proto_new, rep): rows whose class has a global prototype replaced by it, the others
    equal to rep; mean over B*d entries (clientproto.py:47-53), checked with a numpy loop."""
    r = np.random.default_rng(0)
    rep, protos = r.normal(size=(5, 3)), r.normal(size=(4, 3))
    y = np.array([0, 2, 3, 2, 1])
    present = np.array([True, False, True, False])
    proto_new = rep.copy()
    for i, c in enumerate(y):
        if present[c]:
            proto_new[i] = protos[c]
    ref = np.mean((proto_new - rep) ** 2)  # all 5*3 entries in the mean; rows 2 and 4 (classes 3, 1) add 0
    got = P.proto_mse_loss(torch.tensor(rep), torch.tensor(y), torch.tensor(protos), torch.tensor(present))
    assert got.item() == pytest.approx(ref, rel=1e-12)
    # hand value: one sample, one class, d = 2: ((1-0)^2 + (2-4)^2) / 2 = 2.5
    one = P.proto_mse_loss(torch.tensor([[1.0, 2.0]], dtype=DT), torch.tensor([0]), torch.tensor([[0.0, 4.0]], dtype=DT),
                           torch.tensor([True]))
    assert one.item() == 2.5
    # the gradient flows into rep only through rows with a prototype
    t = torch.tensor(rep, requires_grad=True)
    P.proto_mse_loss(t, torch.tensor(y), torch.tensor(protos), torch.tensor(present)).backward()
    assert torch.all(t.grad[[2, 4]] == 0) and torch.all(t.grad[[0, 1, 3]] != 0)


def test_proto_paper_loss_is_the_printed_distance_between_prototypes():
    """reg_form: paper: sum over the batch's classes with a global prototype of ||mean of the batch's
    reps of the class - global prototype||_2 (unsquared), checked with a float64 numpy loop and a hand value."""
    r = np.random.default_rng(1)
    rep, protos = r.normal(size=(7, 4)), r.normal(size=(5, 4))
    y = np.array([0, 2, 3, 2, 1, 0, 0])
    present = np.array([True, True, False, True, True])  # class 2 (two samples) has no global prototype
    ref = 0.0
    for c in range(5):
        rows = [rep[i] for i in range(7) if y[i] == c]
        if rows and present[c]:  # class 4: a global prototype, no sample in the batch: adds 0
            ref += math.sqrt(sum((v - protos[c][k]) ** 2 for k, v in enumerate(np.mean(rows, axis=0))))
    got = P.proto_paper_loss(torch.tensor(rep), torch.tensor(y), torch.tensor(protos), torch.tensor(present))
    assert got.dtype == DT and got.item() == pytest.approx(ref, rel=1e-12)
    # hand value: class 0 from samples (1, 2) and (3, 2) -> mean (2, 2), prototype (5, 6): ||(-3, -4)|| = 5;
    # class 1 from (0, 1), prototype (0, 1): 0
    hand = P.proto_paper_loss(torch.tensor([[1.0, 2.0], [3.0, 2.0], [0.0, 1.0]], dtype=DT), torch.tensor([0, 0, 1]),
                              torch.tensor([[5.0, 6.0], [0.0, 1.0]], dtype=DT), torch.tensor([True, True]))
    assert hand.item() == 5.0
    # no class with a prototype in the batch: 0
    none = P.proto_paper_loss(torch.tensor(rep[:1]), torch.tensor([2]), torch.tensor(protos), torch.tensor(present))
    assert none.item() == 0.0
    # gradients: only rows of classes with a prototype, finite where a class mean sits on its prototype
    t = torch.tensor([[1.0, 2.0], [3.0, 2.0], [0.0, 1.0], [7.0, 7.0]], dtype=DT, requires_grad=True)
    P.proto_paper_loss(t, torch.tensor([0, 0, 1, 2]), torch.tensor([[5.0, 6.0], [0.0, 1.0], [0.0, 0.0]], dtype=DT),
                       torch.tensor([True, True, False])).backward()
    g = t.grad.numpy()
    # d/drow ||mean - p|| = (mean - p) / ||mean - p|| / n_class = (-0.6, -0.8) / 2
    np.testing.assert_allclose(g[:2], [[-0.3, -0.4], [-0.3, -0.4]], rtol=1e-12)
    assert np.all(np.isfinite(g)) and np.all(g[3] == 0)


def test_reg_form_selects_the_regulariser(tiny_data):
    """fedproto's reg_form: code (default) adds lamda * proto_mse_loss, paper lamda * proto_paper_loss."""
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    x, y = fed.clients[0].data.get("private")
    x, y = x[:8].float() / 255, y[:8]
    losses = {}
    for form in ("code", "paper"):
        m = create_method("fedproto", {"reg_form": form, "lamda": 3.0})
        m.setup(fed)
        m.protos = torch.randn(10, m.dim, generator=torch.Generator().manual_seed(0))
        m.present = torch.arange(10) % 2 == 0
        with torch.no_grad():
            got = m.local_loss(fed, fed.clients[0], x, y, 0)
            h, logits = fed.clients[0].model.forward_with_features(x)
        reg = (P.proto_paper_loss if form == "paper" else P.proto_mse_loss)(m.rep(h), y, m.protos, m.present)
        assert reg.item() > 0
        torch.testing.assert_close(got, F.cross_entropy(logits, y) + 3.0 * reg, rtol=0, atol=0)
        losses[form] = got.item()
    assert losses["code"] != losses["paper"]
    assert create_method("fedproto").p.reg_form == "code"


def test_pool_to_is_adaptive_average_pooling():
    """Window i of an adaptive pool from L to n: entries floor(i L / n) .. ceil((i+1) L / n) - 1."""
    h = torch.arange(14, dtype=DT).reshape(2, 7)
    n = 3
    ref = [[h[b, math.floor(i * 7 / n):math.ceil((i + 1) * 7 / n)].mean().item() for i in range(n)] for b in range(2)]
    assert ref == [[1.0, 3.0, 5.0], [8.0, 10.0, 12.0]]  # windows [0, 3), [2, 5), [4, 7): they overlap
    assert P.pool_to(h, n).tolist() == ref
    assert P.pool_to(h, 7) is h


def _gaps_loop(avg, classes, num_classes):
    """servertgp.py:102-115 as written there: a 1e9 start, min over pairs, then 1e9 -> min."""
    gap = [1e9] * num_classes
    for k1 in classes:
        for k2 in classes:
            if k1 > k2:
                d = float(np.linalg.norm(avg[k1] - avg[k2]))
                gap[k1], gap[k2] = min(gap[k1], d), min(gap[k2], d)
    m = min(gap)
    return [m if g > 1e8 else g for g in gap]


def test_class_gaps_and_adaptive_margin_as_the_official_loop():
    # hand values: classes 0, 1, 3 at (0,0), (3,4), (0,1); class 2 absent
    avg = torch.tensor([[0.0, 0.0], [3.0, 4.0], [9.0, 9.0], [0.0, 1.0]], dtype=DT)
    present = torch.tensor([True, True, False, True])
    gaps = P.class_gaps(avg, present)
    # class 0: min(|0-1| = 5, |0-3| = 1) = 1; class 1: min(5, |1-3| = sqrt(9 + 9)) = sqrt(18); class 3: 1;
    # class 2 (absent) keeps 1e9 and takes the minimum, 1
    assert gaps.tolist() == pytest.approx([1.0, math.sqrt(18.0), 1.0, 1.0], rel=1e-15)
    assert gaps.tolist() == pytest.approx(_gaps_loop(avg.numpy(), [0, 1, 3], 4), rel=1e-15)
    assert P.adaptive_margin(avg, present, 100.0) == pytest.approx(math.sqrt(18.0))
    assert P.adaptive_margin(avg, present, 2.0) == 2.0  # capped by the threshold
    # one class present: every gap stays at 1e9 -> min = 1e9 -> the margin is the threshold
    assert P.adaptive_margin(avg, torch.tensor([True, False, False, False]), 100.0) == 100.0


def test_tgp_contrastive_loss_against_loop():
    r = np.random.default_rng(3)
    protos, glob = r.normal(size=(6, 4)), r.normal(size=(5, 4))
    y = np.array([0, 4, 2, 2, 1, 3])
    margin = 0.7
    ref = 0.0
    for i in range(6):
        logits = np.array([-(np.linalg.norm(protos[i] - glob[k]) + (margin if k == y[i] else 0.0)) for k in range(5)])
        ref += -(logits[y[i]] - np.log(np.exp(logits).sum()))
    got = P.tgp_contrastive_loss(torch.tensor(protos), torch.tensor(y), torch.tensor(glob), margin)
    assert got.item() == pytest.approx(ref / 6, rel=1e-12)
    # a larger margin raises the loss (the true class is pushed to count as farther)
    assert P.tgp_contrastive_loss(torch.tensor(protos), torch.tensor(y), torch.tensor(glob), 2.0).item() > got.item()


def test_params_defaults_follow_the_official_commands():
    fp, tgp = create_method("fedproto").p, create_method("fedtgp").p
    assert (fp.lamda, fp.local_protos) == (10.0, "training")  # HtFLlib total.sh:2, clientproto.py:55-57
    assert (tgp.lamda, tgp.local_protos, tgp.server_epochs, tgp.margin_threshold, tgp.server_lr, tgp.server_batch) \
        == (10.0, "eval", 100, 100.0, 0.01, 10)  # FedTGP run_me.sh:1, clienttgp.py:67-88
    from fedshift.errors import ConfigError

    with pytest.raises(ConfigError, match=r"methods.fedtgp: invalid values \{'server_batch': 0\}"):
        create_method("fedtgp", {"server_batch": 0})
    with pytest.raises(ConfigError, match="methods.fedproto.local_protos: invalid value 'x'; valid: 'training', 'eval'"):
        create_method("fedproto", {"local_protos": "x"})


# ------------------------------------------------- one whole round in float64 vs a re-implementation


def _norm64(x):
    return (x.double() / 255.0 - 0.5) / 0.5


def _pool_loop(h, n):
    L = h.shape[1]
    if L == n:
        return h
    return torch.stack([h[:, math.floor(i * L / n):math.ceil((i + 1) * L / n)].mean(1) for i in range(n)], 1)


def _ref_client(model, gen, x, y, glob, lamda, dim, epochs, batch, lr, collect, form="code"):
    """One client's local training as clientproto.py:19-63 / clienttgp.py:19-88 write it (plain SGD);
    ``form="paper"``: the regulariser as the FedProto paper prints it, sum_j ||C^(j) - glob_j||_2 on the batch."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    lists = defaultdict(list)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for s in range(0, len(y), batch):
            idx = order[s:s + batch]
            if len(idx) < 2:  # fedshift's batches skip a single-sample remainder (BatchNorm)
                continue
            xb, yb = _norm64(x[idx]), y[idx]
            h = model.features(xb)
            rep = _pool_loop(h, dim)
            loss = F.cross_entropy(model.classifier(h), yb)
            if glob is not None and form == "paper":
                for c in sorted(set(yb.tolist())):
                    if c in glob:
                        rows = [rep[i] for i in range(len(yb)) if yb[i] == c]
                        loss = loss + lamda * torch.sqrt(((sum(rows) / len(rows) - glob[c]) ** 2).sum())
            elif glob is not None:
                proto_new = rep.detach().clone()
                for i, c in enumerate(yb.tolist()):
                    if c in glob:
                        proto_new[i] = glob[c]
                loss = loss + lamda * ((proto_new - rep) ** 2).mean()
            if collect == "training":
                for i, c in enumerate(yb.tolist()):
                    lists[c].append(rep[i].detach())
            opt.zero_grad()
            loss.backward()
            opt.step()
    if collect == "eval":
        model.eval()
        with torch.no_grad():
            rep = _pool_loop(model.features(_norm64(x)), dim)
        for i, c in enumerate(y.tolist()):
            lists[c].append(rep[i])
        model.train()
    return {c: sum(v) / len(v) for c, v in lists.items()}


def _ref_tgp_server(tgp, uploads, gen, num_classes, epochs, batch, lr, threshold):
    """servertgp.py:89-155 with loops: gaps, margin, SGD on (proto, class) pairs, all-class output."""
    per_class = defaultdict(list)
    pairs = []
    for up in uploads:
        for c in sorted(up):
            per_class[c].append(up[c])
            pairs.append((up[c], c))
    avg = {c: torch.stack(v).mean(0) for c, v in per_class.items()}
    gap = _gaps_loop({c: a.numpy() for c, a in avg.items()}, sorted(avg), num_classes)
    margin = min(max(gap), threshold)
    opt = torch.optim.SGD(tgp.parameters(), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(pairs), generator=gen).tolist()
        for s in range(0, len(pairs), batch):
            sel = [pairs[i] for i in order[s:s + batch]]
            g = tgp.fc(torch.relu(tgp.middle(tgp.embeddings.weight)))
            loss = 0.0
            for p, c in sel:
                logits = torch.stack([-(torch.norm(p - g[k]) + (margin if k == c else 0.0)) for k in range(num_classes)])
                loss = loss - torch.log_softmax(logits, 0)[c]
            loss = loss / len(sel)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        g = tgp.fc(torch.relu(tgp.middle(tgp.embeddings.weight)))
    return {c: g[c] for c in range(num_classes)}, margin


@pytest.fixture
def float64_batches(monkeypatch):
    from fedshift.engine import federation
    monkeypatch.setattr(federation, "normalize", _norm64)
    from fedshift.methods import fedproto
    monkeypatch.setattr(fedproto, "normalize", _norm64)


@pytest.mark.parametrize("name,params,sampled", [
    ("fedproto", {"lamda": 2.0, "proto_dim": 40}, 0),
    ("fedproto", {"lamda": 2.0, "local_protos": "eval"}, 2),
    ("fedproto", {"lamda": 2.0, "proto_dim": 40, "reg_form": "paper"}, 0),
    ("fedtgp", {"lamda": 2.0, "proto_dim": 40, "server_epochs": 4, "server_batch": 4, "server_lr": 0.05}, 2),
], ids=["fedproto-pooled", "fedproto-eval-sampled", "fedproto-paper-form", "fedtgp-sampled"])
def test_two_rounds_in_float64_equal_the_reimplementation(float64_batches, name, params, sampled):
    """Three clients (12-14 random images of 10 classes each), two local epochs of batch 5, plain SGD;
    rounds 1 (no global prototypes yet) and 2 (regularised). With ``sampled`` clients per round, only
    those train and upload (the sampling draw itself is the engine's, read from ``fed.sampled``)."""
    fed = synthetic_federation(3, per_client=12, server_model=False, local_batch=5, local_epochs=2, lr=0.05,
                               momentum=0.0, clients_per_round=sampled)
    m = create_method(name, params)
    m.setup(fed)
    for c in fed.clients:
        c.model.double()
    models = [copy.deepcopy(c.model) for c in fed.clients]
    gens = [torch.Generator().set_state(c.generator.get_state()) for c in fed.clients]
    p = m.p
    dim = p.proto_dim or fed.clients[0].model.feature_dim
    if name == "fedtgp":
        m.tgp.double()
        tgp, tgp_gen = copy.deepcopy(m.tgp), torch.Generator().set_state(m._gen.get_state())
    glob = None
    seen = set()  # the classes uploaded so far: FedTGP scores only those (issue 51 R31)
    for r in (1, 2):
        fed.round = r
        metrics = m.run_round(fed, r)
        chosen = fed.sampled.get(r, range(3))
        assert len(chosen) == (sampled or 3)
        uploads = [_ref_client(models[i], gens[i], *fed.clients[i].data.get("private"), glob, p.lamda, dim, 2, 5,
                               0.05, p.local_protos, getattr(p, "reg_form", "code")) for i in chosen]
        seen |= set().union(*uploads)
        if name == "fedtgp":
            glob, margin = _ref_tgp_server(tgp, uploads, tgp_gen, 10, p.server_epochs, p.server_batch, p.server_lr,
                                           p.margin_threshold)
            assert metrics["server/train/margin"] == pytest.approx(margin, rel=1e-12)
        else:
            glob = {c: sum(u[c] for u in uploads if c in u) / sum(c in u for u in uploads)
                    for c in set().union(*uploads)}
        for mod, c in zip(models, fed.clients):
            for (k, a), b in zip(c.model.state_dict().items(), mod.state_dict().values()):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=f"{name} round {r} {c.name} {k}")
        assert m.protos.dtype == DT and m.present.tolist() == [c in (seen if name == "fedtgp" else glob) for c in range(10)]
        for c, g in glob.items():
            torch.testing.assert_close(m.protos[c], g, rtol=1e-9, atol=1e-12)
    # the example reaches the cases that matter: a class held by some uploaders only; under sampling,
    # a class no uploader holds (FedProto: no global prototype; FedTGP: one for every class, scored once uploaded)
    assert any(0 < sum(c in u for u in uploads) < len(uploads) for c in range(10))
    if sampled:
        assert any(not any(c in u for u in uploads) for c in range(10))
        assert not all(m.present.tolist()) or name == "fedtgp"


# ------------------------------------------------------------------ nearest-prototype scoring


def _np_pool(h, n):
    """numpy adaptive average pooling of rows from L to n entries (windows floor(iL/n) .. ceil((i+1)L/n))."""
    L = h.shape[1]
    return np.stack([h[:, math.floor(i * L / n):math.ceil((i + 1) * L / n)].mean(1) for i in range(n)], 1)


@pytest.mark.parametrize("name", ["fedproto", "fedtgp"])
def test_prototype_scoring_predicts_the_nearest_global_prototype(tiny_data, name):
    """scoring: prototype (default, HtFLlib clientproto.py:70-100 / clienttgp.py:90-120): the evaluated
    prediction of each test image is argmin_j mean_d (rep - g_j)^2 over the classes with a global prototype,
    computed here in float64 numpy from the model's features; LeNet (84-d) beside SimpleCNN (512-d, pooled
    to 84). scoring: head leaves the classifier's logits."""
    from fedshift.data.loading import normalize
    from fedshift.engine.evaluation import correct_topk

    fed = tiny_federation(tiny_data, ("lenet", "simple_cnn"))
    m = create_method(name)
    m.setup(fed)
    x, y = fed.clients[0].data.get("test")
    x, y = x[:64], y[:64]
    with torch.no_grad():
        feats = [c.model.eval().features(normalize(x)).double().numpy() for c in fed.clients]
    for c in fed.clients:
        c.model.train()
    # hand-set prototypes: the class means of LeNet's test reps for the classes 0..6, jittered; 7..9 absent
    rep0 = feats[0]
    g = np.random.default_rng(0)
    protos = np.stack([rep0[y.numpy() == c].mean(0) if (y.numpy() == c).any() else np.zeros(84) for c in range(10)])
    protos = protos + 0.01 * g.normal(size=protos.shape)
    present = np.arange(10) < 7
    m.protos, m.present = torch.tensor(protos, dtype=torch.float32), torch.tensor(present)
    hits_head = None
    for c, h in zip(fed.clients, feats):
        rep = h if h.shape[1] == 84 else _np_pool(h, 84)
        d = ((rep[:, None, :] - protos[None].astype(np.float32).astype(np.float64)) ** 2).mean(2)
        d[:, ~present] = np.inf
        want = d.argmin(1)
        with torch.inference_mode():
            out = c.model.eval()(normalize(x))
        c.model.train()
        assert out.shape == (len(y), 10) and torch.isinf(out[:, 7:]).all()
        np.testing.assert_array_equal(out.argmax(1).numpy(), want)
        np.testing.assert_allclose(out[:, :7].double().numpy(), -d[:, :7], rtol=1e-5)
        hits = correct_topk(c.model, x, y, ks=(1,))[1]  # what the engine's evaluation reads
        np.testing.assert_array_equal(hits.numpy(), want == y.numpy())
        if c.arch == "lenet":
            held = y.numpy() < 7  # the prototypes are the class means: a real classifier on their classes
            assert (want == y.numpy())[held].mean() > 0.5 and not (want == y.numpy())[~held].any()
        hits_head = hits
    # training mode: the classifier's logits pass through (the loss is unchanged by the hook)
    h, logits = fed.clients[1].model.forward_with_features(normalize(x))
    torch.testing.assert_close(logits, fed.clients[1].model.head(h))
    assert not torch.isinf(logits).any()
    # scoring: head (a new method object on the same models) removes the hook: the classifier's logits again
    head = create_method(name, {"scoring": "head"})
    head.setup(fed)
    head.protos, head.present = m.protos, m.present
    c = fed.clients[1]
    with torch.inference_mode():
        c.model.eval()
        torch.testing.assert_close(c.model(normalize(x)), c.model.head(c.model.features(normalize(x))))
        assert not torch.isinf(c.model(normalize(x))).any()
    c.model.train()
    assert not torch.equal(correct_topk(c.model, x, y, ks=(1,))[1], hits_head)
    # before any global prototype: the classifier's logits (HtFLlib reports 0 there)
    fresh = create_method(name)
    fresh.setup(fed)
    with torch.inference_mode():
        c.model.eval()
        assert not torch.isinf(c.model(normalize(x))).any()
    c.model.train()


# ------------------------------------------------------------------ resume


RESUME = [
    ("fedproto", {}, {}),
    ("fedproto", {"local_protos": "eval"}, {"clients_per_round": 1}),
    ("fedtgp", {"server_epochs": 3}, {}),
]


@pytest.mark.parametrize("name,params,engine", RESUME, ids=["fedproto", "fedproto-eval-sampled", "fedtgp"])
def test_restored_from_state_dict_round_three_is_bit_identical(tiny_data, tmp_path, name, params, engine):
    """LeNet beside SimpleCNN (two architectures): round 3 after a save/load of the checkpoint (torch.save,
    weights_only=True) equals round 3 straight on, weights, prototypes and TGP alike."""

    def build():
        fed = tiny_federation(tiny_data, ("lenet", "simple_cnn"), rounds=3, public_aug="none", **engine)
        method = create_method(name, params)
        method.setup(fed)
        return fed, method

    (fed, method), (fed2, method2) = resumed_round_three(build, tmp_path / "state.pt")
    assert torch.equal(method.protos, method2.protos) and torch.equal(method.present, method2.present)
    assert fed.evaluate() == fed2.evaluate()  # nearest-prototype scores (the default) after the resume too
    if name == "fedtgp":
        assert all(torch.equal(a, b) for a, b in zip(method.tgp.state_dict().values(), method2.tgp.state_dict().values()))
    if engine:
        assert fed.sampled == fed2.sampled and len(fed.sampled[3]) == 1


def test_state_of_an_unknown_layout_is_refused(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    m = create_method("fedproto")
    m.setup(fed)
    with pytest.raises(ValueError, match="unknown keys.*tgp"):
        m.load_state_dict({"tgp": {}})
    t = create_method("fedtgp")
    t.setup(fed)
    with pytest.raises(ValueError, match="lacks tgp"):
        t.load_state_dict({"protos": torch.zeros(10, 84), "present": torch.ones(10, dtype=torch.bool)})


@pytest.mark.slow
def test_interrupted_fedtgp_job_resumes_bit_identically(tiny_data, tmp_path, monkeypatch):
    """A real federate job (demo_mixed, two of four participants sampled per round)
    (LeNet 84-d beside the FedAvg CNN 512-d: pooled prototypes) interrupted inside round 3 and rerun ends equal to a straight run: metrics.json, rounds.csv, sampled.csv."""
    from fedshift.experiments import load_experiments
    from fedshift.methods.fedtgp import FedTGP
    from fedshift import runner
    from test_resume import DATA, _interrupt_and_resume, _same_run

    exp = {"engine": {"rounds": 4, "local_epochs": 1, "local_batch": 32, "device": "cpu", "checkpoint_min_s": 0,
                      "threads": 1, "eval_batch": 512, "clients_per_round": 2},
           "methods": {"fedtgp": {"server_epochs": 5}},
           "grid": [{"scenarios": ["rotmnist"], "methods": ["fedtgp"], "structures": ["demo_mixed"]}]}
    (cfg,) = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data)).federate.values()
    ref, out = tmp_path / "ref", tmp_path / "out"
    runner.run_federate(cfg, ref)
    _interrupt_and_resume(monkeypatch, cfg, FedTGP, out)
    _, timings = _same_run(ref, out, ("rounds.csv", "sampled.csv"))
    assert timings["resumed_after_rounds"] == [2]


@pytest.mark.parametrize("name", ["fedproto", "fedtgp", "fpl", "fedheal"])
def test_engine_refusals_are_one_line_naming_the_method(name):
    """Fused clients: no fused objective (or an overridden loss / round); server_model: a model per
    participant (prototype methods) or their own protocol; sampling allowed where the method says so."""
    from fedshift.engine.config import EngineConfig
    from fedshift.engine.fused import fusion_obstacle
    from fedshift.engine.sampling import check_engine
    from fedshift.errors import ConfigError
    from fedshift.models import create_model

    m = create_method(name)
    why = fusion_obstacle(m, ["lenet"] * 2, [create_model("lenet", 10, 1, norm="group")])
    assert why and name in why
    check_engine(m, EngineConfig(device="cpu", clients_per_round=1))  # sampling: every one of them honours it
    if name in ("fedproto", "fedtgp"):
        with pytest.raises(ConfigError, match=f"engine.server_model: method '{name}' keeps a model per participant") as e:
            check_engine(m, EngineConfig(device="cpu", server_model=True))
        assert "\n" not in str(e.value)
    local = create_method(name, {"eval_models": "local"}) if name in ("fpl", "fedheal") else None
    if local is not None:
        with pytest.raises(ConfigError, match="clients_per_round/client_fraction"):
            check_engine(local, EngineConfig(device="cpu", clients_per_round=1))
