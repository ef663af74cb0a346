"""Engine settings shared by every method: rounds, epochs, batches, optimiser, device.

Defaults follow FCCL+ § 4.1 and the authors' code where the paper is silent; each
default says where it comes from. ``params/experiments.yaml`` overrides them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional, Tuple, Union


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
    # FCCL+ § 4.1 / Table XIII recipes. "weak" = the paper text (RandomResizedCrop(0.2-1) + flip);
    # "weak_code" = the authors' FCCL+ code that produced the tables (RandomCrop(32, padding 4) + flip).
    # The default stays the paper text's recipe: it is what § 4.1 and Table XIII describe.
    public_aug: Literal["none", "weak", "weak_code", "strong"] = "weak"
    # Keep the last, partial public batch (the authors' FCCL+ code: a DataLoader without drop_last);
    # true drops it. A last batch of one sample is always dropped (BatchNorm cannot train on it).
    public_drop_last: bool = False
    norm: Literal["default", "batch", "group", "none"] = "default"  # "default": each model's own (papers' choice)
    # NHWC weights and activations: same maths up to float rounding, 1.3-1.8x faster steps of the papers' CNNs
    # on CPU (README round-time budget); false gives the float rounding of fedshift before issue 14
    channels_last: bool = True
    eval_every: int = 1  # evaluate every k rounds (the last round always)
    eval_round0: bool = True  # also evaluate the starting models (round 0 of rounds.csv); the authors' code does not
    eval_batch: int = 256  # inference batch (evaluation, figure data): fastest on CPU (benchmarks/bench_vs_reference.py)
    # bf16 autocast in evaluation: true needs hardware bf16 (AVX-512 BF16, AMX or CUDA), refused otherwise; auto = on
    # for the CPU kinds with hardware bf16 where it was measured to gain (engine/cpu.py KIND_LEVERS: amx 2.2x per
    # evaluation, avx512_bf16 1.2-1.4x; accuracy -0.04 +- 0.10 points, benchmarks/bf16_accuracy.py), off elsewhere
    # (an AVX-512 CPU without avx512_bf16 emulates bf16: slower); false = float32 on every kind
    bf16: Union[bool, Literal["auto"]] = "auto"
    # Inference levers (engine/evaluation.py; auto = the value measured for this CPU kind, engine/cpu.py KIND_LEVERS,
    # benchmarks/bench_eval.py): BatchNorm folded into the conv of an inference copy; the input batch in the
    # weights' layout (NHWC under channels_last)
    eval_fold_bn: Union[bool, Literal["auto"]] = "auto"
    eval_channels_last: Union[bool, Literal["auto"]] = "auto"
    # glibc: keep freed blocks up to this many MB in the heap for reuse instead of unmapping them and faulting
    # fresh pages in on the next step (engine/cpu.py). true = 1024 (every activation buffer: fastest, ~1 GB
    # more peak RSS); false = glibc's own threshold (most page faults, least memory). 64: the FCCL+ Digits
    # round at <= 4 GB (README round-time budget)
    malloc_tuning: Union[bool, int] = 64
    malloc_trim: bool = False  # glibc malloc_trim(0) at phase boundaries (engine/cpu.py release_memory): lower peak RSS, some page faults
    # activation checkpointing of the CNN blocks while training (FedModel.run_blocks): same gradients, less
    # memory, one more forward per block; auto = on for CPU devices (memory-bound) above recompute_budget_mb,
    # off on CUDA; true = every batch
    recompute: Union[bool, Literal["auto"]] = "auto"
    # ... but only for a training batch whose activations exceed this many MB (per participant and phase,
    # counted as resources.count_profile counts them, halved under bf16_train): 0 = every batch. The same
    # budget caps the checkpointed graphs FCCL's one-graph step keeps alive at once. At 1280 the FCCL+
    # Digits round (public 256, local 128) checkpoints EfficientNet-B0 and MobileNetV2 at 256, MobileNetV2
    # at 128 in float32 only, ResNet12 at 256 in float32 only, and keeps EfficientNet's and MobileNet's
    # checkpointed graphs together in the bf16 round only (benchmarks/bench_vs_reference.py, issue 40)
    recompute_budget_mb: int = 1280
    # bf16 autocast of the training-mode feature extractor (local and public steps, train-mode teachers):
    # true needs hardware bf16 and applies to every model; auto = on for the avx512_bf16 CPU kind, for the
    # model families measured to gain there (engine/cpu.py KIND_LEVERS: ResNets 2.0x, MobileNetV2 1.2-1.8x;
    # EfficientNet-B0 ran slower; other kinds: not measured or no hardware bf16, off); false = float32 everywhere
    bf16_train: Union[bool, Literal["auto"]] = "auto"
    public_graphs: Literal["all", "one"] = "one"  # FCCL/FCCL+ collaborative step: every participant's autograd graph alive at once, or one (less memory, K-1 more forwards)
    last_k: int = 3  # headline = mean of the last 3 evaluated rounds (FCCL+ tables)
    # headline selection: "last_k" = mean of the last_k evaluations (FCCL+ tables); "best_val" = per participant,
    # its evaluation with the best validation ACC (FedH2L § IV-A: validation every 50 rounds, keep the best model)
    select: Literal["last_k", "best_val"] = "last_k"
    # Which partition a seed reads. "fixed": the one `dvc repro` built (params/data.yaml's seed) for every run
    # seed, so the seeds' spread is training noise only; "run": each run seed k redraws the scenario's
    # private / public-seed / validation / test subsets with seed k (build/partitions_seeded/<scenario>/seed<k>,
    # a Snakemake rule), as the authors' FCCL+ benchmark redraws each participant's private subset with the
    # run seed (fccl+/datasets/utils/federated_dataset.py:159, seeded in fccl+/main.py:58-59).
    data_seed: Literal["fixed", "run"] = "fixed"
    pooled_rows: bool = False  # also write FedH2L's WDP/CDP/ACC (and validation ACC) rows to rounds.csv
    device: str = "auto"  # "auto" = CUDA when available, else CPU; or "cpu", "cuda", "cuda:1"
    deterministic: bool = False  # torch.use_deterministic_algorithms (slower on GPU)
    threads: Optional[int] = None  # torch intra-op threads (None: torch's default)
    checkpoint_every: int = 1  # write a resumable checkpoint every k rounds (0: never); see engine/checkpoint.py
    # ... and at most once per this many seconds of wall time (0: at every k-th round). A FedH2L round is
    # one minibatch step (10,000 per run); a checkpoint each (~30 ms) would double the run's time.
    checkpoint_min_s: float = 30.0
    # A non-finite loss or weight: "fail" stops the job naming method, participant, round and loss term;
    # "skip_batch" skips the optimiser step of a batch whose loss is not finite (counted in metrics.json).
    on_nonfinite: Literal["fail", "skip_batch"] = "fail"
    # skip_batch must not hide divergence: the job fails once more than this fraction of a round's (or
    # the run's) batches were skipped; the count is in the progress lines and the job's last line.
    max_skipped_fraction: float = 0.1
    # GPU levers (engine/levers.py, engine/fused.py, docs/gpu.md). All off by default: none was
    # measured faster on the CPU here, and the GPU figures of this implementation are unmeasured.
    # YAML reads a bare off/on as false/true: the mode keys accept booleans (false = "off").
    # torch.compile of every participant (CPU: 1.1-1.5x per step after 40-160 s of compiling)
    compile: Union[bool, Literal["off", "default", "reduce-overhead"]] = "off"
    cuda_graphs: bool = False  # CUDA graph of the local forward/backward (CUDA only; H100: 1.4x/step)
    overlap_participants: bool = False  # interleave participants' local steps on CUDA streams (H100: 1.2x for 4 models)
    # CUDA bf16 autocast of local steps; auto = per model family (levers.AMP_BY_FAMILY)
    amp: Union[bool, Literal["off", "bf16", "auto"]] = "off"
    cudnn_benchmark: bool = False  # cuDNN autotuning (slower first round)
    # torch.func-batched clients (engine/fused.py, docs/fused_clients.md); auto = CUDA always, CPU up to 200k parameters
    fused_clients: Union[bool, Literal["off", "on", "auto"]] = "off"
    # -- many-client label-skew runs (FedMMD/FedFusion, Yao et al. 2019; FedAvg, McMahan et al. 2017) --
    clients_per_round: int = 0  # clients sampled each round (seeded, recorded); 0 = every client (FCCL+ protocol)
    client_fraction: float = 0.0  # or the fraction C of clients per round, max(round(C*K), 1) (McMahan); 0 = off
    lr_gamma: float = 1.0  # exponential per-round decay, lr * gamma**t (FedFusion § 4.3: 0.985 / 0.99); 1 = off
    server_model: bool = False  # stateless clients share one working model (server-averaging methods): memory flat in K
    participant_eval: bool = True  # per-participant intra/inter evaluation (FCCL+ Eq. 21-22); off for 100-client runs
    global_eval_every: int = 0  # evaluate the global model on the pooled test set every k rounds (`global/top1`); 0 = off
    targets: Tuple[float, ...] = ()  # metrics.json `rounds_to/<t>`: first evaluated round with global top-1 >= t

    def __post_init__(self):
        for key, allowed, on in (("compile", ("off", "default", "reduce-overhead"), "default"),
                                 ("amp", ("off", "bf16", "auto"), "bf16"),
                                 ("fused_clients", ("off", "on", "auto"), "on")):
            if isinstance(getattr(self, key), bool):
                object.__setattr__(self, key, on if getattr(self, key) else "off")
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {allowed}, got {getattr(self, key)!r}")
        for key in ("eval_fold_bn", "eval_channels_last", "bf16", "bf16_train"):
            if getattr(self, key) not in (True, False, "auto"):
                raise ValueError(f"{key} must be true, false or auto, got {getattr(self, key)!r}")
        for key in ("rounds", "local_batch", "public_batch", "eval_every", "eval_batch", "last_k"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.lr == 0:  # negative lr: check_common's message
            raise ValueError(f"lr must be > 0 (0 trains nothing), got {self.lr}")
        if self.local_epochs < 0 or self.public_epochs < 0:
            raise ValueError("local_epochs and public_epochs must be >= 0")
        check_common(self)
        if self.recompute_budget_mb < 0:
            raise ValueError(f"recompute_budget_mb must be >= 0 (0: checkpoint every batch), got {self.recompute_budget_mb}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0: no checkpoints), got {self.checkpoint_every}")
        if self.checkpoint_min_s < 0:
            raise ValueError(f"checkpoint_min_s must be >= 0 (0: no time limit), got {self.checkpoint_min_s}")
        if not 0.0 <= self.max_skipped_fraction <= 1.0:
            raise ValueError(f"max_skipped_fraction must be in [0, 1], got {self.max_skipped_fraction}")
        if self.public_lr < 0:
            raise ValueError(f"public_lr must be >= 0, got {self.public_lr}")
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
    eval_batch: int = 256  # as EngineConfig.eval_batch
    bf16: Union[bool, Literal["auto"]] = "auto"  # as EngineConfig.bf16: round 0 of a federation scores BASE as its pretraining did
    channels_last: bool = True  # as EngineConfig.channels_last
    recompute: Union[bool, Literal["auto"]] = "auto"  # as EngineConfig.recompute
    malloc_tuning: Union[bool, int] = 64  # as EngineConfig.malloc_tuning
    device: str = "auto"
    threads: Optional[int] = None
    checkpoint_every: int = 1  # write a resumable checkpoint every k epochs (0: never)

    def __post_init__(self):
        if self.bf16 not in (True, False, "auto"):
            raise ValueError(f"bf16 must be true, false or auto, got {self.bf16!r}")
        for key in ("epochs", "batch", "eval_every", "eval_batch"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        check_common(self)
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0: no checkpoints), got {self.checkpoint_every}")


DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def check_device(spec: str) -> None:
    """``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:<index>`` (the form only; see :func:`check_cuda`)."""
    if not isinstance(spec, str) or not DEVICE_RE.fullmatch(spec):
        raise ValueError(f"device: invalid value {spec!r}; valid: auto, cpu, cuda, cuda:<index>, mps")


def check_cuda(spec: str) -> None:
    """Raise when ``spec`` asks for a CUDA/MPS device this machine does not have, or when
    ``FEDSHIFT_GPU_SLOT`` is not a non-negative integer (docs/gpu.md)."""
    import os

    slot = os.environ.get("FEDSHIFT_GPU_SLOT", "")
    if slot and not slot.isdigit():
        raise ValueError(f"FEDSHIFT_GPU_SLOT must be a non-negative integer, got {slot!r}")
    if spec == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise ValueError("device: 'mps' asks for Apple's Metal backend, which torch does not find here; "
                             "use auto or cpu")
        return
    if not spec.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"device: {spec!r} asks for CUDA, but torch finds no CUDA device here; use auto or cpu "
                         "(on a cluster head without GPUs set FEDSHIFT_SKIP_CUDA_CHECK=1)")
    index = int(spec.split(":")[1]) if ":" in spec else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"device: {spec!r} names CUDA device {index}, but only {torch.cuda.device_count()} "
                         f"exist (cuda:0..cuda:{torch.cuda.device_count() - 1})")


def recompute_on(setting: Union[bool, str], device) -> bool:
    """``engine.recompute`` / ``pretrain.recompute`` resolved for ``device`` (auto: on for CPU)."""
    return device.type == "cpu" if setting == "auto" else bool(setting)


def malloc_keep_mb(setting: Union[bool, int]) -> int:
    """``malloc_tuning`` as the MB of freed blocks glibc keeps for reuse (0: glibc's own setting)."""
    if isinstance(setting, bool):
        return 1024 if setting else 0
    return int(setting)


def check_common(cfg) -> None:
    """Checks shared by the engine and pretraining settings (device, learning rate, threads)."""
    check_device(cfg.device)
    if cfg.lr < 0:
        raise ValueError(f"lr must be >= 0, got {cfg.lr}")
    if cfg.weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {cfg.weight_decay}")
    momentum = getattr(cfg, "momentum", 0.0)  # SGD's: negative or >= 1 passed validate and diverged (issue 38)
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1) (0: plain SGD), got {momentum}")
    if not isinstance(cfg.malloc_tuning, bool) and not 1 <= cfg.malloc_tuning <= 4096:
        raise ValueError(f"malloc_tuning must be true, false or a size in MB from 1 to 4096, got {cfg.malloc_tuning}")
    if cfg.recompute not in (True, False, "auto"):
        raise ValueError(f"recompute must be true, false or auto, got {cfg.recompute!r}")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be >= 1 (or null: torch's default), got {cfg.threads}")
