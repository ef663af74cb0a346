"""The resources a job needs, from a model of the job: what SLURM is asked for (``mem_mb``, ``runtime``).

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

Many-client grids (FedMMD/FedFusion's 100 MNIST shards; issue 39 point 3): under
``engine.server_model`` the K stateless clients share one working model, so weights and the
kept activations are those of one model, whatever K; the server step (issue 49) receives each of
the round's m trained states, so m weight copies are counted on top (m = the sampled clients, 10
of FedFusion's 100). ``keep`` is counted once per distinct architecture (the allocator's
reused buffers and oneDNN's primitive caches are per layer shape: ten identical LeNets keep what
one keeps). The batches are those the job really runs: ``local_batch`` at most the largest
client's private samples, ``public_batch`` at most the public set, ``eval_batch`` at most the
pooled test set (engine/federation.py clamps them), read off the built manifests when present.

A request above ``MAX_REQUEST_MB`` (``FEDSHIFT_MAX_MEM_MB``, default 64 GB: the nodes the
papers' grids were sized for) is capped there, with one warning line naming the job; a plugin
model that cannot run on the meta device is counted by one real forward pass on the CPU at
batch 2, and if that fails too by ``FALLBACK_PROFILE`` (one warning line each).

On a GPU (``gpus_per_job: 1``) weights, activations and the data live in device memory; the
host holds the CUDA libraries and the data while it is loaded: ``CUDA_BASE_MB`` + data. That
figure is not measured on this project's CPU machines (no GPU): it is the CUDA runtime's
usual host footprint with a margin, and the SLURM retry doubles it if a cluster disagrees.

Run time (``runtime``, minutes; :func:`slurm_runtime`): rounds x epochs x participants at the demo's
measured cost on one CPU thread (``EPOCH_MINUTES`` per participant-epoch at 28x28, scaled by pixels,
colour counted at a third), divided by the square root of the job's threads; the stepwise methods
(FedH2L / AGG / IND, :class:`~fedshift.methods.stepwise.StepwiseMethod`) cost ``STEP_MINUTES`` per round
of four models (a round is one minibatch step per node, not an epoch). The request is twice the
estimate, at least ``MIN_RUNTIME_MINUTES``, doubled on each retry. On a GPU the real time is far
below: override with ``--set-resources federate:runtime=60`` where a cluster's queues favour short
requests.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Tuple

from .errors import ConfigError

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

# The largest request the workflow makes (MB): larger estimates are capped here with a warning. A
# 64 GB node is the common size of the clusters the paper grids were sized for; set
# FEDSHIFT_MAX_MEM_MB for yours (or --set-resources federate:mem_mb=N for one rule).
MAX_REQUEST_MB = 65536
# (weights MB, activation MB per sample) of a model counted neither on the meta device nor on the CPU:
# a ResNet-18 at 3x32x32 (11.2 M parameters, ~2.4 MB of outputs per sample), larger than every
# built-in CNN of the papers' grids, so a plugin is not under-asked.
FALLBACK_PROFILE = (42.7, 2.4)

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


def _warn(msg: str) -> None:
    print(f"fedshift: warning: {msg}", file=sys.stderr)


@lru_cache(maxsize=None)
def arch_profile(arch: str, image_shape: Tuple[int, int, int], num_classes: int = 10, norm: str = "default",
                 recompute: bool = True) -> Tuple[float, float]:
    """:func:`count_profile` on the meta device; a model that cannot run there (a plugin's custom
    op, a data-dependent shape) is counted on the CPU at batch 2, else ``FALLBACK_PROFILE``."""
    try:
        return count_profile(arch, image_shape, num_classes, norm, recompute, "meta")
    except Exception as exc:  # noqa: BLE001 - any failure of a plugin's forward
        first = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
    try:
        prof = count_profile(arch, image_shape, num_classes, norm, recompute, "cpu")
        _warn(f"model {arch!r} cannot run on torch's meta device ({first}); its memory is counted by one "
              "forward pass on the CPU")
        return prof
    except Exception as exc:  # noqa: BLE001
        _warn(f"model {arch!r} cannot be counted on the meta device ({first}) nor on the CPU "
              f"({type(exc).__name__}); its memory is estimated as {FALLBACK_PROFILE[0]} MB of weights and "
              f"{FALLBACK_PROFILE[1]} MB of activations per sample (resources.FALLBACK_PROFILE)")
        return FALLBACK_PROFILE


def count_profile(arch: str, image_shape: Tuple[int, int, int], num_classes: int = 10, norm: str = "default",
                  recompute: bool = True, device: str = "meta") -> Tuple[float, float]:
    """(weights MB, activation MB per training sample) of ``arch`` at ``image_shape``.

    Counted on torch's meta ``device`` from one training-mode forward pass (nothing is
    allocated, so the workflow can call it while it plans; :func:`arch_profile` caches it per
    architecture and shape): every leaf module's output, 4 bytes an element. With ``recompute`` (activation
    checkpointing, ``engine.recompute``: on for CPU devices) the blocks that
    ``FedModel.run_blocks`` checkpoints keep only their outputs, plus the inner outputs of
    the largest single block while the backward pass recomputes it."""
    import torch

    from .models import create_model
    from .models.activations import model_activations

    kwargs = {} if norm == "default" else {"norm": norm}
    with torch.device(device):
        model = create_model(arch, num_classes=num_classes, in_channels=image_shape[0], **kwargs)
        n = 1 if device == "meta" else 2  # a real BatchNorm1d cannot train on one sample
        x = torch.zeros((n, *image_shape))
    model.train()
    full, checkpointed = model_activations(model, x)  # models/activations.py
    params = sum(p.numel() for p in model.parameters())
    return params * 4 / 2**20, (checkpointed if recompute else full)


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
             recompute: bool = True, recompute_budget_mb: int = 0) -> MemoryEstimate:
    """The model above for one job: ``archs`` one per resident model (a pretraining job, or the
    shared model of ``engine.server_model``: one); ``copies``: the weight copies the method keeps
    beyond the model (``Method.weight_copies``). ``keep`` is counted once per distinct architecture.
    ``recompute_budget_mb`` (``engine.recompute_budget_mb`` under ``recompute: auto``; 0: every batch
    checkpointed): a batch whose activations fit it trains without checkpointing (:func:`batch_activations`)."""
    if device.startswith("cuda"):
        return MemoryEstimate(CUDA_BASE_MB, 2 * data_mb, 0.0, 0.0)
    prof = [arch_profile(a, tuple(image_shape), num_classes, norm, recompute) for a in archs]
    full = [arch_profile(a, tuple(image_shape), num_classes, norm, False)[1] for a in archs] if recompute else \
        [a for _, a in prof]
    slots = 1 + 1 + optimiser + copies + 1  # weights, grads, optimiser, copies, averaging/checkpoint
    weights = sum(w for w, _ in prof) * slots

    def act(i: int, batch: int) -> float:
        return batch_activations(full[i], prof[i][1], batch, recompute, recompute_budget_mb)

    n = range(len(archs))
    local = max(act(i, local_batch) for i in n)
    public = 0.0
    if public_batch and all_graphs:
        public = sum(act(i, public_batch) for i in n)
    elif public_batch:  # one graph, plus the checkpointed participants' graphs kept from the first pass
        ckpt = [i for i in n if recompute and prof[i][1] < full[i]
                and (not recompute_budget_mb or full[i] * public_batch > recompute_budget_mb)]
        held = act(n[-1], public_batch)  # the last participant's graph, then the others' while the budget holds
        for i in ckpt:
            if i != n[-1] and (not recompute_budget_mb or held + act(i, public_batch) <= recompute_budget_mb):
                held += act(i, public_batch)
        public = max(held, max(act(i, public_batch) for i in n))
    kept = KEEP_FACTOR * eval_batch * sum(a for _, a in dict(zip(archs, prof)).values())
    return MemoryEstimate(BASE_MB, data_mb, weights, ACT_FACTOR * max(local, public) + kept)


def batch_activations(full: float, checkpointed: float, batch: int, recompute: bool, budget_mb: int) -> float:
    """MB of one training batch's counted activations: ``full`` / ``checkpointed`` per sample (float32,
    :func:`count_profile` without / with recompute). Under a budget (``engine.recompute_budget_mb``) a
    batch that fits trains unchecked; one that does not is checkpointed, unless it fits at half size on a
    node that trains in bf16 (``engine.bf16_train``, resolved per machine): the larger of the two counts,
    since the planning machine does not know the node's CPU kind."""
    whole = full * batch
    if not recompute:
        return whole
    if budget_mb <= 0:
        return checkpointed * batch
    if whole <= budget_mb:
        return whole
    on_bf16 = whole / 2 if whole / 2 <= budget_mb else checkpointed * batch / 2
    return max(checkpointed * batch, on_bf16)


