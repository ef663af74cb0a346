"""Client sampling, the shared-model (server) mode, exponential LR decay, server-side evaluation
and rounds-to-accuracy (engine/sampling.py, methods/fedavg.py ServerAveraging)."""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch

from fedshift.engine.config import EngineConfig
from fedshift.engine.sampling import (GlobalEvaluator, check_engine, clients_per_round, round_clients, rounds_to,
                                      sample_indices)
from fedshift.errors import ConfigError
from fedshift.methods import create_method
from fedshift.engine.averaging import RunningAverage, weighted_average
from fedshift.models.base import FedModel

from fedshift.testing import synthetic_federation

torch.set_num_threads(1)


def test_clients_per_round_resolution():
    assert clients_per_round(EngineConfig(), 7) == 7
    assert clients_per_round(EngineConfig(clients_per_round=3), 7) == 3
    assert clients_per_round(EngineConfig(client_fraction=0.1), 100) == 10
    assert clients_per_round(EngineConfig(client_fraction=0.1), 4) == 1  # max(C*K, 1)
    with pytest.raises(ConfigError, match="clients_per_round"):
        clients_per_round(EngineConfig(clients_per_round=8), 7)
    with pytest.raises(ValueError, match="not both"):
        EngineConfig(clients_per_round=2, client_fraction=0.5)


def test_sampling_is_deterministic_per_seed_and_recorded():
    def draws(seed):
        fed = synthetic_federation(20, seed=seed, clients_per_round=4)
        return [[c.name for c in round_clients(fed, r)] for r in (1, 2, 3)], fed

    a, fed_a = draws(0)
    b, _ = draws(0)
    c, _ = draws(1)
    assert a == b
    assert a != c
    assert all(len(set(r)) == 4 for r in a)
    assert len({tuple(r) for r in a}) > 1  # rounds draw afresh
    assert sorted(fed_a.sampled) == [1, 2, 3]
    assert [[fed_a.clients[i].name for i in fed_a.sampled[r]] for r in (1, 2, 3)] == a
    # asking twice in one round returns the same clients (no second draw)
    assert [c.name for c in round_clients(fed_a, 2)] == a[1]


def test_no_draw_without_sampling():
    fed = synthetic_federation(5)
    before = fed.sample_gen.get_state().clone()
    assert round_clients(fed, 1) == fed.clients
    assert torch.equal(fed.sample_gen.get_state(), before)
    assert fed.sampled == {}


def test_sample_indices_uniform_without_replacement():
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(10)
    for _ in range(400):
        idx = sample_indices(10, 3, g)
        assert len(set(idx)) == 3 and idx == sorted(idx)
        counts[idx] += 1
    assert counts.min() > 60 and counts.max() < 180  # each about 120


def test_running_average_matches_weighted_average():
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 4, generator=g), "n": torch.tensor(i)} for i in range(4)]
    weights = [3.0, 1.0, 5.0, 2.0]
    ref = weighted_average(states, weights)
    run = RunningAverage(sum(weights))
    for s, w in zip(states, weights):
        run.add(s, w)
    out = run.result(states[0])
    assert torch.equal(out["w"], ref["w"]) and out["w"].dtype == torch.float32
    assert int(out["n"]) == 0  # integer buffers from the first state


def test_fedavg_round_is_sample_weighted_average_of_sampled_clients():
    """The global model after a sampled round = the n_k-weighted average of the sampled clients,
    each trained from the global model (checked against clients trained one by one here)."""
    fed = synthetic_federation(8, clients_per_round=3, server_model=False)
    ref_fed = synthetic_federation(8, clients_per_round=3, server_model=False)
    method, ref_method = create_method("fedavg"), create_method("fedavg")
    fed.setup(method)
    ref_fed.setup(ref_method)
    fed.run_round(1)
    sampled = sample_indices(8, 3, ref_fed.sample_gen)  # the same draw from the same seed
    g0 = {k: v.clone() for k, v in ref_fed.clients[0].model.state_dict().items()}
    states, weights = [], []
    for i in sampled:
        c = ref_fed.clients[i]
        c.model.load_state_dict(g0)
        ref_fed.train_local(c)
        states.append({k: v.clone() for k, v in c.model.state_dict().items()})
        weights.append(c.num_private)
    ref = weighted_average(states, weights)
    assert sorted(fed.sampled[1]) == sorted(sampled)
    for c in fed.clients:  # every participant holds the new global model
        for k, v in c.model.state_dict().items():
            torch.testing.assert_close(v, ref[k], rtol=0, atol=1e-6)
    unsampled = [i for i in range(8) if i not in sampled]
    assert unsampled and all(ref_fed.clients[i].model.state_dict()["head.weight"].equal(g0["head.weight"])
                             for i in unsampled)


