"""Engine settings shared by every method: rounds, epochs, batches, optimiser, device.

Defaults follow FCCL+ § 4.1 and the authors' code where the paper is silent; each
default says where it comes from. ``params/experiments.yaml`` overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


@dataclass(frozen=True)
class EngineConfig:
    rounds: int = 40  # FCCL+ § 4.1: 40 communication rounds
    local_epochs: int = 20  # authors' code: 20 local epochs per round (FCCL+ Table XIX studies 10/20/30)
    local_batch: int = 256  # FCCL+ § 4.1: batch 256 on private data
    public_batch: int = 512  # FCCL+ § 4.1: batch 512 on public data (authors' code: 256)
    public_epochs: int = 1  # passes over the public set per collaborative step (authors' code: 1)
    optimizer: Literal["adam", "sgd"] = "adam"  # FCCL+ § 4.1: Adam for both phases
    lr: float = 1e-3  # local learning rate (FCCL+ § 4.1)
    public_lr: float = 1e-3  # collaborative learning rate (FCCL+ § 4.1)
    weight_decay: float = 1e-5  # authors' code, local updating only
    momentum: float = 0.9  # SGD only
    lr_decay: bool = False  # authors' code decays both rates as lr * (1 - 0.9 t / T); off = paper
    public_aug: Literal["none", "weak", "strong"] = "weak"  # FCCL+ § 4.1 / Table XIII recipes
    norm: Literal["default", "batch", "group", "none"] = "default"  # "default": each model's own (papers' choice)
    channels_last: bool = False  # NHWC weights: same maths up to float rounding, 1.3-1.8x faster steps of the papers' CNNs on CPU (benchmarks/); off keeps runs bit-identical to earlier versions
    eval_every: int = 1  # evaluate every k rounds (the last round always)
    eval_round0: bool = True  # also evaluate the starting models (round 0 of rounds.csv); the authors' code does not
    eval_batch: int = 256  # inference batch (evaluation, figure data): fastest on CPU (benchmarks/bench_vs_reference.py)
    bf16: bool = False  # bf16 autocast in evaluation; needs hardware bf16 (AVX-512 BF16, AMX or CUDA), refused otherwise
    malloc_tuning: bool = True  # glibc: reuse freed activation buffers instead of faulting in fresh pages (engine/cpu.py)
    public_graphs: Literal["all", "one"] = "one"  # FCCL/FCCL+ collaborative step: every participant's autograd graph alive at once, or one (less memory, K-1 more forwards)
    last_k: int = 3  # headline = mean of the last 3 evaluated rounds (FCCL+ tables)
    device: str = "auto"  # "auto" = CUDA when available, else CPU; or "cpu", "cuda", "cuda:1"
    deterministic: bool = False  # torch.use_deterministic_algorithms (slower on GPU)
    threads: Optional[int] = None  # torch intra-op threads (None: torch's default)

    def __post_init__(self):
        for key in ("rounds", "local_batch", "public_batch", "eval_every", "eval_batch", "last_k"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.local_epochs < 0 or self.public_epochs < 0:
            raise ValueError("local_epochs and public_epochs must be >= 0")

    def lr_at(self, base: float, round_index: int) -> float:
        """Learning rate of round ``round_index`` (0-based) under the optional linear decay."""
        if not self.lr_decay:
            return base
        return base * (1 - 0.9 * round_index / self.rounds)


@dataclass(frozen=True)
class PretrainConfig:
    epochs: int = 50  # FCCL+ § 4.1: SOLO/BASE = 50 epochs on private data only
    batch: int = 256  # private batch
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 1e-5
    momentum: float = 0.9
    norm: Literal["default", "batch", "group", "none"] = "default"  # must match the federated runs using the checkpoint
    eval_every: int = 5  # evaluate on every domain's test set every k epochs (and the last)
    eval_batch: int = 256  # as EngineConfig.eval_batch
    bf16: bool = False  # as EngineConfig.bf16
    channels_last: bool = False  # as EngineConfig.channels_last
    malloc_tuning: bool = True  # as EngineConfig.malloc_tuning
    device: str = "auto"
    threads: Optional[int] = None