def _budget(section: Mapping) -> int:
    """``recompute_budget_mb`` where ``recompute: auto`` applies it, else 0 (every batch checkpointed)."""
    if section.get("recompute", "auto") != "auto":
        return 0
    from .engine.config import EngineConfig

    return int(section.get("recompute_budget_mb", EngineConfig.recompute_budget_mb))


def _device_of(section: Mapping, gpus: int) -> str:
    dev = str(section.get("device", "auto"))
    if dev == "auto":
        return "cuda" if gpus else "cpu"
    return dev


def _recompute(section: Mapping, device: str) -> bool:
    from .engine.config import recompute_on

    import torch

    return recompute_on(section.get("recompute", "auto"), torch.device("cuda" if device.startswith("cuda") else "cpu"))


@lru_cache(maxsize=None)
def _manifest_sizes(folder: Path) -> Tuple[int, int, int]:
    """(largest participant's private samples, pooled test samples, public samples) read off a
    built partition or public-set ``manifest.json``; 0 where unknown (not built yet)."""
    try:
        m = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return 0, 0, 0
    if m.get("kind") == "public":
        return 0, 0, int(((m.get("splits") or {}).get("train") or {}).get("n", 0))
    parts = (m.get("participants") or {}).values()
    private = max((int(((p.get("splits") or {}).get("private") or {}).get("n", 0)) for p in parts), default=0)
    test = sum(int(((p.get("splits") or {}).get("test") or {}).get("n", 0)) for p in parts)
    return private, test, 0


