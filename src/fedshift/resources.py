"""The memory a job needs, from a model of the job: what SLURM is asked for (``mem_mb``).

A training job's peak resident memory on the CPU is, in MB (issue 22 point 2)::

    peak = base + data + sum_k params_k * slots_k + act_factor * activations + keep

* ``base``: the interpreter, torch, fedshift, MLflow's client and the allocator's own
  overhead, measured as the peak RSS of the smallest real job (``BASE_MB``);
* ``data``: the job's arrays as stored (uint8 images stay uint8 in memory: data/loading.py),
  read off the partition and public-set folders when they exist;
* ``params_k * slots_k``: participant k's weights (4 bytes each) times the copies the job
  keeps of them: the model, its gradient, the optimiser's state (Adam 2, SGD with momentum 1,
  plain SGD 0) and the method's own copies (teachers, the previous round's model, the global
  model: the method class's ``weight_copies``), plus one for checkpointing and averaging;
* ``activations``: the largest training phase's activation memory: per-sample activation
  bytes of each architecture at the scenario's image size (every leaf module's output,
  counted by one forward pass on torch's ``meta`` device: no memory, no data), times the
  batch, for one model at a time in local training and for all K at once in the collaborative
  step of methods that keep every participant's autograd graph (the class's ``public_graphs``:
  ``all``, or ``engine`` with ``engine.public_graphs: all``), and on K-1 peer batches at once for a
  method whose step runs each model on all its peers' batches (``steps_on_peer_batches``: FedH2L,
  counted as K batches);
* ``act_factor``: measured, not assumed: autograd's saved tensors and the gradients of the
  activations in the backward pass over the kept forward outputs;
* ``keep``: what stays resident per participant once its phases end: the freed buffers the
  tuned allocator keeps for reuse (``engine.malloc_tuning``, engine/cpu.py) and oneDNN's
  caches grow with each model's layer sizes: ``KEEP_FACTOR`` x its activations at the
  evaluation batch, summed over participants. Without it the four Digits models' jobs were
  under-predicted by 1.5-2 GB whatever the batch (benchmarks/results/memory_model.md).

FedDF, FedMatch and RHFL also keep every participant's graph in their public step
(``AveragingMethod.public_step``), but they are counted as one: FedDF's measured peak on FCCL+'s
Digits architectures at public batch 512 (4,683 MB) sits below even the one-graph estimate
(6,220 MB), and counting four graphs would ask 3.3x its peak. No job with several graphs and
recompute off has been measured; until one is, the one-graph count is the measured envelope.

``BASE_MB``, ``ACT_FACTOR`` and ``KEEP_FACTOR`` are fitted as upper envelopes of the peak RSS that
``benchmarks/memory_model.py`` measured for real small jobs of several methods and
architectures (benchmarks/results/memory_model.md); the request adds ``HEADROOM`` on top,
so a job is asked for at least 1.25x its measured peak (tests/test_memory_model.py checks
that against fresh runs; tests/test_slurm.py against sacct's MaxRSS under enforcement).

On a GPU (``gpus_per_job: 1``) weights, activations and the data live in device memory; the
host holds the CUDA libraries and the data while it is loaded: ``CUDA_BASE_MB`` + data. That
figure is not measured on this project's CPU machines (no GPU): it is the CUDA runtime's
usual host footprint with a margin, and the SLURM retry doubles it if a cluster disagrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

BASE_MB = 1000.0  # peak RSS of the smallest real jobs, LeNet, MLflow on: 1,001-1,009 MB (benchmarks/results/memory_model.md)
ACT_FACTOR = 1.3  # RSS of the largest training phase / its kept activations' bytes (upper envelope, measured jobs)
KEEP_FACTOR = 0.5  # resident per participant after its phases, x its activations at the evaluation batch (fitted)
HEADROOM = 1.3  # requested = estimate x HEADROOM: >= 1.25x the measured peak (issue 22)
CUDA_BASE_MB = 4096.0  # host RSS of a CUDA job before its data: CUDA runtime + cuDNN/cuBLAS (not measured here)
RETRY_FACTOR = 2  # each SLURM retry (profile `retries`) asks for twice the previous memory
# Under SLURM the job's MaxRSS also counts the Snakemake process that runs it inside the allocation
# (the executor plugin's job step, which parses the workflow and so imports fedshift and torch):
# LeNet jobs read 1,640-1,770 MB in sacct against 996-1,007 MB alone (tests/test_slurm.py,
# benchmarks/results/memory_model.md); the workflow adds this, with a margin, to every request.
WRAPPER_MB = 900.0

OPTIMISER_SLOTS = {"adam": 2, "amsgrad": 3, "sgd": 0, "sgd_momentum": 1}


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak RSS estimate of one job, in MB, by component; ``request_mb(attempt)`` is what SLURM gets."""

    base: float
    data: float
    weights: float
    activations: float

    @property
    def total(self) -> float:
        return self.base + self.data + self.weights + self.activations

    def request_mb(self, attempt: int = 1, step: int = 256, extra_mb: float = 0.0) -> int:
        """HEADROOM x (the estimate + ``extra_mb``: e.g. WRAPPER_MB under SLURM), doubled per retry,
        rounded up to ``step`` MB."""
        mb = HEADROOM * (self.total + extra_mb) * RETRY_FACTOR ** (max(1, int(attempt)) - 1)
        return int(math.ceil(mb / step) * step)

    def describe(self) -> str:
        return (f"{self.total:.0f} MB = base {self.base:.0f} + data {self.data:.0f} + weights {self.weights:.0f} "
                f"+ activations {self.activations:.0f}")


