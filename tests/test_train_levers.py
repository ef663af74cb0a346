"""Training levers of issue 40: bf16 autocast of the training forwards (``engine.bf16_train``) and
activation checkpointing only above a memory budget (``engine.recompute_budget_mb``).

bf16 error bound used below: bf16 keeps 8 significand bits, so rounding an operand costs a relative
error of at most u = 2**-8 (round to nearest: 2**-9; we take the looser). A conv / linear layer run in
bf16 rounds its input and its weight, with float32 accumulation: relative error <= 2u times the
layer's cancellation factor kappa = ||W|| ||x|| / ||W x||. Over L such layers the first-order bound is
L * 2u * kappa; we allow kappa <= 4 (random weights, ReLU networks), so ``4 * L * 2u``.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
import torch.nn.functional as F

from fedshift.engine import cpu
from fedshift.engine.config import EngineConfig
from fedshift.errors import ConfigError
from fedshift.models import create_model
from helpers import saved_bytes

U = 2.0 ** -8


def bf16_layers(model) -> int:
    """Conv / linear layers of the feature extractor (the part run under bf16 autocast)."""
    head = set(model.head.modules()) if hasattr(model, "head") else set()
    return sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) and m not in head for m in model.modules())


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("arch,shape", [("lenet", (1, 28, 28)), ("resnet10", (3, 32, 32)),
                                        ("fedavg_cnn_mnist", (1, 28, 28))])
def test_bf16_train_logits_and_gradients_within_the_bf16_bound(arch, shape):
    torch.manual_seed(0)
    plain = create_model(arch, num_classes=10, in_channels=shape[0])
    half = copy.deepcopy(plain)
    half.train_bf16 = True
    x, y = torch.randn(16, *shape), torch.randint(0, 10, (16,))
    bound = 4 * bf16_layers(plain) * 2 * U
    outs = {}
    for name, m in (("plain", plain), ("half", half)):
        m.train()
        torch.manual_seed(1)  # the same dropout masks for both
        h, z = m.forward_with_features(x)
        F.cross_entropy(z, y).backward()
        outs[name] = (h, z, [p.grad for p in m.parameters()])
    (hp, zp, gp), (hh, zh, gh) = outs["plain"], outs["half"]
    assert zh.dtype == hh.dtype == torch.float32  # heads and losses stay float32
    assert 0 < rel(zh, zp) <= bound, (rel(zh, zp), bound)  # > 0: bf16 really ran
    assert rel(hh, hp) <= bound
    # The whole gradient (every parameter, concatenated): the backward of a bf16 layer rounds once more,
    # so twice the bound. Per tensor there is no such bound: a small tensor summing terms of both signs
    # (a bias over a batch of 16) has an unbounded cancellation factor.
    flat_h, flat_p = torch.cat([g.flatten() for g in gh]), torch.cat([g.flatten() for g in gp])
    assert rel(flat_h, flat_p) <= 2 * bound, (rel(flat_h, flat_p), bound)
    # BatchNorm running statistics move as in float32, up to the same bound
    for (name, a), b in zip(half.named_buffers(), plain.buffers()):
        if a.dtype.is_floating_point:
            assert rel(a, b) <= bound or torch.equal(a, b), name


def test_bf16_train_same_values_with_and_without_graph_and_off_in_eval():
    """FCCL's one-graph step takes its targets from a no_grad pass and steps on a graph pass: both must
    give the same logits; evaluation (eval mode) is engine.bf16's business, not bf16_train's."""
    torch.manual_seed(0)
    m = create_model("resnet10", num_classes=10, in_channels=3)
    m.train_bf16 = True
    ref = copy.deepcopy(m)
    ref.train_bf16 = False
    x = torch.randn(8, 3, 32, 32)
    m.train()
    torch.manual_seed(1)
    with torch.no_grad():
        a = m(x)
    m.load_state_dict(ref.state_dict())  # undo the running-statistics update
    torch.manual_seed(1)
    b = m(x)
    assert torch.equal(a, b.detach())
    m.load_state_dict(ref.state_dict())
    m.eval(), ref.eval()
    with torch.no_grad():
        assert torch.equal(m(x), ref(x))


def test_bf16_train_resolution_per_kind_and_family(monkeypatch):
    """auto: on for the avx512_bf16 kind and the families measured to gain (KIND_LEVERS), off for
    EfficientNet (slower in bf16) and for families never measured; CUDA has engine.amp instead."""
    cpu_dev, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(cpu, "cpu_kind", lambda: "avx512_bf16")
    on = {a: cpu.train_bf16_on("auto", cpu_dev, a) for a in
          ("resnet10", "resnet12", "mobilenet_v2", "efficientnet_b0", "lenet", "fedavg_cnn_mnist", "shufflenet_v2")}
    assert on == {"resnet10": True, "resnet12": True, "mobilenet_v2": True, "efficientnet_b0": False,
                  "lenet": False, "fedavg_cnn_mnist": True, "shufflenet_v2": False}
    assert cpu.train_bf16_on("auto", cuda, "resnet10") is False
    assert cpu.train_bf16_on(True, cpu_dev, "efficientnet_b0") is True
    assert cpu.train_bf16_on(False, cpu_dev, "resnet10") is False
    monkeypatch.setattr(cpu, "cpu_kind", lambda: "avx2")
    assert cpu.train_bf16_on("auto", cpu_dev, "resnet10") is False
    monkeypatch.setattr(cpu, "bf16_supported", lambda device: False)
    with pytest.raises(ConfigError, match=r"engine.bf16_train: true, but cpu has no hardware bf16.*false or auto"):
        cpu.check_bf16_train(True, cpu_dev)
    cpu.check_bf16_train("auto", cpu_dev)  # auto turns itself off there
    with pytest.raises(ValueError, match="bf16_train must be true, false or auto"):
        EngineConfig(bf16_train="yes")
    with pytest.raises(ValueError, match="recompute_budget_mb must be >= 0"):
        EngineConfig(recompute_budget_mb=-1)


def test_recompute_only_above_the_budget_batch():
    assert cpu.recompute_batch(1024, 6.0, bf16=False) == 170  # 170 * 6 MB fits 1024 MB, 171 does not
    assert cpu.recompute_batch(1024, 6.0, bf16=True) == 341  # bf16 activations: half the bytes
    assert cpu.recompute_batch(0, 6.0, bf16=False) == 0  # budget 0: every batch
    torch.manual_seed(0)
    plain = create_model("mobilenet_v2", 10, 3)
    gated = copy.deepcopy(plain)
    gated.recompute, gated.recompute_batch = True, 4
    plain.train(), gated.train()
    for n, checkpointed in ((4, False), (5, True)):
        x, y = torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))
        assert gated.recomputes(n) is checkpointed
        a, b = (saved_bytes(lambda m=m: F.cross_entropy(m(x), y).backward())[0] for m in (plain, gated))
        assert (b < 0.5 * a) if checkpointed else (b == a), (n, a, b)


def test_federation_resolves_the_budget_per_participant(tiny_data):
    from fedshift.resources import arch_profile
    from fedshift.testing import tiny_federation

    fed = tiny_federation(tiny_data, ("resnet10", "lenet"), recompute_budget_mb=16, bf16_train=False)
    r, lenet = (c.model for c in fed.clients)
    per_sample = arch_profile("resnet10", (1, 28, 28), 10, "default", recompute=False)[1]  # the meta count
    assert r.recompute and r.recompute_batch == int(16 // per_sample)  # equals the live model's
    assert lenet.recompute_batch == sys.maxsize and not lenet.recomputes(10 ** 6)  # nothing to checkpoint
    fed = tiny_federation(tiny_data, ("resnet10", "lenet"), recompute=True, recompute_budget_mb=16)
    assert fed.clients[0].model.recompute_batch == 0  # true: every batch, whatever the budget
    fed = tiny_federation(tiny_data, ("resnet10", "efficientnet_b0"), bf16_train=True)
    assert [c.model.train_bf16 for c in fed.clients] == [True, True]
    fed = tiny_federation(tiny_data, ("resnet10", "efficientnet_b0"), bf16_train=False)
    assert [c.model.train_bf16 for c in fed.clients] == [False, False]