def _count_models():
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), FedModel))


@pytest.mark.parametrize("method", ["fedavg", "fedmmd", "fedfusion_conv"])
def test_server_mode_memory_does_not_grow_with_clients(method):
    """A 100-client round holds as many models (and parameters) as a 10-client one."""
    held = {}
    for k in (10, 100):
        base = _count_models()
        fed = synthetic_federation(k, per_client=6, client_fraction=0.1)
        m = create_method(method)
        fed.setup(m)
        fed.run_round(1)
        modules = {id(c.model) for c in fed.clients}
        params = sum(p.numel() for mod in {id(c.model): c.model for c in fed.clients}.values()
                     for p in mod.parameters())
        held[k] = (_count_models() - base, len(modules), params)
        del fed, m
    assert held[10] == held[100]
    # one working model (+ one frozen global copy for the two-stream methods; FedFusion's are
    # wrappers, each holding its base model: 4 FedModel objects)
    assert held[100][1] == 1 and held[100][0] <= 4


def test_server_mode_requires_a_server_averaging_method():
    cfg = EngineConfig(server_model=True)
    with pytest.raises(ConfigError, match="server_model"):
        check_engine(create_method("fedmd"), cfg)
    with pytest.raises(ConfigError, match="clients_per_round"):
        check_engine(create_method("base"), EngineConfig(clients_per_round=2))
    with pytest.raises(ConfigError, match="global_eval_every"):
        check_engine(create_method("fccl_plus"), EngineConfig(global_eval_every=1))
    check_engine(create_method("fedavg"), EngineConfig(server_model=True, global_eval_every=1, clients_per_round=2))


def test_exponential_lr_decay():
    cfg = EngineConfig(lr_gamma=0.985, rounds=10)
    assert cfg.lr_at(0.003, 0) == 0.003
    assert math.isclose(cfg.lr_at(0.003, 4), 0.003 * 0.985 ** 4)
    both = EngineConfig(lr_gamma=0.5, lr_decay=True, rounds=10)
    assert math.isclose(both.lr_at(1.0, 2), 0.25 * (1 - 0.9 * 2 / 10))
    assert EngineConfig().lr_at(0.1, 7) == 0.1  # default: constant
    fed = synthetic_federation(3, lr_gamma=0.5)
    fed.round = 3
    assert math.isclose(fed.make_optimizer(fed.clients[0].model).param_groups[0]["lr"], 0.05 * 0.25)


def test_rounds_to():
    curve = [(0, 0.1), (1, 0.5), (2, 0.93), (3, 0.91), (4, 0.95)]
    assert rounds_to(curve, [0.9, 0.95, 0.99]) == {0.9: 2, 0.95: 4, 0.99: None}


def test_global_evaluator_schedule_and_summary():
    fed = synthetic_federation(4, rounds=5, global_eval_every=2, participant_eval=False, targets=(0.01, 1.0))
    m = create_method("fedavg")
    fed.setup(m)
    ev = GlobalEvaluator(fed, m, fed.cfg)
    rows = [row for r in range(6) for row in ev(r)]
    assert [row["round"] for row in rows] == [0, 2, 4, 5]  # every k rounds and the last
    assert all(row["kind"] == "global" and 0 <= row["top1"] <= 1 for row in rows)
    s = ev.summary(last_k=2)
    assert s["rounds_to/0.01"] == 0 or s["rounds_to/0.01"] >= 0
    assert math.isnan(s["rounds_to/1"])  # random data: never 100 %
    assert math.isclose(s["global/top1"], (rows[-1]["top1"] + rows[-2]["top1"]) / 2)


