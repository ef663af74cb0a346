"""Engine speed levers, each a switch under ``engine.`` (defaults in :mod:`.config`).

The small models of these benchmarks leave a GPU idle between kernel launches
(../notes: ~0.5% of an H100's arithmetic). The levers attack that overhead without
changing what is computed; each one falls back to the plain eager path where it does
not apply, so a config that names them runs anywhere:

* ``compile: off | default | reduce-overhead`` - ``nn.Module.compile`` on every
  participant's model (in place: parameter names, checkpoints and the optimiser are
  unchanged), so local steps, collaborative steps and evaluation run compiled.
  ``reduce-overhead`` adds CUDA graphs (measured 2.8-3.1x per step on an H100); on the
  CPU it is the same as ``default`` (inductor, 1.1-1.5x per step after 40-160 s of
  compilation; inductor's layout optimisation is turned off there: with it, torch 2.13
  computed wrong convolution weight gradients on the CPU). The last partial batch of an epoch runs eagerly
  (``torch.compiler.set_stance("force_eager")``): no recompilation, no second graph.
* ``cuda_graphs: true`` - without compile, the participant's training-mode forward and
  backward at the full local batch are captured once with
  ``torch.cuda.make_graphed_callables`` and replayed inside :meth:`Federation.train_local`
  (measured 1.4x for EfficientNet-B0). Any other call (another shape, eval mode, no
  grad, the collaborative step) runs the model's own forward. CUDA only; ignored on CPU.
  Requires that the method's local loss calls the participant's model once per step
  (a second call would overwrite the first call's static output).
* ``overlap_participants: true`` - :meth:`Federation.train_participants` interleaves the
  participants' local steps, one step each in turn, each participant on its own CUDA
  stream (measured 1.2x for the four Digits models). Same arithmetic as one after
  another: each participant's data order comes from its own generator; dropout masks
  come from the shared RNG, so models with dropout are equal in distribution only. On
  the CPU the interleaving runs without streams (no gain, same results).
* ``amp: off | bf16 | auto`` - bf16 autocast of the local step on CUDA; ``auto`` uses
  :data:`AMP_BY_FAMILY` (measured: bf16 slows EfficientNet and MobileNet, helps ResNets a
  little). CPU bf16 is a separate CPU lever (emulated bf16 is 10x slower without AVX-512
  BF16), so here it is ignored on the CPU with a warning.
* ``cudnn_benchmark: true`` - ``torch.backends.cudnn.benchmark`` (autotuned convolutions:
  a slower first round, faster later ones).
* metrics stay on the device: :meth:`Federation.train_participants` reads every
  participant's loss in one host transfer per call.
* packed runs: :func:`slot_device` maps ``device: cuda`` to ``cuda:<FEDSHIFT_GPU_SLOT mod
  GPUs>`` so k jobs share or spread over the node's GPUs (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

log = logging.getLogger(__name__)

COMPILE_MODES = ("off", "default", "reduce-overhead")
AMP_MODES = ("off", "bf16", "auto")
FUSED_MODES = ("off", "on", "auto")

# engine.amp: auto -> autocast dtype per model family on CUDA (../notes/gpu-h100.md, one H100:
# bf16 autocast slowed EfficientNet-B0 and MobileNetV2, helped ResNet10 slightly). Families not
# listed were not measured: off.
AMP_BY_FAMILY: Dict[str, str] = {
    "resnet": "bf16",
    "efficientnet": "off",
    "mobilenet": "off",
}

SLOT_ENV = "FEDSHIFT_GPU_SLOT"


def model_family(arch: str) -> str:
    """'resnet10' -> 'resnet', 'efficientnet_b0' -> 'efficientnet', 'mobilenet_v2' -> 'mobilenet'."""
    m = re.match(r"[a-z]+", arch.lower())
    return m.group(0) if m else arch


def amp_dtype(amp: str, arch: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype of a participant's local step, or None (full precision)."""
    if amp not in AMP_MODES:
        raise ValueError(f"engine.amp must be one of {AMP_MODES}, got {amp!r}")
    if amp == "off" or device.type != "cuda":
        return None
    mode = AMP_BY_FAMILY.get(model_family(arch), "off") if amp == "auto" else amp
    return torch.bfloat16 if mode == "bf16" else None


