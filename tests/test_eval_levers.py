"""Evaluation levers (issue 40): folded BatchNorm, channels_last input, per-CPU-kind defaults, bf16 gate."""

import copy

import pytest
import torch

from fedshift.engine import cpu
from fedshift.engine.config import EngineConfig
from fedshift.engine.evaluation import (correct_topk, eval_lever, fold_bn, inference_copy,
                                        weights_layout)
from fedshift.models import create_model

ARCHS = ["resnet10", "resnet12", "efficientnet_b0", "mobilenet_v2"]  # structure fcclplus_digits


def trained_looking(arch: str, seed: int = 0) -> torch.nn.Module:
    """A model whose BatchNorm layers hold non-trivial statistics and affine weights, so folding
    changes every conv's weights and bias (a fresh model's mean 0 / variance 1 would hide errors)."""
    torch.manual_seed(seed)
    m = create_model(arch, num_classes=10, in_channels=3)
    g = torch.Generator().manual_seed(seed)
    for b in m.modules():
        if isinstance(b, torch.nn.BatchNorm2d):
            b.running_mean.normal_(0, 0.5, generator=g)
            b.running_var.uniform_(0.3, 3.0, generator=g)
            b.weight.data.uniform_(0.5, 1.5, generator=g)
            b.bias.data.normal_(0, 0.2, generator=g)
    return m


@pytest.mark.parametrize("arch", ARCHS)
def test_folded_bn_equals_unfolded_in_float64(arch):
    """Folding is exact algebra: in float64 the folded copy's logits equal the model's to ~1e-10
    (float64 rounding of a few dozen layers), every BatchNorm is folded, the model is unchanged."""
    m = trained_looking(arch).double().train()
    before = copy.deepcopy(m.state_dict())
    folded = inference_copy(m, fold=True)
    assert folded is not m and m.training, "the training model keeps its mode"
    assert not any(isinstance(x, torch.nn.BatchNorm2d) for x in folded.modules()), "a BatchNorm was not folded"
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} of the training model changed"
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m.eval()(x)
        got = folded(x)
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= 1e-9 * max(scale, 1.0)


@pytest.mark.parametrize("arch", ["resnet10", "mobilenet_v2"])
def test_levers_keep_float32_predictions(arch):
    """In float32 (the evaluation's precision) folding and the NHWC input change the logits only by
    float32 rounding: relative error of the order of eps32 x depth, far below the logit gaps."""
    m = trained_looking(arch).to(memory_format=torch.channels_last)
    x = torch.randint(0, 256, (24, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 10, (24,), generator=torch.Generator().manual_seed(3))
    xf = x.float().div(255)
    with torch.no_grad():
        ref = m.eval()(xf)
        got = inference_copy(m, True)(xf.contiguous(memory_format=torch.channels_last))
    assert (got - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    base = correct_topk(m, x, y, ks=(1, 5), batch=10)
    fast = correct_topk(m, x, y, ks=(1, 5), batch=10, fold=True, channels_last=True)
    for k in (1, 5):
        assert torch.equal(base[k], fast[k])


def test_fold_skips_what_it_cannot_fold():
    """A BatchNorm without running statistics, or not right after a conv, is left as it is."""
    seq = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, track_running_stats=False),
                              torch.nn.ReLU(), torch.nn.BatchNorm2d(4))
    assert fold_bn(seq.eval()) == 0
    assert isinstance(seq[1], torch.nn.BatchNorm2d) and isinstance(seq[3], torch.nn.BatchNorm2d)
    assert inference_copy(seq, fold=False) is seq


def test_folded_copy_keeps_layout():
    m = trained_looking("resnet10").to(memory_format=torch.channels_last)
    assert weights_layout(m) == torch.channels_last
    assert weights_layout(inference_copy(m, True)) == torch.channels_last
    assert weights_layout(trained_looking("resnet10")) == torch.contiguous_format