@lru_cache(maxsize=None)
def arch_profile(arch: str, image_shape: Tuple[int, int, int], num_classes: int = 10, norm: str = "default",
                 recompute: bool = True) -> Tuple[float, float]:
    """(weights MB, activation MB per training sample) of ``arch`` at ``image_shape``.

    Counted on torch's meta device from one training-mode forward pass (nothing is
    allocated, so the workflow can call it while it plans; cached per architecture and
    shape): every leaf module's output, 4 bytes an element. With ``recompute`` (activation
    checkpointing, ``engine.recompute``: on for CPU devices) the blocks that
    ``FedModel.run_blocks`` checkpoints keep only their outputs, plus the inner outputs of
    the largest single block while the backward pass recomputes it."""
    import torch

    from .models import create_model

    kwargs = {} if norm == "default" else {"norm": norm}
    with torch.device("meta"):
        model = create_model(arch, num_classes=num_classes, in_channels=image_shape[0], **kwargs)
        x = torch.empty((1, *image_shape))
    out: Dict[int, int] = {}  # id(module) -> output numel

    def hook(module, _inputs, result):
        n = sum(t.numel() for t in (result if isinstance(result, (tuple, list)) else (result,))
                if isinstance(t, torch.Tensor))
        out[id(module)] = out.get(id(module), 0) + n

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    blocks: list = []  # composite children of every sequence run through run_blocks
    real_run_blocks = model.run_blocks

    def run_blocks(seq, inp):
        blocks.extend(m for m in seq if next(m.children(), None) is not None)
        return real_run_blocks(seq, inp)

    model.run_blocks = run_blocks
    try:
        model.train()
        with torch.no_grad():  # meta tensors: the counts do not depend on autograd
            model(x)
    finally:
        for h in handles:
            h.remove()
    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    if not recompute or not blocks:
        per_sample = sum(out.get(id(m), 0) for m in leaves)
    else:
        inside = {id(leaf) for b in blocks for leaf in b.modules()}
        kept = sum(out.get(id(m), 0) for m in leaves if id(m) not in inside) + sum(out.get(id(b), 0) for b in blocks)
        largest = max(sum(out.get(id(leaf), 0) for leaf in b.modules() if next(leaf.children(), None) is None)
                      for b in blocks)
        per_sample = kept + largest
    params = sum(p.numel() for p in model.parameters())
    return params * 4 / 2**20, per_sample * 4 / 2**20


def optimiser_slots(cfg: Mapping) -> int:
    """State tensors per weight of the job's optimiser (Adam/AMSGrad: moments; SGD: momentum)."""
    eng = cfg.get("engine", {}) or {}
    mp = cfg.get("method_params", {}) or {}
    name = str(mp.get("optimizer") or eng.get("optimizer") or "adam").lower()
    if name.startswith("sgd"):
        mom = mp.get("momentum", eng.get("momentum", 0)) or 0
        return OPTIMISER_SLOTS["sgd_momentum"] if float(mom) > 0 else OPTIMISER_SLOTS["sgd"]
    return OPTIMISER_SLOTS.get(name, 2)


@lru_cache(maxsize=None)
def _arrays_mb(folder: Path) -> float:
    """MB of the arrays below ``folder`` (0 when it does not exist yet). Cached: Snakemake sizes
    every job of a grid, and the jobs of one scenario share its partition and public folders."""
    if not folder.is_dir():
        return 0.0
    return sum(f.stat().st_size for f in folder.rglob("*.npy")) / 2**20


