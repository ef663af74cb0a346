"""FedFusion: the three fusion operators (shapes, formulas, gradients), the wrapped model, the
server-side EMA of lambda, and resumption from state_dict()."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedshift.losses import ema
from fedshift.methods import create_method
from fedshift.methods.fedfusion import FusedModel, Fusion, fuse_conv, fuse_weighted
from fedshift.models import create_model

from fedshift.testing import synthetic_federation

torch.set_num_threads(1)


@pytest.mark.parametrize("op", ["conv", "multi", "single"])
def test_operator_shapes_and_gradients(op):
    g = torch.Generator().manual_seed(0)
    fusion = Fusion(op, 6).double()
    with torch.no_grad():  # away from the symmetric start, so every gradient is generic
        for p in fusion.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    local = torch.randn(3, 6, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    glob = torch.randn(3, 6, 4, 5, generator=g, dtype=torch.float64)
    out = fusion(local, glob)
    assert out.shape == local.shape
    (out ** 2).sum().backward()
    assert local.grad is not None and local.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in fusion.parameters())
    torch.autograd.gradcheck(lambda a, b: fusion(a, b), (local.detach().requires_grad_(), glob.requires_grad_()))


def test_operator_formulas():
    g = torch.Generator().manual_seed(1)
    local, glob = torch.randn(2, 3, 2, 2, generator=g), torch.randn(2, 3, 2, 2, generator=g)
    w = torch.randn(3, 6, 1, 1, generator=g)
    # Eq. 6: out[b, o] = sum_i W[o, i] * concat(global, local)[b, i]
    cat = torch.cat([glob, local], 1)
    expected = torch.einsum("oi,bihw->bohw", w[:, :, 0, 0], cat)
    torch.testing.assert_close(fuse_conv(local, glob, w), expected)
    lam = torch.tensor([0.0, 0.25, 1.0])  # Eq. 7, per channel
    out = fuse_weighted(local, glob, lam)
    torch.testing.assert_close(out[:, 0], local[:, 0])
    torch.testing.assert_close(out[:, 1], 0.25 * glob[:, 1] + 0.75 * local[:, 1])
    torch.testing.assert_close(out[:, 2], glob[:, 2])
    torch.testing.assert_close(fuse_weighted(local, glob, torch.tensor(0.3)), 0.3 * glob + 0.7 * local)  # Eq. 8
    assert Fusion("multi", 3).lam.shape == (3,) and Fusion("single", 3).lam.shape == ()
    with pytest.raises(ValueError, match="valid"):
        Fusion("sum", 3)


@pytest.mark.parametrize("op", ["conv", "multi", "single"])
def test_fused_model_starts_as_the_plain_model(op):
    base = create_model("lenet", num_classes=10, in_channels=1)
    x = torch.randn(4, 1, 28, 28)
    fused = FusedModel(base, op, 16)
    torch.testing.assert_close(fused(x), base(x))  # F(E(x), E(x)) = E(x) at the start
    assert {k for k in fused.state_dict() if k.startswith("fusion.")} == ({"fusion.weight"} if op == "conv"
                                                                           else {"fusion.lam"})


def test_ema():
    assert ema(torch.tensor(1.0), torch.tensor(0.0), 0.9).item() == pytest.approx(0.9)
    prev, new = torch.tensor([0.5, 0.2]), torch.tensor([0.1, 1.0])
    torch.testing.assert_close(ema(prev, new, 0.75), 0.75 * prev + 0.25 * new)


@pytest.mark.parametrize("op", ["multi", "single"])
def test_server_smooths_lambda_with_ema(op):
    fed = synthetic_federation(4, clients_per_round=2)
    m = create_method(f"fedfusion_{op}", {"ema_decay": 0.8})
    fed.setup(m)
    g = {k: v.clone() for k, v in fed.clients[0].model.state_dict().items()}
    avg = {k: v + 1.0 if v.is_floating_point() else v for k, v in g.items()}
    new = m.aggregate(fed.ctx, dict(avg), g)
    torch.testing.assert_close(new["fusion.lam"], 0.8 * g["fusion.lam"] + 0.2 * avg["fusion.lam"])
    torch.testing.assert_close(new["base.head.weight"], avg["base.head.weight"])  # the rest: plain average
    conv = create_method("fedfusion_conv")
    conv_fed = synthetic_federation(4, clients_per_round=2)
    conv_fed.setup(conv)
    g = conv_fed.clients[0].model.state_dict()
    avg = {k: v + 1.0 for k, v in g.items()}
    assert torch.equal(conv.aggregate(conv_fed, dict(avg), g)["fusion.weight"], avg["fusion.weight"])  # no EMA


@pytest.mark.parametrize("op", ["conv", "multi", "single"])
def test_local_loss_fuses_with_frozen_global_extractor(op):
    fed = synthetic_federation(3)
    m = create_method(f"fedfusion_{op}")
    fed.setup(m)
    c = fed.clients[0]
    assert isinstance(c.model, FusedModel) and all(cl.model is c.model for cl in fed.clients)
    g_state = {k: v.clone() for k, v in c.model.state_dict().items()}
    m.begin_round(fed.ctx, g_state)
    with torch.no_grad():
        for p in c.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x, y = next(fed.private_batches(c))
    loss = m.local_loss(fed.ctx, c, x, y, 0)
    with torch.no_grad():
        glob_map = m.global_net.base.feature_map(x)
        ref_global = create_model("lenet", num_classes=10, in_channels=1)
        ref_global.load_state_dict({k[5:]: v for k, v in g_state.items() if k.startswith("base.")})
        torch.testing.assert_close(glob_map, ref_global.feature_map(x))
    fused = c.model.fusion(c.model.base.feature_map(x), glob_map)
    expected = F.cross_entropy(c.model.classifier(c.model.pool(fused)), y)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(p.grad is None for p in m.global_net.parameters())
    assert all(p.grad is not None for p in c.model.fusion.parameters())


@pytest.mark.parametrize("op", ["conv", "multi"])
def test_state_dict_round_trip_resumes_identically(op):
    def fresh():
        fed = synthetic_federation(6, clients_per_round=2)
        meth = create_method(f"fedfusion_{op}")
        fed.setup(meth)
        return fed, meth

    fed, m = fresh()
    fed.round = 1
    fed.run_round(1)
    weights = {k: v.clone() for k, v in fed.clients[0].model.state_dict().items()}
    gens = [c.generator.get_state() for c in fed.clients]
    sample_state, state = fed.sample_gen.get_state(), m.state_dict()
    assert state == {}
    fed2, m2 = fresh()
    m2.load_state_dict(state)
    fed2.clients[0].model.load_state_dict(weights)
    for c, s in zip(fed2.clients, gens):
        c.generator.set_state(s)
    fed2.sample_gen.set_state(sample_state)
    for f, meth in ((fed, m), (fed2, m2)):
        f.round = 2
        f.run_round(2)
    for k, v in fed.clients[0].model.state_dict().items():
        assert torch.equal(v, fed2.clients[0].model.state_dict()[k]), k
    assert not torch.equal(weights["base.head.weight"], fed.clients[0].model.state_dict()["base.head.weight"])
