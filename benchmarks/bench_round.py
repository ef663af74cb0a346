"""Where one communication round of a method spends its time (not a test).

Builds the federation of a scenario and structure from ``build/`` (run ``dvc repro``
first), runs one untimed warm-up round, then times ``--rounds`` rounds of
``Method.run_round`` and splits their wall time, exclusively (a nested phase is
charged to itself, not to its caller), into

* ``forward``: every model call (participants, teachers, frozen copies), from the
  outermost ``nn.Module.__call__`` or ``FedModel.forward_with_features`` to its end;
* ``backward``: ``Tensor.backward``;
* ``optimizer``: ``Optimizer.step`` and ``zero_grad``;
* ``augmentation``: the public batches' augmentation (``data.augment.augment``);
* ``loss math``: the loss functions and collaborative targets the methods call
  (``fedshift.losses``, ``collaborative_targets``, ``ensemble_target``, cross-entropy);
* ``snapshots``: teacher copies and parameter averaging;
* ``other``: everything else (Python glue, batch slicing and normalisation, data
  shuffling, host syncs).

The cross-correlation matrices of FCCL/FCCL+ (``after_round``) are evaluation, timed
apart and excluded from the round's total. On CUDA every phase boundary is
synchronised, so GPU time lands in the phase that queued it (this adds a little
overhead of its own). The engine settings come from the ``engine`` block of
``--grid`` (default ``params/experiments.yaml``); models start from random weights
(the time of a round does not depend on them), whatever the method's ``init``.

    PYTHONPATH=src python benchmarks/bench_round.py --method fccl_plus --structures demo_mixed homo_lenet
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.optim.optimizer as optim_hooks
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedshift.config import resolve  # noqa: E402
from fedshift.data.loading import load_federated  # noqa: E402
from fedshift.engine.config import EngineConfig  # noqa: E402
from fedshift.engine.federation import Federation, resolve_device  # noqa: E402
from fedshift.runner import build_models  # noqa: E402
from fedshift.methods import create_method  # noqa: E402
from fedshift.models import FedModel, get_structure  # noqa: E402

PHASES = ["forward", "backward", "optimizer", "augmentation", "loss math", "snapshots", "other"]


class PhaseTimer:
    """Exclusive wall time per phase: a stack of phases, time charged to the top one."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.stack: List[str] = []
        self.times: Dict[str, float] = defaultdict(float)
        self.active = False
        self.mark = time.perf_counter()

    def _tick(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self.active:
            self.times[self.stack[-1] if self.stack else "other"] += now - self.mark
        self.mark = now

    def enter(self, phase: str) -> None:
        self._tick()
        self.stack.append(phase)

    def exit(self) -> None:
        self._tick()
        self.stack.pop()

    @contextlib.contextmanager
    def phase(self, name: str):
        self.enter(name)
        try:
            yield
        finally:
            self.exit()

    def wrap(self, fn: Callable, name: str) -> Callable:
        def timed(*a, **k):
            with self.phase(name):
                return fn(*a, **k)

        timed.__wrapped__ = fn
        return timed


def instrument(timer: PhaseTimer) -> Callable[[], None]:
    """Patch the framework and the method modules; returns a function that undoes it."""
    import torch.nn.functional as F

    import fedshift.engine.federation as fed_mod
    import fedshift.methods.fccl as fccl_mod
    import fedshift.methods.fccl_plus as plus_mod
    import fedshift.methods.feddf as df_mod
    import fedshift.methods.homogeneous as homo_mod

    undo = []

    def patch(obj, attr, name):
        orig = getattr(obj, attr)
        setattr(obj, attr, timer.wrap(orig, name))
        undo.append(lambda: setattr(obj, attr, orig))

    depth = [0]

    def pre(module, args):
        if depth[0] == 0:
            timer.enter("forward")
        depth[0] += 1

    def post(module, args, out):
        depth[0] -= 1
        if depth[0] == 0:
            timer.exit()

    handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
               torch.nn.modules.module.register_module_forward_hook(post)]
    undo.append(lambda: [h.remove() for h in handles])

    orig_fwf = FedModel.forward_with_features

    def fwf(self, x):
        pre(self, (x,))
        try:
            return orig_fwf(self, x)
        finally:
            post(self, (x,), None)

    FedModel.forward_with_features = fwf
    undo.append(lambda: setattr(FedModel, "forward_with_features", orig_fwf))
    patch(torch.Tensor, "backward", "backward")
    patch(torch.optim.Optimizer, "zero_grad", "optimizer")
    step_handles = [optim_hooks.register_optimizer_step_pre_hook(lambda o, a, k: timer.enter("optimizer")),
                    optim_hooks.register_optimizer_step_post_hook(lambda o, a, k: timer.exit())]
    undo.append(lambda: [h.remove() for h in step_handles])
    patch(fed_mod, "augment", "augmentation")
    patch(F, "cross_entropy", "loss math")
    for mod in (fccl_mod, plus_mod, df_mod):
        for attr in ("fccm_loss", "fisl_loss", "instance_similarity", "fntd_loss", "kd_loss", "ewc_penalty",
                     "fccl_dual_distillation_loss", "soft_target_loss", "collaborative_targets", "ensemble_target"):
            if hasattr(mod, attr):
                patch(mod, attr, "loss math")
    for mod, attr in ((fccl_mod, "refresh_copy"), (fccl_mod, "frozen_copy"), (homo_mod, "average_models")):
        patch(mod, attr, "snapshots")
    patch(fccl_mod, "correlation_matrices", "evaluation")

    def restore():
        for u in reversed(undo):
            u()

    return restore


