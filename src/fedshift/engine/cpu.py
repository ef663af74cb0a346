"""CPU levers: the allocator setting and the bf16 check behind ``engine.malloc_tuning`` / ``engine.bf16``.

Measured with ``benchmarks/bench_vs_reference.py`` (numbers in the README's round-time
budget):

* ``tune_allocator``: glibc hands every block above its mmap threshold (at most 32 MB)
  straight back to the kernel when it is freed, so each activation buffer of a CNN at
  batch 128-2048 is a fresh mapping whose pages the kernel must fault in and zero on
  every forward pass. Half of a CPU run's time went to that (system time as large as
  user time). Raising the mmap and trim thresholds keeps freed buffers in the heap,
  where the next step reuses them. The price is peak RSS: freed buffers of every size
  stay resident beside the live ones (FCCL+ Digits round: 3.9-5 GB kept at 1 GB, 2.7 GB
  untuned); ``malloc_tuning: 64`` (the default) keeps blocks up to 64 MB, most of the
  speed at a fraction of the memory (README round-time budget).
* ``cpu_kind`` / ``KIND_LEVERS``: the CPU kinds, told apart by the hardware's own flags, and what
  every ``auto`` lever resolves to on each (measured on that kind, or off). bf16 autocast pays
  only with hardware bf16 (AVX-512 BF16 or AMX); emulated, it is slower than float32, so
  ``true`` is refused there.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
from dataclasses import dataclass
from typing import Dict, FrozenSet, Mapping, Optional

import torch

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_tuned = 0  # MB kept (0: not tuned)


def tune_allocator(keep_mb: int = 1024) -> bool:
    """Keep freed blocks of up to ``keep_mb`` MB in the heap (glibc only; elsewhere a no-op).

    Blocks above the threshold are still mapped and unmapped per allocation. The heap is
    trimmed once more than twice that much is free at its top. 1024 MB covers every
    activation buffer of the papers' models at these batches (fastest, largest peak RSS:
    freed buffers of every size stay resident); 64 MB keeps the many small and mid-sized
    buffers and maps the few largest afresh. A later call with another size replaces the
    setting. True if applied.
    """
    global _tuned
    if _tuned == int(keep_mb):
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        return False
    keep = int(keep_mb) << 20
    ok = bool(mallopt(_M_MMAP_THRESHOLD, keep)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * keep))
    _tuned = int(keep_mb) if ok else 0
    return ok


def tuned_mb() -> int:
    """The MB of freed blocks :func:`tune_allocator` keeps now (0: not tuned)."""
    return _tuned


_trim_enabled = False
_malloc_trim = None  # glibc's malloc_trim, False where there is none


def set_trim(enabled: bool) -> None:
    """``engine.malloc_trim``: let :func:`release_memory` hand the heap's free pages back."""
    global _trim_enabled
    _trim_enabled = bool(enabled)


def release_memory() -> bool:
    """At a phase boundary (one participant's local training, a collaborative pass, one model's
    evaluation): glibc ``malloc_trim(0)`` returns the free pages the tuned allocator keeps, so
    the buffers of one model's phase are not resident beside the next one's. No-op unless
    ``engine.malloc_trim`` is on and glibc is the allocator. True if it ran."""
    global _malloc_trim
    if not _trim_enabled:
        return False
    if _malloc_trim is None:  # looked up once: find_library runs ldconfig
        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
        except (OSError, AttributeError, TypeError):
            _malloc_trim = False
    if not _malloc_trim:
        return False
    _malloc_trim(0)
    return True