def slot_device(spec: str, env: Optional[Dict[str, str]] = None,
                device_count: Optional[Callable[[], int]] = None) -> str:
    """Packed runs: ``cuda`` (or ``auto`` on a GPU node) -> ``cuda:<slot mod GPUs>``.

    The slot comes from ``FEDSHIFT_GPU_SLOT`` (set per job by whoever packs k jobs per
    node). Without it, or with an explicit index (``cuda:1``), the spec is returned as it
    is: under SLURM, ``--gres`` sets CUDA_VISIBLE_DEVICES and ``cuda`` is the job's GPU.
    """
    env = os.environ if env is None else env
    slot = env.get(SLOT_ENV)
    if slot in (None, "") or spec not in ("cuda", "auto"):
        return spec
    try:
        index = int(slot)
    except ValueError:
        raise ValueError(f"{SLOT_ENV} must be a non-negative integer, got {slot!r}") from None
    if index < 0:
        raise ValueError(f"{SLOT_ENV} must be a non-negative integer, got {slot!r}")
    count = (device_count or torch.cuda.device_count)()
    if count == 0:
        if spec == "cuda":
            raise ValueError(f"device: cuda with {SLOT_ENV}={slot}, but no CUDA device is visible")
        return spec
    return f"cuda:{index % count}"


# ----------------------------------------------------------- interleaving
class _NoStream:
    """Stand-in for a CUDA stream on the CPU: waits are no-ops, the context does nothing."""

    def wait_stream(self, other) -> None:
        pass


def interleave(steppers: Sequence[Iterator], streams: Optional[Sequence] = None,
               use_stream: Callable = lambda s: contextlib.nullcontext(), current=None) -> List:
    """Advance generators one step each in turn until all are exhausted; return their return values.

    Generator i runs inside ``use_stream(streams[i])``; each stream first waits for the
    ``current`` stream (work queued before, e.g. the data), and ``current`` waits for all
    of them at the end, so the caller sees finished results on its own stream.
    """
    n = len(steppers)
    streams = list(streams) if streams is not None else [_NoStream() for _ in range(n)]
    current = current if current is not None else _NoStream()
    for s in streams:
        s.wait_stream(current)
    results: List = [None] * n
    live = list(range(n))
    while live:
        still = []
        for i in live:
            with use_stream(streams[i]):
                try:
                    next(steppers[i])
                    still.append(i)
                except StopIteration as stop:
                    results[i] = stop.value
        live = still
    for s in streams:
        current.wait_stream(s)
    return results


def drive(stepper: Iterator):
    """Run a step generator to the end; its return value."""
    while True:
        try:
            next(stepper)
        except StopIteration as stop:
            return stop.value


# ------------------------------------------------------------------ levers
class _GraphedForward:
    """A participant's forward under ``engine.cuda_graphs``: the captured graph for the local
    step's shape, the model's own forward for anything else.

    A deep copy (teachers, frozen copies) gets the class's plain forward bound to the copy:
    a copied closure would run the original model's graph and weights.
    """

    def __init__(self, levers: "EngineLevers", model: torch.nn.Module, shape: Tuple[int, ...], graphed, orig):
        self.levers, self.model, self.shape, self.graphed, self.orig = levers, model, shape, graphed, orig

    def __call__(self, *args, **kwargs):
        m = self.model
        if (self.levers._in_local.get(id(m)) and m.training and torch.is_grad_enabled() and not kwargs
                and len(args) == 1 and tuple(args[0].shape) == self.shape):
            return self.graphed(*args)
        return self.orig(*args, **kwargs)

    def __deepcopy__(self, memo):
        copied = memo.get(id(self.model))
        if copied is None:  # the forward copied on its own: keep pointing at the original
            return self
        return functools.partial(type(self.model).forward, copied)