def build(args, structure: str):
    grid = yaml.safe_load(Path(args.grid).read_text()) if args.grid else {}
    eng = dict(grid.get("engine") or {})
    eng.update(device=args.device, threads=args.threads)
    for kv in args.engine:
        k, v = kv.split("=", 1)
        eng[k] = yaml.safe_load(v)
    cfg = resolve(EngineConfig, eng, "engine")
    device = resolve_device(cfg.device)
    method = create_method(args.method, args.params, args.scenario)
    data = load_federated(Path(args.build) / "partitions" / args.scenario,
                          Path(args.build) / "public" / args.public if method.uses_public else None, device)
    archs = get_structure(structure).assign(len(data.clients))
    models = build_models(archs, data.num_classes, data.image_shape[0], cfg.norm, args.seed)
    fed = Federation(data, models, archs, cfg, args.seed, device)
    fed.round = 1
    fed.setup(method)
    return fed, method, cfg, archs


def bench(args, structure: str) -> Dict[str, float]:
    fed, method, cfg, archs = build(args, structure)
    cuda = fed.device.type == "cuda"
    fed.run_round(1)  # warm-up: lazy allocations, kernel choice
    timer = PhaseTimer(cuda)
    restore = instrument(timer)
    try:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        timer.mark, timer.active = t0, True
        for r in range(2, 2 + args.rounds):
            fed.round = r
            fed.run_round(r)
        timer._tick()
        total = time.perf_counter() - t0
    finally:
        timer.active = False
        restore()
    times = dict(timer.times)
    evaluation = times.pop("evaluation", 0.0)
    round_total = (total - evaluation) / args.rounds
    out = {p: times.get(p, 0.0) / args.rounds for p in PHASES}
    out["total"] = round_total
    out["evaluation"] = evaluation / args.rounds
    out["archs"] = ",".join(archs)
    return out


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="fccl_plus")
    p.add_argument("--params", type=yaml.safe_load, default={}, help="method overrides as YAML, e.g. '{target: all}'")
    p.add_argument("--scenario", default="rotmnist")
    p.add_argument("--public", default="photo_patches")
    p.add_argument("--structures", nargs="+", default=["demo_mixed", "homo_lenet"])
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--grid", default=str(ROOT / "params/experiments.yaml"), help="YAML whose `engine` block is used")
    p.add_argument("--engine", nargs="*", default=[], metavar="KEY=VALUE", help="engine overrides")
    p.add_argument("--rounds", type=int, default=1, help="timed rounds (after one warm-up round)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# One communication round of `{args.method}` on {args.scenario} x {args.public}\n")
    print(f"command: `{' '.join(['python'] + sys.argv)}`\n")
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}; engine from {args.grid} "
          f"{' '.join(args.engine)}; mean of {args.rounds} timed round(s) after 1 warm-up\n")
    print("| structure | round (s) | " + " | ".join(PHASES) + " | outside fwd+bwd | correlations (s, excl.) |")
    print("| --- | ---: | " + " | ".join("---:" for _ in PHASES) + " | ---: | ---: |")
    for s in args.structures:
        r = bench(args, s)
        tot = r["total"]
        cells = " | ".join(f"{r[ph]:.2f} ({100 * r[ph] / tot:.0f}%)" for ph in PHASES)
        outside = 100 * (1 - (r["forward"] + r["backward"]) / tot)
        print(f"| {s} ({r['archs']}) | {tot:.2f} | {cells} | {outside:.1f}% | {r['evaluation']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
