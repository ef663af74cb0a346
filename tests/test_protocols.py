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
    """``name`` set up on ``fed`` (whose scoring is the grid's) and run for ``rounds``."""
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


# ------------------------------------------------------------------ eval_models (the grid's scoring)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "moon", "fedproc", "fedrs", "scaffold", "fednova"])
def test_local_protocol_scores_each_participants_own_model(tiny_data, name):
    torch.manual_seed(0)
    fed = tiny_federation(tiny_data, ("lenet",) * 3, rounds=2, scoring={"eval_models": "global"})
    _run(fed, name, rounds=(1, 2))
    glob = _states(fed)
    assert all(torch.equal(glob[0], g) for g in glob[1:])  # McMahan: every participant holds the average
    assert _gap(fed) < 1e-9 and fed.pending is None
    torch.manual_seed(0)
    fed = tiny_federation(tiny_data, ("lenet",) * 3, rounds=2, scoring={"eval_models": "local", "weighting": "uniform"})
    _run(fed, name, rounds=(1, 2))
    loc = _states(fed)
    assert any(not torch.equal(loc[0], g) for g in loc[1:])  # each keeps its locally updated model
    x = fed.clients[0].data.get("test")[0][:16].float() / 255.0
    with torch.no_grad():
        outs = [c.model.eval()(x) for c in fed.clients]
    assert any(not torch.allclose(outs[0], o) for o in outs[1:])  # so the scored models differ too
    assert set(fed.pending) == {c.name for c in fed.clients}  # the server's step ran: its delivery waits


