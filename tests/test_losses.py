"""Known-answer tests for fedshift.losses.

Reference values come from hand computation on tiny inputs and from straightforward
numpy float64 formulas with explicit loops written here (never from the torch code
under test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedshift import losses as L
from fedshift.errors import ConfigError

DT = torch.float64


def t(x, dtype=DT):
    return torch.tensor(x, dtype=dtype)


def rng(seed):
    return np.random.default_rng(seed)


# ----------------------------------------------------------- numpy references (loops)


def np_softmax_row(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def np_kl_rows(p_rows, q_rows):
    """mean over rows of sum_u p log(p / q), p == 0 terms skipped."""
    total = 0.0
    for p, q in zip(p_rows, q_rows):
        total += sum(pu * math.log(pu / qu) for pu, qu in zip(p, q) if pu > 0)
    return total / len(p_rows)


def np_cross_correlation(z, zt):
    b, c = z.shape
    c2 = zt.shape[1]

    def standardise(a, col):
        vals = [a[i, col] for i in range(b)]
        mean = sum(vals) / b
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (b - 1))
        return [(v - mean) / std for v in vals]

    zn = [standardise(z, u) for u in range(c)]
    tn = [standardise(zt, v) for v in range(c2)]
    m = np.zeros((c, c2))
    for u in range(c):
        for v in range(c2):
            m[u, v] = sum(zn[u][i] * tn[v][i] for i in range(b)) / b
    return m


def np_fccm(z, zt, lam):
    m = np_cross_correlation(z, zt)
    total = 0.0
    for u in range(m.shape[0]):
        for v in range(m.shape[1]):
            total += (1 - m[u, v]) ** 2 if u == v else lam * (1 + m[u, v]) ** 2
    return total


def np_instance_similarity(h, mu):
    b = h.shape[0]
    norms = [math.sqrt(sum(x * x for x in h[i])) for i in range(b)]
    out = np.zeros((b, b - 1))
    for i in range(b):
        k = 0
        for j in range(b):
            if j == i:
                continue
            out[i, k] = sum(h[i, d] * h[j, d] for d in range(h.shape[1])) / (norms[i] * norms[j]) / mu
            k += 1
    return out


def np_kd(s, te, T):
    p = [np_softmax_row(row / T) for row in te]
    q = [np_softmax_row(row / T) for row in s]
    return np_kl_rows(p, q) * T * T


def np_fntd(s, te, y, T, renormalize):
    total = 0.0
    for b in range(s.shape[0]):
        keep = [u for u in range(s.shape[1]) if u != y[b]]
        if renormalize:
            p = np_softmax_row([te[b, u] / T for u in keep])
            q = np_softmax_row([s[b, u] / T for u in keep])
        else:
            pf, qf = np_softmax_row(te[b] / T), np_softmax_row(s[b] / T)
            p, q = [pf[u] for u in keep], [qf[u] for u in keep]
        total += sum(pu * math.log(pu / qu) for pu, qu in zip(p, q))
    return total / s.shape[0] * T * T


def np_cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def np_ce(row, y):
    return -math.log(np_softmax_row(row)[y])


# ------------------------------------------------------------------ cross-correlation / FCCM


def test_cross_correlation_hand_values():
    # column [1,2,3]: mean 2, unbiased std 1 -> [-1,0,1]; target [2,4,6] -> [-1,0,1]
    m = L.cross_correlation(t([[1.0], [2.0], [3.0]]), t([[2.0], [4.0], [6.0]]))
    assert m.shape == (1, 1)
    assert m.item() == pytest.approx(2.0 / 3.0, abs=1e-15)  # (B-1)/B, the unbiased-std convention
    m = L.cross_correlation(t([[1.0], [2.0], [3.0]]), t([[6.0], [4.0], [2.0]]))
    assert m.item() == pytest.approx(-2.0 / 3.0, abs=1e-15)


def test_cross_correlation_scale_shift_invariant_and_shape():
    r = rng(0)
    z = r.normal(size=(7, 3))
    zt = r.normal(size=(7, 5))
    m1 = L.cross_correlation(t(z), t(zt))
    m2 = L.cross_correlation(t(3.0 * z - 1.0), t(0.5 * zt + 4.0))
    assert m1.shape == (3, 5)
    torch.testing.assert_close(m1, m2, rtol=0, atol=1e-12)


def test_cross_correlation_matches_loop_reference():
    r = rng(1)
    z, zt = r.normal(size=(9, 4)), r.normal(size=(9, 4))
    m = L.cross_correlation(t(z), t(zt))
    np.testing.assert_allclose(m.numpy(), np_cross_correlation(z, zt), rtol=0, atol=1e-13)
    assert m.dtype == DT


def test_fccm_orthogonal_columns_hand_value():
    # B=4, two centred orthogonal columns: M = diag((B-1)/B) = 0.75 I, off-diagonal 0.
    z = t([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    m = L.cross_correlation(z, z)
    torch.testing.assert_close(m, t([[0.75, 0.0], [0.0, 0.75]]), rtol=0, atol=1e-15)
    lam = 0.0051
    # 2 * (1 - 0.75)^2 + lam * 2 * (1 + 0)^2
    assert L.fccm_loss(z, z, lam).item() == pytest.approx(0.125 + 2 * lam, abs=1e-15)


def test_fccm_anticorrelated_columns_hand_value():
    # columns [-1,0,1] and [1,0,-1] after standardising: M = [[2/3,-2/3],[-2/3,2/3]]
    z = t([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]])
    lam = 0.3
    expected = 2 * (1 / 3) ** 2 + lam * 2 * (1 / 3) ** 2
    assert L.fccm_loss(z, z, lam).item() == pytest.approx(expected, abs=1e-15)


def test_fccm_matches_loop_reference():
    r = rng(2)
    z, zt = r.normal(size=(16, 5)), r.normal(size=(16, 5))
    for lam in (0.0, 0.0051, 1.0):
        assert L.fccm_loss(t(z), t(zt), lam).item() == pytest.approx(np_fccm(z, zt, lam), rel=1e-12)


def test_fccm_gradcheck():
    r = rng(3)
    z = t(r.normal(size=(5, 3))).requires_grad_()
    zt = t(r.normal(size=(5, 3))).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: L.fccm_loss(a, b, 0.2), (z, zt))


# ------------------------------------------------------------------ instance similarity / FISL


def test_instance_similarity_shape_and_row_order():
    h = t([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    s = L.instance_similarity(h, mu=0.5)
    r2 = 1 / math.sqrt(2)
    expected = [
        [0.0, r2, -1.0],  # row 0: j = 1, 2, 3
        [0.0, r2, 0.0],  # row 1: j = 0, 2, 3
        [r2, r2, -r2],  # row 2: j = 0, 1, 3
        [-1.0, 0.0, -r2],  # row 3: j = 0, 1, 2
    ]
    assert s.shape == (4, 3)
    torch.testing.assert_close(s, t(expected) / 0.5, rtol=0, atol=1e-14)


def test_instance_similarity_matches_loop_reference():
    r = rng(4)
    h = r.normal(size=(6, 8))
    s = L.instance_similarity(t(h), mu=0.02)
    np.testing.assert_allclose(s.numpy(), np_instance_similarity(h, 0.02), rtol=1e-12, atol=1e-12)


def test_fisl_hand_value():
    # row 0: target softmax [3/4, 1/4] vs uniform; row 1: equal -> 0. Mean over 2 rows.
    sim = t([[0.0, 0.0], [1.0, 2.0]])
    target = t([[math.log(3.0), 0.0], [1.0, 2.0]])
    row0 = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert L.fisl_loss(sim, target).item() == pytest.approx(row0 / 2, abs=1e-15)
    assert L.fisl_loss(target, target).item() == pytest.approx(0.0, abs=1e-15)


def test_fisl_matches_loop_reference():
    r = rng(5)
    h1, h2 = r.normal(size=(6, 4)), r.normal(size=(6, 4))
    s, st = np_instance_similarity(h1, 0.5), np_instance_similarity(h2, 0.5)
    expected = np_kl_rows([np_softmax_row(row) for row in st], [np_softmax_row(row) for row in s])
    got = L.fisl_loss(L.instance_similarity(t(h1), 0.5), L.instance_similarity(t(h2), 0.5))
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_fisl_gradcheck_through_similarity():
    r = rng(6)
    h = t(r.normal(size=(4, 3))).requires_grad_()
    target = t(r.normal(size=(4, 3))).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: L.fisl_loss(L.instance_similarity(a, 0.5), b), (h, target))


# ------------------------------------------------------------------ KD / FNTD


def test_kd_hand_values():
    s, te = t([[0.0, 0.0]]), t([[math.log(3.0), 0.0]])
    assert L.kd_loss(s, te, 1.0).item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), abs=1e-15)
    # T = 2: teacher softmax [sqrt3, 1] / (sqrt3 + 1) against uniform, times 4
    p = math.sqrt(3) / (math.sqrt(3) + 1)
    expected = 4 * (p * math.log(2 * p) + (1 - p) * math.log(2 * (1 - p)))
    assert L.kd_loss(s, te, 2.0).item() == pytest.approx(expected, abs=1e-14)


def test_kd_scales_with_t_squared():
    r = rng(7)
    s, te = t(r.normal(size=(5, 4))), t(r.normal(size=(5, 4)))
    for T in (2.0, 3.0):
        # same softened distributions, so the value differs only by the T^2 factor
        torch.testing.assert_close(L.kd_loss(s * T, te * T, T), T * T * L.kd_loss(s, te, 1.0), rtol=1e-12, atol=0)


def test_kd_matches_loop_reference():
    r = rng(8)
    s, te = r.normal(size=(6, 5)) * 3, r.normal(size=(6, 5)) * 3
    assert L.kd_loss(t(s), t(te), 3.0).item() == pytest.approx(np_kd(s, te, 3.0), rel=1e-12)


def test_fntd_hand_values_both_forms():
    s = t([[0.0, 0.0, 0.0]])  # student probs 1/3 each
    te = t([[0.0, math.log(2.0), 0.0]])  # teacher probs 1/4, 1/2, 1/4
    y = torch.tensor([0])
    # authors' form: non-target terms of the full softmaxes
    raw = 0.5 * math.log(0.5 / (1 / 3)) + 0.25 * math.log(0.25 / (1 / 3))
    assert L.fntd_loss(s, te, y, 1.0).item() == pytest.approx(raw, abs=1e-15)
    # renormalised: teacher [2/3, 1/3] vs student [1/2, 1/2]
    ren = (2 / 3) * math.log(4 / 3) + (1 / 3) * math.log(2 / 3)
    assert L.fntd_loss(s, te, y, 1.0, renormalize=True).item() == pytest.approx(ren, abs=1e-15)
    assert raw != pytest.approx(ren)


def test_fntd_identical_is_zero():
    r = rng(9)
    z = t(r.normal(size=(4, 6)))
    y = torch.tensor([0, 5, 2, 2])
    for ren in (False, True):
        assert L.fntd_loss(z, z.clone(), y, 3.0, renormalize=ren).item() == pytest.approx(0.0, abs=1e-14)


def test_fntd_matches_loop_reference_and_forms_differ():
    r = rng(10)
    s, te = r.normal(size=(8, 7)) * 2, r.normal(size=(8, 7)) * 2
    y = r.integers(0, 7, size=8)
    yt = torch.tensor(y)
    for ren in (False, True):
        got = L.fntd_loss(t(s), t(te), yt, 3.0, renormalize=ren).item()
        assert got == pytest.approx(np_fntd(s, te, y, 3.0, ren), rel=1e-12)
    assert L.fntd_loss(t(s), t(te), yt, 3.0).item() != pytest.approx(
        L.fntd_loss(t(s), t(te), yt, 3.0, renormalize=True).item(), rel=1e-3
    )


def test_kd_is_fntd_plus_target_term():
    # FCCL+ Eq. 11: KD = TD + NTD with the unrenormalised (authors') NTD
    r = rng(11)
    s, te = r.normal(size=(5, 4)), r.normal(size=(5, 4))
    y = r.integers(0, 4, size=5)
    T = 3.0
    td = 0.0
    for b in range(5):
        p, q = np_softmax_row(te[b] / T)[y[b]], np_softmax_row(s[b] / T)[y[b]]
        td += p * math.log(p / q)
    td = td / 5 * T * T
    fntd = L.fntd_loss(t(s), t(te), torch.tensor(y), T).item()
    assert L.kd_loss(t(s), t(te), T).item() == pytest.approx(fntd + td, rel=1e-12)


def test_fntd_unrenormalised_can_be_negative():
    # teacher sure of the target (little non-target mass), student not: the authors'
    # form is not a KL between distributions and goes below zero.
    s, te = t([[0.0, 0.0, 0.0]]), t([[5.0, 0.0, 0.0]])
    y = torch.tensor([0])
    assert L.fntd_loss(s, te, y, 1.0).item() < 0
    assert L.fntd_loss(s, te, y, 1.0, renormalize=True).item() == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("ren", [False, True])
def test_fntd_gradcheck(ren):
    r = rng(12)
    s = t(r.normal(size=(3, 4))).requires_grad_()
    te = t(r.normal(size=(3, 4))).requires_grad_()
    y = torch.tensor([1, 0, 3])
    assert torch.autograd.gradcheck(lambda a, b: L.fntd_loss(a, b, y, 2.0, renormalize=ren), (s, te))


def test_fntd_student_gradient_finite_when_teacher_detached():
    s = t([[1.0, -2.0, 0.5]]).requires_grad_()
    te = t([[3.0, 0.0, -1.0]])
    for ren in (False, True):
        (g,) = torch.autograd.grad(L.fntd_loss(s, te, torch.tensor([0]), 3.0, renormalize=ren), s)
        assert torch.isfinite(g).all()


# ------------------------------------------------------------------ FCCL dual distillation


def test_fccl_dual_is_sum_of_halves_and_hand_value():
    s = t([[0.0, 0.0], [0.0, 0.0]])
    prev = t([[math.log(3.0), 0.0], [0.0, 0.0]])
    pre = t([[0.0, 0.0], [0.0, math.log(3.0)]])
    one = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert L.inter_domain_kd(s, prev).item() == pytest.approx(one / 2, abs=1e-15)
    assert L.intra_domain_kd(s, pre).item() == pytest.approx(one / 2, abs=1e-15)
    assert L.fccl_dual_distillation_loss(s, prev, pre).item() == pytest.approx(one, abs=1e-15)
    # temperature 1 and no T^2: equals kd_loss at T = 1
    r = rng(13)
    a, b, c = (t(r.normal(size=(4, 5))) for _ in range(3))
    torch.testing.assert_close(
        L.fccl_dual_distillation_loss(a, b, c), L.kd_loss(a, b, 1.0) + L.kd_loss(a, c, 1.0), rtol=1e-13, atol=0
    )
    # T is a plain softening temperature, never squared
    assert L.inter_domain_kd(a, b, T=2.0).item() == pytest.approx(np_kd(a.numpy(), b.numpy(), 2.0) / 4, rel=1e-12)


# ------------------------------------------------------------------ counterparts


def test_soft_target_hand_value_and_feddf_equivalence():
    s = t([[0.0, 0.0, 0.0]])
    target = t([[0.5, 0.5, 0.0]])  # a zero entry must contribute 0, not NaN
    assert L.soft_target_loss(s, target, 1.0).item() == pytest.approx(math.log(1.5), abs=1e-15)
    r = rng(14)
    zs = [r.normal(size=(5, 4)) for _ in range(3)]
    student = r.normal(size=(5, 4))
    T = 2.0
    avg = np.array([[sum(np_softmax_row(z[b] / T)[c] for z in zs) / 3 for c in range(4)] for b in range(5)])
    expected = np_kl_rows(list(avg), [np_softmax_row(row / T) for row in student]) * T * T
    assert L.soft_target_loss(t(student), t(avg), T).item() == pytest.approx(expected, rel=1e-12)
    # a single teacher's softened probabilities -> exactly kd_loss
    torch.testing.assert_close(
        L.soft_target_loss(t(student), torch.softmax(t(zs[0]) / T, 1), T), L.kd_loss(t(student), t(zs[0]), T)
    )


def test_fedmd_digest_hand_values_and_bad_kind():
    z, c = t([[1.0, 2.0], [0.0, -1.0]]), t([[0.0, 0.0], [0.0, 0.0]])
    assert L.fedmd_digest_loss(z, c).item() == pytest.approx(1.0, abs=1e-15)  # (1+2+0+1)/4
    assert L.fedmd_digest_loss(z, c, kind="l2").item() == pytest.approx(1.5, abs=1e-15)  # (1+4+0+1)/4
    with pytest.raises(ConfigError, match="l1, l2"):
        L.fedmd_digest_loss(z, c, kind="l3")


def test_symmetric_ce_hand_value_and_reference():
    z, y = t([[0.0, 0.0]]), torch.tensor([0])
    alpha, beta = 0.1, 1.0
    # CE = log 2; RCE = -log(1e-4) * (1 - 1/2)
    expected = alpha * math.log(2) + beta * 0.5 * math.log(1e4)
    assert L.symmetric_ce_loss(z, y, alpha, beta).item() == pytest.approx(expected, abs=1e-14)
    r = rng(15)
    zs, ys = r.normal(size=(6, 5)), r.integers(0, 5, size=6)
    ref = 0.0
    for b in range(6):
        p = np_softmax_row(zs[b])
        ref += alpha * np_ce(zs[b], ys[b]) + beta * (-math.log(1e-3)) * (1 - p[ys[b]])
    got = L.symmetric_ce_loss(t(zs), torch.tensor(ys), alpha, beta, clip=1e-3).item()
    assert got == pytest.approx(ref / 6, rel=1e-12)


def test_ewc_penalty_hand_value_lists_and_dicts():
    w = [t([1.0, 2.0]), t([[3.0]])]
    a = [t([0.0, 0.0]), t([[1.0]])]
    f = [t([1.0, 0.5]), t([[2.0]])]
    # lam/2 * (1*1 + 0.5*4 + 2*4) = lam/2 * 11
    assert L.ewc_penalty(w, a, f, lam=2.0).item() == pytest.approx(11.0, abs=1e-15)
    dw = {"x": w[0], "y": w[1]}
    da = {"y": a[1], "x": a[0]}  # key order must not matter
    df = {"x": f[0], "y": f[1]}
    assert L.ewc_penalty(dw, da, df, lam=2.0).item() == pytest.approx(11.0, abs=1e-15)
    with pytest.raises(ValueError):
        L.ewc_penalty(dw, {"x": a[0]}, df, lam=1.0)
    with pytest.raises(ValueError):
        L.ewc_penalty(w, a[:1], f, lam=1.0)


def test_diagonal_fisher_hand_value_and_no_side_effects():
    model = nn.Linear(2, 1, bias=False).to(DT)
    with torch.no_grad():
        model.weight.copy_(t([[1.0, -1.0]]))
    model.train()

    def loss_fn(out, y):
        return 0.5 * ((out.squeeze(1) - y) ** 2).sum()

    # batch 1: x=[1,2], y=0: residual 1*1-1*2 = -1, grad = -1 * [1, 2] = [-1, -2]
    # batch 2: x=[3,0], y=1: residual 3 - 1 = 2, grad = 2 * [3, 0] = [6, 0]
    batches = [(t([[1.0, 2.0]]), t([0.0])), (t([[3.0, 0.0]]), t([1.0]))]
    fisher = L.diagonal_fisher(model, batches, loss_fn)
    assert list(fisher) == ["weight"]
    torch.testing.assert_close(fisher["weight"], t([[(1 + 36) / 2, (4 + 0) / 2]]), rtol=0, atol=1e-14)
    assert model.training and model.weight.grad is None
    assert not fisher["weight"].requires_grad


def test_prox_term_hand_value():
    w = [t([1.0, 2.0]), t([[0.0, 3.0]])]
    g = [t([1.0, 0.0]), t([[1.0, 1.0]])]
    # (mu/2) * (0 + 4 + 1 + 4)
    assert L.prox_term(w, g, mu=0.01).item() == pytest.approx(0.045, abs=1e-15)
    assert L.prox_term({"a": w[0]}, {"a": w[0].clone()}, mu=1.0).item() == 0.0


def test_moon_hand_value_and_reference():
    z = t([[1.0, 0.0]])
    zg = t([[2.0, 0.0]])  # cos 1
    zp = t([[0.0, 5.0]])  # cos 0
    tau = 0.5
    assert L.moon_contrastive_loss(z, zg, zp, tau).item() == pytest.approx(math.log(1 + math.exp(-1 / tau)), abs=1e-15)
    r = rng(16)
    a, b, c = (r.normal(size=(5, 3)) for _ in range(3))
    ref = 0.0
    for i in range(5):
        pos, neg = math.exp(np_cos(a[i], b[i]) / tau), math.exp(np_cos(a[i], c[i]) / tau)
        ref += -math.log(pos / (pos + neg))
    assert L.moon_contrastive_loss(t(a), t(b), t(c), tau).item() == pytest.approx(ref / 5, rel=1e-12)


def restricted_softmax_ce(logits, labels, present_mask, alpha):
    """FedRS's restricted softmax as its paper writes it (no bias): logits of absent classes times alpha, CE."""
    one = torch.ones((), dtype=logits.dtype)
    return torch.nn.functional.cross_entropy(logits * torch.where(present_mask, one, one * alpha), labels)


