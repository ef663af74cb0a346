"""FCCL+ Eq. 21-22 on a hand-made example; last-3-rounds headline."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from fedshift.engine.evaluation import correct_topk, evaluate_domains, intra_inter
from fedshift.engine.federation import summarise
from fedshift.runner import headline


class Lookup(nn.Module):
    """'Model' whose logits for an image are stored in its first pixel's row index."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table, dtype=torch.float32)

    def forward(self, x):
        idx = ((x[:, 0, 0, 0] + 1) / 2 * 255).round().long()  # undo normalize()
        return self.table[idx]


def imgs(ids):
    x = torch.zeros(len(ids), 1, 2, 2, dtype=torch.uint8)
    x[:, 0, 0, 0] = torch.tensor(ids, dtype=torch.uint8)
    return x


def test_topk_by_hand():
    # 3 classes; sample 0: order 2,1,0 ; sample 1: order 0,2,1
    model = Lookup([[0.1, 0.5, 0.9], [0.9, 0.1, 0.5]])
    hits = correct_topk(model, imgs([0, 1]), torch.tensor([1, 1]), ks=(1, 2, 5))
    assert hits[1].tolist() == [False, False]
    assert hits[2].tolist() == [True, False]
    assert hits[5].tolist() == [True, True]  # k capped at the number of classes


def test_eq21_eq22_by_hand():
    # Logits table: rows 0..5; predicted class = argmax.
    table = [[1, 0], [1, 0], [0, 1], [0, 1], [1, 0], [0, 1]]
    model = Lookup(table)
    tests = {
        "a": (imgs([0, 1, 2, 3]), torch.tensor([0, 0, 0, 0])),  # 2 of 4 right -> 0.5
        "b": (imgs([4, 5]), torch.tensor([0, 0])),  # 1 of 2 -> 0.5
        "c": (imgs([0, 2, 3, 5, 1]), torch.tensor([1, 1, 1, 1, 1])),  # 3 of 5 -> 0.6
    }
    acc = evaluate_domains(model, tests, ks=(1,))
    assert acc == {"a": {1: 0.5}, "b": {1: 0.5}, "c": {1: pytest.approx(0.6)}}
    m = intra_inter(acc, "a")
    assert m["intra/top1"] == 0.5
    # Eq. 22: mean of per-domain accuracies (not pooled: pooled would be 4/7).
    assert m["inter/top1"] == pytest.approx((0.5 + 0.6) / 2)


def test_summarise_averages_participants():
    rows = []
    for p, own, accs in (("p1", "a", {"a": 0.9, "b": 0.3, "c": 0.5}), ("p2", "b", {"a": 0.2, "b": 0.8, "c": 0.6})):
        for d, v in accs.items():
            rows.append({"participant": p, "domain": d, "kind": "intra" if d == own else "inter", "top1": v, "top5": 1.0})
    s = summarise(rows)
    assert s["p1/inter/top1"] == pytest.approx(0.4)
    assert s["p2/inter/top1"] == pytest.approx(0.4)
    assert s["avg/intra/top1"] == pytest.approx(0.85)
    assert s["avg/inter/top5"] == 1.0


def test_headline_is_mean_of_last_three():
    hist = [{"x": v} for v in (0.1, 0.2, 0.4, 0.6, 0.8)]
    assert headline(hist, 3)["x"] == pytest.approx(0.6)
    assert headline(hist[:2], 3)["x"] == pytest.approx(0.15)