def test_runner_server_mode_writes_global_metrics(tiny_data, tmp_path):
    """End to end through run_federate: shared model, sampling, global evaluation, rounds_to, sampled.csv."""
    from fedshift.config import to_dict
    from fedshift.runner import run_federate
    from fedshift.methods import resolve_method_params

    parts = ["m0", "m20", "m40", "m60"]
    cfg = {"run_name": "t", "scenario": "rotmnist", "seed": 0, "base_method": "fedmmd", "method": "fedmmd",
           "method_params": to_dict(resolve_method_params("fedmmd", {})), "archs": ["lenet"] * 4,
           "participants": parts,
           "engine": dict(rounds=2, local_epochs=1, local_batch=64, optimizer="sgd", lr=0.01, device="cpu",
                          clients_per_round=2, server_model=True, participant_eval=False, global_eval_every=1,
                          targets=[0.05, 0.99]),
           "paths": {"partition": str(tiny_data / "partitions/rotmnist"), "public": None, "pretrained": None}}
    m = run_federate(cfg, tmp_path / "run")
    head = m["headline"]
    assert 0 <= head["global/top1"] <= 1 and head["rounds_to/0.05"] in (0.0, 1.0, 2.0)
    assert math.isnan(head["rounds_to/0.99"])
    rounds = (tmp_path / "run" / "rounds.csv").read_text().splitlines()
    assert len(rounds) == 1 + 3 and all(",global," in r for r in rounds[1:])
    sampled = (tmp_path / "run" / "sampled.csv").read_text().splitlines()
    assert sampled[0] == "round,clients" and len(sampled) == 3 and len(sampled[1].split(",")[1].split()) == 2
    assert json.loads((tmp_path / "run" / "metrics.json").read_text().replace("NaN", "null"))["final"] == {}


def test_rounds_report_table_and_figure(tmp_path):
    """Report arithmetic: first round per seed, mean over every seed (never reached = last round + 1),
    reduction vs fedavg."""
    import pandas as pd

    from fedshift.report.rounds import rounds_report, rounds_table

    curves = {("fedavg", 0): [0.5, 0.7, 0.9, 0.95], ("fedavg", 1): [0.5, 0.8, 0.85, 0.91],
              ("fedmmd", 0): [0.6, 0.92, 0.93, 0.96], ("fedmmd", 1): [0.6, 0.91, 0.8, 0.85]}
    rows = [{"scenario": "s", "public": "none", "structure": "homo_lenet", "method": m, "seed": s, "round": r,
             "participant": "global", "arch": "lenet", "domain": "all", "kind": "global", "top1": acc, "top5": 1.0}
            for (m, s), accs in curves.items() for r, acc in enumerate(accs)]
    df = pd.DataFrame(rows)
    t = rounds_table(df, [0.9, 0.95], last_k=2)
    assert list(t.index) == ["fedavg", "fedmmd"]
    assert t.loc["fedavg", "rounds_to/0.9"] == 2.5 and t.loc["fedmmd", "rounds_to/0.9"] == 1.0
    assert t.loc["fedmmd", "reduce/0.9"] == pytest.approx(60.0)
    assert t.loc["fedmmd", "reached/0.95"] == 1 and t.loc["fedavg", "reached/0.95"] == 1
    # fedmmd seed 1 never reaches 0.95 (4 rounds: 0..3): it stays in the mean as round 4, a lower bound
    assert t.loc["fedmmd", "rounds_to/0.95"] == pytest.approx((3 + 4) / 2)
    assert t.loc["fedavg", "global/top1"] == pytest.approx(100 * (0.925 + 0.88) / 2)
    md = "\n".join(rounds_report(df, tmp_path, {"targets": [0.9, 0.95], "published": ["no_such_table"]}))
    assert "never (" not in md and "≥ 3.5 (1/2)" in md and "no_such_table" in md
    assert (tmp_path / "rounds__s__none__homo_lenet.csv").exists()
    assert (tmp_path / "global_curves__s__none__homo_lenet.png").stat().st_size > 0