@pytest.mark.parametrize("kind", sorted(cpu.KIND_LEVERS) + ["arm_neon"])
def test_auto_resolves_per_cpu_kind(kind):
    """``auto`` takes the measured value of the given CPU kind; an unknown kind gets "other";
    an explicit true/false is kept whatever the kind."""
    cpu_dev = torch.device("cpu")
    want = cpu.KIND_LEVERS.get(kind, cpu.KIND_LEVERS["other"])
    for lever in ("fold_bn", "channels_last"):
        assert eval_lever(lever, "auto", cpu_dev, kind=kind) is getattr(want, f"eval_{lever}")
        assert eval_lever(lever, True, cpu_dev, kind=kind) is True
        assert eval_lever(lever, False, cpu_dev, kind=kind) is False


def test_auto_on_cuda_is_other():
    assert eval_lever("fold_bn", "auto", torch.device("cuda")) is cpu.KIND_LEVERS["other"].eval_fold_bn


def test_bf16_gated_on_the_cpu_flag(monkeypatch):
    """engine.bf16: true is refused without hardware bf16; auto turns itself off there (no autocast)."""
    from fedshift.errors import ConfigError

    dev = torch.device("cpu")
    monkeypatch.setattr(cpu, "cpu_kind", lambda: "avx512")
    with pytest.raises(ConfigError, match="engine.bf16: true, but cpu has no hardware bf16 .CPU kind avx512"):
        cpu.check_bf16(True, dev)
    cpu.check_bf16("auto", dev)
    assert cpu.bf16_on("auto", dev) is False
    with cpu.autocast("auto", dev):
        assert not torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(cpu, "cpu_kind", lambda: "avx512_bf16")
    cpu.check_bf16(True, dev)
    assert cpu.bf16_on("auto", dev) is True
    with cpu.autocast("auto", dev):
        assert torch.is_autocast_enabled("cpu")
    assert cpu.bf16_on("auto", torch.device("cuda")) is False  # auto: the CPU kind's measured default only
    monkeypatch.setattr(cpu, "cpu_kind", lambda: "avx2")
    assert cpu.bf16_on("auto", dev) is False


def test_engine_config_checks_the_switches():
    cfg = EngineConfig()
    assert cfg.eval_fold_bn == cfg.eval_channels_last == cfg.bf16 == "auto"
    EngineConfig(eval_fold_bn=False, eval_channels_last=True, bf16=False)
    for key in ("eval_fold_bn", "bf16"):
        with pytest.raises(ValueError, match=key):
            EngineConfig(**{key: "yes"})


def test_compile_turns_auto_folding_off():
    """With engine.compile on, the model runs compiled: a folded copy would recompile every evaluation."""
    from fedshift.engine.evaluation import inference_levers

    cpu_dev = torch.device("cpu")
    assert inference_levers(EngineConfig(compile="default"), cpu_dev)[0] is False
    assert inference_levers(EngineConfig(compile="default", eval_fold_bn=True), cpu_dev)[0] is True
    assert inference_levers(EngineConfig(eval_fold_bn=False), cpu_dev) == (False, False)


def test_federation_evaluation_with_and_without_the_levers():
    """Federation.evaluate gives the same accuracies with the inference levers on and off (float32)."""
    from fedshift.data.loading import ClientData, FederatedData
    from fedshift.engine.federation import Federation

    g = torch.Generator().manual_seed(0)

    def part(n):
        return torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8), torch.randint(0, 10, (n,), generator=g)

    data = FederatedData(scenario="t", num_classes=10, image_shape=(3, 32, 32), public=part(8)[0], public_name="p",
                         clients=[ClientData(name=n, domain=n, splits={"private": part(8), "test": part(12)})
                                  for n in ("a", "b")])
    rows = {}
    for on in (False, True):
        models = [trained_looking("resnet10", 0), trained_looking("mobilenet_v2", 1)]
        cfg = EngineConfig(device="cpu", eval_fold_bn=on, eval_channels_last=on, bf16=False)
        rows[on] = Federation(data, models, ["resnet10", "mobilenet_v2"], cfg, 0, torch.device("cpu")).evaluate()
    assert rows[True] == rows[False]
