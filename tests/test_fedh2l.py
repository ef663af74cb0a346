"""FedH2L: projection (Eq. 7-8/14), confidence weights (Eq. 3), mutual loss, WDP/CDP/ACC,
best-validation selection, each switch, resumable state, IND/AGG, the runner and report path."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fedshift.engine.selection import best_val_headline
from fedshift.scoring import pooled as h2l_metrics
from fedshift.losses import batch_accuracy, confidence_weights, h2l_mutual_loss, project_gradient
from fedshift.methods import create_method
from fedshift.methods import fedh2l as fedh2l_mod
from fedshift.methods.stepwise import bind_flat_grads

from fedshift.testing import tiny_federation
from helpers import client_params, run_method

LENET4 = ("lenet",) * 4


# ------------------------------------------------------------------ projection
def test_projection_conflicting_case_by_hand():
    g_pub, g_loc = torch.tensor([1.0, -1.0]), torch.tensor([0.0, 2.0])
    g = project_gradient(g_pub, g_loc, "closed_form")
    # <g_pub, g_loc> = -2 < 0: g_pub - (-2 / 4) * g_loc = [1, 0]
    assert torch.allclose(g, torch.tensor([1.0, 0.0]))
    assert torch.equal(g_pub, torch.tensor([1.0, -1.0]))  # inputs untouched


def test_projection_non_conflicting_is_identity():
    g_pub, g_loc = torch.tensor([1.0, 1.0, -3.0]), torch.tensor([0.0, 1.0, 0.0])
    assert torch.equal(project_gradient(g_pub, g_loc, "closed_form"), g_pub)


def test_projection_solves_the_qp_of_eq_8():
    """Closed form = argmin ||g - g_pub||^2 s.t. <g, g_loc> >= 0 (checked against the dual, Eq. 14,
    solved numerically in numpy, and against feasibility / optimality conditions)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        gp, gl = rng.normal(size=50), rng.normal(size=50)
        g = project_gradient(torch.tensor(gp), torch.tensor(gl), "closed_form").numpy()
        vs = np.linspace(0, 5, 200001)  # dual: min_v 0.5 v^2 |g_loc|^2 + (g_pub . g_loc) v, v >= 0
        v = vs[np.argmin(0.5 * vs ** 2 * (gl @ gl) + (gp @ gl) * vs)]
        assert np.allclose(g, gp + v * gl, atol=1e-3 * np.abs(gl).max())
        assert g @ gl >= -1e-9
        if gp @ gl < 0:
            assert abs(g @ gl) < 1e-9  # active constraint: projected onto the boundary


def test_projection_none_and_pcgrad():
    g_pub, g_loc = torch.tensor([1.0, -1.0]), torch.tensor([0.0, 1.0])
    assert torch.equal(project_gradient(g_pub, g_loc, "none"), g_pub)
    # PCGrad: g_pub -> [1, 0]; g_loc -> g_loc - (-1 / 2) g_pub = [0.5, 0.5]; update = sum
    assert torch.allclose(project_gradient(g_pub, g_loc, "pcgrad"), torch.tensor([1.5, 0.5]))
    ok_pub = torch.tensor([1.0, 1.0])
    assert torch.allclose(project_gradient(ok_pub, g_loc, "pcgrad"), ok_pub + g_loc)
    from fedshift.errors import ConfigError

    with pytest.raises(ConfigError, match="projection: invalid value 'gem'"):
        project_gradient(g_pub, g_loc, "gem")


# ------------------------------------------------------------------ Eq. 3-6
def test_confidence_weights_and_batch_accuracy():
    assert torch.allclose(confidence_weights(torch.tensor([0.5, 1.0, 0.25]), 4), torch.tensor([0.5, 1.0, 0.25]) / 3)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 5.0]])
    assert batch_accuracy(logits, torch.tensor([0, 1, 1, 0])).item() == pytest.approx(0.5)


