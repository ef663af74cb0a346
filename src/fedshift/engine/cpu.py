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
* ``bf16_supported``: bf16 autocast pays only with hardware bf16 (AVX-512 BF16 or
  AMX); emulated, it is an order of magnitude slower, so the switch is refused there.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
from typing import Dict

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


def cpu_kind() -> str:
    """This CPU's kind, as the per-kind defaults of the evaluation levers name it:
    ``avx512_bf16`` (AVX-512 kernels and hardware bf16), else torch's kernel set in lower
    case (``avx512``, ``avx2``, ``default``...). ``ATEN_CPU_CAPABILITY=avx2`` makes an
    AVX-512 machine report ``avx2`` (torch then also reports no mkldnn bf16)."""
    cap = str(torch.backends.cpu.get_cpu_capability()).lower()
    if cap.startswith("avx512") and bf16_supported(torch.device("cpu")):
        return "avx512_bf16"
    return cap


def bf16_on(setting, device: torch.device) -> bool:
    """``engine.bf16`` resolved: ``auto`` = on for the CPU kind ``avx512_bf16`` only (measured with
    benchmarks/bench_eval.py; CUDA and other kinds: off, not measured or emulated)."""
    if setting == "auto":
        return device.type == "cpu" and cpu_kind() == "avx512_bf16"
    return bool(setting)


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 autocast runs on hardware bf16 on ``device``."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def check_bf16(enabled: bool, device: torch.device) -> None:
    """Refuse ``engine.bf16: true`` where bf16 would be emulated (a silent 10x slow-down)."""
    if enabled is True and not bf16_supported(device):  # "auto" turns itself off there
        from ..errors import ConfigError

        raise ConfigError(f"engine.bf16: true, but {device} has no hardware bf16 (CPU capability "
                          f"{torch.backends.cpu.get_cpu_capability()}); set engine.bf16: false")


def autocast(enabled: bool, device: torch.device):
    """bf16 autocast on ``device`` when ``enabled`` (``auto``: :func:`bf16_on`), else a no-op context."""
    if not bf16_on(enabled, device):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# engine.bf16_train: auto -> bf16 autocast of the training forwards per model family, on the avx512_bf16
# CPU kind only (benchmarks/bench_train_steps.py, issue 40; idle AVX-512 BF16 EPYC without AMX, 2 threads,
# MB = malloc_tuning 64, one step forward + backward + Adam, float32 -> bf16):
#   resnet        batch 256: ResNet10 2.29 -> 1.12 s, ResNet12 3.14 -> 1.59 s (2.0x)
#   mobilenet     MobileNetV2 with recompute: batch 128 2.13 -> 1.20 s, batch 256 3.95 -> 3.25 s; peak RSS
#                 of one step 2.92 -> 1.88 GB at 256 (without recompute: 2.27 -> 2.22 s, no gain)
#   efficientnet  EfficientNet-B0, batch 128: 0.55 -> 1.00 s (slower: SiLU / squeeze-excitation in bf16)
#   fedavg        FedAvg's MNIST CNN, batch 64: 43.8 -> 31.6 ms (1.39x)
#   lenet, simple LeNet-5 / SimpleCNN, batch 64: 6.5 -> 6.4 / 8.0 ms (no gain)
# Families not listed were not measured: off.
TRAIN_BF16_BY_FAMILY: Dict[str, bool] = {
    "resnet": True,
    "mobilenet": True,
    "efficientnet": False,
    "fedavg": True,
    "lenet": False,
    "simple": False,
}


def train_bf16_on(setting, device: torch.device, arch: str) -> bool:
    """``engine.bf16_train`` resolved for one participant's architecture on ``device``: ``auto`` = on for
    the ``avx512_bf16`` CPU kind and a family measured to gain (:data:`TRAIN_BF16_BY_FAMILY`); ``true``
    on every model (refused where bf16 would be emulated, :func:`check_bf16_train`); off on CUDA
    (``engine.amp`` is CUDA's)."""
    from .levers import model_family

    if device.type != "cpu":
        return False
    if setting == "auto":
        return cpu_kind() == "avx512_bf16" and TRAIN_BF16_BY_FAMILY.get(model_family(arch), False)
    return bool(setting)


def check_bf16_train(enabled, device: torch.device) -> None:
    """Refuse ``engine.bf16_train: true`` on a CPU without hardware bf16 (a silent 10x slow-down)."""
    if enabled is True and device.type == "cpu" and not bf16_supported(device):
        from ..errors import ConfigError

        raise ConfigError(f"engine.bf16_train: true, but {device} has no hardware bf16 (CPU capability "
                          f"{torch.backends.cpu.get_cpu_capability()}); set engine.bf16_train: false or auto")


def recompute_batch(budget_mb: int, act_mb_per_sample: float, bf16: bool) -> int:
    """The largest training batch whose activations fit ``budget_mb`` (``engine.recompute_budget_mb``):
    checkpointing starts above it. ``act_mb_per_sample``: resources.count_profile's float32 count
    (halved under bf16 autocast); 0 budget = checkpoint every batch."""
    if budget_mb <= 0 or act_mb_per_sample <= 0:
        return 0
    per = act_mb_per_sample / (2 if bf16 else 1)
    return int(budget_mb // per)
