"""Issue 21 protocols: which models a table scores (eval_models), who averages in homogeneous
mode, FedRS's two restrictions, MOON's Table XV rows, and the refusals at validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift import losses as L
from fedshift.engine.federation import summarise
from fedshift.errors import ConfigError
from fedshift.experiments import load_experiments, snakemake_config
from fedshift.methods import create_method
from fedshift.methods.moon import MOONParams

from fedshift.testing import copy_engine_state, tiny_federation

ROOT = Path(__file__).resolve().parents[1]


def _states(fed):
    return [torch.cat([v.detach().flatten().double() for v in c.model.state_dict().values()
                       if torch.is_floating_point(v)]) for c in fed.clients]


def _run(fed, name, params=None, rounds=(1,)):
    m = create_method(name, params)
    fed.setup(m)
    for r in rounds:
        fed.round = r
        fed.run_round(r)
    return m


def _gap(fed):
    """max_i |inter_i - mean_{j != i} intra_j| (equal test-set sizes: 0 when all models are one)."""
    s = summarise(fed.evaluate())
    names = [c.name for c in fed.clients]
    return max(abs(s[f"{p}/inter/top1"] - np.mean([s[f"{q}/intra/top1"] for q in names if q != p])) for p in names)


# ------------------------------------------------------------------ eval_models


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "moon", "fedproc", "fedrs"])
def test_local_protocol_scores_each_participants_own_model(tiny_data, name):
    torch.manual_seed(0)
    fed = tiny_federation(tiny_data, ("lenet",) * 3, rounds=2)
    _run(fed, name, {"eval_models": "global"}, rounds=(1, 2))
    glob = _states(fed)
    assert all(torch.equal(glob[0], g) for g in glob[1:])  # McMahan: every participant holds the average
    assert _gap(fed) < 1e-9
    torch.manual_seed(0)
    fed = tiny_federation(tiny_data, ("lenet",) * 3, rounds=2)
    _run(fed, name, {"eval_models": "local", "weighting": "uniform"}, rounds=(1, 2))
    loc = _states(fed)
    assert any(not torch.equal(loc[0], g) for g in loc[1:])  # each keeps its locally updated model
    x = fed.clients[0].data.get("test")[0][:16].float() / 255.0
    with torch.no_grad():
        outs = [c.model.eval()(x) for c in fed.clients]
    assert any(not torch.allclose(outs[0], o) for o in outs[1:])  # so the scored models differ too


def test_local_protocol_averages_uniformly_at_the_round_start(tiny_data):
    torch.manual_seed(0)
    fed = tiny_federation(tiny_data, ("lenet",) * 3, rounds=2)
    m = _run(fed, "fedavg", {"eval_models": "local", "weighting": "uniform"}, rounds=(1,))
    before = [{k: v.clone().double() for k, v in c.model.state_dict().items()} for c in fed.clients]
    fed.round = 2
    m.collaborate(fed.ctx)
    for k, v in fed.clients[0].model.state_dict().items():
        if torch.is_floating_point(v):
            expected = sum(b[k] for b in before) / 3.0  # uniform 1/K, whatever the sample counts
            torch.testing.assert_close(v.double(), expected, rtol=1e-6, atol=1e-7)
    assert all(torch.equal(a, b) for a, b in zip(_states(fed)[0:1] * 2, _states(fed)[1:]))


@pytest.mark.parametrize("name", ["fedavg", "moon", "fedproc"])
def test_local_protocol_resumes_bit_identically(tiny_data, name):
    """Under eval_models: local the participants' own weights (saved by the engine) and the
    method's state are all a round needs: a restored run's round 2 equals the uninterrupted one."""
    import io

    params = {"eval_models": "local", "weighting": "uniform"}
    torch.manual_seed(0)
    fed_a = tiny_federation(tiny_data, ("lenet",) * 2, rounds=2)
    m_a = _run(fed_a, name, params)
    buf = io.BytesIO()
    torch.save(m_a.state_dict(), buf)
    buf.seek(0)
    fed_b = tiny_federation(tiny_data, ("lenet",) * 2, rounds=2)
    m_b = create_method(name, params)
    fed_b.setup(m_b)
    copy_engine_state(fed_a, fed_b)
    m_b.load_state_dict(torch.load(buf, weights_only=True))
    for fed, m in ((fed_a, m_a), (fed_b, m_b)):
        fed.round = 2
        fed.run_round(2)
    assert all(torch.equal(a, b) for a, b in zip(_states(fed_a), _states(fed_b)))


# --------------------------------------------- FedMD / RCFL / FML averaging


@pytest.mark.parametrize("name", ["fedmd", "rcfl", "fml"])
def test_heterogeneous_methods_average_before_local_updating_when_homogeneous(tiny_data, name):
    seen = []

    def run(params):
        torch.manual_seed(0)
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), rounds=2)
        m = create_method(name, params)
        fed.setup(m)
        inner = m.local_update

        def spy(fed_, r):
            seen.append(_states(fed_))
            return inner(fed_, r)

        m.local_update = spy
        for r in (1, 2):
            fed.round = r
            fed.run_round(r)
        return m

    m = run({})
    assert m.averaging == "before_local"
    for states in seen:  # right after the averaging every participant holds the same weights
        assert torch.equal(states[0], states[1])
    seen.clear()
    run({"homogeneous_averaging": "none"})
    assert not torch.equal(seen[-1][0], seen[-1][1])  # without it the participants differ


def test_heterogeneous_federation_is_not_averaged(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "simple_cnn"))
    m = create_method("fedmd")
    fed.setup(m)
    assert m.averaging is None
    with pytest.raises(ConfigError, match="homogeneous_averaging"):
        create_method("rcfl", {"homogeneous_averaging": "before_local"}).setup(fed)


def test_fccl_averages_before_local_by_default_and_the_code_position_is_a_switch(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    assert _run(fed, "fccl").averaging == "before_local"
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    m = _run(fed, "fccl", {"homogeneous_averaging": "after_local"})
    assert m.averaging == "after_local"
    a, b = _states(fed)
    assert torch.equal(a, b)  # after_local: the scored models are one shared model


# ------------------------------------------------------------------ FedRS


def test_fedrs_class_scales_against_the_formula():
    counts = torch.tensor([10, 0, 5, 20])
    alpha = 0.3
    expected = [alpha + (1 - alpha) * n / 20 for n in (10, 0, 5, 20)]
    assert L.fedrs_class_scales(counts, alpha, "count").tolist() == pytest.approx(expected)
    assert L.fedrs_class_scales(counts, alpha, "missing").tolist() == pytest.approx([1, alpha, 1, 1])
    with pytest.raises(ValueError, match="count, missing"):
        L.fedrs_class_scales(counts, alpha, "labels")


def test_restricted_logits_scale_w_dot_h_but_not_the_bias():
    r = np.random.default_rng(0)
    h, w, b = r.normal(size=(5, 3)), r.normal(size=(4, 3)), r.normal(size=4)
    s = np.array([1.0, 0.5, 0.8, 0.65])
    z = torch.tensor(h @ w.T + b)
    got = L.restricted_logits(z, torch.tensor(s), torch.tensor(b))
    np.testing.assert_allclose(got.numpy(), (h @ w.T) * s + b, rtol=1e-12)
    np.testing.assert_allclose(L.restricted_logits(z, torch.tensor(s)).numpy(), (h @ w.T + b) * s, rtol=1e-12)


def test_fedrs_count_differs_from_fedavg_when_every_class_is_present_with_unequal_counts(tiny_data):
    def run(name, params):
        torch.manual_seed(0)
        fed = tiny_federation(tiny_data, ("lenet", "lenet"))
        x, y = fed.clients[0].data.splits["private"]
        keep = (y != 0) | (torch.arange(len(y)) % 4 == 0)  # class 0 kept but rarer: unequal counts
        fed.clients[0].data.splits["private"] = (x[keep], y[keep])
        counts = torch.bincount(fed.clients[0].data.get("private")[1], minlength=10)
        assert bool((counts > 0).all()) and counts.min() < counts.max()
        _run(fed, name, params)
        return _states(fed)

    avg = run("fedavg", {})
    missing = run("fedrs", {"restriction": "missing"})
    count = run("fedrs", {"restriction": "count"})
    assert all(torch.allclose(a, b) for a, b in zip(avg, missing))  # paper text: nothing is missing
    assert any(not torch.allclose(a, b) for a, b in zip(avg, count))


# ------------------------------------------------------------------ MOON rows


@pytest.mark.parametrize("grid", ["params/papers/fccl_plus_table15.yaml", "params/papers/fccl_plus_table15_offline.yaml",
                                  "benchmarks/grids/table_xv_protocol.yaml"])
def test_moon_table_xv_rows_vary_mu_at_the_default_temperature(grid):
    data = "params/papers/fccl_plus_data.yaml" if grid.endswith("table15.yaml") else "params/data.yaml"
    plan = load_experiments(snakemake_config(ROOT / grid), ROOT / data)
    rows = {j.method: c["method_params"] for j, c in plan.federate.items() if c["base_method"] == "moon"}
    assert {"moon_tau5", "moon_tau1"} <= set(rows)
    for label, mu in (("moon_tau5", 5.0), ("moon_tau1", 1.0)):
        assert rows[label]["tau"] == MOONParams().tau == 0.5  # authors' moon.py: a hard-coded 0.5
        assert rows[label]["mu"] == mu
        assert rows[label]["eval_models"] == "local"


# --------------------------------------------------------- refusals at validation


def _grid(method, engine, params=None):
    exp = snakemake_config(ROOT / "benchmarks/grids/table_xv_protocol.yaml")
    exp["engine"].update(engine)
    exp["methods"] = {method: params or {}}
    exp.pop("scenario_overrides", None)  # params/experiments.yaml's rotmnist protocol would win over `methods`
    exp.pop("report", None)  # its tables name the protocol grid's methods, which this one-method grid does not run
    exp["grid"] = [{"name": "g", "scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method],
                    "structures": ["homo_lenet"], "seeds": [0]}]
    return exp


@pytest.mark.parametrize("method, engine, params, match", [
    ("moon", {"server_model": True}, None, "previous local model"),
    ("fedproc", {"clients_per_round": 2}, None, "prototypes"),
    ("fedavg", {"client_fraction": 0.5}, {"eval_models": "local"}, "eval_models: global"),
    ("fedavg", {"global_eval_every": 1}, {"eval_models": "local"}, "global_eval_every"),
])
def test_state_the_method_cannot_keep_is_refused_before_any_job(method, engine, params, match):
    with pytest.raises(ConfigError, match=match):
        load_experiments(_grid(method, engine, params), ROOT / "params/data.yaml")


def test_global_fedavg_still_samples():
    plan = load_experiments(_grid("fedavg", {"client_fraction": 0.5}, {"eval_models": "global"}),
                            ROOT / "params/data.yaml")
    assert len(plan.federate) == 1


# ------------------------------------------------ protocol per family, not per name (issue 35)


def _family_grid(methods, own=None, variants=None, overrides=None):
    """The embedded default's scenario_overrides (the FCCL+ protocol on rotmnist, keyed by method name)
    with a grid of ``methods`` on rotmnist; ``own``: a methods: block; ``overrides``: replaces the rows."""
    exp = snakemake_config(ROOT / "params/experiments.yaml")
    exp["methods"] = own or {}
    exp["variants"] = variants or {}
    if overrides is not None:
        exp["scenario_overrides"]["rotmnist"]["methods"] = overrides
    exp.pop("report", None)
    exp["grid"] = [{"name": "g", "scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": methods,
                    "structures": ["homo_lenet"], "seeds": [0]}]
    return {j.method: c["method_params"] for j, c in load_experiments(exp, ROOT / "params/data.yaml").federate.items()}


def test_the_scenario_protocol_reaches_family_methods_it_does_not_name():
    """rotmnist's override names fedavg, fedprox, moon, fedproc and fedrs; FPL (a FedAvg-family method it does
    not name) ran under McMahan's protocol beside them. Now it takes the family's; FedMMD is no member."""
    rows = _family_grid(["fedavg", "fpl", "fedmmd"])
    assert (rows["fedavg"]["eval_models"], rows["fedavg"]["weighting"]) == ("local", "uniform")
    assert (rows["fpl"]["eval_models"], rows["fpl"]["weighting"]) == ("local", "uniform")
    assert "eval_models" not in rows["fedmmd"] and rows["fedmmd"]["weighting"] == "samples"


def test_a_plugin_of_the_family_takes_the_scenario_protocol(monkeypatch):
    """The FedAvgM of docs/extending.md, registered as an entry point would register it."""
    from fedshift.methods import METHODS
    from test_method_contract import _doc_plugin

    _, FedAvgM = _doc_plugin()
    monkeypatch.setitem(METHODS._items, "fedavgm", FedAvgM)
    rows = _family_grid(["fedavg", "fedavgm"])
    assert rows["fedavgm"]["eval_models"] == rows["fedavg"]["eval_models"] == "local"
    assert rows["fedavgm"]["weighting"] == rows["fedavg"]["weighting"] == "uniform"


def test_a_method_s_own_protocol_keys_win_over_the_family_s():
    rows = _family_grid(["fpl", "fpl_global"], own={"fpl": {"weighting": "samples"}},
                        variants={"fpl_global": {"method": "fpl", "params": {"eval_models": "global"}}})
    assert (rows["fpl"]["eval_models"], rows["fpl"]["weighting"]) == ("local", "samples")
    assert (rows["fpl_global"]["eval_models"], rows["fpl_global"]["weighting"]) == ("global", "samples")


def test_override_rows_that_disagree_on_the_protocol_are_refused_in_one_line():
    rows = {"fedavg": {"eval_models": "local", "weighting": "uniform"}, "fedprox": {"eval_models": "global"}}
    with pytest.raises(ConfigError) as err:
        _family_grid(["fedavg", "fpl"], overrides=rows)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1
    assert msg.startswith("scenario_overrides.rotmnist.methods: fedavg.eval_models is 'local' but fedprox.eval_models "
                          "is 'global'")
