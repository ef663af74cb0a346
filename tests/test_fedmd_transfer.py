"""FedMD's transfer phase (FedMD Algorithm 1: labelled public data, then private data, before
round 1): it runs once, equals a hand-written training loop, learns the public labels, is refused
without labels, and a run interrupted after round 1 resumes bit-identically without repeating it."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from fedshift import runner
from fedshift.config import ConfigError
from fedshift.data.loading import normalize
from fedshift.engine import checkpoint
from fedshift.experiments import load_experiments
from fedshift.methods import create_method
from fedshift.methods.fedmd import FedMD

from fedshift.testing import tiny_federation
from helpers import client_params, reference_batches

TRANSFER = {"public_data": "seed", "public_subset": 64, "homogeneous_averaging": "none"}


def _fed_and_method(root, params, **engine):
    fed = tiny_federation(root, ("lenet", "lenet"), public_aug="none", local_batch=16, public_batch=16, **engine)
    m = create_method("fedmd", {**TRANSFER, **params})
    fed.method_name = "fedmd"
    fed.setup(m)
    return fed, m


def _hand_train(model, x, y, gen, epochs, batch, lr, wd):
    """Independent reference: Adam(lr, wd), per epoch a fresh permutation from ``gen``, batches of
    ``batch`` in that order (a last batch of one sample skipped), mean cross-entropy per batch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
    model.train()
    for xb, yb in reference_batches((x, y), gen, batch, epochs, normalize):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()


def test_transfer_equals_public_then_private_training_by_hand(tiny_data):
    fed, m = _fed_and_method(tiny_data, {"transfer_epochs": 2, "transfer_private_epochs": 1})
    x_pub = torch.cat([c.data.get("public")[0] for c in fed.clients])
    y_pub = torch.cat([c.data.get("public")[1] for c in fed.clients])
    assert len(set(y_pub.tolist())) > 1  # every participant's seed split, labels included
    refs = []
    for c in fed.clients:
        model, gen = copy.deepcopy(c.model), torch.Generator()
        gen.set_state(c.generator.get_state())
        _hand_train(model, x_pub, y_pub, gen, 2, 16, fed.cfg.public_lr, 0.0)  # FedMD's public optimiser
        x, y = c.data.get("private")
        _hand_train(model, x, y, gen, 1, 16, fed.cfg.lr, fed.cfg.weight_decay)  # a fresh local optimiser
        refs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    before = client_params(fed, 0).clone()
    metrics = m.transfer(fed.ctx)
    for i, ref in enumerate(refs):
        assert torch.equal(client_params(fed, i), ref), i  # same operations in the same order
    assert not torch.equal(client_params(fed, 0), before)
    assert set(metrics) == {f"{c.name}/train/transfer_{k}_loss" for c in fed.clients for k in ("public", "private")}


def test_transfer_learns_the_public_labels(tiny_data):
    """Public seed labels all set to class 3: the public phase alone moves predictions on the
    test images toward class 3 (the participants' private data never saw such a skew)."""
    fed, m = _fed_and_method(tiny_data, {"transfer_epochs": 5})
    for c in fed.clients:
        x, y = c.data.splits["public"]
        c.data.splits["public"] = (x, torch.full_like(y, 3))
    x_test = fed.clients[0].data.get("test")[0]

    def share_of_3():
        with torch.no_grad():
            fed.clients[0].model.eval()
            out = (fed.clients[0].model(normalize(x_test)).argmax(1) == 3).double().mean().item()
            fed.clients[0].model.train()
        return out

    before = share_of_3()
    m.transfer(fed.ctx)
    assert before < 0.5 and share_of_3() > 0.9, (before, share_of_3())


def test_transfer_runs_once_before_round_one(tiny_data, monkeypatch):
    calls, real = [], FedMD.transfer
    monkeypatch.setattr(FedMD, "transfer", lambda self, fed: calls.append(fed.round) or real(self, fed))
    fed, m = _fed_and_method(tiny_data, {"transfer_epochs": 1, "transfer_private_epochs": 1})
    for r in (1, 2, 3):
        fed.round = r
        out = fed.run_round(r)
        assert ("m0/train/transfer_public_loss" in out) == (r == 1)
    assert calls == [1] and m.state_dict() == {"transferred": True}
    # Off by default: no phase, no state (checkpoints of runs without it are unchanged).
    fed0, m0 = _fed_and_method(tiny_data, {})
    fed0.round = 1
    fed0.run_round(1)
    assert calls == [1] and m0.state_dict() == {}
    fed1, m1 = _fed_and_method(tiny_data, {"transfer_epochs": 1})
    fed1.round = 1
    fed1.run_round(1)
    assert not torch.equal(client_params(fed0, 0), client_params(fed1, 0))  # the phase changed round 1


def test_transfer_without_labels_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="transfer_epochs: 2 trains on labelled public data") as e:
        create_method("fedmd", {"transfer_epochs": 2})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=">= 0"):
        create_method("fedmd", {"public_data": "seed", "transfer_private_epochs": -1})


def test_resume_after_round_one_equals_straight_run(tiny_data, tmp_path, monkeypatch):
    exp = {"engine": {"rounds": 3, "eval_every": 1, "local_epochs": 1, "local_batch": 16, "public_batch": 16, "device": "cpu",
                      "checkpoint_min_s": 0, "threads": 1, "eval_batch": 512, "public_aug": "none"},
           "methods": {"fedmd": {**TRANSFER, "transfer_epochs": 2, "transfer_private_epochs": 1}},
           "grid": [{"scenarios": ["rotmnist"], "methods": ["fedmd"], "structures": ["homo_lenet"]}]}
    plan = load_experiments(exp, {"scenarios": {"rotmnist": {}}}, results=str(tmp_path / "r"), build=str(tiny_data))
    (cfg,) = plan.federate.values()
    ref, out = tmp_path / "ref", tmp_path / "out"
    runner.run_federate(cfg, ref)

    calls, real_round, real_transfer = [], FedMD.run_round, FedMD.transfer

    def stop_in_round_2(self, ctx):
        r = ctx.round
        if r == 2:
            raise KeyboardInterrupt
        return real_round(self, ctx)

    monkeypatch.setattr(FedMD, "run_round", stop_in_round_2)
    monkeypatch.setattr(FedMD, "transfer", lambda self, fed: calls.append(fed.round) or real_transfer(self, fed))
    with pytest.raises(KeyboardInterrupt):
        runner.run_federate(cfg, out)
    saved = torch.load(checkpoint.partial_dir(out) / checkpoint.CHECKPOINT, weights_only=True)
    assert saved["round"] == 1 and calls == [1]
    monkeypatch.setattr(FedMD, "run_round", real_round)
    runner.run_federate(cfg, out)
    assert calls == [1]  # the resumed run did not repeat the phase
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (ref, out))
    a.pop("timings"), b.pop("timings")
    assert a == b
    assert (ref / "rounds.csv").read_bytes() == (out / "rounds.csv").read_bytes()
    ma, mb = (torch.load(d / "models.pt", weights_only=True)["participants"] for d in (ref, out))
    for name in ma:
        sa, sb = ma[name]["state_dict"], mb[name]["state_dict"]
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