class EngineLevers:
    """The speed switches of one Federation, applied to its participants' models and steps."""

    def __init__(self, cfg, device: torch.device):
        self.device = device
        self.compile = getattr(cfg, "compile", "off")
        self.cuda_graphs = bool(getattr(cfg, "cuda_graphs", False))
        self.overlap = bool(getattr(cfg, "overlap_participants", False))
        self.amp = getattr(cfg, "amp", "off")
        self.cudnn_benchmark = bool(getattr(cfg, "cudnn_benchmark", False))
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"engine.compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"engine.amp must be one of {AMP_MODES}, got {self.amp!r}")
        self.cuda = device.type == "cuda"
        if self.amp != "off" and not self.cuda:
            log.warning("engine.amp=%s applies to CUDA only; running in full precision on %s", self.amp, device)
        if self.cuda_graphs and not self.cuda:
            log.warning("engine.cuda_graphs applies to CUDA only; running eagerly on %s", device)
        if self.cuda_graphs and self.compile != "off":
            log.warning("engine.cuda_graphs is ignored with engine.compile=%s (compile captures its own graphs)",
                        self.compile)
        self._graphed: Dict[int, Tuple] = {}  # id(model) -> (input shape, graphed forward) or None
        self._in_local: Dict[int, bool] = {}

    @property
    def active(self) -> bool:
        return any((self.compile != "off", self.cuda_graphs and self.cuda, self.overlap,
                    self.amp != "off" and self.cuda, self.cudnn_benchmark and self.cuda))

    # -- models ------------------------------------------------------------------
    def prepare(self, models: Sequence[torch.nn.Module]) -> None:
        """Apply the model-level switches (cuDNN autotuning, compile) once, before training."""
        if self.cudnn_benchmark and self.cuda:
            torch.backends.cudnn.benchmark = True
        if self.compile != "off":
            # Module.compile compiles the shared Module._call_impl: every architecture x mode x
            # shape is one cache entry, so the default limit (8) would silently fall back to eager.
            import torch._dynamo.config as dynamo_cfg

            need = 8 * max(len(models), 1) + 8
            dynamo_cfg.recompile_limit = max(dynamo_cfg.recompile_limit, need)
            dynamo_cfg.accumulated_recompile_limit = max(dynamo_cfg.accumulated_recompile_limit, 4 * need)
            if not self.cuda:
                # torch 2.13, CPU: inductor's layout optimisation (channels_last convolutions)
                # returned ZERO weight gradients for the first conv of LeNet and wrong ones for the
                # second (tests/test_levers.py catches it); without it compiled == eager to 1e-8.
                import torch._inductor.config as inductor_cfg

                inductor_cfg.layout_optimization = False
            mode = None if self.compile == "default" else self.compile
            if mode == "reduce-overhead" and not self.cuda:
                mode = None  # CUDA graphs need CUDA: plain inductor on the CPU
            for m in models:
                if getattr(m, "_compiled_call_impl", None) is not None:
                    continue  # the same model object twice (simulations sharing one model)
                m.compile(mode=mode, dynamic=False)
                fwf = getattr(type(m), "forward_with_features", None)
                if fwf is not None:  # the collaborative steps' entry point (FCCL, FedMD...)
                    # partial(compiled unbound function, module): deepcopy (teachers, frozen copies)
                    # rebinds it to the copy, where a compiled bound method would run the original.
                    m.forward_with_features = functools.partial(torch.compile(fwf, mode=mode, dynamic=False), m)

    def _capture(self, model: torch.nn.Module, x: torch.Tensor) -> None:
        """Hand-captured CUDA graph of the model's train-mode forward+backward at x's shape."""
        key = id(model)
        if key in self._graphed:
            return
        if any(b.requires_grad for b in model.buffers()) or model._forward_hooks or model._forward_pre_hooks:
            log.warning("engine.cuda_graphs: %s has hooks or grad buffers; not graphed", type(model).__name__)
            self._graphed[key] = None
            return
        orig = model.forward
        torch.cuda.synchronize(self.device)
        torch.cuda.make_graphed_callables(model, (x.detach().clone(),))
        graphed = model.forward  # make_graphed_callables installed it on the instance
        model.forward = _GraphedForward(self, model, tuple(x.shape), graphed, orig)
        self._graphed[key] = (tuple(x.shape), graphed)

    @contextlib.contextmanager
    def local_step(self, model: torch.nn.Module, arch: str, x: torch.Tensor, full_batch: int):
        """Context of one local training step's forward and loss (not its backward)."""
        partial = len(x) < full_batch
        with contextlib.ExitStack() as stack:
            if self.compile != "off":
                if partial:
                    stack.enter_context(torch.compiler.set_stance("force_eager"))
                elif self.compile == "reduce-overhead" and self.cuda:
                    torch.compiler.cudagraph_mark_step_begin()
            dtype = amp_dtype(self.amp, arch, self.device)
            if dtype is not None:
                # cache off: required with graphed callables (captured below, inside autocast)
                stack.enter_context(torch.autocast("cuda", dtype=dtype, cache_enabled=False))
            if self.compile == "off" and self.cuda_graphs and self.cuda and not partial:
                self._capture(model, x)
                self._in_local[id(model)] = True
                stack.callback(self._in_local.pop, id(model), None)
            yield

    # -- participants ---------------------------------------------------------------
    def run_interleaved(self, steppers: Sequence[Iterator]) -> List:
        """Run participants' step generators: interleaved (own CUDA streams on a GPU) or one by one."""
        if not self.overlap:
            return [drive(s) for s in steppers]
        if not self.cuda:
            return interleave(steppers)
        streams = [torch.cuda.Stream(self.device) for _ in steppers]
        results = interleave(steppers, streams, torch.cuda.stream, torch.cuda.current_stream(self.device))
        main = torch.cuda.current_stream(self.device)
        for r in results:  # tensors made on a side stream, used and freed on the main one
            for t in (r if isinstance(r, tuple) else (r,)):
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(main)
        return results
