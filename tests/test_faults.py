"""Issue 51: nothing trained on data it did not ask for, no class predicted because nobody holds it, and
one line for every fault. Each test names its case id (docs/reliability.md) and failed on 3ff206b."""

from __future__ import annotations

import logging

import pytest
import torch

from fedshift.methods import create_method
from fedshift.testing import tiny_federation


def _without_class(fed, k):
    """Every participant's private split without class ``k`` (the test sets keep it)."""
    for c in fed.clients:
        x, y = c.data.splits["private"]
        keep = y != k
        c.data.splits["private"] = (x[keep], y[keep])
    return fed


# ----------------------------------------------------------------- R31: a class nobody holds
@pytest.mark.parametrize("name", ["fedproto", "fedtgp", "fpl"])
def test_a_class_nobody_holds_gets_no_prototype_and_a_warning(tiny_data, name, caplog):
    """R31: a class no participant holds has no global prototype: nearest-prototype scoring never predicts
    it (FedProto already, as HtFLlib's clientproto.py:87-95; FedTGP's server model made one for every class,
    servertgp.py:153-156, so its untrained prototype could be the nearest), it adds no prototype loss term,
    and one warning names the class (none was printed)."""
    from fedshift.data.loading import normalize

    fed = _without_class(tiny_federation(tiny_data, ("lenet",) * 4, public_aug="none"), 3)
    params = {"server_epochs": 2} if name == "fedtgp" else {}
    m = create_method(name, params)
    m.setup(fed)
    with caplog.at_level(logging.WARNING):
        for r in (1, 2):
            fed.round = r
            m.run_round(fed, r)
    msgs = [rec.getMessage() for rec in caplog.records if "class" in rec.getMessage() and name in rec.getMessage()]
    assert len(msgs) == 1 and "class 3 " in msgs[0] and "no participant" in msgs[0], caplog.text  # once, not per round
    assert m.present.tolist() == [c != 3 for c in range(10)]
    if name == "fpl":  # FPL scores with the classifier; its prototypes: no cluster and no unbiased row for class 3
        assert 3 not in m.owner.tolist() and not m.unbiased[3].any()
        return
    x, y = fed.clients[0].data.get("test")
    with torch.inference_mode():
        for c in fed.clients:
            out = c.model.eval()(normalize(x))
            c.model.train()
            assert torch.isneginf(out[:, 3]).all() and torch.isfinite(out[:, [k for k in range(10) if k != 3]]).all()
            assert (out.argmax(1) != 3).all()
