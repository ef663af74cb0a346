"""The FCCL+ structures train the authors' variants: same FLOPs and parameters as theirs.

Reference figures (data) were measured on the FCCL+ authors' published backbones
(``backbone/efficientnet.py``, ``backbone/mobilnet_v2.py``, ``backbone/ResNet.py``),
10 classes, one 3x32x32 image, with torch.utils.flop_counter (2 FLOPs per multiply-add,
convolutions and matrix products). Their parameter totals include modules their forward
never calls: a projection head ``encoder`` (Linear(d, d) + ReLU + Linear(d, 512)) on
every backbone, and, in EfficientNet, the 1x1 expansion conv + BN of the first block
(expansion 1). The test adds those back to fedshift's counts, so a change of width,
depth or stride in fedshift's variants shows up here.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fedshift.models import create_model, get_structure

# name: (authors' total parameters, unused parameters in their total, authors' forward GFLOPs)
AUTHORS = {
    # encoder 320*320+320 + 320*512+512 = 267,072; first block's unused 1x1 conv 32*32 + BN 64 = 1,088
    "efficientnet_b0": (3_866_758, 267_072 + 1_088, 0.06071),
    # encoder 1280*1280+1280 + 1280*512+512 = 2,295,552
    "mobilenet_v2": (4_592_474, 2_295_552, 0.18232),
    # encoder 512*512+512 + 512*512+512 = 525,312
    "resnet10": (5_428_554, 525_312, 0.50686),
    "resnet12": (5_502_538, 525_312, 0.65786),
}
TOL = 0.01  # the bound: within 1 %


def gflops(model: torch.nn.Module) -> float:
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 32, 32))
    return counter.get_total_flops() / 1e9


@pytest.mark.parametrize("name", sorted(AUTHORS))
def test_matches_authors_variant(name):
    total, unused, ref_gflops = AUTHORS[name]
    model = create_model(name, num_classes=10, in_channels=3)
    params = sum(p.numel() for p in model.parameters())
    assert abs(params + unused - total) <= TOL * total
    assert params == total - unused  # in fact exact: the same layers
    assert gflops(model) == pytest.approx(ref_gflops, rel=TOL)


def test_efficientnet_s1_is_the_costlier_variant():
    """The kept stride-1 variant: same parameters, about 3.6x the authors' FLOPs."""
    a, b = create_model("efficientnet_b0"), create_model("efficientnet_b0_s1")
    assert sum(p.numel() for p in a.parameters()) == sum(p.numel() for p in b.parameters())
    assert gflops(b) > 3 * gflops(a)


def test_fcclplus_structures_use_the_authors_variants():
    for s in ("fcclplus_digits", "fcclplus_digits_alt1", "fcclplus_digits_alt2"):
        archs = get_structure(s).assign(4)
        assert "efficientnet_b0" in archs and "efficientnet_b0_s1" not in archs


def test_authors_efficientnet_has_no_stochastic_depth():
    """Their schedule never leaves 0: two train-mode passes agree once dropout is off."""
    torch.manual_seed(0)
    m = create_model("efficientnet_b0", num_classes=10).train()
    m.head[0].p = 0.0
    for mod in m.modules():  # BatchNorm: use batch statistics without touching running ones
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = 0.0
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(m(x), m(x))
