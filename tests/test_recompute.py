"""engine.recompute (activation checkpointing of the CNN blocks, FedModel.run_blocks): the same
outputs, gradients and BatchNorm statistics as plain training, for a fraction of the saved
activations; off under no_grad / eval and for deep copies' teachers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fedshift.models import create_model as build_model
from helpers import saved_bytes


def step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("arch", ["resnet10", "mobilenet_v2", "efficientnet_b0", "shufflenet_v2", "googlenet"])
def test_recompute_same_gradients_and_bn_stats_less_saved_memory(arch):
    torch.manual_seed(0)
    plain = build_model(arch, num_classes=10, in_channels=3)
    re = copy.deepcopy(plain)
    re.recompute = True
    plain.train(), re.train()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    torch.manual_seed(1)
    saved_plain, loss_plain = saved_bytes(lambda: step(plain, x, y))
    torch.manual_seed(1)
    saved_re, loss_re = saved_bytes(lambda: step(re, x, y))
    assert torch.equal(loss_plain, loss_re)
    for (name, p), q in zip(plain.named_parameters(), re.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), name
    for (name, b), c in zip(plain.named_buffers(), re.buffers()):
        assert torch.equal(b, c), name  # running stats updated once, not twice
    assert saved_re < 0.5 * saved_plain, (saved_re, saved_plain)


def test_recompute_is_inert_without_autograd_or_in_eval():
    torch.manual_seed(0)
    model = build_model("mobilenet_v2", num_classes=10, in_channels=3)
    model.recompute = True
    x = torch.randn(4, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        a = model(x)
    model.recompute = False
    with torch.no_grad():
        b = model(x)
    assert torch.equal(a, b)


def test_engine_recompute_reaches_the_participants(tiny_data):
    from fedshift.testing import tiny_federation

    fed = tiny_federation(tiny_data, ("resnet10", "lenet"), seed=0, rounds=1, recompute=True)
    assert [c.model.recompute for c in fed.clients] == [True, True]
    teacher = copy.deepcopy(fed.clients[0].model)  # a frozen copy keeps its own (plain) forward
    teacher.recompute = False
    assert fed.clients[0].model.recompute is True


def test_recompute_auto_is_on_for_cpu_only(tiny_data):
    """engine.recompute: auto (the default) checkpoints on CPU, where a round is memory-bound, and
    not on CUDA, where recomputing only adds kernels; true / false are taken as given."""
    from fedshift.config import resolve
    from fedshift.engine.config import EngineConfig, recompute_on
    from fedshift.testing import tiny_federation

    assert resolve(EngineConfig, {}, "engine").recompute == "auto"
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert (recompute_on("auto", cpu), recompute_on("auto", cuda)) == (True, False)
    assert (recompute_on(True, cuda), recompute_on(False, cpu)) == (True, False)
    fed = tiny_federation(tiny_data, ("resnet10", "lenet"), seed=0, rounds=1)
    assert [c.model.recompute for c in fed.clients] == [True, True]
    fed = tiny_federation(tiny_data, ("resnet10", "lenet"), seed=0, rounds=1, recompute=False)
    assert [c.model.recompute for c in fed.clients] == [False, False]
    with pytest.raises(Exception, match="engine.recompute: expected bool \\| 'auto'"):
        resolve(EngineConfig, {"recompute": "yes"}, "engine")