def folder_mb(paths: Iterable[Optional[Path]]) -> float:
    """MB of the arrays below ``paths`` (existing folders only): the job's data as it sits in memory."""
    return sum(_arrays_mb(Path(p).resolve()) for p in paths if p is not None)


def estimate(archs: Sequence[str], image_shape: Tuple[int, int, int], *, copies: int = 1, local_batch: int,
             public_batch: int = 0, eval_batch: int = 256, all_graphs: bool = False, optimiser: int = 2,
             data_mb: float = 0.0, num_classes: int = 10, device: str = "cpu", norm: str = "default",
             recompute: bool = True) -> MemoryEstimate:
    """The model above for one job: ``archs`` one per participant (a pretraining job: one);
    ``copies``: the weight copies the method keeps beyond the model (``Method.weight_copies``)."""
    if device.startswith("cuda"):
        return MemoryEstimate(CUDA_BASE_MB, 2 * data_mb, 0.0, 0.0)
    prof = [arch_profile(a, tuple(image_shape), num_classes, norm, recompute) for a in archs]
    slots = 1 + 1 + optimiser + copies + 1  # weights, grads, optimiser, copies, averaging/checkpoint
    weights = sum(w for w, _ in prof) * slots
    per_sample = [a for _, a in prof]
    local = local_batch * max(per_sample)
    public = public_batch * (sum(per_sample) if all_graphs else max(per_sample)) if public_batch else 0.0
    kept = KEEP_FACTOR * eval_batch * sum(per_sample)
    return MemoryEstimate(BASE_MB, data_mb, weights, ACT_FACTOR * max(local, public) + kept)


def _device_of(section: Mapping, gpus: int) -> str:
    dev = str(section.get("device", "auto"))
    if dev == "auto":
        return "cuda" if gpus else "cpu"
    return dev


def _recompute(section: Mapping, device: str) -> bool:
    from .engine.config import recompute_on

    import torch

    return recompute_on(section.get("recompute", "auto"), torch.device("cuda" if device.startswith("cuda") else "cpu"))


def job_estimate(cfg: Mapping, gpus: int = 0, root: Path = Path(".")) -> MemoryEstimate:
    """The estimate of one resolved job config (``kind: federate`` or ``pretrain``, as the
    workflow plans them): its scenario's image shape and classes, architectures, batches, method,
    optimiser, data folders, device."""
    from .data import SCENARIOS

    spec = SCENARIOS.get(cfg["scenario"])
    image_shape, num_classes = tuple(spec.image_shape), spec.num_classes
    paths = cfg.get("paths", {}) or {}
    data_mb = folder_mb([root / paths["partition"] if paths.get("partition") else None,
                         root / paths["public"] if paths.get("public") else None])
    if cfg.get("kind") == "pretrain":
        p = cfg["pretrain"]
        dev = _device_of(p, gpus)
        return estimate([cfg["arch"]], image_shape, copies=0, local_batch=int(p["batch"]),
                        eval_batch=int(p.get("eval_batch", 256)), optimiser=optimiser_slots({"engine": p}),
                        data_mb=data_mb, num_classes=num_classes, device=dev,
                        norm=str(p.get("norm", "default")), recompute=_recompute(p, dev))
    from .methods import METHODS

    eng = cfg["engine"]
    method = cfg.get("base_method", cfg.get("method"))
    cls = METHODS.get(method, key="method")
    archs = list(cfg["archs"])
    dev = _device_of(eng, gpus)
    local_batch = int(eng["local_batch"])
    if cls.steps_on_peer_batches:  # FedH2L's mutual step: one model on every peer's batch
        local_batch *= len(archs)
    uses_public = bool(paths.get("public")) and cls.uses_public
    graphs = cls.public_graphs if cls.public_graphs != "engine" else str(eng.get("public_graphs", "one"))
    return estimate(archs, image_shape, copies=cls.weight_copies, local_batch=local_batch,
                    public_batch=int(eng["public_batch"]) if uses_public else 0,
                    eval_batch=int(eng.get("eval_batch", 256)),
                    all_graphs=uses_public and graphs == "all",
                    optimiser=optimiser_slots(cfg), data_mb=data_mb, num_classes=num_classes,
                    device=dev, norm=str(eng.get("norm", "default")), recompute=_recompute(eng, dev))


def slurm_mem_mb(cfg: Mapping, attempt: int = 1, gpus: int = 0) -> int:
    """What the workflow asks SLURM for (``mem_mb``): the job's estimate plus the Snakemake
    process inside the allocation (``WRAPPER_MB``), with ``HEADROOM``, doubled per retry."""
    return job_estimate(cfg, gpus=gpus).request_mb(attempt, extra_mb=WRAPPER_MB)