def _clamped(batch: int, n: int) -> int:
    """The batch a job really runs: at most the ``n`` samples it batches (0: unknown, kept)."""
    return min(batch, n) if n > 0 else batch


def job_estimate(cfg: Mapping, gpus: int = 0, root: Path = Path(".")) -> MemoryEstimate:
    """The estimate of one resolved job config (``kind: federate`` or ``pretrain``, as the
    workflow plans them): its scenario's image shape and classes, architectures, batches (clamped
    to the built data), method, optimiser, data folders, device, ``engine.server_model``."""
    from .data import SCENARIOS

    spec = SCENARIOS.get(cfg["scenario"])
    image_shape, num_classes = tuple(spec.image_shape), spec.num_classes
    paths = cfg.get("paths", {}) or {}
    partition = (root / paths["partition"]).resolve() if paths.get("partition") else None
    public = (root / paths["public"]).resolve() if paths.get("public") else None
    data_mb = folder_mb([partition, public])
    private_n, test_n, _ = _manifest_sizes(partition) if partition else (0, 0, 0)
    if cfg.get("kind") == "pretrain":
        p = cfg["pretrain"]
        dev = _device_of(p, gpus)
        return estimate([cfg["arch"]], image_shape, copies=0, local_batch=_clamped(int(p["batch"]), private_n),
                        eval_batch=_clamped(int(p.get("eval_batch", 256)), test_n),
                        optimiser=optimiser_slots({"engine": p}),
                        data_mb=data_mb, num_classes=num_classes, device=dev,
                        norm=str(p.get("norm", "default")), recompute=_recompute(p, dev))
    from .methods import METHODS

    eng = cfg["engine"]
    method = cfg.get("base_method", cfg.get("method"))
    cls = METHODS.get(method, key="method")
    archs = list(cfg["archs"])
    copies = cls.weight_copies
    if eng.get("server_model"):  # stateless clients share one working model: memory flat in K ...
        # ... but the server step gets every trained client's state: the round's clients, one copy each
        k, fraction = len(archs), float(eng.get("client_fraction") or 0.0)
        m = int(eng.get("clients_per_round") or 0) or (max(int(math.floor(fraction * k + 0.5)), 1) if fraction else k)
        copies += min(m, k)
        archs = archs[:1]
    dev = _device_of(eng, gpus)
    local_batch = _clamped(int(eng["local_batch"]), private_n)
    if cls.steps_on_peer_batches:  # FedH2L's mutual step: one model on every peer's batch
        local_batch *= len(archs)
    uses_public = bool(paths.get("public")) and cls.uses_public
    public_n = _manifest_sizes(public)[2] if public and uses_public else 0
    graphs = cls.public_graphs if cls.public_graphs != "engine" else str(eng.get("public_graphs", "one"))
    return estimate(archs, image_shape, copies=copies, local_batch=local_batch,
                    public_batch=_clamped(int(eng["public_batch"]), public_n) if uses_public else 0,
                    eval_batch=_clamped(int(eng.get("eval_batch", 256)), test_n),
                    all_graphs=uses_public and graphs == "all",
                    optimiser=optimiser_slots(cfg), data_mb=data_mb, num_classes=num_classes,
                    device=dev, norm=str(eng.get("norm", "default")), recompute=_recompute(eng, dev),
                    recompute_budget_mb=_budget(eng))


