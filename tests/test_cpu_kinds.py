"""CPU kinds from the hardware's own flags (issue 48): each kind faked through torch's capability calls, every
``auto`` lever's resolution, the refusal of bf16 where it would be emulated, and what a run records."""

from __future__ import annotations

import pytest
import torch

from fedshift.engine import cpu
from fedshift.engine.config import EngineConfig
from fedshift.errors import ConfigError

AVX2 = {"avx2": True}
AVX512 = {**AVX2, "avx512_f": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True}
AVX512_BF16 = {**AVX512, "avx512_bf16": True}
AMX = {**AVX512_BF16, "amx_tile": True, "amx_bf16": True}
# name: (flags, torch's kernel set on that machine, the kind)
MACHINES = {
    "avx2": (AVX2, "AVX2", "avx2"),
    "avx512": (AVX512, "AVX512", "avx512"),  # e.g. Ice Lake Xeon: oneDNN says bf16 "supported" (emulated)
    "avx512_bf16": (AVX512_BF16, "AVX512", "avx512_bf16"),  # e.g. AMD Zen 4
    "amx": (AMX, "AVX512", "amx"),  # e.g. Sapphire Rapids
}
FAMILIES = ("resnet10", "resnet12", "mobilenet_v2", "efficientnet_b0", "lenet", "fedavg_cnn_mnist", "shufflenet_v2")


@pytest.fixture
def machine(monkeypatch):
    """Make this process see the named machine: CPUID flags, torch's kernel set, no oneDNN cap, and oneDNN
    claiming bf16 support everywhere (as it does on any AVX-512 core): the kind must not listen to it."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)

    def use(name):
        flags, aten, _ = MACHINES[name]
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {f: True for f in flags})
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: aten)
    return use


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_kind_from_the_hardware_flags(machine, name):
    machine(name)
    assert cpu.cpu_kind() == MACHINES[name][2]
    assert cpu.hardware_kind(MACHINES[name][0]) == MACHINES[name][2]


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_auto_lever_per_kind(machine, name):
    """bf16 (evaluation and training) is on only where the hardware has it and it was measured to gain:
    eval on amx and avx512_bf16, training on avx512_bf16 for ResNets, MobileNetV2 and FedAvg's CNN (amx: not
    measured, off); BatchNorm folding on every x86 kind; the NHWC input nowhere."""
    from fedshift.engine.evaluation import eval_lever

    machine(name)
    dev = torch.device("cpu")
    kind = MACHINES[name][2]
    assert cpu.bf16_on("auto", dev) is (kind in ("amx", "avx512_bf16"))
    assert cpu.bf16_supported(dev) is (kind in ("amx", "avx512_bf16"))
    trained = {a for a in FAMILIES if cpu.train_bf16_on("auto", dev, a)}
    assert trained == ({"resnet10", "resnet12", "mobilenet_v2", "fedavg_cnn_mnist"} if kind == "avx512_bf16" else set())
    assert eval_lever("fold_bn", "auto", dev) is True
    assert eval_lever("channels_last", "auto", dev) is False
    # explicit settings are kept (true only where allowed, below)
    assert cpu.bf16_on(False, dev) is False and cpu.train_bf16_on(False, dev, "resnet10") is False


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_true_refused_where_bf16_is_emulated(machine, name):
    machine(name)
    dev = torch.device("cpu")
    if MACHINES[name][2] in cpu.BF16_KINDS:
        cpu.check_bf16(True, dev)
        cpu.check_bf16_train(True, dev)
        return
    for key, check in (("engine.bf16", cpu.check_bf16), ("engine.bf16_train", cpu.check_bf16_train)):
        with pytest.raises(ConfigError, match=rf"^{key}: true, but cpu has no hardware bf16 \(CPU kind {name};"
                                              r" flags: .*bf16 would be emulated.*set " + key):
            check(True, dev)
        check("auto", dev)  # auto turns itself off
        check(False, dev)


@pytest.mark.parametrize("aten,onednn,want", [
    ("AVX2", None, "avx2"),  # ATEN_CPU_CAPABILITY=avx2 on an AMX machine: torch's kernels are AVX2
    ("AVX512", "AVX2", "avx2"),  # oneDNN capped at AVX2
    ("AVX512", "AVX512_CORE", "avx512"),  # oneDNN without bf16 instructions: bf16 would be emulated
    ("AVX512", "avx512_core_vnni", "avx512"),  # the variable is case-insensitive
    ("AVX512", "AVX512_CORE_BF16", "avx512_bf16"),
    ("AVX512", "AVX512_CORE_AMX", "amx"),
    ("AVX512", "ALL", "amx"),
    ("AVX512", "NONSENSE", "amx"),  # an unknown value caps nothing (oneDNN ignores it too)
    ("DEFAULT", None, "default"),
    ("VSX", None, "vsx"),  # another architecture keeps torch's name
])
def test_kernel_caps_lower_the_kind(aten, onednn, want):
    """One machine times another kind's kernels with ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA: the kind (and so
    every auto lever and the run's record) follows the slowest of the flags and the two caps."""
    assert cpu.cpu_kind(AMX, aten, onednn) == want


def test_a_kernel_cap_cannot_raise_the_kind():
    assert cpu.cpu_kind(AVX512, "AVX512", "AVX512_CORE_AMX") == "avx512"
    assert cpu.cpu_kind(AVX2, "AVX2", None) == "avx2"


def test_oneDNN_cap_read_from_the_environment(machine, monkeypatch):
    machine("amx")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert cpu.cpu_kind() == "avx512" and cpu.bf16_on("auto", torch.device("cpu")) is False


def test_this_machine_is_told_by_its_own_flags():
    """The real machine: no hardware bf16 flag -> never a bf16 kind, whatever oneDNN says it can emulate."""
    flags = cpu.cpu_capabilities()
    kind = cpu.cpu_kind()
    if not (flags["avx512_bf16"] or flags["amx_bf16"]):
        assert kind not in cpu.BF16_KINDS
        assert cpu.bf16_on("auto", torch.device("cpu")) is False
        assert not any(cpu.train_bf16_on("auto", torch.device("cpu"), a) for a in FAMILIES)
        with pytest.raises(ConfigError, match="engine.bf16: true"):
            cpu.check_bf16(True, torch.device("cpu"))
    record = cpu.kind_record()
    assert record["cpu_kind"] == kind and set(record["cpu_flags"]) == {f for f, on in flags.items() if on}


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_numerics_record_the_true_kind(machine, name):
    """What a run writes into metrics.json (runner.eval_numerics): the kind and the flags it was read from."""
    from fedshift import runner

    machine(name)
    eng = EngineConfig()
    rec = runner.eval_numerics(eng, torch.device("cpu"), (True, False))
    assert rec["cpu_kind"] == MACHINES[name][2]
    assert set(rec["cpu_flags"]) == set(MACHINES[name][0])
    assert rec["eval_bf16"] is (MACHINES[name][2] in ("amx", "avx512_bf16"))
    assert rec["onednn_max_cpu_isa"] is None
