"""FCCL, FCCL+ and FedDF: every switch changes behaviour, the collaborative targets and
local losses match hand computations, homogeneous averaging happens where the papers
put it, and the ablation grids in params/ablations/ resolve.

Kept small: LeNet/SimpleCNN, 2-3 participants, 128 public and 64 private images each.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedshift.data.loading import normalize
from fedshift.errors import ConfigError
from fedshift.losses import fccm_loss, fisl_loss, fntd_loss, instance_similarity, kd_loss, soft_target_loss
from fedshift.methods import create_method
from fedshift.methods.fccl import collaborative_targets
from fedshift.methods.feddf import ensemble_target

from conftest import REPO
from fedshift.testing import tiny_federation

HETERO = ("lenet", "simple_cnn")
HOMO = ("lenet", "lenet")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one intra-op thread is several times faster than oversubscribed cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def small_federation(root, archs=HETERO, public=128, private=64, **engine):
    """tiny_federation with the public set and every private split cut short (fast rounds)."""
    engine.setdefault("public_aug", "none")
    engine.setdefault("norm", "batch")  # BatchNorm everywhere, so that teacher_bn matters
    fed = tiny_federation(root, archs, **engine)
    fed.data.public = fed.data.public[:public]
    for c in fed.clients:
        x, y = c.data.splits["private"]
        c.data.splits["private"] = (x[:private], y[:private])
    return fed


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def one_round(root, method, params, archs=HETERO, **engine):
    torch.manual_seed(0)
    fed = small_federation(root, archs, **engine)
    m = create_method(method, params)
    fed.setup(m)
    fed.run_round(1)
    return torch.cat([flat(c.model) for c in fed.clients])


# ---------------------------------------------------------------- collaborative targets


def test_collaborative_targets_by_hand():
    a, b, c = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 5.0]]), torch.tensor([[8.0, -1.0]])
    pa, pb, pc = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 4.0]])
    allt = collaborative_targets([a, b, c], "all")
    assert all(torch.allclose(t, torch.tensor([[4.0, 2.0]])) for t in allt)
    others = collaborative_targets([a, b, c], "others")
    assert torch.allclose(others[0], torch.tensor([[5.5, 2.0]]))  # (b + c) / 2
    assert torch.allclose(others[1], torch.tensor([[4.5, 0.5]]))  # (a + c) / 2
    assert torch.allclose(others[2], torch.tensor([[2.0, 3.5]]))  # (a + b) / 2
    prev = collaborative_targets([a, b, c], "others_prev", [pa, pb, pc])
    assert torch.allclose(prev[0], torch.tensor([[11.0 / 3, 4.0 / 3]]))  # (pa + b + c) / 3
    assert torch.allclose(prev[1], torch.tensor([[10.0 / 3, 2.0 / 3]]))  # (a + pb + c) / 3
    assert torch.allclose(prev[2], torch.tensor([[6.0 / 3, 11.0 / 3]]))  # (a + b + pc) / 3
    with pytest.raises(ValueError):
        collaborative_targets([a], "others")
    with pytest.raises(ValueError):
        collaborative_targets([a, b], "others_prev")


@pytest.mark.parametrize("method,target", [("fccl_plus", "all"), ("fccl_plus", "others"),
                                           ("fccl_plus", "others_prev"), ("fccl", "others_prev")])
def test_collaborative_loss_uses_the_target(tiny_data, method, target):
    """3 participants, one public batch: the logged loss is FCCM (+ omega*FISL for FCCL+) toward the target."""
    fed = small_federation(tiny_data, ("lenet", "simple_cnn", "lenet"), public=128, public_batch=128)
    m = create_method(method, {"target": target})
    fed.setup(m)
    fed.public_gen.manual_seed(7)
    x = next(fed.public_batches())
    outs = [c.model.forward_with_features(x) for c in fed.clients]
    with torch.no_grad():
        prev = [c.state["prev"].forward_with_features(x) for c in fed.clients]
    z = [o[1].detach() for o in outs]
    s = [instance_similarity(o[0].detach(), 0.02) for o in outs]
    ps = [instance_similarity(h, 0.02) for h, _ in prev]
    k = 3
    for i, c in enumerate(fed.clients):
        others_z = sum(z[j] for j in range(k) if j != i)
        others_s = sum(s[j] for j in range(k) if j != i)
        zt, st = {"all": (sum(z) / k, sum(s) / k),
                  "others": (others_z / (k - 1), others_s / (k - 1)),
                  "others_prev": ((others_z + prev[i][1]) / k, (others_s + ps[i]) / k)}[target]
        expect = fccm_loss(outs[i][1], zt, 0.0051)
        if method == "fccl_plus":
            expect = expect + 3.0 * fisl_loss(instance_similarity(outs[i][0], 0.02), st)
        c.state["expect"] = float(expect.detach())
    fed.public_gen.manual_seed(7)
    got = m.collaborate(fed.ctx)
    for c in fed.clients:
        assert got[f"{c.name}/train/colla_loss"] == pytest.approx(c.state["expect"], rel=1e-4)


def test_fccl_target_default_is_the_cvpr_code():
    assert create_method("fccl").p.target == "others_prev"
    assert create_method("fccl_plus").p.target == "all"


# ------------------------------------------------------------------ every switch matters

SWITCHES = [
    ("fccl_plus", {"target": "others"}),
    ("fccl_plus", {"target": "others_prev"}),
    ("fccl_plus", {"local_distill": "kd"}),  # Fig. 10
    ("fccl_plus", {"local_distill": "ewc"}),  # Table XVI
    ("fccl_plus", {"local_distill": "none"}),  # Table XIX w/o FNTD
    ("fccl_plus", {"fntd": False}),  # Table X: CVPR Eq. 19
    ("fccl_plus", {"tau": 1.0}),  # Fig. 10
    ("fccl_plus", {"teacher": "collaborated"}),  # Fig. 9
    ("fccl_plus", {"kd_ratio": 1.0}),  # Table XVII
    ("fccl_plus", {"fntd_renormalize": True}),
    ("fccl_plus", {"teacher_bn": "train"}),
    ("fccl_plus", {"lam": 0.1}),  # Table XI
    ("fccl_plus", {"omega": 1.0}),  # Table XIV
    ("fccl_plus", {"mu": 0.2}),
    ("fccl", {"target": "all"}),
    ("fccl", {"target": "others"}),
    ("fccl", {"lambda_loc": 0.0}),  # CVPR Fig. 8 "w/o CON"
    ("fccl", {"tau": 3.0}),
    ("fccl", {"teacher": "collaborated"}),
    ("fccl", {"teacher_bn": "train"}),
    ("fccl", {"fresh_optimizer": False}),
    ("feddf", {"ensemble": "logits"}),
    ("feddf", {"tau": 3.0}),
    ("feddf", {"fresh_optimizer": False}),
]
_BASELINES = {}


@pytest.mark.parametrize("method,switch", SWITCHES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={x}" for k, x in v.items()))
def test_switch_changes_the_result(tiny_data, method, switch):
    if method not in _BASELINES:
        _BASELINES[method] = one_round(tiny_data, method, {})
    assert not torch.allclose(_BASELINES[method], one_round(tiny_data, method, switch))


def test_ewc_lambda_changes_the_result(tiny_data):
    a = one_round(tiny_data, "fccl_plus", {"local_distill": "ewc", "ewc_lambda": 0.01}, local_epochs=2)
    b = one_round(tiny_data, "fccl_plus", {"local_distill": "ewc", "ewc_lambda": 1000.0}, local_epochs=2)
    assert not torch.allclose(a, b)


def test_inconsistent_switches_fail():
    with pytest.raises(ConfigError, match="fntd: false"):
        create_method("fccl_plus", {"fntd": False, "local_distill": "kd"})
    with pytest.raises(ConfigError, match="kd_ratio"):
        create_method("fccl_plus", {"kd_ratio": 0.1, "local_distill": "none"})
    with pytest.raises(ConfigError, match="kd_ratio"):
        create_method("fccl_plus", {"kd_ratio": 1.5})
    assert create_method("fccl_plus", {"fntd": False}).p.distill == "dual"


# ----------------------------------------------------------------- local updating


def test_kd_ratio_switches_from_kd_to_fntd_at_the_right_epoch(tiny_data, monkeypatch):
    assert create_method("fccl_plus", {"kd_ratio": 0.3}).epoch_modes(20) == ["kd"] * 6 + ["fntd"] * 14
    assert create_method("fccl_plus", {"kd_ratio": 0.1}).epoch_modes(20) == ["kd"] * 2 + ["fntd"] * 18
    assert create_method("fccl_plus").epoch_modes(3) == ["fntd"] * 3
    import fedshift.methods.fccl_plus as mod

    calls = []
    monkeypatch.setattr(mod, "kd_loss", lambda *a, **k: calls.append("kd") or kd_loss(*a, **k))
    monkeypatch.setattr(mod, "fntd_loss", lambda *a, **k: calls.append("fntd") or fntd_loss(*a, **k))
    fed = small_federation(tiny_data, ("lenet",), local_epochs=4, local_batch=32)  # 64 images: 2 steps per epoch
    m = create_method("fccl_plus", {"kd_ratio": 0.5})
    fed.setup(m)
    m.local_update(fed.ctx)
    assert calls == ["kd"] * 4 + ["fntd"] * 4


def test_fccl_local_loss_is_ce_plus_two_kls(tiny_data):
    """FCCL Eq. 7 with lambda_loc = 1: CE + KL(prev || student) + KL(pretrained || student), T = 1."""
    torch.manual_seed(0)
    fed = small_federation(tiny_data, HETERO)
    m = create_method("fccl")
    fed.setup(m)
    fed.run_round(1)  # the previous-round model now differs from the pretrained one
    m.collaborate(fed.ctx)
    c = fed.clients[0]
    assert not same_state(c.state["prev"], c.state["pretrained"])
    x, y = c.data.get("private")
    x, y = normalize(x[:32]), y[:32]
    m._mode = "dual"
    c.state["teacher"] = c.state["prev"]
    got = m.local_loss(fed.ctx, c, x, y, 0)
    logits = c.model(x)
    with torch.no_grad():
        p_prev = F.softmax(c.state["prev"](x), dim=1)
        p_pre = F.softmax(c.state["pretrained"](x), dim=1)
    log_s = F.log_softmax(logits, dim=1)
    expect = (F.cross_entropy(logits, y) + F.kl_div(log_s, p_prev, reduction="batchmean")
              + F.kl_div(log_s, p_pre, reduction="batchmean"))
    assert float(got.detach()) == pytest.approx(float(expect.detach()), rel=1e-5)
    assert m.epoch_modes(2) == ["dual", "dual"]
    assert create_method("fccl", {"lambda_loc": 0.0}).epoch_modes(2) == ["none", "none"]


def test_fccl_plus_without_fntd_uses_eq19_with_the_base_checkpoint(tiny_data):
    """Without FNTD (Eq. 19) theta^* is the BASE model (FCCL's behaviour), not FCCL+'s random start."""
    from fedshift.runner import build_models

    fed = small_federation(tiny_data, HETERO)
    base = build_models(list(HETERO), 10, 1, "batch", seed=123)  # stands for the BASE checkpoints
    fed.base_models = base
    m = create_method("fccl_plus", {"fntd": False})
    assert m.p.init == "scratch" and type(m).needs_base(m.p)
    fed.setup(m)
    start = copy.deepcopy(fed.clients[0].model)
    fed.run_round(1)
    c = fed.clients[0]
    assert same_state(c.state["pretrained"], base[0])  # theta^* = the BASE model ...
    assert not same_state(c.state["pretrained"], start)  # ... not the (random) starting model
    assert not same_state(c.state["prev"], start)  # theta^{e-1} moved on
    assert not type(m).needs_base(create_method("fccl_plus").p)  # FNTD needs no BASE model
    fed2 = small_federation(tiny_data, HETERO)
    m2 = create_method("fccl_plus")
    fed2.setup(m2)
    assert "pretrained" not in fed2.clients[0].state  # FNTD keeps no extra copy


@pytest.mark.parametrize("teacher", ["previous", "collaborated"])
def test_teacher_snapshot(tiny_data, teacher):
    """Fig. 9: FNTD's teacher is the model before (previous) or after (collaborated) the collaborative step."""
    fed = small_federation(tiny_data, HETERO)
    m = create_method("fccl_plus", {"teacher": teacher})
    fed.setup(m)
    before = [copy.deepcopy(c.model) for c in fed.clients]
    m.collaborate(fed.ctx)
    after = [copy.deepcopy(c.model) for c in fed.clients]
    seen = {}
    orig = m.local_loss

    def spy(fed_, client, x, y, step):
        seen.setdefault(client.name, copy.deepcopy(client.state["teacher"]))
        return orig(fed_, client, x, y, step)

    m.local_loss = spy
    m.local_update(fed.ctx)
    for c, b, a in zip(fed.clients, before, after):
        t = seen[c.name]
        assert same_state(t, b if teacher == "previous" else a)
        assert not same_state(t, a if teacher == "previous" else b)
        assert same_state(c.state["prev"], c.model)  # next round's theta^{e-1}


def test_ewc_anchor_and_fisher(tiny_data):
    fed = small_federation(tiny_data, HETERO)
    m = create_method("fccl_plus", {"local_distill": "ewc"})
    fed.setup(m)
    c = fed.clients[0]
    anchor, fisher = c.state["ewc"]
    assert all(torch.equal(a, p) for a, p in zip(anchor, c.model.parameters()))
    assert all((f >= 0).all() for f in fisher) and any((f > 0).any() for f in fisher)
    x, y = c.data.get("private")
    x, y = normalize(x[:32]), y[:32]
    m._mode = "ewc"
    c.model.eval()  # same BatchNorm statistics in both evaluations
    assert float(m.local_loss(fed.ctx, c, x, y, 0).detach()) == pytest.approx(float(F.cross_entropy(c.model(x), y).detach()), rel=1e-6)


# ------------------------------------------------------------------ homogeneous mode


def _identical(fed) -> bool:
    return all(same_state(fed.clients[0].model, c.model) for c in fed.clients[1:])


@pytest.mark.parametrize("method,setting,order", [
    ("fccl_plus", "auto", ["average", "local"]),  # FCCL+ averages before local updating
    ("fccl", "auto", ["average", "local"]),  # FCCL: before local updating, as the printed rows (docs/fccl.md)
    ("fccl", "after_local", ["local", "average"]),  # the authors' fccl+/models/fccl.py position
    ("feddf", "auto", ["average", "local"]),
    ("fccl_plus", "after_local", ["local", "average"]),
    ("fccl", "before_local", ["average", "local"]),
    ("fccl_plus", "none", ["local"]),
])
def test_homogeneous_averaging_position(tiny_data, method, setting, order):
    fed = small_federation(tiny_data, HOMO)
    m = create_method(method, {"homogeneous_averaging": setting, "init": "base"})
    start = [copy.deepcopy(c.model) for c in fed.clients]
    fed.setup(m)
    assert _identical(fed) == (setting != "none")  # averaging runs start from participant 0's weights
    if method == "fccl":  # the teachers are each participant's own start (taken before the sync)
        assert all(same_state(c.state["pretrained"], s) for c, s in zip(fed.clients, start))
    fed.run_round(1)  # local training makes the models differ again
    seen = []
    orig_local, orig_avg = m.local_update, m.average
    m.local_update = lambda ctx: seen.append(("local", _identical(fed))) or orig_local(ctx)
    m.average = lambda ctx: seen.append(("average", _identical(fed))) or orig_avg(ctx)
    fed.run_round(2)
    assert [name for name, _ in seen] == order
    if order[0] == "average":  # before local updating: averaged after the collaborative step
        assert not seen[0][1] and seen[1][1] and not _identical(fed)
    elif len(order) == 2:  # after local updating: the round ends with one model
        assert _identical(fed)
    else:
        assert not _identical(fed)


def test_averaging_needs_a_homogeneous_federation(tiny_data):
    fed = small_federation(tiny_data, HETERO)
    m = create_method("fccl_plus")  # auto: nothing to average on heterogeneous participants
    fed.setup(m)
    assert m.averaging is None
    for method in ("fccl_plus", "fccl", "feddf"):
        with pytest.raises(ConfigError, match="homogeneous_averaging"):
            fed.setup(create_method(method, {"homogeneous_averaging": "before_local"}))


# ------------------------------------------------------------ optimisers and lr decay


def test_persistent_optimizer_follows_lr_decay(tiny_data):
    fed = small_federation(tiny_data, HETERO, rounds=10, lr_decay=True, public_lr=1e-3)
    m = create_method("fccl_plus", {"fresh_optimizer": False})
    fed.setup(m)
    c = fed.clients[0]
    fed.round = 1
    opt = m.public_optimizer(fed.ctx, c)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)
    fed.round = 6
    assert m.public_optimizer(fed.ctx, c) is opt
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 0.9 * 5 / 10))
    assert fed.make_optimizer(c.model, "local").param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 0.9 * 5 / 10))