def test_local_protocol_delivers_the_uniform_average_at_the_next_round_start(tiny_data):
    """eval_models: local: the server step runs after local training as under global; its uniform average
    (weighting: uniform, 1/K whatever the sample counts) is what every participant starts round 2 from."""
    torch.manual_seed(0)
    fed = tiny_federation(tiny_data, ("lenet",) * 3, rounds=2, scoring={"eval_models": "local", "weighting": "uniform"})
    m = _run(fed, "fedavg", rounds=(1,))
    trained = [{k: v.clone().double() for k, v in c.model.state_dict().items()} for c in fed.clients]
    starts = []
    m.begin_round = lambda ctx, global_state: starts.append({k: v.clone() for k, v in global_state.items()})
    fed.run_round(2)
    (start,) = starts
    for k, v in start.items():
        if torch.is_floating_point(v):
            expected = sum(t[k] for t in trained) / 3.0
            torch.testing.assert_close(v.double(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["fedavg", "moon", "fedproc", "scaffold"])
def test_local_protocol_resumes_bit_identically(tiny_data, name):
    """Under eval_models: local the participants' own weights and the server's pending delivery (both
    restored by the engine) and the method's state are all a round needs: a restored run's round 2 equals
    the uninterrupted one."""
    import io

    scoring = {"eval_models": "local", "weighting": "uniform"}
    torch.manual_seed(0)
    fed_a = tiny_federation(tiny_data, ("lenet",) * 2, rounds=2, scoring=scoring)
    m_a = _run(fed_a, name)
    buf = io.BytesIO()
    torch.save(m_a.state_dict(), buf)
    buf.seek(0)
    fed_b = tiny_federation(tiny_data, ("lenet",) * 2, rounds=2, scoring=scoring)
    m_b = create_method(name)
    fed_b.setup(m_b)
    copy_engine_state(fed_a, fed_b)
    m_b.load_state_dict(torch.load(buf, weights_only=True))
    for fed in (fed_a, fed_b):
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

        def spy(ctx):
            seen.append(_states(fed))
            return inner(ctx)

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
        fed.setup(create_method("rcfl", {"homogeneous_averaging": "before_local"}))


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
    scoring = {c["scoring"]["eval_models"] for c in plan.federate.values()}
    assert scoring == {"local"}  # the grid's protocol: every row of the table alike


# --------------------------------------------------------- refusals at validation


def _grid(method, engine, scoring=None):
    exp = snakemake_config(ROOT / "benchmarks/grids/table_xv_protocol.yaml")
    exp["engine"].update(engine)
    exp["methods"] = {}
    exp["scoring"] = scoring or {}
    exp.pop("scenario_overrides", None)  # params/experiments.yaml's rotmnist protocol would win over scoring:
    exp.pop("report", None)  # its tables name the protocol grid's methods, which this one-method grid does not run
    exp["grid"] = [{"name": "g", "scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": [method],
                    "structures": ["homo_lenet"], "seeds": [0]}]
    return exp


@pytest.mark.parametrize("method, engine, scoring, match", [
    ("moon", {"server_model": True}, None, "previous local model"),
    ("fedproc", {"clients_per_round": 2}, None, "prototypes"),
    ("fedavg", {"client_fraction": 0.5}, {"eval_models": "local"}, "scoring.eval_models: local"),
    ("fedavg", {"global_eval_every": 1}, {"eval_models": "local"}, "global_eval_every"),
    ("scaffold", {}, None, "method 'scaffold' requires engine.optimizer: sgd"),
    ("scaffold", {"optimizer": "sgd"}, None, "method 'scaffold' requires engine.momentum: 0"),
    ("fednova", {}, None, "method 'fednova' requires engine.optimizer: sgd"),
    ("fedavg", {}, {"predict": "prototype"}, "scoring.predict: prototype: method 'fedavg' has no prototypes"),
])
def test_what_the_method_or_scoring_cannot_honour_is_refused_before_any_job(method, engine, scoring, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_experiments(_grid(method, engine, scoring), ROOT / "params/data.yaml")
    assert len(str(err.value).splitlines()) == 1


def test_global_fedavg_still_samples_and_scaffold_runs_with_plain_sgd():
    plan = load_experiments(_grid("fedavg", {"client_fraction": 0.5}, {"eval_models": "global"}),
                            ROOT / "params/data.yaml")
    assert len(plan.federate) == 1
    plan = load_experiments(_grid("scaffold", {"optimizer": "sgd", "momentum": 0.0}), ROOT / "params/data.yaml")
    assert len(plan.federate) == 1


# ------------------------------------------------ one protocol per table, by construction (issue 49)


def _scoring_grid(methods, own=None, variants=None, scoring=None):
    """The embedded default (its rotmnist scoring: the FCCL+ protocol) with a grid of ``methods`` on rotmnist;
    ``own``: a methods: block; ``scoring``: the grid's own scoring: block. Returns method -> resolved config."""
    exp = snakemake_config(ROOT / "params/experiments.yaml")
    exp["methods"] = own or {}
    exp["variants"] = variants or {}
    if scoring is not None:
        exp["scoring"] = scoring
    exp.pop("report", None)
    exp["grid"] = [{"name": "g", "scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": methods,
                    "structures": ["homo_lenet"], "seeds": [0]}]
    return {j.method: c for j, c in load_experiments(exp, ROOT / "params/data.yaml").federate.items()}


def test_the_scenario_scoring_reaches_every_method_of_its_tables():
    """rotmnist's scoring (the FCCL+ protocol) is every row's: FedAvg, FPL, FedMMD and a public-data method
    alike, with no key in their params."""
    rows = _scoring_grid(["fedavg", "fpl", "fedmmd", "fedmd"])
    assert {(c["scoring"]["eval_models"], c["scoring"]["weighting"]) for c in rows.values()} == {("local", "uniform")}
    assert all("eval_models" not in c["method_params"] and "weighting" not in c["method_params"] for c in rows.values())


def test_a_plugin_of_the_family_is_scored_as_its_table(monkeypatch):
    """The FedAvgM of docs/extending.md, registered as an entry point would register it."""
    from fedshift.methods import METHODS
    from test_method_contract import _doc_plugin

    _, FedAvgM = _doc_plugin()
    monkeypatch.setitem(METHODS._items, "fedavgm", FedAvgM)
    rows = _scoring_grid(["fedavg", "fedavgm"])
    assert rows["fedavgm"]["scoring"] == rows["fedavg"]["scoring"]


@pytest.mark.parametrize("where", ["methods", "variant"])
def test_a_protocol_key_per_method_or_variant_is_refused_naming_the_grid_s_scoring(where):
    own = {"fpl": {"eval_models": "global"}} if where == "methods" else None
    variants = {"fpl_global": {"method": "fpl", "params": {"weighting": "samples"}}} if where == "variant" else None
    with pytest.raises(ConfigError) as err:
        _scoring_grid(["fpl"] + (["fpl_global"] if variants else []), own=own, variants=variants)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and "this key moved to the grid's scoring." in msg


def test_moved_engine_and_fedproto_keys_name_their_new_place():
    from fedshift.config import resolve
    from fedshift.engine.config import EngineConfig
    from fedshift.methods import resolve_method_params

    with pytest.raises(ConfigError, match=r"engine.pooled_rows: this key moved to scoring.metrics"):
        resolve(EngineConfig, {"pooled_rows": True}, "engine")
    with pytest.raises(ConfigError, match=r"methods.fedproto.scoring: this key moved to the grid's scoring.predict"):
        resolve_method_params("fedproto", {"scoring": "head"})
    with pytest.raises(ConfigError, match=r"scoring \(rotmnist\)\.metrics: unknown scorer 'poled' \(did you mean 'pooled'\?\)"):
        _scoring_grid(["fedavg"], scoring={"metrics": ["poled"]})


def test_the_grid_s_own_scoring_outranks_the_base_file_s_per_scenario_scoring(tmp_path, capsys):
    """A user grid merged on params/experiments.yaml (whose rotmnist scoring is the FCCL+ protocol) that sets
    scoring.eval_models itself gets it on rotmnist too, with one note; a key it leaves unset stays the base's."""
    import yaml

    own = tmp_path / "grid.yaml"
    own.write_text(yaml.safe_dump({"scoring": {"eval_models": "global"}, "grid": [
        {"scenarios": ["rotmnist"], "public": ["photo_patches"], "methods": ["fedavg"], "structures": ["homo_lenet"]}]}))
    cfg = snakemake_config([own], workflow_config=ROOT / "params/experiments.yaml")
    assert "scoring.eval_models: 'global' (this grid) replaces the base file's " \
           "scenario_overrides.rotmnist.scoring.eval_models: 'local'" in capsys.readouterr().err
    cfg.pop("report", None)
    (job,) = load_experiments(cfg, ROOT / "params/data.yaml").federate.values()
    assert (job["scoring"]["eval_models"], job["scoring"]["weighting"]) == ("global", "uniform")
