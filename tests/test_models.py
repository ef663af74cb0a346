"""Smoke and reference tests for every registered model (fedshift.models).

Parametrised over the registry: a newly registered model gets the shape, backward,
seeding, norm-variant and channels-last tests with no new test code; only its
reference parameter count (REFERENCE_PARAMS, data) has to be added.
All on CPU at batch 2, so the whole file runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from fedshift.errors import ConfigError
from fedshift.models import MODELS, FedModel, create_model

NAMES = MODELS.names()
BATCH = 2
NUM_CLASSES = 7  # not 10, so a hard-coded class count shows up as a shape error

# Reference parameter counts, 10 classes, default norm of each model.
# name: (in_channels, count, how the count was derived).
# Derived independently of fedshift's code: from torchvision's ImageNet models
# (counts printed by torchvision 0.28) or the papers, adjusting by hand for the CIFAR
# stems, the 10-class classifier and the variant's differences; every derivation is
# exact, so the tolerance is 0 (a single missing norm layer would be a few hundred
# parameters out of millions and must not pass).
REL_TOL = 0.0
TV_RESNET_ADJ = "- 7x7 stem 9,408 + 3x3 stem 1,728"  # conv 7*7*3*64 -> 3*3*3*64, no bias either way
REFERENCE_PARAMS = {
    "resnet18": (3, 11_173_962, f"torchvision resnet18 11,689,512 - fc 513,000 + fc 5,130 {TV_RESNET_ADJ}"),
    "resnet34": (3, 21_282_122, f"torchvision resnet34 21,797,672 - fc 513,000 + fc 5,130 {TV_RESNET_ADJ}"),
    "resnet50": (3, 23_520_842, f"torchvision resnet50 25,557,032 - fc 2,049,000 + fc 20,490 {TV_RESNET_ADJ}"),
    # A BasicBlock of p planes without projection: two 3x3 convs 18p^2 + two BNs 4p;
    # resnet18 minus one such block per stage (p = 64, 128, 256, 512): 6,270,720.
    "resnet10": (3, 4_903_242, "resnet18 11,173,962 - blocks 73,984 + 295,424 + 1,180,672 + 4,720,640"),
    "resnet12": (3, 4_977_226, "resnet10 4,903,242 + one 64-plane block 73,984"),
    # kuangliu-style MobileNetV2 = torchvision's + the expansion-1 block's 1x1 conv
    # (32*32 + BN 64) + 1x1 projection shortcuts (+BN) on stride-1 width changes
    # 32->16, 16->24, 64->96, 160->320: 544 + 432 + 6,336 + 51,840.
    "mobilenet_v2": (3, 2_296_922, "torchvision mobilenet_v2 3,504,872 - fc 1,281,000 + 12,810 + 1,088 + 59,152"),
    # CIFAR B0 = torchvision's B0 without the 1x1 conv 320->1280 (+BN): 412,160.
    "efficientnet_b0": (3, 3_598_598, "torchvision efficientnet_b0 5,288,548 - head 412,160 - fc 1,281,000 + 3,210"),
    "efficientnet_b0_s1": (3, 3_598_598, "efficientnet_b0 with one stride changed: same parameters"),
    # Same units and widths as torchvision's x1.0; only the stem stride and max-pool differ.
    "shufflenet_v2": (3, 1_263_854, "torchvision shufflenet_v2_x1_0 2,278,604 - fc 1,025,000 + 10,250"),
    # torchvision googlenet (no aux heads) 6,624,904; - its stem (convs 9,408 + 4,096 +
    # 110,592, BNs 128 + 128 + 384 = 124,736) + 3x3 stem to 192 (5,184 + BN 384);
    # - fc 1,025,000 + 10,250; + the second 3x3 conv of each "5x5" branch
    # (9c^2 + BN 2c for c = 32, 96, 48, 64, 64, 64, 128, 128, 128: 667,360).
    # (kuangliu's count 6,166,250 also has the 7,904 conv biases we drop before BN.)
    "googlenet": (3, 6_158_346, "torchvision googlenet 6,624,904 - 124,736 + 5,568 - 1,025,000 + 10,250 + 667,360"),
    # torchvision vgg11_bn 132,868,840 - classifier 123,642,856 = convs+BN 9,225,984;
    # - the 2,752 conv biases (cancelled by BN) + Linear(512, 10) 5,130.
    "vgg11": (3, 9_228_362, "torchvision vgg11_bn features 9,225,984 - biases 2,752 + fc 5,130"),
    # torchvision alexnet 61,100,840 - classifier 58,631,144 = convs 2,469,696 (same widths).
    "alexnet": (3, 2_472_266, "torchvision alexnet features 2,469,696 + Linear(256, 10) 2,570"),
    # By hand: conv 3*6*25+6, conv 6*16*25+16, FC 400*120+120, 120*84+84, 84*10+10.
    "lenet": (3, 62_006, "456 + 2,416 + 48,120 + 10,164 + 850"),
    "simple_cnn": (3, 62_006, "same layers as lenet: 456 + 2,416 + 48,120 + 10,164 + 850"),
    # Stated in McMahan et al. 2017 (FedAvg), Sec. 3: "1,663,370 total parameters".
    "fedavg_cnn_mnist": (1, 1_663_370, "FedAvg paper, MNIST CNN on 28x28x1"),
    # By hand: 5*5*3*64+64, 5*5*64*64+64, 4096*384+384, 384*192+192, 192*10+10.
    "fedavg_cnn_cifar": (3, 1_756_426, "4,864 + 102,464 + 1,573,248 + 73,920 + 1,930"),
}

_CACHE: dict = {}


def built(name: str, in_channels: int = 3) -> FedModel:
    """One model per (name, channels) for the read-only tests, built under a fixed seed."""
    key = (name, in_channels)
    if key not in _CACHE:
        torch.manual_seed(0)
        _CACHE[key] = create_model(name, num_classes=NUM_CLASSES, in_channels=in_channels).eval()
    return _CACHE[key]


def test_registry_has_the_papers_models():
    expected = {
        "resnet10", "resnet12", "resnet18", "resnet34", "resnet50", "efficientnet_b0", "mobilenet_v2",
        "googlenet", "shufflenet_v2", "simple_cnn", "alexnet", "vgg11", "fedavg_cnn_mnist",
        "fedavg_cnn_cifar", "lenet",
    }
    assert expected <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_docstring_cites_paper(name):
    doc = (MODELS.get(name).__doc__ or "").strip()
    assert doc, f"{name} has no docstring"
    assert re.search(r"\b(19|20)\d\d\b", doc.splitlines()[0]), f"{name}: first docstring line cites no paper/year"


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_split(name):
    """features/classifier/forward/feature_map shapes, and forward == classifier(pool(feature_map))."""
    model = built(name)
    sizes = [(32, 3)] + ([(28, 1)] if 28 in model.input_sizes else [])
    for size, channels in sizes:
        model = built(name, channels)
        x = torch.randn(BATCH, channels, size, size)
        with torch.no_grad():
            h = model.features(x)
            logits = model.classifier(h)
            out = model(x)
            h2, logits2 = model.forward_with_features(x)
        assert h.shape == (BATCH, model.feature_dim)
        assert logits.shape == out.shape == (BATCH, NUM_CLASSES)
        torch.testing.assert_close(out, logits)
        torch.testing.assert_close(h2, h)
        torch.testing.assert_close(logits2, logits)
        if model.has_feature_map:
            with torch.no_grad():
                fmap = model.feature_map(x)
                pooled = model.pool(fmap)
            assert fmap.dim() == 4 and fmap.shape[0] == BATCH
            torch.testing.assert_close(pooled, h)


@pytest.mark.parametrize("name", NAMES)
def test_channels_last_same_output(name):
    """The benchmark's channels_last path computes the same function."""
    torch.manual_seed(0)
    model = create_model(name, num_classes=NUM_CLASSES).eval()
    x = torch.randn(BATCH, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        out = model.to(memory_format=torch.channels_last)(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_backward_reaches_every_parameter(name):
    torch.manual_seed(0)
    model = create_model(name, num_classes=NUM_CLASSES).train()
    x = torch.randn(BATCH, 3, 32, 32)
    loss = nn.functional.cross_entropy(model(x), torch.tensor([0, NUM_CLASSES - 1]))
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert sum(p.grad.abs().sum() for p in model.parameters()) > 0


@pytest.mark.parametrize("name", NAMES)
def test_init_is_deterministic_per_seed(name):
    def state(seed):
        torch.manual_seed(seed)
        return create_model(name, num_classes=NUM_CLASSES).state_dict()

    a, b, c = state(0), state(0), built(name).state_dict()  # built() also seeds 0
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    other = state(1)
    assert any(not torch.equal(a[k], other[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_matches_reference(name):
    assert name in REFERENCE_PARAMS, f"add {name}'s reference parameter count (and its derivation)"
    in_channels, ref, how = REFERENCE_PARAMS[name]
    model = create_model(name, num_classes=10, in_channels=in_channels)
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - ref) <= REL_TOL * ref, f"{name}: {n:,} parameters, reference {ref:,} ({how})"


@pytest.mark.parametrize("norm", ["group", "none"])
@pytest.mark.parametrize("name", NAMES)
def test_norm_variants_build_and_run(name, norm):
    torch.manual_seed(0)
    model = create_model(name, num_classes=NUM_CLASSES, norm=norm).eval()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if norm == "group" and name.startswith("resnet"):
        assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    with torch.no_grad():
        assert model(torch.randn(BATCH, 3, 32, 32)).shape == (BATCH, NUM_CLASSES)


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("resnet")])
def test_resnet_group_norm_has_no_redundant_bias(name):
    """A bias right before a norm layer is cancelled by it; "none" keeps the biases."""
    convs = [m for m in create_model(name, norm="group").modules() if isinstance(m, nn.Conv2d)]
    assert all(c.bias is None for c in convs)
    convs = [m for m in create_model(name, norm="none").modules() if isinstance(m, nn.Conv2d)]
    assert all(c.bias is not None for c in convs)


def test_unknown_model_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        create_model("resnet19")
    msg = str(err.value)
    assert "resnet19" in msg and "model" in msg
    assert all(name in msg for name in NAMES)


def test_unknown_norm_is_a_config_error():
    with pytest.raises(ConfigError, match="norm"):
        create_model("resnet10", norm="layer")


def test_create_model_records_arch():
    assert built("lenet").arch == "lenet"
