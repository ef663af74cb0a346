"""FedHEAL (issue 37): its server arithmetic against hand values, three whole rounds in float64
against a re-implementation from yuhangchen0/FedHEAL models/utils/federated_model.py, and resume
bit-identical."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fedshift.methods import create_method
from fedshift.methods.fedheal import consistency_mask, fair_weights, masked_aggregate, update_size

from fedshift.testing import resumed_round_three, scoring_of, synthetic_federation, tiny_federation
from helpers import reference_batches

DT = torch.float64


def t(x):
    return torch.tensor(x, dtype=DT)


def test_consistency_mask_hand_values():
    # round 1: mask of ones; history = [u >= 0]
    m, h = consistency_mask({"w": t([0.5, -1.0, 0.0])}, None, 0, 0.3)
    assert m["w"].tolist() == [1, 1, 1] and h["w"].tolist() == [1, 0, 1]
    # round 2 (count 1): entry 0 keeps its direction (history 1 > 0.3: kept); entry 1 turns >= 0 after a
    # negative history (consistency 0: dropped); entry 2 turns negative after >= 0 (1 - 1 = 0: dropped)
    m, h = consistency_mask({"w": t([2.0, 3.0, -1.0])}, h, 1, 0.3)
    assert m["w"].tolist() == [1, 0, 0] and h["w"].tolist() == [1, 0.5, 0.5]
    # round 3 (count 2): histories 1, 0.5, 0.5; updates -, -, +: consistencies 0, 0.5, 0.5 -> 0, 1, 1
    m, h = consistency_mask({"w": t([-1.0, -1.0, 1.0])}, h, 2, 0.3)
    assert m["w"].tolist() == [0, 1, 1] and h["w"].tolist() == pytest.approx([2 / 3, 1 / 3, 2 / 3])
    # the threshold is strict: consistency 0.5 with threshold 0.5 is dropped
    m, _ = consistency_mask({"w": t([-1.0])}, {"w": t([0.5])}, 2, 0.5)
    assert m["w"].tolist() == [0]


def test_fair_weights_and_update_size_hand_values():
    # sizes are sums of per-tensor norms over the parameters only: |(3, 4)| + |(0, 1)| = 6; the buffer is left out
    masked = {"a": t([3.0, 4.0]), "b": t([0.0, 1.0]), "running_mean": t([100.0])}
    assert update_size(masked, ["a", "b"]) == 6.0
    sizes = {"x": 1.0, "y": 3.0}
    f, w, d = fair_weights(["x", "y"], sizes, {}, {}, 0.4)
    # delta = 0.4 * size / 4: 0.1, 0.3; w = 1/2 + delta: 0.6, 0.8; normalised: 3/7, 4/7
    assert d == pytest.approx({"x": 0.1, "y": 0.3}) and w == pytest.approx({"x": 0.6, "y": 0.8})
    assert f == pytest.approx([3 / 7, 4 / 7])
    # next round, equal sizes: delta = 0.6 * prev + 0.4 * 0.5; w accumulates (unnormalised)
    f2, w2, d2 = fair_weights(["x", "y"], {"x": 2.0, "y": 2.0}, w, d, 0.4)
    assert d2 == pytest.approx({"x": 0.26, "y": 0.38}) and w2 == pytest.approx({"x": 0.86, "y": 1.18})
    assert f2 == pytest.approx([0.86 / 2.04, 1.18 / 2.04])


def test_masked_aggregate_hand_values():
    g = {"w": t([10.0, 10.0, 10.0])}
    u1, u2 = {"w": t([1.0, 2.0, 0.0])}, {"w": t([3.0, 0.0, 0.0])}
    m1, m2 = {"w": t([1.0, 1.0, 0.0])}, {"w": t([1.0, 0.0, 0.0])}  # masked updates are 0 where the mask is
    out = masked_aggregate(g, [u1, u2], [m1, m2], [0.25, 0.75])
    # entry 0: both kept, 10 - (1 * .25 + 3 * .75); entry 1: only client 1 kept -> weight 1: 10 - 2;
    # entry 2: nobody kept -> plain weights on zero updates: 10
    assert out["w"].tolist() == [10 - 2.5, 8.0, 10.0]
    assert g["w"].tolist() == [10.0, 10.0, 10.0]  # the input is not modified


# ------------------------------------------------- whole rounds in float64 vs a re-implementation


def _norm64(x):
    return (x.double() / 255.0 - 0.5) / 0.5


class RefHEAL:
    """models/fedavgheal.py:33-75 + models/utils/federated_model.py:70-214, dict by dict (plain SGD, CE)."""

    def __init__(self, threshold, beta):
        self.threshold, self.beta = threshold, beta
        self.hist, self.seen, self.dist, self.pw, self.pd = {}, {}, {}, {}, {}
        self.dropped = 0  # entries masked out, over all rounds and clients

    def round(self, global_w, model, sampled, epochs, batch, lr, param_names):
        updates, masks = {}, {}
        for name, c, gen in sampled:
            model.load_state_dict(global_w)
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            for xb, yb in reference_batches(c.data.get("private"), gen, batch, epochs, _norm64):
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
            local = model.state_dict()
            diff = {k: global_w[k] - local[k] for k in global_w if torch.is_floating_point(global_w[k])}
            if name not in self.hist:
                self.hist[name] = {k: (v >= 0).double() for k, v in diff.items()}
                self.seen[name] = 1
                mask = {k: torch.ones_like(v) for k, v in diff.items()}
            else:
                mask = {}
                for k, v in diff.items():
                    cons = torch.where(v >= 0, self.hist[name][k], 1 - self.hist[name][k])
                    mask[k] = (cons > self.threshold).double()
                n = self.seen[name]
                for k, v in diff.items():
                    self.hist[name][k] = (self.hist[name][k] * n + (v >= 0).double()) / (n + 1)
                self.seen[name] = n + 1
            updates[name] = {k: diff[k] * mask[k] for k in diff}
            self.dropped += int(sum((1 - v).sum() for v in mask.values()))
            masks[name] = mask
            self.dist[name] = sum(torch.norm(updates[name][k]).item() for k in diff if k in param_names)
        names = [n for n, _, _ in sampled]
        weights = {}
        for n in names:
            delta = (1 - self.beta) * self.pd.get(n, 0) + self.beta * self.dist[n] / sum(self.dist.values())
            weights[n] = self.pw.get(n, 1 / len(names)) + delta
            self.pw[n], self.pd[n] = weights[n], delta
        total = sum(weights.values())
        freq = {n: weights[n] / total for n in names}
        new = {k: v.clone() for k, v in global_w.items()}
        for k in updates[names[0]]:
            tot = sum(freq[n] * masks[n][k] for n in names)
            for n in names:
                w = torch.where(tot == 0, torch.full_like(tot, freq[n]), freq[n] * masks[n][k] / tot)
                new[k] = new[k] - updates[n][k] * w
        return new


@pytest.mark.parametrize("sampled", [0, 3], ids=["all", "sampled"])
def test_three_rounds_in_float64_equal_the_reimplementation(monkeypatch, sampled):
    from fedshift.engine import federation
    monkeypatch.setattr(federation, "normalize", _norm64)
    fed = synthetic_federation(4, per_client=12, server_model=False, local_batch=5, local_epochs=2, lr=0.1,
                               momentum=0.0, clients_per_round=sampled)
    m = create_method("fedheal", {"threshold": 0.3, "beta": 0.4})
    fed.setup(m)
    for c in fed.clients:
        c.model.double()
    model = copy.deepcopy(fed.clients[0].model)
    param_names = [n for n, _ in model.named_parameters()]
    gens = [torch.Generator().set_state(c.generator.get_state()) for c in fed.clients]
    global_w = {k: v.clone() for k, v in fed.clients[0].model.state_dict().items()}
    ref = RefHEAL(0.3, 0.4)
    for r in (1, 2, 3):
        fed.round = r
        metrics = fed.run_round(r)
        chosen = fed.sampled.get(r, range(4))
        assert len(chosen) == (sampled or 4)
        global_w = ref.round(global_w, model, [(fed.clients[i].name, fed.clients[i], gens[i]) for i in chosen], 2, 5,
                             0.1, param_names)
        for c in fed.clients:
            for k, v in c.model.state_dict().items():
                torch.testing.assert_close(v, global_w[k], rtol=1e-9, atol=1e-12, msg=f"round {r} {c.name} {k}")
        w = [metrics[f"{fed.clients[i].name}/train/heal_weight"] for i in chosen]
        assert sum(w) == pytest.approx(1.0)
    # the example reaches the cases that matter: masks drop entries, the weights move away from uniform
    assert ref.dropped > 0 and len(set(round(x, 6) for x in w)) > 1


# ------------------------------------------------------------------ resume


@pytest.mark.parametrize("name,scoring,engine", [("fedheal", {}, {}), ("fedheal", {"eval_models": "local"}, {}),
                                                 ("fedheal", {}, {"clients_per_round": 1}), ("fpl_heal", {}, {})],
                         ids=["global", "local", "sampled", "fpl_heal"])
def test_restored_from_state_dict_round_three_is_bit_identical(tiny_data, tmp_path, name, scoring, engine):
    def build():
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), rounds=3, public_aug="none", scoring=scoring, **engine)
        method = create_method(name)
        fed.setup(method)
        return fed, method

    (fed, method), (fed2, method2) = resumed_round_three(build, tmp_path / "state.pt")
    assert method.prev_w == method2.prev_w and method.count == method2.count
    if scoring:  # eval_models: local: the engine keeps the server's delivery aside for the next round's start
        assert fed.pending is not None and fed.pending.keys() == fed2.pending.keys()
        for name_ in fed.pending:
            assert all(torch.equal(v, fed2.pending[name_][k]) for k, v in fed.pending[name_].items())
    else:
        assert fed.pending is None and fed2.pending is None
    if name == "fpl_heal":
        assert torch.equal(method.clusters, method2.clusters) and torch.equal(method.unbiased, method2.unbiased)


def test_unknown_state_keys_are_refused(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    m = create_method("fedheal")
    fed.setup(m)
    with pytest.raises(ValueError, match="unknown keys.*protos"):
        m.load_state_dict({"protos": torch.zeros(1)})


def test_init_base_starts_every_participant_from_one_average(tiny_data):
    """init: base averages the participants' (BASE) models into one start, as FedAvg does."""
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    a, b = (dict(c.model.state_dict()) for c in fed.clients)
    fed.scoring = scoring_of({"weighting": "uniform"})
    m = create_method("fedheal", {"init": "base"})
    fed.setup(m)
    for k, v in fed.clients[0].model.state_dict().items():
        assert torch.equal(v, fed.clients[1].model.state_dict()[k])
        if torch.is_floating_point(v):
            torch.testing.assert_close(v, (a[k] + b[k]) / 2)


def test_fpl_heal_is_fpls_clients_under_fedheals_server():
    """Round 1 has no prototypes yet: fpl_heal's global model equals FedHEAL's and its prototypes
    equal FPL's, bit for bit; in round 2 FPL's prototype terms change the clients, so the models part."""
    def run(name, rounds):
        fed = synthetic_federation(4, per_client=12, server_model=False, local_batch=5, local_epochs=2, lr=0.1,
                                   momentum=0.0)
        m = create_method(name, {"tau": 0.5} if "fpl" in name else {})
        fed.setup(m)
        for r in range(1, rounds + 1):
            fed.round = r
            fed.run_round(r)
        return fed.clients[0].model.state_dict(), m

    both, m = run("fpl_heal", 1)
    heal, _ = run("fedheal", 1)
    _, fpl = run("fpl", 1)
    assert all(torch.equal(both[k], heal[k]) for k in both)
    assert torch.equal(m.clusters, fpl.clusters) and torch.equal(m.unbiased, fpl.unbiased)
    both2, _ = run("fpl_heal", 2)
    heal2, _ = run("fedheal", 2)
    assert not all(torch.allclose(both2[k], heal2[k]) for k in both2)