def test_fresh_optimizer_equals_a_new_adam(tiny_data):
    """Clearing the state each batch gives exactly the steps of a new Adam per batch."""
    fed = small_federation(tiny_data, ("lenet",))
    m = create_method("fccl_plus")
    fed.setup(m)
    model = fed.clients[0].model
    twin = copy.deepcopy(model)
    x = normalize(fed.data.public[:32])
    for _ in range(3):
        opt = m.public_optimizer(fed.ctx, fed.clients[0])
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        new = torch.optim.Adam(twin.parameters(), lr=fed.cfg.public_lr)
        new.zero_grad()
        twin(x).pow(2).mean().backward()
        new.step()
    assert torch.allclose(flat(model), flat(twin), atol=1e-7)


# ------------------------------------------------------------------------- FedDF


def test_feddf_target_is_the_mean_of_softened_predictions(tiny_data):
    z = [torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([[0.0, 2.0, 0.0]]), torch.tensor([[3.0, 3.0, 0.0]])]
    T = 2.0
    expect = sum(torch.exp(v / T) / torch.exp(v / T).sum() for v in z) / 3
    assert torch.allclose(ensemble_target(z, T), expect)
    mean_logits = torch.tensor([[4.0 / 3, 5.0 / 3, -1.0 / 3]])
    assert torch.allclose(ensemble_target(z, T, "logits"), F.softmax(mean_logits / T, dim=1))
    # in the collaborative step: one public batch, loss = T² KL(mean softmax(z_j/T) || softmax(z_i/T))
    fed = small_federation(tiny_data, HETERO, public_batch=128)
    m = create_method("feddf", {"tau": T})
    fed.setup(m)
    fed.public_gen.manual_seed(3)
    x = next(fed.public_batches())
    zs = [c.model(x) for c in fed.clients]
    target = sum(F.softmax(v.detach() / T, dim=1) for v in zs) / 2
    expect = [float(soft_target_loss(v, target, T).detach()) for v in zs]
    fed.public_gen.manual_seed(3)
    got = m.collaborate(fed.ctx)
    for c, e in zip(fed.clients, expect):
        assert got[f"{c.name}/train/distill_loss"] == pytest.approx(e, rel=1e-4)