def test_restricted_softmax_hand_value_and_reference():
    """FedRS's ``missing`` scales through restricted_logits (no bias) are the paper's restricted softmax."""
    z, y = t([[2.0, 4.0]]), torch.tensor([0])
    mask = torch.tensor([True, False])
    # absent class 1 scaled: [2, 2] -> CE = log 2
    assert restricted_softmax_ce(z, y, mask, 0.5).item() == pytest.approx(math.log(2), abs=1e-15)
    r = rng(17)
    zs, ys = r.normal(size=(4, 5)), r.integers(0, 3, size=4)
    present = [True, True, True, False, False]
    ref = sum(np_ce([zs[b, c] * (1.0 if present[c] else 0.5) for c in range(5)], ys[b]) for b in range(4)) / 4
    assert restricted_softmax_ce(t(zs), torch.tensor(ys), torch.tensor(present), 0.5).item() == pytest.approx(ref, rel=1e-12)
    scales = L.fedrs_class_scales(torch.tensor([3, 1, 2, 0, 0]), 0.5, "missing")  # 0.5: exact in float32
    got = torch.nn.functional.cross_entropy(L.restricted_logits(t(zs), scales), torch.tensor(ys))
    assert got.item() == pytest.approx(ref, rel=1e-12)
    assert got.dtype == DT