# ------------------------------------------------------------------------------------------------ CPU kinds
# fedshift tells the CPU kinds apart by the hardware's own flags (torch.cpu.get_capabilities(), read from
# CPUID), never by whether a library can run a type: oneDNN answers "bf16 supported" on every AVX-512 core
# because it *emulates* bf16 there (an Intel Xeon with AVX-512 but no avx512_bf16 ran a ResNet-18 forward at
# batch 256 in 278 ms under bf16 autocast against 151 ms in float32; issue 48). The kinds, fastest first:
#
#   amx          AMX tiles with bf16 (amx_bf16 + amx_tile; Sapphire Rapids and later Xeons), AVX-512 BF16
#   avx512_bf16  AVX-512 with hardware bf16 (avx512_bf16; AMD Zen 4, Cooper Lake), no AMX
#   avx512       AVX-512 (avx512_f/bw/vl/dq) without hardware bf16 (Skylake-SP ... Ice Lake Xeons)
#   avx2         AVX2 only
#   default      anything else x86 without AVX2; other architectures keep torch's own name (e.g. "vsx")
#
# The kernels torch and oneDNN may use cap the kind: ATEN_CPU_CAPABILITY=avx2 (torch's kernels) or
# ONEDNN_MAX_CPU_ISA=AVX2 / AVX512_CORE (oneDNN's convolutions) make a faster machine run, and be recorded
# as, the slower kind, which is how one machine times another kind's kernels (figures so taken are
# labelled "emulated" in the tables below).
KINDS = ("amx", "avx512_bf16", "avx512", "avx2", "default")
BF16_KINDS = frozenset({"amx", "avx512_bf16"})  # hardware bf16: engine.bf16 / bf16_train true allowed

# ONEDNN_MAX_CPU_ISA values in oneDNN's order (docs: "CPU ISA hints"); the rank at which each kind starts.
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
                "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL",
                "DEFAULT")
_KIND_ONEDNN = {"amx": "AVX10_1_512_AMX", "avx512_bf16": "AVX512_CORE_BF16", "avx512": "AVX512_CORE",
                "avx2": "AVX2"}
# The flags the kind is read from (recorded with every run as numerics.cpu_flags).
KIND_FLAGS = ("avx2", "avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_capabilities() -> Dict[str, bool]:
    """The hardware flags :func:`cpu_kind` reads (:data:`KIND_FLAGS`), from ``torch.cpu.get_capabilities()``
    (CPUID, whatever ATEN_CPU_CAPABILITY says); all False where torch cannot tell."""
    try:
        caps = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):
        caps = {}
    return {f: bool(caps.get(f, False)) for f in KIND_FLAGS}


def hardware_kind(caps: Mapping[str, bool]) -> str:
    """The kind the flags ``caps`` describe (before any kernel cap)."""
    if caps.get("avx512_f") and caps.get("avx512_bw") and caps.get("avx512_vl") and caps.get("avx512_dq"):
        if caps.get("amx_tile") and caps.get("amx_bf16"):
            return "amx"
        return "avx512_bf16" if caps.get("avx512_bf16") else "avx512"
    return "avx2" if caps.get("avx2") else "default"


def _onednn_cap(value: Optional[str]) -> Optional[str]:
    """The fastest kind ``ONEDNN_MAX_CPU_ISA=value`` lets oneDNN run (None: no cap or an unknown value)."""
    if not value:
        return None
    value = value.strip().upper()
    if value not in _ONEDNN_ISAS or value in ("ALL", "DEFAULT"):
        return None
    rank = _ONEDNN_ISAS.index(value)
    for kind, start in _KIND_ONEDNN.items():  # fastest first
        if rank >= _ONEDNN_ISAS.index(start):
            return kind
    return "default"


def cpu_kind(caps: Optional[Mapping[str, bool]] = None, aten: Optional[str] = None,
             onednn_isa: Optional[str] = None) -> str:
    """This CPU's kind (:data:`KINDS`): the hardware's flags (``caps``, default :func:`cpu_capabilities`)
    capped by torch's kernel set (``aten``, default ``torch.backends.cpu.get_cpu_capability()``, which
    ATEN_CPU_CAPABILITY lowers) and by oneDNN's (``onednn_isa``, default the ONEDNN_MAX_CPU_ISA /
    DNNL_MAX_CPU_ISA environment variable). Another architecture keeps torch's own name in lower case."""
    caps = cpu_capabilities() if caps is None else caps
    aten = str(torch.backends.cpu.get_cpu_capability() if aten is None else aten).lower()
    if onednn_isa is None:
        onednn_isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if not (aten.startswith("avx") or aten == "default"):
        return aten  # vsx, zvector, sve...: not an x86 kind
    kinds = [hardware_kind(caps), KINDS[0] if aten.startswith("avx512") else aten]  # AVX-512 kernels cap nothing
    cap = _onednn_cap(onednn_isa)
    if cap:
        kinds.append(cap)
    order = {k: i for i, k in enumerate(KINDS)}
    return max(kinds, key=lambda k: order.get(k, len(KINDS)))  # the slowest of the three