# ------------------------------------------------------- cross-correlation artifacts


def test_cross_correlation_artifacts(tiny_data, tmp_path):
    fed = small_federation(tiny_data, HETERO, rounds=2)
    m = create_method("fccl_plus", {"corr_every": 2, "corr_samples": 64})
    fed.setup(m)
    fed.round = 1
    m.after_round(fed.ctx)  # not a multiple of 2 and not the last round
    assert not m._corr
    fed.round = 2
    m.after_round(fed.ctx)
    m.artifacts(tmp_path)
    npz = np.load(tmp_path / "cross_correlation.npz")
    assert list(npz["rounds"]) == [2] and list(npz["participants"]) == ["m0", "m20"]
    assert npz["public"].shape == (1, 2, 10, 10) and npz["private"].shape == (1, 2, 10, 10)
    assert np.abs(npz["public"]).max() <= 1.0 + 1e-5
    png = (tmp_path / "cross_correlation.png").read_bytes()
    assert png[:4] == b"\x89PNG"
    empty = tmp_path / "none"
    empty.mkdir()
    m2 = create_method("fccl_plus", {"corr_every": 0})  # off: no artifact
    fed.setup(m2)
    m2.after_round(fed.ctx)
    m2.artifacts(empty)
    assert not list(empty.iterdir())