def test_mutual_loss_matches_an_explicit_loop():
    torch.manual_seed(0)
    P, B, C = 3, 5, 4
    s = torch.randn(P, B, C, dtype=torch.float64)
    t = F.softmax(torch.randn(P, B, C, dtype=torch.float64), -1)
    acc = torch.tensor([0.9, 0.5, 0.7], dtype=torch.float64)
    y = torch.randint(0, C, (P, B))
    kl_ref = sum(acc[j] * np.mean([sum(t[j, b, c] * (np.log(t[j, b, c]) - F.log_softmax(s[j, b], -1)[c])
                                      for c in range(C)).item() for b in range(B)]) for j in range(P)) / P
    ce_ref = sum(F.cross_entropy(s[j], y[j]) for j in range(P)) / P
    total, kl, ce = h2l_mutual_loss(s, t, acc, y)
    assert kl.item() == pytest.approx(float(kl_ref), rel=1e-9)
    assert ce.item() == pytest.approx(ce_ref.item(), rel=1e-9)
    assert total.item() == pytest.approx(float(kl_ref) + ce_ref.item(), rel=1e-9)
    _, kl0, ce0 = h2l_mutual_loss(s, t, acc, None, kl=False)
    assert kl0.item() == 0 and ce0.item() == 0


# ------------------------------------------------------------------ metrics
def test_wdp_cdp_acc_are_sample_weighted():
    sizes = {"d0": 100, "d1": 300, "d2": 600}
    rows = []
    for part, own, accs in (("a", "d0", (0.9, 0.5, 0.2)), ("b", "d1", (0.4, 0.8, 0.6))):
        for dom, acc in zip(sizes, accs):
            rows.append({"participant": part, "arch": "lenet", "domain": dom,
                         "kind": "intra" if dom == own else "inter", "top1": acc, "top5": 1.0})
    got = h2l_metrics.pooled_summary(h2l_metrics.pooled_rows(rows, sizes))
    assert got["a/wdp"] == pytest.approx(0.9)
    assert got["a/cdp"] == pytest.approx((0.5 * 300 + 0.2 * 600) / 900)  # 0.30, not the mean 0.35
    assert got["a/acc"] == pytest.approx((90 + 150 + 120) / 1000)
    assert got["b/cdp"] == pytest.approx((0.4 * 100 + 0.6 * 600) / 700)
    assert got["b/acc"] == pytest.approx((40 + 240 + 360) / 1000)
    assert got["avg/acc"] == pytest.approx((0.36 + 0.64) / 2)


def test_best_val_selection_per_participant():
    hist = [{"a/val/acc": 0.5, "a/acc": 0.1, "b/val/acc": 0.7, "b/acc": 0.2},
            {"a/val/acc": 0.8, "a/acc": 0.3, "b/val/acc": 0.6, "b/acc": 0.4},
            {"a/val/acc": 0.8, "a/acc": 0.9, "b/val/acc": 0.7, "b/acc": 0.9}]
    head, chosen = best_val_headline(hist, [50, 100, 150])
    assert chosen == {"a": 100, "b": 50}  # earliest maximum
    assert head["a/acc"] == 0.3 and head["b/acc"] == 0.2
    assert head["avg/acc"] == pytest.approx(0.25)


# ------------------------------------------------------------------ the method
def _params(fed, i=0):
    return client_params(fed, i)


def _run(tiny_data, params, rounds=3, method="fedh2l", archs=LENET4):
    return run_method(tiny_data, params, method, rounds, archs)


def test_flat_grad_buffer_is_the_gradient(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet",), public_aug="none")
    model = fed.clients[0].model
    buf = bind_flat_grads(model)
    x, y = fed.clients[0].data.get("private")
    from fedshift.data.loading import normalize

    loss = F.cross_entropy(model(normalize(x[:16])), y[:16])
    ref = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)])
    loss.backward()
    assert torch.allclose(buf, ref)
    assert all(p.grad.data_ptr() >= buf.data_ptr() for p in model.parameters())  # still views