# ------------------------------------------------------------------ general properties


def _calls(r):
    z1, z2, z3 = (t(r.normal(size=(6, 4))) for _ in range(3))
    y = torch.tensor(r.integers(0, 4, size=6))
    probs = torch.softmax(z3, 1)
    return [
        (L.fccm_loss, (z1, z2, 0.0051)),
        (L.fisl_loss, (z1, z2)),
        (L.kd_loss, (z1, z2, 3.0)),
        (L.fntd_loss, (z1, z2, y, 3.0)),
        (lambda a, b, c, d: L.fntd_loss(a, b, c, d, renormalize=True), (z1, z2, y, 3.0)),
        (L.fccl_dual_distillation_loss, (z1, z2, z3)),
        (L.soft_target_loss, (z1, probs, 2.0)),
        (L.fedmd_digest_loss, (z1, z2)),
        (L.symmetric_ce_loss, (z1, y, 0.1, 1.0)),
        (L.moon_contrastive_loss, (z1, z2, z3, 0.5)),
        (L.prox_term, ([z1], [z2], 0.01)),
        (L.ewc_penalty, ([z1], [z2], [probs], 1.0)),
    ]


def test_scalar_float64_differentiable_and_inputs_untouched():
    for fn, args in _calls(rng(18)):
        args = tuple(a.clone().requires_grad_() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)
        args = tuple([a[0].clone().requires_grad_()] if isinstance(a, list) else a for a in args)
        before = [a.detach().clone() if torch.is_tensor(a) else a for a in args]
        out = fn(*args)
        assert out.dim() == 0 and out.dtype == DT, fn
        assert torch.isfinite(out)
        out.backward()
        first = args[0][0] if isinstance(args[0], list) else args[0]
        assert first.grad is not None and torch.isfinite(first.grad).all(), fn
        for a, b in zip(args, before):
            if torch.is_tensor(a):
                assert torch.equal(a.detach(), b), fn
