"""Fidelity checks found by the audit: one local optimiser per round (not per epoch),
evaluation in eval mode (BatchNorm), the authors' weak public augmentation, the last
partial public batch switch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedshift.data.augment import augment
from fedshift.engine.evaluation import evaluate_domains
from fedshift.engine.federation import Federation
from fedshift.methods import create_method

from fedshift.testing import tiny_federation

METHODS = [("base", {}), ("fedavg", {}), ("fedmd", {"public_subset": 64}), ("feddf", {}),
           ("fccl", {"corr_every": 0}), ("fccl_plus", {"corr_every": 0})]


@pytest.mark.parametrize("name,params", METHODS, ids=[m for m, _ in METHODS])
def test_local_optimiser_lives_for_the_whole_round(tiny_data, monkeypatch, name, params):
    """With E local epochs, each participant's local optimiser takes E x batches steps: an optimiser
    re-created every epoch (Adam moments reset) would show E separate optimisers."""
    made = []
    real = Federation.make_optimizer

    def spy(self, model, phase="local", params=None):
        opt = real(self, model, phase, params)
        if phase == "local":
            made.append((model, opt))
        return opt

    monkeypatch.setattr(Federation, "make_optimizer", spy)
    archs = ("lenet", "lenet")
    fed = tiny_federation(tiny_data, archs, local_epochs=3, public_aug="none")
    m = create_method(name, params)
    fed.setup(m)
    fed.round = 1
    fed.run_round(1)
    per_epoch = {c.name: len(list(fed.private_batches(c))) for c in fed.clients}
    assert len(made) == len(fed.clients)  # one per participant and round
    for c, (model, opt) in zip(fed.clients, made):
        steps = {int(s["step"]) for s in opt.state.values()}
        assert steps == {3 * per_epoch[c.name]}, (c.name, steps)


def test_evaluation_runs_in_eval_mode_on_batchnorm_models(tiny_data):
    fed = tiny_federation(tiny_data, ("lenet", "lenet"), norm="batch")
    model = fed.clients[0].model
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    model.train()
    with torch.no_grad():  # non-trivial running statistics
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = fed.clients[0].data.get("test")
    acc = evaluate_domains(model, {"d": (x, y)}, (1,), batch=7)["d"][1]
    assert model.training  # mode restored
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # running stats untouched
    from fedshift.data.loading import normalize

    model.eval()
    with torch.no_grad():
        expect = (model(normalize(x)).argmax(1) == y).float().mean().item()
    assert acc == pytest.approx(expect)
    rows = fed.evaluate()  # the federation's evaluation goes through the same path
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert rows


def test_weak_code_is_random_crop_with_padding_and_flip():
    """Each output equals a 32x32 window of the black-padded input, mirrored or not (explicit loop)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 3, 32, 32) * 2 - 1
    y = augment(x, "weak_code", g)
    padded = F.pad(x, (4, 4, 4, 4), value=-1.0)
    flips = 0
    for i in range(len(x)):
        found = None
        for oy in range(9):
            for ox in range(9):
                win = padded[i, :, oy:oy + 32, ox:ox + 32]
                if torch.equal(y[i], win):
                    found = "plain"
                elif torch.equal(y[i], win.flip(-1)):
                    found = "flip"
        assert found, i
        flips += found == "flip"
    assert 0 < flips < len(x)
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(augment(x, "weak_code", g2), y)  # seeded


@pytest.mark.parametrize("drop_last,n,batch,expect", [(False, 10, 4, [4, 4, 2]), (True, 10, 4, [4, 4]),
                                                      (False, 9, 4, [4, 4])])
def test_public_drop_last_switch(tiny_data, drop_last, n, batch, expect):
    fed = tiny_federation(tiny_data, ("lenet",), public_batch=batch, public_drop_last=drop_last, public_aug="none")
    fed.data.public = fed.data.public[:n]
    assert [len(b) for b in fed.public_batches()] == expect  # a last batch of 1 is always dropped