# What `auto` resolves to per kind, in one place: each value was measured on that kind (the figure, its script
# and machine beside it) or is off. "emulated": measured on a faster machine with its kernels capped to the kind.
#   eval_bf16     engine.bf16 (bf16 autocast in evaluation; benchmarks/bench_eval.py, settings interleaved)
#                 amx: 2.16x (2.07-2.20) on an idle AMX Xeon (torch 2.11, 2026-11-27)
#                 avx512_bf16: 1.23x (1.00-1.32) and 1.38x (1.19-1.56), two sittings on a loaded AVX-512 BF16 EPYC
#                 avx512 / avx2: no hardware bf16 (emulated: 1.84x slower on an AVX-512 Xeon), off
#   eval_fold_bn  engine.eval_fold_bn (BatchNorm folded into an inference copy; bench_eval.py)
#                 amx: 1.18x (1.17-1.25), idle AMX Xeon; avx512_bf16: 0.97x / 1.09x (loaded EPYC, two sittings,
#                 not told apart from noise; kept on, as on the AMX Xeon whose float32 kernels it shares)
#                 avx512: 1.18x (1.11-1.22) on an Ice Lake Xeon without avx512_bf16 (2026-11-28, loaded machine,
#                 benchmark at autogroup nice -20, benchmarks/results/eval_levers_avx512.md); avx2: 1.15x
#                 (1.06-1.17), emulated (AMX Xeon with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
#   eval_channels_last  the input batch in NHWC: 0.96x (AMX Xeon), 0.96x (0.92-1.00, the Ice Lake Xeon),
#                 0.90-0.94x (emulated avx2): off everywhere
#   train_bf16    engine.bf16_train, per model family (benchmarks/bench_train_steps.py; idle AVX-512 BF16 EPYC
#                 without AMX, 2 threads, malloc_tuning 64, one step forward + backward + Adam, float32 -> bf16):
#                 resnet       batch 256: ResNet10 2.29 -> 1.12 s, ResNet12 3.14 -> 1.59 s (2.0x)
#                 mobilenet    MobileNetV2 with recompute: batch 128 2.13 -> 1.20 s, batch 256 3.95 -> 3.25 s;
#                              peak RSS of one step 2.92 -> 1.88 GB at 256 (without recompute: no gain)
#                 efficientnet EfficientNet-B0, batch 128: 0.55 -> 1.00 s (slower: SiLU / squeeze-excitation)
#                 fedavg       FedAvg's MNIST CNN, batch 64: 43.8 -> 31.6 ms (1.39x)
#                 lenet, simple  LeNet-5 / SimpleCNN, batch 64: 6.5 -> 6.4 / 8.0 ms (no gain)
#                 amx: not measured, off; avx512 / avx2: no hardware bf16, off
@dataclass(frozen=True)
class KindLevers:
    eval_bf16: bool
    eval_fold_bn: bool
    eval_channels_last: bool
    train_bf16: FrozenSet[str]  # model families (engine.levers.model_family) trained under bf16 autocast


KIND_LEVERS: Dict[str, KindLevers] = {
    "amx": KindLevers(eval_bf16=True, eval_fold_bn=True, eval_channels_last=False, train_bf16=frozenset()),
    "avx512_bf16": KindLevers(eval_bf16=True, eval_fold_bn=True, eval_channels_last=False,
                              train_bf16=frozenset({"resnet", "mobilenet", "fedavg"})),
    "avx512": KindLevers(eval_bf16=False, eval_fold_bn=True, eval_channels_last=False, train_bf16=frozenset()),
    "avx2": KindLevers(eval_bf16=False, eval_fold_bn=True, eval_channels_last=False, train_bf16=frozenset()),
    # any other kind (no AVX2, other architectures, CUDA devices): nothing measured, every lever off
    "other": KindLevers(eval_bf16=False, eval_fold_bn=False, eval_channels_last=False, train_bf16=frozenset()),
}


