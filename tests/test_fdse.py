"""FDSE (issue 37): its regulariser, QP and aggregations against independent numpy values, three whole
rounds in float64 against a re-implementation written from WwZzz/FDSE_CVPR25 algorithm/fdse.py, resume
bit-identical, and the layer decomposition on fedshift's models."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedshift.methods import create_method
from fedshift.methods.fdse import (DSEConv2d, DSELinear, consistency_loss, decompose, fair_aggregate, key_kind,
                                   min_norm_weights, similarity_aggregate)
from fedshift.models import create_model

from fedshift.testing import resumed_round_three, synthetic_federation, tiny_federation
from helpers import reference_batches

DT = torch.float64


def t(x):
    return torch.tensor(x, dtype=DT)


# ------------------------------------------------------------------ regulariser


def test_consistency_loss_equals_the_official_formula_by_hand():
    feats = [np.array([0.5, -1.0, 2.0]), np.array([1.0, 3.0])]
    g = [np.array([0.1, 0.2, 0.3]), np.array([-0.5, 0.5])]
    v = [np.array([1.0, 2.0, 0.5]), np.array([0.25, 4.0])]
    w = [0.4, 0.6]
    m = [0.1, 0.3]
    # by hand (algorithm/fdse.py:256-263): scalar mean / unbiased variance over the channels, EMA across layers
    fn, vn, total = 0.7, 2.0, 0.0  # carried from a previous step
    for f, gi, vi, wi, mi in zip(feats, g, v, w, m):
        fn = (1 - mi) * fn + mi * f.mean()
        vn = (1 - mi) * vn + mi * f.var(ddof=1)
        total += wi * np.mean((gi ** 2 - fn ** 2) / (2 * vn))
        total += wi * 0.5 * np.mean(np.log(vn / (vi + 1e-8)) + vi / (vn + 1e-8))
    loss, fn_t, vn_t = consistency_loss([t(f) for f in feats], [t(x) for x in g], [t(x) for x in v], w, m,
                                        t(0.7), t(2.0))
    assert float(loss) == pytest.approx(total, rel=1e-12)
    assert float(fn_t) == pytest.approx(fn, rel=1e-12) and float(vn_t) == pytest.approx(vn, rel=1e-12)
    # at the first step the EMA starts from the first layer's values
    loss0, fn0, _ = consistency_loss([t(feats[0])], [t(g[0])], [t(v[0])], [1.0], [0.1])
    f = feats[0]
    hand = np.mean((g[0] ** 2 - f.mean() ** 2) / (2 * f.var(ddof=1))) + 0.5 * np.mean(
        np.log(f.var(ddof=1) / (v[0] + 1e-8)) + v[0] / (f.var(ddof=1) + 1e-8))
    assert float(loss0) == pytest.approx(hand, rel=1e-12) and float(fn0) == pytest.approx(f.mean())


# ------------------------------------------------------------------ server arithmetic


def brute_min_norm(V):
    """The min-norm point of the convex hull of V's rows: every support, the affine minimiser on it, kept
    when its weights are >= 0 (independent of the active-set solver)."""
    n = len(V)
    G = V @ V.T
    best = None
    for k in range(1, n + 1):
        for S in itertools.combinations(range(n), k):
            S = list(S)
            A = np.block([[G[np.ix_(S, S)], np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
            try:
                sol = np.linalg.solve(A, np.r_[np.zeros(k), 1.0])
            except np.linalg.LinAlgError:
                continue
            if (sol[:k] < -1e-12).any():
                continue
            lam = np.zeros(n)
            lam[S] = sol[:k]
            val = lam @ G @ lam
            if best is None or val < best[0] - 1e-15:
                best = (val, lam)
    return best[1]


@pytest.mark.parametrize("n,d,seed", [(2, 3, 0), (3, 5, 1), (4, 3, 2), (5, 8, 3), (6, 2, 4)])
def test_min_norm_weights_equal_brute_force(n, d, seed):
    V = np.random.default_rng(seed).normal(size=(n, d)) + (0.8 if seed % 2 else 0.0)  # hull away from 0 or not
    lam = min_norm_weights(torch.tensor(V))
    assert lam.min() >= 0 and lam.sum() == pytest.approx(1.0)
    ref = brute_min_norm(V)
    np.testing.assert_allclose(lam @ V, ref @ V, atol=1e-10)


def test_min_norm_weights_two_vectors_closed_form():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    # min |l a + (1-l) b|^2: l = b.(b-a) / |a-b|^2 = 4/5
    assert min_norm_weights(torch.tensor(np.stack([a, b]))) == pytest.approx([0.8, 0.2])
    # a vertex is the answer when it is the closest point: b = 2a
    assert min_norm_weights(torch.tensor(np.stack([a, 2 * a]))) == pytest.approx([1.0, 0.0])


def test_fair_aggregate_and_similarity_aggregate_by_numpy():
    rng = np.random.default_rng(5)
    cur = rng.normal(size=(2, 3))
    loc = [rng.normal(size=(2, 3)) for _ in range(3)]
    d = [x.ravel() - cur.ravel() for x in loc]
    norms = np.array([np.linalg.norm(x) for x in d])
    unit = np.stack([x / (n + 1e-8) for x, n in zip(d, norms)])
    lam = brute_min_norm(unit)
    hand = (norms.mean() * lam @ unit + cur.ravel()).reshape(2, 3)
    out = fair_aggregate(torch.tensor(cur), [torch.tensor(x) for x in loc])
    np.testing.assert_allclose(out.numpy(), hand, atol=1e-10)

    P = np.stack([x.ravel() for x in loc])
    U = P / np.linalg.norm(P, axis=1, keepdims=True)
    S = U @ U.T / 0.5
    W = np.exp(S) / np.exp(S).sum(1, keepdims=True)
    got = similarity_aggregate([torch.tensor(x) for x in loc], 0.5)
    for i in range(3):
        np.testing.assert_allclose(got[i].numpy(), (W[i] @ P).reshape(2, 3), rtol=1e-12)
    assert not np.allclose(got[0].numpy(), got[1].numpy())  # personalised: every client its own


# ------------------------------------------------------------------ layers


def test_decomposed_layers_follow_the_official_shapes():
    conv = torch.nn.Conv2d(3, 7, 3, padding=1)
    layer = DSEConv2d(conv, ratio=2, dw_size=3)
    # ceil(7/2) = 4 DFE channels, 4 DSE channels, concatenation truncated to 7 (algorithm/fdse.py:23-25, :47)
    assert layer.dfe_conv.out_channels == 4 and layer.dse_conv.out_channels == 4 and layer.dse_conv.groups == 4
    x = torch.randn(5, 3, 6, 6)
    layer.train()
    with torch.no_grad():
        layer.dfe_bias.fill_(0.25)
        x1 = layer.dse_bn(layer.dfe_conv(x))
    layer.dse_bn.reset_running_stats()
    y = layer(x)
    assert y.shape == (5, 7, 6, 6)
    torch.testing.assert_close(y[:, :4], x1 + 0.25)
    lin = DSELinear(torch.nn.Linear(10, 5), ratio=2)
    assert lin(torch.randn(4, 10)).shape == (4, 5) and lin.dse_conv.kernel_size == (1, 1)


def test_key_kinds_and_decomposition_on_fedshift_models():
    m = create_model("lenet", 10, 1)
    layers = decompose(m)  # LeNet has no norm: a DFE BatchNorm is added in every layer (dfe_bn: auto)
    assert len(layers) == 4 and all(isinstance(l, torch.nn.modules.batchnorm._BatchNorm) for l in layers)
    kinds = {k: key_kind(k) for k in m.state_dict()}
    assert kinds["head.weight"] == "shared" and kinds["conv.0.dfe_conv.weight"] == "shared"
    assert kinds["conv.0.dse_conv.weight"] == "personal" and kinds["conv.0.dse_bn.weight"] == "personal"
    assert kinds["conv.0.dse_bn.running_mean"] == "local" and kinds["conv.0.dfe_bn.running_var"] == "shared"
    # a BatchNorm host (ResNet): its own BatchNorms after each conv serve as the DFE BatchNorms
    r = create_model("resnet10", 10, 3, norm="batch")
    n_convs = sum(isinstance(x, torch.nn.Conv2d) for x in r.modules())
    layers = decompose(r)
    assert not any(n.endswith("dfe_bn") for n, _ in r.named_modules())
    assert len(layers) == n_convs
    assert r(torch.randn(2, 3, 32, 32)).shape == (2, 10)


# ------------------------------------------------- whole rounds in float64 vs a re-implementation


def _norm64(x):
    return (x.double() / 255.0 - 0.5) / 0.5


class RefFDSE:
    """algorithm/fdse.py Server.iterate (:115-161) and Client.train (:222-273), dict by dict; plain SGD."""

    def __init__(self, model, names, lmbd, tau, beta):
        self.lmbd, self.tau, self.beta = lmbd, tau, beta
        self.models = {n: copy.deepcopy(model) for n in names}
        sd = model.state_dict()
        # official: "dfe" or "head" (:98); a host BatchNorm serving as the DFE BatchNorm is shared likewise
        host_bn = [n for n, mod in model.named_modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)
                   and not n.endswith("dse_bn") and not n.endswith("dfe_bn")]
        self.shared_keys = [k for k in sd if "dfe" in k or "head" in k or k.rsplit(".", 1)[0] in host_bn]
        self.local_keys = [k for k in sd if "dse_bn.running_" in k or "dse_bn.num_batches" in k]
        self.per_keys = [k for k in sd if k not in self.shared_keys and k not in self.local_keys]
        self.server = {k: sd[k].clone() for k in self.shared_keys}
        self.states = {n: {k: sd[k].clone() for k in self.per_keys} for n in names}

    def train(self, model, data, gen, r, epochs, batch, lr):
        layers = [mod for name, mod in model.named_modules()  # the DFE BatchNorms: added, or the host's
                  if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and not name.endswith("dse_bn")]
        gm = [l.running_mean.detach().clone() for l in layers]
        gv = [l.running_var.detach().clone() for l in layers]
        wts = np.exp(np.array([self.beta * i for i in range(len(layers))]))
        wts /= wts.sum()
        maps = []
        hooks = [l.register_forward_hook(lambda mod, inp, out: maps.append(
            inp[0].mean(0).mean(-1).mean(-1) if inp[0].dim() > 3 else inp[0].mean(0))) for l in layers]
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        fn = vn = None
        model.train()
        for xb, yb in reference_batches(data, gen, batch, epochs, _norm64):
            loss = F.cross_entropy(model(xb), yb)
            if r > 1 and self.lmbd > 0:
                lm = lv = 0.0
                for g, w, f, v, ln in zip(gm, wts, maps, gv, layers):
                    mf, vf = f.mean(dim=0), f.var(dim=0)
                    fn = (1 - ln.momentum) * fn + ln.momentum * mf if fn is not None else mf
                    vn = (1 - ln.momentum) * vn + ln.momentum * vf if vn is not None else vf
                    lm = lm + w * ((g.pow(2) - fn.pow(2)) / (2 * vn)).mean()
                    lv = lv + w * 0.5 * (torch.log(vn / (v + 1e-8)) + v / (vn + 1e-8)).mean()
                loss = loss + self.lmbd * (lm + lv)
            opt.zero_grad()
            loss.backward()
            opt.step()
            maps.clear()
            fn = fn.detach() if fn is not None else None
            vn = vn.detach() if vn is not None else None
        for h in hooks:
            h.remove()

    def round(self, r, sampled, epochs, batch, lr):
        mdicts = []
        for name, data, gen in sampled:
            model = self.models[name]
            model.load_state_dict({**self.server, **self.states[name]}, strict=False)
            self.train(model, data, gen, r, epochs, batch, lr)
            mdicts.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        new = {}
        for k in self.shared_keys:
            if "num_batches_tracked" in k:
                new[k] = torch.stack([md[k] for md in mdicts]).sum(0)
            elif "running_" in k:
                new[k] = torch.stack([md[k] for md in mdicts]).mean(0)
            else:
                crt = self.server[k].reshape(-1)
                vecs = [md[k].reshape(-1) - crt for md in mdicts]
                norms = [v.norm() for v in vecs]
                unit = np.stack([(v / (n + 1e-8)).numpy() for v, n in zip(vecs, norms)])
                lam = torch.tensor(brute_min_norm(unit))
                new[k] = (torch.stack(norms).mean() * (lam @ torch.tensor(unit)) + crt).reshape(self.server[k].shape)
        self.server = new
        for k in self.per_keys:
            if "num_batches_tracked" in k:
                continue
            vecs = [md[k].reshape(-1) for md in mdicts]
            vecs = [v / v.norm() for v in vecs]
            sims = torch.stack(vecs) @ torch.stack(vecs).T
            for (name, _, _), sim in zip(sampled, sims):
                w = torch.softmax(sim / self.tau, 0)
                self.states[name][k] = sum(wi * md[k] for wi, md in zip(w, mdicts))


@pytest.mark.parametrize("protocol,sampled,norm", [("local", 0, "default"), ("global", 2, "default"),
                                                   ("local", 0, "batch")],
                         ids=["local", "global_sampled", "host_batchnorm"])
def test_three_rounds_in_float64_equal_the_reimplementation(monkeypatch, protocol, sampled, norm):
    from fedshift.engine import federation
    monkeypatch.setattr(federation, "normalize", _norm64)
    fed = synthetic_federation(3, per_client=10, server_model=False, local_batch=5, local_epochs=1, lr=0.05,
                               momentum=0.0, clients_per_round=sampled, norm=norm, scoring={"eval_models": protocol})
    p = {"lmbd": 0.05, "tau": 0.5, "beta": 0.05}
    m = create_method("fdse", p)
    fed.setup(m)
    for c in fed.clients:
        c.model.double()
    m.shared = {k: v.double() for k, v in m.shared.items()}
    m.personal = {n: {k: v.double() for k, v in s.items()} for n, s in m.personal.items()}
    ref = RefFDSE(copy.deepcopy(fed.clients[0].model), [c.name for c in fed.clients], 0.05, 0.5, 0.05)
    names = [n for n, _ in fed.clients[0].model.named_modules()]
    # LeNet with BatchNorm: its convs' own BatchNorms are their DFE BatchNorms, its linear layers get one
    assert sum(n.endswith("dfe_bn") for n in names) == (2 if norm == "batch" else 4)
    gens = [torch.Generator().set_state(c.generator.get_state()) for c in fed.clients]
    # tolerances: float64 round-off (two QP solvers, other summation orders) is amplified by the regulariser's
    # steep gradients to ~5e-9 relative by round 2; a DFE bias in front of a BatchNorm has a zero gradient, so
    # its update is pure round-off (~1e-11) magnified by the unit normalisation: hence atol 1e-9
    for r in (1, 2, 3):
        fed.round = r
        metrics = fed.run_round(r)
        assert all(math.isfinite(v) for v in metrics.values())
        chosen = fed.sampled.get(r, range(3))
        assert len(chosen) == (sampled or 3)
        ref.round(r, [(fed.clients[i].name, fed.clients[i].data.get("private"), gens[i]) for i in chosen], 1, 5, 0.05)
        for k, v in m.shared.items():
            torch.testing.assert_close(v, ref.server[k], rtol=1e-7, atol=1e-9,
                                       msg=lambda s: f"round {r} shared {k}: {s}")
        for c in fed.clients:
            for k, v in m.personal[c.name].items():
                torch.testing.assert_close(v, ref.states[c.name][k], rtol=1e-7, atol=1e-9,
                                           msg=f"round {r} {c.name} {k}")
            # the scored model: local = the client's trained one (the ref's), global = its aggregate
            want = ref.models[c.name].state_dict()
            if protocol == "global":
                want = {**want, **ref.server, **ref.states[c.name]}
            for k, v in c.model.state_dict().items():
                torch.testing.assert_close(v, want[k], rtol=1e-7, atol=1e-9,
                                           msg=lambda s: f"round {r} {c.name} model {k} {s}")
    # the example reaches the cases that matter: the personalised DSE parts differ between clients
    a, b = (m.personal[fed.clients[i].name] for i in (0, 1))
    assert any(not torch.allclose(a[k], b[k]) for k in a if "num_batches" not in k)


def test_the_regulariser_changes_the_second_round(monkeypatch):
    def run(lmbd):
        fed = synthetic_federation(2, per_client=10, server_model=False, local_batch=5, momentum=0.0)
        m = create_method("fdse", {"lmbd": lmbd})
        fed.setup(m)
        out = []
        for r in (1, 2):
            fed.round = r
            out.append(fed.run_round(r))
        return out
    a, b = run(0.0), run(0.05)
    assert a[0] == b[0] and a[1] != b[1]  # round 1 has no regulariser (algorithm/fdse.py:253)


# ------------------------------------------------------------------ resume and refusals


@pytest.mark.parametrize("scoring,engine", [({"eval_models": "local"}, {}), ({"eval_models": "global"}, {}),
                                            ({"eval_models": "global"}, {"clients_per_round": 1})],
                         ids=["local", "global", "sampled"])
def test_restored_from_state_dict_round_three_is_bit_identical(tiny_data, tmp_path, scoring, engine):
    def build():
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), rounds=3, public_aug="none", scoring=scoring, **engine)
        method = create_method("fdse")
        fed.setup(method)
        return fed, method

    (_, m1), (_, m2) = resumed_round_three(build, tmp_path / "state.pt")
    assert all(torch.equal(m1.shared[k], m2.shared[k]) for k in m1.shared)
    for n in m1.personal:
        assert all(torch.equal(m1.personal[n][k], m2.personal[n][k]) for k in m1.personal[n])


def test_refusals(tiny_data):
    with pytest.raises(ValueError, match="from scratch only"):
        create_method("fdse", {"init": "base"})
    m = create_method("fdse")
    assert m.supports_sampling and not m.supports_server_model and m.fused_objective is None  # sampling: global
    assert "domain-skew erasers" in m.per_client_state
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    fed.setup(m)
    with pytest.raises(ValueError, match="unknown keys"):
        m.load_state_dict({"protos": torch.zeros(1)})


def test_scenario_defaults_are_the_authors_tuned_values():
    from fedshift.methods import resolve_method_params
    assert (resolve_method_params("fdse", scenario="office_caltech").lmbd,
            resolve_method_params("fdse", scenario="office_caltech").beta) == (0.05, 0.05)
    pacs = resolve_method_params("fdse", scenario="pacs")
    assert (pacs.lmbd, pacs.tau, pacs.beta) == (0.5, 0.5, 0.001)
    d = resolve_method_params("fdse", scenario="digits")
    assert (d.lmbd, d.tau, d.beta, d.ratio, d.dw_size) == (0.01, 0.5, 0.1, 2, 3)


def test_engine_refusals_are_one_line_naming_the_method():
    """Fused clients: a custom round (no fused objective); server_model: a model per participant; sampling
    only under the global scoring protocol (the local one scores each participant's own trained model)."""
    from fedshift.engine.config import EngineConfig, ScoringConfig
    from fedshift.engine.fused import fusion_obstacle
    from fedshift.engine.sampling import check_engine
    from fedshift.errors import ConfigError

    m = create_method("fdse")
    why = fusion_obstacle(m, ["lenet"] * 2, [create_model("lenet", 10, 1, norm="group")])
    assert why and "fdse" in why
    local = ScoringConfig(eval_models="local")
    with pytest.raises(ConfigError, match="engine.server_model: method 'fdse'") as e:
        check_engine(m, EngineConfig(device="cpu", server_model=True), local)
    assert "\n" not in str(e.value) and "domain-skew erasers" in str(e.value)
    with pytest.raises(ConfigError, match="clients_per_round/client_fraction: scoring.eval_models: local") as e:
        check_engine(m, EngineConfig(device="cpu", clients_per_round=1), local)
    assert "\n" not in str(e.value)
    check_engine(m, EngineConfig(device="cpu", clients_per_round=1), ScoringConfig(eval_models="global"))


def test_real_job_interrupted_in_round_three_resumes_bit_identically(tiny_data, tmp_path, monkeypatch):
    """A real federate job (rotmnist, homo_lenet: the offline grid's setting) interrupted inside round 3
    and rerun ends equal to a straight run: the decomposition in setup() and the restored weights agree."""
    from fedshift import runner
    from fedshift.experiments import load_experiments
    from fedshift.methods.fdse import FDSE
    from test_resume import DATA, _interrupt_and_resume, _same_run

    exp = {"engine": {"rounds": 3, "local_epochs": 1, "local_batch": 32, "device": "cpu", "checkpoint_min_s": 0,
                      "threads": 1, "eval_batch": 512},
           "scoring": {"eval_models": "local"},  # the official logger's; the checkpoint holds the pending delivery
           "grid": [{"scenarios": ["rotmnist"], "methods": ["fdse"], "structures": ["homo_lenet"]}]}
    (cfg,) = load_experiments(exp, DATA, results=str(tmp_path / "results"), build=str(tiny_data)).federate.values()
    ref, out = tmp_path / "ref", tmp_path / "out"
    runner.run_federate(cfg, ref)
    _interrupt_and_resume(monkeypatch, cfg, FDSE, out)
    _, timings = _same_run(ref, out, ("rounds.csv",))
    assert timings["resumed_after_rounds"] == [2]