@pytest.mark.parametrize("switch", [{"E": 2}, {"projection": "none"}, {"projection": "pcgrad"}, {"kl": False},
                                    {"public_labels": False}, {"peers": "random_pairs"}, {"g_loc": "param_change"}])
def test_each_switch_changes_the_result(tiny_data, switch):
    base, _ = _run(tiny_data, {})
    other, _ = _run(tiny_data, switch)
    assert not torch.allclose(_params(base), _params(other))


def test_e_gt_1_projects_against_the_sum_of_local_gradients(tiny_data, monkeypatch):
    fed = tiny_federation(tiny_data, LENET4, public_aug="none")
    m = create_method("fedh2l", {"E": 3})
    fed.setup(m)
    local, seen = [], []
    orig_after, orig_proj = m.after_local, fedh2l_mod.project_gradient

    def after_local(i, node):
        if i == 1:
            local.append(node.buf.clone())
        orig_after(i, node)

    def proj(g_pub, g_loc, mode):
        seen.append(g_loc.clone())
        return orig_proj(g_pub, g_loc, mode)

    monkeypatch.setattr(m, "after_local", after_local)
    monkeypatch.setattr(fedh2l_mod, "project_gradient", proj)
    for r in (1, 2):
        fed.run_round(r)
    assert not seen  # no global step before round E
    fed.run_round(3)
    assert len(seen) == 4 and torch.allclose(seen[1], local[0] + local[1] + local[2])
    fed.run_round(4)
    assert torch.allclose(m.nodes[1].gloc, local[3])  # restarted after the global step


def test_random_pairs_learn_from_one_peer(tiny_data):
    _, m = _run(tiny_data, {"peers": "random_pairs"}, rounds=1)
    pairs = m.peers(4)
    assert sorted(len(p) for p in pairs) == [1, 1, 1, 1]
    assert all(pairs[pairs[i][0]] == [i] for i in range(4))
    assert sum(len(p) for p in m.peers(5)) == 4  # odd N: one node sits out


