"""Method behaviour: aggregation by hand, collaborative targets, switches, and a smoke
run of every registered method (2 participants, 1 round, LeNet, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from fedshift.losses import fccm_loss, fisl_loss, instance_similarity
from fedshift.methods import METHODS, create_method
from fedshift.engine.averaging import weighted_average

from fedshift.testing import tiny_federation


def test_weighted_average_by_hand():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(7)}
    avg = weighted_average([a, b], [1, 3])  # (1*[1,2] + 3*[3,6]) / 4
    assert torch.allclose(avg["w"], torch.tensor([2.5, 5.0]))
    assert avg["n"].item() == 3  # integer buffers come from the first state


def test_fedavg_round_equals_weighted_mean_of_local_models(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"))
    m = create_method("fedavg")
    fed.setup(m)
    s0 = fed.clients[0].model.state_dict()
    assert all(torch.equal(s0[k], fed.clients[1].model.state_dict()[k]) for k in s0)  # one global start
    m.local_update(fed.ctx)
    locals_ = [copy.deepcopy(c.model.state_dict()) for c in fed.clients]
    n = [c.num_private for c in fed.clients]
    delivery = m.server_step(fed.ctx, {c.name: s0 for c in fed.clients}, {c.name: loc for c, loc in zip(fed.clients, locals_)})
    assert set(delivery) == {c.name for c in fed.clients}  # the average, for every participant
    for key, val in delivery[fed.clients[1].name].items():
        if torch.is_floating_point(val):
            expect = (locals_[0][key].double() * n[0] + locals_[1][key].double() * n[1]) / sum(n)
            assert torch.allclose(val.double(), expect, atol=1e-6), key


def test_fedmd_digest_moves_toward_consensus(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "simple_cnn"))
    m = create_method("fedmd", {"public_subset": 128, "digest_epochs": 3})
    from fedshift.data.loading import normalize

    x = normalize(fed.data.public[:128])

    def gap():
        with torch.no_grad():
            for c in fed.clients:
                c.model.eval()
            z = [c.model(x) for c in fed.clients]
            for c in fed.clients:
                c.model.train()
        return (z[0] - z[1]).abs().mean().item()

    before = gap()
    torch.manual_seed(0)
    fed.public_gen.manual_seed(0)
    m.collaborate(fed.ctx)
    assert gap() < before


def test_fccl_plus_collaborative_loss_matches_formula(tiny_data):
    """The logged loss of a one-batch collaborative step equals FCCM + omega*FISL computed
    from the same pre-update outputs with the target = mean over ALL participants."""
    fed = tiny_federation(tiny_data, ("lenet", "simple_cnn"), public_batch=256, public_aug="none")
    m = create_method("fccl_plus", {"omega": 2.0})
    fed.setup(m)
    x = next(fed.public_batches(aug="none"))
    fed.public_gen.manual_seed(123)
    x = next(fed.public_batches(aug="none"))
    outs = [c.model.forward_with_features(x) for c in fed.clients]
    zbar = torch.stack([z.detach() for _, z in outs]).mean(0)
    sbar = torch.stack([instance_similarity(h.detach(), 0.02) for h, _ in outs]).mean(0)
    expect = [float((fccm_loss(z, zbar, 0.0051) + 2.0 * fisl_loss(instance_similarity(h, 0.02), sbar)).detach())
              for h, z in outs]
    fed.public_gen.manual_seed(123)
    got = m.collaborate(fed.ctx)
    assert got["m0/train/colla_loss"] == pytest.approx(expect[0], rel=1e-4)
    assert got["m20/train/colla_loss"] == pytest.approx(expect[1], rel=1e-4)


def test_fccl_plus_teacher_is_model_before_collaboration(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"), public_aug="none")
    m = create_method("fccl_plus")
    fed.setup(m)
    before = copy.deepcopy(fed.clients[0].model.state_dict())
    m.collaborate(fed.ctx)
    teacher = fed.clients[0].state["teacher"].state_dict()
    assert all(torch.equal(before[k], teacher[k]) for k in before)
    assert any(not torch.equal(before[k], fed.clients[0].model.state_dict()[k]) for k in before)


@pytest.mark.parametrize("switch", [{"fccm": False}, {"fisl": False}, {"fntd": False}, {"fresh_optimizer": False}])
def test_fccl_plus_switches_change_the_result(tiny_data, switch):
    def run(params):
        torch.manual_seed(0)
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), public_aug="none")
        m = create_method("fccl_plus", params)
        fed.setup(m)
        fed.run_round(1)
        return torch.cat([p.detach().flatten() for p in fed.clients[0].model.parameters()])

    assert not torch.allclose(run({}), run(switch))


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_runs_one_round(tiny_data, name):
    cls = METHODS.get(name)
    fed = tiny_federation(tiny_data, ("lenet", "lenet"), public_aug="none")
    m = create_method(name)
    fed.setup(m)
    before = torch.cat([p.detach().flatten().clone() for p in fed.clients[0].model.parameters()])
    metrics = fed.run_round(1)
    after = torch.cat([p.detach().flatten() for p in fed.clients[0].model.parameters()])
    assert not torch.equal(before, after)
    assert all(v == v for v in metrics.values())  # no NaN losses
    rows = fed.evaluate()
    assert len(rows) == 2 * 2 and all(0 <= r["top1"] <= r["top5"] <= 1 for r in rows)


def test_unknown_method_and_key():
    from fedshift.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown method 'fccl_plsu'.*fccl_plus"):
        create_method("fccl_plsu")
    with pytest.raises(ConfigError, match=r"methods.fccl_plus.omgea: unknown key.*omega"):
        create_method("fccl_plus", {"omgea": 1})
    with pytest.raises(ConfigError, match=r"methods.fccl_plus.omega: expected float"):
        create_method("fccl_plus", {"omega": "3"})


def test_scenario_defaults_apply_before_overrides():
    assert create_method("fccl_plus", scenario="office_home").p.omega == 1.0
    assert create_method("fccl_plus", {"omega": 5.0}, scenario="office_home").p.omega == 5.0
    assert create_method("fccl_plus", scenario="digits").p.omega == 3.0


def test_channels_last_engine_gives_the_same_gradients(tiny_data):
    """NHWC weights change the kernels' summation order only: equal gradients up to float
    rounding (a whole Adam round amplifies such rounding, so one step is compared)."""
    def grads(cl):
        fed = tiny_federation(tiny_data, ("lenet", "lenet"), public_aug="none", channels_last=cl)
        model = fed.clients[0].model
        conv = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)][-1]  # C_in > 1
        assert conv.weight.is_contiguous(memory_format=torch.channels_last) == cl
        x, y = fed.clients[0].data.get("private")
        from fedshift.data.loading import normalize

        torch.nn.functional.cross_entropy(model(normalize(x[:64])), y[:64]).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    assert torch.allclose(grads(False), grads(True), rtol=1e-4, atol=1e-6)
