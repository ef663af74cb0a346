"""The FCCL+ counterparts (fedprox, moon, fedproc, fedrs, fml, fedmatch, rhfl, rcfl):
their losses against hand values or an explicit numpy loop, each method's state
round trip (a method restored from state_dict() after round 1 behaves identically in
round 2), and the switches that must change behaviour."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from fedshift import losses as L
from fedshift.errors import ConfigError
from fedshift.methods import create_method

from fedshift.testing import copy_engine_state, tiny_federation

DT = torch.float64


def t(x):
    return torch.tensor(x, dtype=DT)


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def kl(p, q):
    return float(np.sum(p * (np.log(p) - np.log(q))))


# ------------------------------------------------------------------ losses


def test_fedproc_alpha_schedules():
    assert L.fedproc_alpha(7, 40, 0.5) == 0.5
    assert [L.fedproc_alpha(r, 5, 0.5, "linear") for r in range(1, 6)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert L.fedproc_alpha(1, 1, 0.5, "linear") == 1.0
    with pytest.raises(ConfigError, match="constant, linear"):
        L.fedproc_alpha(1, 5, 0.5, "cosine")


def test_class_prototypes_hand_values():
    h = t([[1.0, 0.0], [3.0, 2.0], [0.0, 5.0]])
    protos, counts = L.class_prototypes(h, torch.tensor([0, 0, 2]), 3)
    torch.testing.assert_close(protos, t([[2.0, 1.0], [0.0, 0.0], [0.0, 5.0]]))
    torch.testing.assert_close(counts, t([2.0, 0.0, 1.0]))


def test_prototype_contrastive_loss_against_loop():
    r = np.random.default_rng(0)
    h, c = r.normal(size=(6, 4)), r.normal(size=(5, 4))
    y = np.array([0, 1, 2, 3, 4, 2])
    present = np.array([True, True, True, False, True])  # class 3 has no prototype: sample 3 left out
    tau = 0.5
    ref, n = 0.0, 0
    for b in range(6):
        if not present[y[b]]:
            continue
        sims = np.array([h[b] @ c[k] / np.linalg.norm(h[b]) / np.linalg.norm(c[k]) for k in range(5)]) / tau
        sims = sims[present]
        pos = list(np.flatnonzero(present)).index(y[b])
        ref += -(sims[pos] - np.log(np.exp(sims).sum()))
        n += 1
    got = L.prototype_contrastive_loss(t(h), torch.tensor(y), t(c), torch.tensor(present), tau)
    assert got.item() == pytest.approx(ref / n, rel=1e-12)
    dot = L.prototype_contrastive_loss(t(h), torch.tensor(y), t(c), torch.tensor(present), 1.0, "dot")
    z = h @ c.T
    keep = present[y]
    ref_dot = np.mean([-(z[b, y[b]] - np.log(np.exp(z[b, present]).sum())) for b in np.flatnonzero(keep)])
    assert dot.item() == pytest.approx(ref_dot, rel=1e-12)
    # no sample has a prototype: 0, still differentiable
    hh = t(h).requires_grad_()
    zero = L.prototype_contrastive_loss(hh, torch.tensor([3] * 6), t(c), torch.tensor(present))
    zero.backward()
    assert zero.item() == 0.0 and hh.grad is not None


def test_mutual_learning_losses_formula_and_independence():
    r = np.random.default_rng(1)
    zl, zm = r.normal(size=(4, 3)), r.normal(size=(4, 3))
    y = np.array([0, 2, 1, 1])
    pl, pm = softmax(zl), softmax(zm)
    ce_l = -np.mean(np.log(pl[np.arange(4), y]))
    ce_m = -np.mean(np.log(pm[np.arange(4), y]))
    kl_ml = np.mean([kl(pm[b], pl[b]) for b in range(4)])
    kl_lm = np.mean([kl(pl[b], pm[b]) for b in range(4)])
    a, b = 0.3, 0.6
    tl, tm = t(zl).requires_grad_(), t(zm).requires_grad_()
    loss_l, loss_m = L.mutual_learning_losses(tl, tm, torch.tensor(y), a, b)
    assert loss_l.item() == pytest.approx(a * ce_l + (1 - a) * kl_ml, rel=1e-12)
    assert loss_m.item() == pytest.approx(b * ce_m + (1 - b) * kl_lm, rel=1e-12)
    loss_l.backward()
    assert tm.grad is None  # the meme is the private model's teacher: no gradient into it
    # alpha = beta = 1 (HtFLlib's FML defaults) leaves two independent CE losses
    l1, m1 = L.mutual_learning_losses(t(zl), t(zm), torch.tensor(y), 1.0, 1.0)
    assert (l1.item(), m1.item()) == pytest.approx((ce_l, ce_m), rel=1e-12)


def test_agreement_pseudo_labels_votes_and_ties():
    own = t([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]])
    h1 = t([[0.1, 0.8, 0.1], [0.2, 0.7, 0.1]])
    h2 = t([[0.2, 0.7, 0.1], [0.3, 0.3, 0.4]])
    # row 0: votes 2, 1, 1 -> 1; row 1: votes 0, 1, 2 -> three-way tie -> lowest index 0
    assert L.agreement_pseudo_labels(own, [h1, h2]).tolist() == [1, 0]
    assert L.agreement_pseudo_labels(own, []).tolist() == [2, 0]


def test_fedmatch_unlabeled_loss_against_loop():
    r = np.random.default_rng(2)
    z = r.normal(size=(6, 4)) * 3
    zs = r.normal(size=(6, 4))
    hs = [r.normal(size=(6, 4)) * 3 for _ in range(2)]
    conf, li, la = 0.75, 0.01, 0.02
    p = softmax(z)
    keep = np.flatnonzero(p.max(1) >= conf)
    assert 0 < len(keep) < 6  # the threshold matters in this example
    cons = np.mean([np.mean([kl(softmax(h)[b], p[b]) for b in keep]) for h in hs])
    votes = np.zeros((6, 4))
    for m in [z] + hs:
        votes[np.arange(6), m.argmax(1)] += 1
    pseudo = votes.argmax(1)
    ce = np.mean([-np.log(softmax(zs)[b, pseudo[b]]) for b in keep])
    got = L.fedmatch_unlabeled_loss(t(z), t(zs), [t(h) for h in hs], conf, li, la)
    assert got.item() == pytest.approx(li * cons + la * ce, rel=1e-12)
    # nothing confident: 0, still differentiable
    zz = t(z).requires_grad_()
    zero = L.fedmatch_unlabeled_loss(zz, t(zs), [t(h) for h in hs], 1.0, li, la)
    zero.backward()
    assert zero.item() == 0.0 and zz.grad is not None


def test_rhfl_confidence_weights_as_the_rhfl_code():
    assert L.rhfl_confidence_weights(None, [1.0, 2.0, 3.0], 0.5).tolist() == [0.5, 0.5, 0.5]
    prev, now, beta = [2.0, 1.5, 1.0], [1.0, 1.0, 1.0], 0.5
    q = [(a - b) / b for a, b in zip(prev, now)]  # 1, 0.5, 0
    amount = [1 / 2 + beta * v / sum(q) for v in q]
    e = [math.exp(a) for a in amount]
    expect = [v / sum(e) for v in e]
    got = L.rhfl_confidence_weights(prev, now, beta)
    assert got.tolist() == pytest.approx(expect, rel=1e-12)
    assert got[0] > got[1] > got[2]  # the participant that learns fastest gets the most weight
    assert L.rhfl_confidence_weights([1.0, 1.0], [1.0, 1.0], 0.5).tolist() == [1.0, 1.0]  # quality sum 0


def test_weighted_kl_alignment_against_loop():
    r = np.random.default_rng(3)
    z, o1, o2 = (r.normal(size=(5, 3)) for _ in range(3))
    w = [0.2, 0.7]
    ref = sum(wj * np.mean([kl(softmax(o)[b], softmax(z)[b]) for b in range(5)]) for wj, o in zip(w, (o1, o2)))
    assert L.weighted_kl_alignment(t(z), [t(o1), t(o2)], w).item() == pytest.approx(ref, rel=1e-12)
    with pytest.raises(ValueError, match="weights"):
        L.weighted_kl_alignment(t(z), [t(o1)], w)


def test_classwise_aggregate_hand_values():
    s = t([[[0.5, 0.5, 0.0]], [[0.1, 0.3, 0.6]]])  # K=2, B=1, C=3
    mask = torch.tensor([[True, True, False], [False, True, True]])
    # class 0: only participant 0 -> 0.5; class 1: both -> 0.4; class 2: only participant 1 -> 0.6
    agg = L.classwise_aggregate(s, mask)
    torch.testing.assert_close(agg, t([[0.5, 0.4, 0.6]]) / 1.5)
    full = L.classwise_aggregate(s, torch.ones(2, 3, dtype=torch.bool))
    torch.testing.assert_close(full, s.mean(0))  # everyone holds every class: the plain mean


# ------------------------------------------------------------------ methods

HOMOGENEOUS = ("fedprox", "moon", "fedproc", "fedrs")
HETEROGENEOUS = ("fml", "fedmatch", "rhfl", "rcfl")
STATEFUL = ("moon", "fedproc", "fml", "rhfl", "rcfl")  # their round 2 depends on what round 1 left


def _archs(name):
    return ("lenet", "lenet") if name in HOMOGENEOUS else ("lenet", "simple_cnn")


def _weights(fed):
    return [torch.cat([v.detach().flatten().double() for v in c.model.state_dict().values()]) for c in fed.clients]


@pytest.fixture
def make_fed(tiny_data):
    """make_fed(method) -> a 2-participant federation of the architectures the method needs."""
    def make(name, **engine):
        engine = {"public_aug": "weak", "rounds": 2, **engine}
        return tiny_federation(tiny_data, _archs(name), **engine)
    return make


def _run(make_fed, name, params=None, rounds=(1,), fed=None):
    fed = fed or make_fed(name)
    m = create_method(name, params)
    fed.setup(m)
    for r in rounds:
        fed.round = r
        fed.run_round(r)
    return fed, m


@pytest.mark.parametrize("name", HOMOGENEOUS + HETEROGENEOUS)
def test_restored_method_behaves_identically(make_fed, name):
    torch.manual_seed(0)
    fed_a, m_a = _run(make_fed, name)
    buf = io.BytesIO()
    torch.save(m_a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # tensors, numbers, strings, dicts and lists only

    def resumed(with_state):
        fed_b = make_fed(name)
        m_b = create_method(name)
        fed_b.setup(m_b)
        copy_engine_state(fed_a, fed_b)  # what the engine restores itself
        if with_state:
            m_b.load_state_dict(state)
        fed_b.round = 2
        fed_b.run_round(2)
        return _weights(fed_b)

    restored = resumed(True)
    fresh = resumed(False) if name in STATEFUL else None
    fed_a.round = 2
    fed_a.run_round(2)
    for a, b in zip(_weights(fed_a), restored):
        assert torch.equal(a, b)
    if fresh is not None:  # the state matters: without it round 2 differs
        assert any(not torch.equal(a, b) for a, b in zip(_weights(fed_a), fresh))


def _differs(a, b):
    return any(not torch.allclose(x, y) for x, y in zip(a, b))


def test_fedprox_mu_zero_is_fedavg_and_mu_changes_it(make_fed):
    torch.manual_seed(0)
    avg = _weights(_run(make_fed, "fedavg", rounds=(1, 2), fed=make_fed("fedprox"))[0])
    torch.manual_seed(0)
    prox0 = _weights(_run(make_fed, "fedprox", {"mu": 0.0}, rounds=(1, 2))[0])
    torch.manual_seed(0)
    prox = _weights(_run(make_fed, "fedprox", {"mu": 1.0}, rounds=(1, 2))[0])
    assert all(torch.allclose(a, b) for a, b in zip(avg, prox0))
    assert _differs(avg, prox)


def test_moon_contrastive_term_from_round_two(make_fed):
    torch.manual_seed(0)
    avg = _weights(_run(make_fed, "fedavg", rounds=(1, 2), fed=make_fed("moon"))[0])
    torch.manual_seed(0)
    off = _weights(_run(make_fed, "moon", {"mu": 0.0}, rounds=(1, 2))[0])
    torch.manual_seed(0)
    fed, m = _run(make_fed, "moon", rounds=(1,))
    torch.manual_seed(0)
    avg1 = _weights(_run(make_fed, "fedavg", fed=make_fed("moon"))[0])
    assert all(torch.allclose(a, b) for a, b in zip(avg1, _weights(fed)))  # round 1: no previous model yet
    fed.run_round(2)
    assert all(torch.allclose(a, b) for a, b in zip(avg, off))
    assert _differs(avg, _weights(fed))


def test_fedrs_restricts_only_missing_classes(make_fed):
    def run(params, drop_class):
        torch.manual_seed(0)
        fed = make_fed("fedrs")
        if drop_class:
            x, y = fed.clients[0].data.splits["private"]
            keep = y != 0
            fed.clients[0].data.splits["private"] = (x[keep], y[keep])
        return _weights(_run(make_fed, "fedrs", params, fed=fed)[0]), fed

    full, _ = run({"restriction": "missing"}, False)
    torch.manual_seed(0)
    avg = _weights(_run(make_fed, "fedavg", fed=make_fed("fedrs"))[0])
    assert all(torch.allclose(a, b) for a, b in zip(full, avg))  # every class present: FedAvg (paper text)
    w1, fed = run({"alpha": 1.0, "restriction": "missing"}, True)
    w5, _ = run({"alpha": 0.5, "restriction": "missing"}, True)
    assert fed.clients[0].data.get("private")[1].min() > 0
    assert _differs(w1, w5)


def test_fedproc_prototypes_and_alpha_schedule(make_fed):
    _, m = _run(make_fed, "fedproc")
    assert m.protos.shape[0] == 10 and bool(m.present.all())
    torch.manual_seed(0)
    const = _weights(_run(make_fed, "fedproc", rounds=(1, 2))[0])
    torch.manual_seed(0)
    # round 2 of 2 under the linear schedule: alpha 0, so plain FedAvg
    linear = _weights(_run(make_fed, "fedproc", {"alpha_schedule": "linear"}, rounds=(1, 2))[0])
    torch.manual_seed(0)
    avg = _weights(_run(make_fed, "fedavg", rounds=(1, 2), fed=make_fed("fedproc"))[0])
    assert all(torch.allclose(a, b) for a, b in zip(avg, linear))
    assert _differs(const, linear)


def test_fml_defaults_make_both_kl_terms_active(make_fed):
    torch.manual_seed(0)
    base = _weights(_run(make_fed, "base", fed=make_fed("fml"))[0])
    torch.manual_seed(0)
    independent = _weights(_run(make_fed, "fml", {"alpha": 1.0, "beta": 1.0})[0])
    torch.manual_seed(0)
    fed, m = _run(make_fed, "fml")
    # alpha = beta = 1: the private models train exactly as alone (the public-code pitfall)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(base, independent))
    assert _differs(base, _weights(fed))
    assert set(m.state_dict()["meme"]) == set(m.memes["m0"].state_dict())


def test_fedmatch_switches(make_fed):
    def colla(params):
        torch.manual_seed(0)
        fed = make_fed("fedmatch")
        m = create_method("fedmatch", params)
        fed.setup(m)
        before = _weights(fed)
        m.collaborate(fed.ctx)
        return before, _weights(fed), m

    before, after, _ = colla({"confidence": 1.0})  # nothing confident: no update
    assert not _differs(before, after)
    before, all_conf, m = colla({"confidence": 0.0})
    assert _differs(before, all_conf) and m.helper_index == [[1], [0]]
    _, same_view, _ = colla({"confidence": 0.0, "strong_view": False})
    _, no_helpers, _ = colla({"confidence": 0.0, "helpers": 0})
    assert _differs(all_conf, same_view) and _differs(all_conf, no_helpers)


def test_rhfl_confidence_weights_follow_private_losses(make_fed):
    torch.manual_seed(0)
    fed, m = _run(make_fed, "rhfl")
    assert m.prev_losses is not None and len(m.prev_losses) == 2
    before = list(m.prev_losses)
    fed.round = 2
    metrics = fed.run_round(2)
    expect = L.rhfl_confidence_weights(before, m.prev_losses, 0.5)
    assert [metrics["m0/train/confidence"], metrics["m20/train/confidence"]] == pytest.approx(expect.tolist())
    torch.manual_seed(0)
    off = _weights(_run(make_fed, "rhfl", {"ccr": False}, rounds=(1, 2))[0])
    assert _differs(_weights(fed), off)


def test_rcfl_distils_toward_aggregated_scores_from_round_two(make_fed):
    torch.manual_seed(0)
    fed, m = _run(make_fed, "rcfl", {"public_subset": 128})
    assert m.scores.shape == (128, 10)
    torch.testing.assert_close(m.scores.sum(1), torch.ones(128))
    before = _weights(fed)
    fed.round = 2
    metrics = m.collaborate(fed.ctx)
    assert _differs(before, _weights(fed)) and "m0/train/distill_loss" in metrics
    m0 = create_method("rcfl", {"distill_epochs": 0})
    fed.setup(m0)
    m0.load_state_dict(m.state_dict())
    before = _weights(fed)
    assert m0.collaborate(fed.ctx) == {} and not _differs(before, _weights(fed))



def test_rcfl_distillation_stops_on_a_non_finite_target(make_fed):
    """RCFL's distillation goes through the shared digest loop: a NaN score fails the job naming the
    method, participant, round and term (engine.on_nonfinite: fail), instead of training on it."""
    from fedshift.errors import NonFiniteError

    torch.manual_seed(0)
    fed, m = _run(make_fed, "rcfl", {"public_subset": 128})
    m.scores[0] = float("nan")
    fed.round = 2
    with pytest.raises(NonFiniteError, match=r"participant m0, round 2, term distill_loss"):
        m.collaborate(fed.ctx)

# ------------------------------------------------------------------ grids

@pytest.mark.parametrize("grid, data, federate", [
    ("fccl_plus_table8", "params/papers/fccl_plus_data.yaml", 4 * 7 * 3),
    ("fccl_plus_table15", "params/papers/fccl_plus_data.yaml", 2 * 11 * 3),
    ("fccl_plus_table8_offline", "params/data.yaml", 9),
    ("fccl_plus_table15_offline", "params/data.yaml", 12),
])
def test_paper_grids_validate_with_every_counterpart(grid, data, federate):
    from pathlib import Path

    from fedshift.experiments import load_experiments

    root = Path(__file__).resolve().parents[1]
    plan = load_experiments(root / f"params/papers/{grid}.yaml", root / data)
    assert len(plan.federate) == federate
    methods = {c["base_method"] for c in plan.federate.values()}
    expected = {"fedmatch", "rhfl"} if "table8" in grid else {"fedprox", "moon", "fedproc", "fedrs"}
    if grid.endswith("offline") and "table8" in grid:
        expected |= {"fml", "rcfl"}
    assert expected <= methods


@pytest.mark.parametrize("teacher_bn", ["eval", "train"])
def test_moon_teacher_bn_switch(make_fed, teacher_bn):
    """`teacher_bn: train` (the FCCL+ benchmark, fccl+/models/moon.py:59-60): the teachers' BatchNorm uses the
    batch's statistics (and moves their running statistics); `eval` (MOON's code) uses the running ones. The
    loss equals CE + mu * L_con computed on copies of the three models put in the expected modes."""
    import copy

    import torch.nn.functional as F

    from fedshift.data.loading import normalize

    torch.manual_seed(0)
    fed, m = _run(make_fed, "moon", {"teacher_bn": teacher_bn}, rounds=(1,), fed=make_fed("moon", norm="batch"))
    c = fed.clients[0]
    prev, glob = m._prev[c.name], m._global[c.name]
    stats = {k: v.clone() for k, v in prev.state_dict().items() if "running_mean" in k}
    assert stats  # a BatchNorm model
    x, y = c.data.splits["private"]
    xb, yb = normalize(x[:16]), y[:16]
    train = teacher_bn == "train"
    model_c, glob_c, prev_c = (copy.deepcopy(t) for t in (c.model, glob, prev))
    glob_c.train(train)
    prev_c.train(train)
    with torch.no_grad():
        h, logits = model_c.forward_with_features(xb)
        want = F.cross_entropy(logits, yb) + m.p.mu * L.moon_contrastive_loss(
            h, glob_c.features(xb), prev_c.features(xb), m.p.tau)
    got = m.local_loss(fed.ctx, c, xb, yb, 0)
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    assert prev.training == train and glob.training == train
    moved = any(not torch.equal(stats[k], v) for k, v in prev.state_dict().items() if k in stats)
    assert moved == train
