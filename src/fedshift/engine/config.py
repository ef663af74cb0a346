"""Engine settings shared by every method: rounds, epochs, batches, optimiser, device.

Defaults follow FCCL+ § 4.1 and the authors' code where the paper is silent; each
default says where it comes from. ``params/experiments.yaml`` overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple


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
    channels_last: bool = False  # NHWC weights: same maths (float rounding aside), 1.1-1.6x faster CNN training here (benchmarks/)
    eval_every: int = 1  # evaluate every k rounds (the last round always)
    eval_batch: int = 2048  # evaluation batch; evaluation is vectorised over all test sets
    last_k: int = 3  # headline = mean of the last 3 evaluated rounds (FCCL+ tables)
    device: str = "auto"  # "auto" = CUDA when available, else CPU; or "cpu", "cuda", "cuda:1"
    deterministic: bool = False  # torch.use_deterministic_algorithms (slower on GPU)
    threads: Optional[int] = None  # torch intra-op threads (None: torch's default)
    # -- many-client label-skew runs (FedMMD/FedFusion, Yao et al. 2019; FedAvg, McMahan et al. 2017) --
    clients_per_round: int = 0  # clients sampled each round (seeded, recorded); 0 = every client (FCCL+ protocol)
    client_fraction: float = 0.0  # or the fraction C of clients per round, max(round(C*K), 1) (McMahan); 0 = off
    lr_gamma: float = 1.0  # exponential per-round decay, lr * gamma**t (FedFusion § 4.3: 0.985 / 0.99); 1 = off
    server_model: bool = False  # stateless clients share one working model (server-averaging methods): memory flat in K
    participant_eval: bool = True  # per-participant intra/inter evaluation (FCCL+ Eq. 21-22); off for 100-client runs
    global_eval_every: int = 0  # evaluate the global model on the pooled test set every k rounds (`global/top1`); 0 = off
    targets: Tuple[float, ...] = ()  # metrics.json `rounds_to/<t>`: first evaluated round with global top-1 >= t

    def __post_init__(self):
        for key in ("rounds", "local_batch", "public_batch", "eval_every", "eval_batch", "last_k"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.local_epochs < 0 or self.public_epochs < 0:
            raise ValueError("local_epochs and public_epochs must be >= 0")
        if self.clients_per_round < 0 or not 0.0 <= self.client_fraction <= 1.0:
            raise ValueError(f"clients_per_round must be >= 0 and client_fraction in [0, 1], got "
                             f"{self.clients_per_round} and {self.client_fraction}")
        if self.clients_per_round and self.client_fraction:
            raise ValueError("set clients_per_round or client_fraction, not both")
        if not 0.0 < self.lr_gamma <= 1.0:
            raise ValueError(f"lr_gamma must be in (0, 1], got {self.lr_gamma}")
        if self.global_eval_every < 0:
            raise ValueError(f"global_eval_every must be >= 0, got {self.global_eval_every}")
        if not self.participant_eval and not self.global_eval_every:
            raise ValueError("participant_eval is off and global_eval_every is 0: the run would evaluate nothing")
        if any(not 0.0 < t <= 1.0 for t in self.targets):
            raise ValueError(f"targets are accuracies in (0, 1], got {self.targets}")

    def lr_at(self, base: float, round_index: int) -> float:
        """Learning rate of round ``round_index`` (0-based) under the optional linear decay and
        the optional exponential decay ``lr_gamma ** round_index`` (both multiply when both are on)."""
        lr = base * self.lr_gamma ** round_index
        if not self.lr_decay:
            return lr
        return lr * (1 - 0.9 * round_index / self.rounds)


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
    eval_batch: int = 2048
    device: str = "auto"
    threads: Optional[int] = None