def kind_levers(kind: Optional[str] = None, device: Optional[torch.device] = None) -> KindLevers:
    """The `auto` values of ``kind`` (default: this machine's; a CUDA ``device`` or an unlisted kind: "other")."""
    if device is not None and device.type != "cpu":
        return KIND_LEVERS["other"]
    kind = cpu_kind() if kind is None else kind
    return KIND_LEVERS.get(kind, KIND_LEVERS["other"])


def bf16_on(setting, device: torch.device) -> bool:
    """``engine.bf16`` resolved: ``auto`` = :data:`KIND_LEVERS`' ``eval_bf16`` of this CPU kind (off on CUDA:
    ``amp`` is CUDA's); ``true`` / ``false`` as given (``true`` is refused without hardware bf16, :func:`check_bf16`)."""
    if setting == "auto":
        return kind_levers(device=device).eval_bf16
    return bool(setting)


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 autocast runs on hardware bf16 on ``device``: a CUDA device that says so, or a CPU of a
    :data:`BF16_KINDS` kind (hardware flags, never oneDNN's "supported", which emulation also answers)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_kind() in BF16_KINDS


def _no_bf16_error(key: str, device: torch.device, fix: str):
    from ..errors import ConfigError

    flags = ", ".join(f for f, on in cpu_capabilities().items() if on) or "none"
    return ConfigError(f"{key}: true, but {device} has no hardware bf16 (CPU kind {cpu_kind()}; flags: {flags}; "
                       f"bf16 would be emulated, slower than float32); set {key}: {fix}")


def check_bf16(enabled, device: torch.device) -> None:
    """Refuse ``engine.bf16: true`` where bf16 would be emulated (a silent slow-down)."""
    if enabled is True and not bf16_supported(device):  # "auto" turns itself off there
        raise _no_bf16_error("engine.bf16", device, "false or auto")


def autocast(enabled: bool, device: torch.device):
    """bf16 autocast on ``device`` when ``enabled`` (``auto``: :func:`bf16_on`), else a no-op context."""
    if not bf16_on(enabled, device):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def train_bf16_on(setting, device: torch.device, arch: str) -> bool:
    """``engine.bf16_train`` resolved for one participant's architecture on ``device``: ``auto`` = on where this
    CPU kind's :data:`KIND_LEVERS` lists the model's family; ``true`` on every model (refused where bf16 would
    be emulated, :func:`check_bf16_train`); off on CUDA (``engine.amp`` is CUDA's)."""
    from .levers import model_family

    if device.type != "cpu":
        return False
    if setting == "auto":
        return model_family(arch) in kind_levers().train_bf16
    return bool(setting)


def check_bf16_train(enabled, device: torch.device) -> None:
    """Refuse ``engine.bf16_train: true`` on a CPU without hardware bf16 (a silent slow-down)."""
    if enabled is True and device.type == "cpu" and not bf16_supported(device):
        raise _no_bf16_error("engine.bf16_train", device, "false or auto")


def kind_record() -> Dict[str, object]:
    """How :func:`cpu_kind` decided, for a run's numerics: the kind, the hardware flags it read, torch's kernel
    set and the oneDNN cap in force."""
    return {"cpu_kind": cpu_kind(), "cpu_flags": [f for f, on in cpu_capabilities().items() if on],
            "aten_capability": str(torch.backends.cpu.get_cpu_capability()),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")}


def recompute_batch(budget_mb: int, act_mb_per_sample: float, bf16: bool) -> int:
    """The largest training batch whose activations fit ``budget_mb`` (``engine.recompute_budget_mb``):
    checkpointing starts above it. ``act_mb_per_sample``: resources.count_profile's float32 count
    (halved under bf16 autocast); 0 budget = checkpoint every batch."""
    if budget_mb <= 0 or act_mb_per_sample <= 0:
        return 0
    per = act_mb_per_sample / (2 if bf16 else 1)
    return int(budget_mb // per)