# ---------------------------------------------------------------- ablation grids


ABLATIONS = sorted((REPO / "params/ablations").glob("*.yaml"))


@pytest.mark.parametrize("path", ABLATIONS, ids=lambda p: p.stem)
def test_ablation_grid_resolves(path):
    from fedshift.experiments import load_experiments, load_yaml

    plan = load_experiments(path, REPO / "params/data.yaml")
    labels = {j.method for j in plan.federate}
    cfg = load_yaml(path)
    assert cfg["report"]["tables"], "every ablation grid names its table(s)"
    for table in cfg["report"]["tables"]:
        assert set(table["methods"]) <= labels, f"{table['name']}: methods not in the grid"
    for name in cfg.get("variants", {}):
        assert name in labels, f"variant {name} is defined but never run"


def test_a_variant_name_means_the_same_in_every_grid():
    from fedshift.experiments import load_yaml

    seen = {}
    for path in ABLATIONS:
        for name, spec in (load_yaml(path).get("variants") or {}).items():
            assert seen.setdefault(name, spec) == spec, f"{path.name}: variant {name} differs from another grid's"


def test_ablation_grids_share_the_main_engine():
    """Same engine/pretrain as params/experiments.yaml: base and fccl_plus runs are reused, never re-run."""
    from fedshift.experiments import load_yaml

    main = load_yaml(REPO / "params/experiments.yaml")
    for path in ABLATIONS:
        cfg = load_yaml(path)
        assert cfg["engine"] == main["engine"] and cfg["pretrain"] == main["pretrain"], path.name


def test_ablation_grids_exist():
    names = {p.stem for p in ABLATIONS}
    assert {"table_x", "table_xi", "table_xiv", "table_xvi", "table_xvii", "table_xix", "fig9", "fig10"} <= names