def max_request_mb() -> int:
    """The ceiling of a request: ``FEDSHIFT_MAX_MEM_MB`` or ``MAX_REQUEST_MB``."""
    text = os.environ.get("FEDSHIFT_MAX_MEM_MB", "")
    if not text:
        return MAX_REQUEST_MB
    if not text.isdigit() or int(text) < 1024:
        raise ConfigError(f"FEDSHIFT_MAX_MEM_MB={text!r}: expected a whole number of MB, at least 1024")
    return int(text)


_CAPPED: set = set()  # jobs already warned about (Snakemake asks for a job's resources more than once)


def slurm_mem_mb(cfg: Mapping, attempt: int = 1, gpus: int = 0) -> int:
    """What the workflow asks SLURM for (``mem_mb``): the job's estimate plus the Snakemake
    process inside the allocation (``WRAPPER_MB``), with ``HEADROOM``, doubled per retry, at most
    :func:`max_request_mb` (one warning line per job when capped)."""
    est = job_estimate(cfg, gpus=gpus)
    mb, ceiling = est.request_mb(attempt, extra_mb=WRAPPER_MB), max_request_mb()
    if mb <= ceiling:
        return mb
    name = cfg.get("run_name", cfg.get("kind", "job"))
    if name not in _CAPPED:
        _CAPPED.add(name)
        _warn(f"{name}: memory request {mb} MB (estimated peak {est.describe()}) capped at {ceiling} MB "
              "(FEDSHIFT_MAX_MEM_MB; per rule: --set-resources federate:mem_mb=N)")
    return ceiling


# ----------------------------------------------------------------------------- run time

EPOCH_MINUTES = 4 / 60  # one participant-epoch at 28x28 on one CPU thread, measured on the demo
# One round of the stepwise methods (four LeNets at 28x28, one step each + FedH2L's mutual step) on one
# CPU thread, evaluation included: a FedH2L Table II run of 10,000 rounds takes 635 CPU-s, 17-20 min of
# wall time on a loaded machine (docs/fedh2l.md); AGG/IND 192-203 CPU-s. Counting its rounds as epochs
# asked SLURM for 7.4 days per FedH2L job.
STEP_MINUTES = 0.12 / 60
MIN_RUNTIME_MINUTES = 15  # the smallest request: start-up, data loading and writing outputs included


def pixel_scale(scenario: str) -> float:
    """A scenario's cost per epoch relative to 28x28 grey images (at least 1; colour channels cost less
    than pixels: a third each)."""
    from .data import SCENARIOS

    c, h, w = SCENARIOS.get(scenario).image_shape
    return max(1.0, c * h * w / (1 * 28 * 28) / 3)


def is_stepwise(method: str) -> bool:
    """Whether a round of ``method`` is one minibatch step per node (FedH2L, AGG, IND), not local epochs."""
    from .methods import METHODS
    from .methods.stepwise import StepwiseMethod

    cls = METHODS.get(method, key="method")
    return isinstance(cls, type) and issubclass(cls, StepwiseMethod)


def runtime_minutes(cfg: Mapping, threads: int) -> float:
    """Estimated minutes of one resolved job config on ``threads`` CPU threads: a ``pretrain`` job's
    epochs, or a federated job's (federate, tune candidate) rounds x (local + public epochs) x
    participants, each round priced per step for a stepwise method."""
    if cfg.get("kind") == "pretrain":
        return cfg["pretrain"]["epochs"] * EPOCH_MINUTES * pixel_scale(cfg["scenario"]) / threads ** 0.5
    e = cfg["engine"]
    scale = len(cfg["archs"]) * pixel_scale(cfg["scenario"]) / threads ** 0.5
    if is_stepwise(cfg.get("base_method", cfg.get("method"))):  # a round is one minibatch step per node
        return e["rounds"] * STEP_MINUTES / 4 * scale
    return e["rounds"] * (e["local_epochs"] + e.get("public_epochs", 1)) * EPOCH_MINUTES * scale


def slurm_runtime(cfg: Mapping, attempt: int = 1, threads: int = 1) -> int:
    """What the workflow asks SLURM for (``runtime``, minutes): twice :func:`runtime_minutes`, at least
    ``MIN_RUNTIME_MINUTES``, doubled per retry."""
    est = runtime_minutes(cfg, threads)
    return int(max(MIN_RUNTIME_MINUTES, math.ceil(2 * est)) * 2 ** (attempt - 1))