def test_state_dict_round_trip_resumes_identically(tiny_data):
    params = {"E": 2, "peers": "random_pairs", "g_loc": "param_change", "log_every": 3}
    fed, m = _run(tiny_data, params, rounds=3)
    buf = io.BytesIO()
    torch.save({"method": m.state_dict(), "models": [c.model.state_dict() for c in fed.clients]}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    fed2 = tiny_federation(tiny_data, LENET4, public_aug="none", seed=1)  # other init: all must come from the state
    m2 = create_method("fedh2l", params)
    fed2.setup(m2)
    for c, s in zip(fed2.clients, saved["models"]):
        c.model.load_state_dict(s)
    m2.load_state_dict(saved["method"])
    for r in (4, 5, 6):
        fed.round = fed2.round = r
        out1, out2 = fed.run_round(r), fed2.run_round(r)
        assert out1 == out2
    for i in range(4):
        assert torch.equal(_params(fed, i), _params(fed2, i))
    assert m.state_dict()["comm_bytes"] == m2.state_dict()["comm_bytes"] > 0


@pytest.mark.parametrize("name", ["ind", "agg"])
def test_baselines_round_trip_and_data(tiny_data, name):
    fed, m = _run(tiny_data, {}, rounds=2, method=name)
    n_priv = len(fed.clients[0].data.get("private")[1])
    n_pub = sum(len(c.data.get("public")[1]) for c in fed.clients)
    assert len(m.nodes[0].y) == (n_priv + n_pub if name == "agg" else n_priv)
    state = m.state_dict()
    fed2, m2 = _run(tiny_data, {}, rounds=0, method=name)
    for c, c2 in zip(fed.clients, fed2.clients):
        c2.model.load_state_dict(c.model.state_dict())
    m2.load_state_dict(state)
    fed.run_round(3)
    fed2.run_round(3)
    assert torch.equal(_params(fed), _params(fed2))
    assert m.run_summary(fed.ctx)["communication"]["bytes_total"] == 0


def test_logging_only_every_k_rounds(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"), public_aug="none")
    m = create_method("fedh2l", {"log_every": 2})
    fed.setup(m)
    assert fed.run_round(1) == {}
    out = fed.run_round(2)
    assert {"m0/train/local_loss", "m0/train/kl", "m0/train/ce", "m20/train/conflict"} <= set(out)
    assert 0 <= out["m0/train/conflict"] <= 1


# ------------------------------------------------------------------ runner, experiments, report
def test_runner_writes_h2l_metrics_selection_and_communication(tiny_data, tmp_path):
    from fedshift import runner
    from fedshift.experiments import load_experiments

    exp = {"engine": {"rounds": 4, "eval_every": 2, "select": "best_val", "device": "cpu"},
           "scoring": {"metrics": ["pooled"]},
           "variants": {"fedmd": {"method": "fedmd", "engine": {"rounds": 2, "eval_every": 1}}},
           "methods": {"fedmd": {"public_data": "seed", "public_subset": 64}},
           "grid": [{"scenarios": ["rotmnist"], "methods": ["fedh2l", "fedmd"], "structures": ["homo_lenet"]}]}
    plan = load_experiments(exp, {"scenarios": {"rotmnist": {}}}, results=str(tmp_path), build=str(tiny_data))
    cfgs = {c["method"]: c for c in plan.federate.values()}
    assert cfgs["fedmd"]["paths"]["public"] is None and cfgs["fedmd"]["engine"]["rounds"] == 2
    out = tmp_path / "run"
    metrics = runner.run_federate(cfgs["fedh2l"], out)
    saved = json.loads((out / "metrics.json").read_text())
    head = saved["headline"]
    for p in ("m0", "m20", "m40", "m60", "avg"):
        assert all(0 <= head[f"{p}/{k}"] <= 1 for k in ("acc", "wdp", "cdp"))
    assert set(saved["selected_rounds"].values()) <= {2, 4}
    assert saved["communication"]["bytes_total"] > 0 and saved["communication"]["fedavg_over_method"] > 1
    df = pd.read_csv(out / "rounds.csv")
    assert set(df["kind"]) == {"intra", "inter", "wdp", "cdp", "acc", "val_acc"}
    sel = df[(df["kind"] == "acc") & (df["participant"] == "m0") & (df["round"] == saved["selected_rounds"]["m0"])]
    assert sel["top1"].item() == pytest.approx(head["m0/acc"])
    assert metrics["headline"] == pytest.approx(head)
    fm = runner.run_federate(cfgs["fedmd"], tmp_path / "fedmd")  # FedMD on the seed set, no public set loaded
    assert "m0/acc" in fm["headline"]


def test_report_table2_with_published_delta(tmp_path):
    from fedshift.report.h2l import h2l_section

    rows = []
    for seed in (0, 1):
        for r in (50, 100):
            for p in ("m0", "m20"):
                val = 0.9 if (r == 50) == (p == "m0") else 0.5  # m0 best at 50, m20 at 100
                rows.append({"scenario": "rotmnist_a10", "public": "none", "method": "fedh2l", "base_method": "fedh2l",
                             "structure": "homo_lenet", "seed": seed, "round": r, "participant": p, "arch": "lenet",
                             "domain": "val", "kind": "val_acc", "top1": val, "top5": 1.0})
                for k, v in (("acc", 0.6), ("wdp", 0.8), ("cdp", 0.4)):
                    rows.append({**rows[-1], "domain": "pooled", "kind": k, "top1": v + r / 1000 + seed / 100})
    pub = tmp_path / "published"
    pub.mkdir()
    (pub / "t2.csv").write_text("paper,table,scenario,method,participant,metric,value,flag,note\n"
                                "fedh2l,II,rotmnist_a10,fedh2l,avg,acc,90.00,,\n")
    md = "\n".join(h2l_section(pd.DataFrame(rows), {"published": ["t2"]}, tmp_path, published_dir=pub))
    long = pd.read_csv(tmp_path / "h2l_table__homo_lenet.csv")
    m0 = long[(long.participant == "m0") & (long.metric == "acc")].iloc[0]
    assert m0["ours"] == pytest.approx((0.65 + 0.66) / 2 * 100)  # round 50 selected
    avg = long[(long.participant == "avg") & (long.metric == "acc")].iloc[0]
    assert avg["ours"] == pytest.approx(((0.65 + 0.70) / 2 + (0.66 + 0.71) / 2) / 2 * 100)
    assert avg["delta"] == pytest.approx(avg["ours"] - 90.0)
    assert "(90.00, Δ" in md and "m0 ACC" in md


def test_rotmnist_alpha_scenarios_partition_disjoint(tiny_data, tmp_path):
    from fedshift.data import build

    man = build.partition("rotmnist_a05", {"mnist5k": tiny_data / "datasets/mnist5k"}, tmp_path / "p",
                          {"per_class": 20})
    m0 = man["participants"]["m0"]["splits"]
    assert m0["public"]["n"] == 10 and m0["test"]["n"] == 30  # 5 % and 15 % of 200
    assert man["audit"]["disjoint_by_index"] and man["params"]["alpha"] == 0.05


def test_alpha_scenarios_share_val_and_test_images_and_nest_their_seed_sets(tiny_data, tmp_path):
    """Table II compares alphas: rotmnist_a05/a10/a15 must differ in the seed/private boundary
    only (same validation and test images, seed sets nested), else an alpha difference mixes in
    a different test set. The plain `rotmnist` (eval_first false) keeps its first layout."""
    import numpy as np

    from fedshift.data import build

    rows = {}
    for name in ("rotmnist_a05", "rotmnist_a10", "rotmnist_a15"):
        out = tmp_path / name
        build.partition(name, {"mnist5k": tiny_data / "datasets/mnist5k"}, out, {"per_class": 20})
        rows[name] = {role: set(np.load(out / "m20" / f"{role}_index.npy").tolist())
                      for role in ("test", "val", "public", "private")}
    a05, a10, a15 = rows["rotmnist_a05"], rows["rotmnist_a10"], rows["rotmnist_a15"]
    for role in ("test", "val"):
        assert a05[role] == a10[role] == a15[role]
    assert a05["public"] < a10["public"] < a15["public"]  # strictly nested: 10 < 20 < 30 of 200
    assert a15["private"] < a10["private"] < a05["private"]
    assert len(a15["public"]) == 30 and len(a05["test"]) == 30
    # the first layout (public cut first) moves the test images with alpha
    from fedshift.data.scenarios.rotmnist import RotMnistParams, build_rotmnist

    dirs = {"mnist5k": tiny_data / "datasets/mnist5k"}
    old = [set(build_rotmnist(dirs, RotMnistParams(per_class=20, alpha=a, test=0.15, eval_first=False))["m0"]
               .splits["test"].index.tolist()) for a in (0.05, 0.15)]
    assert old[0] != old[1]


def test_flat_params_takes_channels_last_weights_in_the_gradient_buffer_order():
    """engine.channels_last (the default) gives NHWC conv weights, which parameters_to_vector
    (view(-1)) refuses; flat_params flattens in logical order, the order of bind_flat_grads."""
    from torch.nn.utils import parameters_to_vector

    from fedshift.methods.stepwise import flat_params
    from fedshift.models import create_model

    torch.manual_seed(0)
    model = create_model("lenet", num_classes=10, in_channels=1)
    want = parameters_to_vector(model.parameters()).detach()
    model = model.to(memory_format=torch.channels_last)
    assert any(p.dim() == 4 and not p.is_contiguous() for p in model.parameters())
    assert torch.equal(flat_params(list(model.parameters())), want)
    buf = bind_flat_grads(model)
    x = torch.randn(3, 1, 28, 28).to(memory_format=torch.channels_last)
    model(x).sum().backward()
    assert torch.equal(buf, torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
