"""Run one job from its resolved config file: a BASE pretraining or a federated run.

A job writes into a temporary folder beside its output folder and renames it into
place at the end, so a failed or interrupted job never leaves files a rerun would
take for finished. Outputs (the source of truth for Snakemake and the report):

* ``metrics.json``: headline numbers (mean of the last ``last_k`` evaluated rounds);
* ``rounds.csv``: one row per (round, participant, evaluated domain) with top-1/top-5;
* ``config.yaml``: the resolved config (also an MLflow artifact);
* ``model.pt`` (pretraining) - the checkpoint federated methods start from.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from ..data import store
from ..data.loading import load_federated
from ..errors import ConfigError
from ..models import create_model
from .config import EngineConfig, PretrainConfig
from .cpu import check_bf16, tune_allocator
from .federation import Federation, derive_seeds, resolve_device, summarise

log = logging.getLogger(__name__)

ROUND_FIELDS = ["round", "participant", "arch", "domain", "kind", "top1", "top5"]


def write_rounds_csv(path: Path, rows: List[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROUND_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in ROUND_FIELDS})


def headline(history: List[Dict[str, float]], last_k: int) -> Dict[str, float]:
    """Mean of every metric over the last ``last_k`` evaluated rounds (FCCL+ tables)."""
    tail = history[-last_k:]
    keys = tail[0].keys() if tail else []
    return {k: float(sum(h[k] for h in tail) / len(tail)) for k in keys}


def _setup_torch(device_spec: str, threads: Optional[int], deterministic: bool = False,
                 malloc_tuning: bool = False) -> torch.device:
    torch.set_flush_denormal(True)  # denormal floats in late training slow CPU kernels by orders of magnitude
    if malloc_tuning:
        tune_allocator()
    if threads:
        torch.set_num_threads(threads)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    return resolve_device(device_spec)


def build_models(archs: List[str], num_classes: int, in_channels: int, norm: str, seed: int):
    seeds = derive_seeds(seed, len(archs))
    models = []
    for arch, s in zip(archs, seeds):
        torch.manual_seed(s)
        kwargs = {} if norm == "default" else {"norm": norm}
        models.append(create_model(arch, num_classes=num_classes, in_channels=in_channels, **kwargs))
    return models


def load_checkpoint(model: torch.nn.Module, path: Path, arch: str) -> None:
    if not Path(path).exists():
        raise ConfigError(f"missing BASE checkpoint {path}: run the pretrain rule first (snakemake)")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if ckpt.get("arch") != arch:
        raise ConfigError(f"{path} holds a {ckpt.get('arch')!r} model, the structure assigns {arch!r}")
    model.load_state_dict(ckpt["state_dict"])


class _Progress:
    def __init__(self, label: str, total: int):
        self.label, self.total, self.t0 = label, total, time.time()

    def __call__(self, step: int, msg: str) -> None:
        el = time.time() - self.t0
        eta = el / max(step, 1) * (self.total - step)
        print(f"[{self.label}] {step}/{self.total} {msg} | {el:.0f}s elapsed, ~{eta:.0f}s left", flush=True)


def run_federate(cfg: Dict[str, Any], out_dir: Path, tracker=None) -> Dict[str, Any]:
    """Run a federated job described by a resolved config (see ``fedshift.experiments``)."""
    from ..methods import create_method
    from ..tracking import NullTracker

    tracker = tracker or NullTracker()
    eng = EngineConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg["engine"].items()})
    device = _setup_torch(eng.device, eng.threads, eng.deterministic, eng.malloc_tuning)
    check_bf16(eng.bf16, device)
    seed = int(cfg["seed"])
    torch.manual_seed(seed)
    method = create_method(cfg["base_method"], cfg["method_params"], cfg["scenario"], f"methods.{cfg['method']}")
    data = load_federated(Path(cfg["paths"]["partition"]),
                          Path(cfg["paths"]["public"]) if method.uses_public and cfg["paths"].get("public") else None,
                          device, cfg.get("participants"))
    archs = cfg["archs"]
    models = build_models(archs, data.num_classes, data.image_shape[0], eng.norm, seed)
    if getattr(method.p, "init", "scratch") == "base":
        for m, a, ck in zip(models, archs, cfg["paths"]["pretrained"]):
            load_checkpoint(m, Path(ck), a)
    fed = Federation(data, models, archs, eng, seed, device)
    method.setup(fed)
    tracker.set_tags({f"data.{k}": v for k, v in data.manifests.items()})
    prog = _Progress(cfg["run_name"], eng.rounds)
    all_rows: List[dict] = []
    history: List[Dict[str, float]] = []
    timings = {"train_s": 0.0, "eval_s": 0.0}

    def evaluate(r: int):
        t = time.time()
        rows = fed.evaluate()
        timings["eval_s"] += time.time() - t
        for row in rows:
            row["round"] = r
        all_rows.extend(rows)
        summ = summarise(rows)
        tracker.log_metrics(summ, step=r)
        return summ

    if eng.eval_round0:
        evaluate(0)
    for r in range(1, eng.rounds + 1):
        fed.round = r
        t = time.time()
        train_metrics = method.run_round(fed, r)
        timings["train_s"] += time.time() - t
        tracker.log_metrics(train_metrics, step=r)
        if r % eng.eval_every == 0 or r == eng.rounds:
            summ = evaluate(r)
            history.append(summ)
            prog(r, f"inter top1 {summ['avg/inter/top1']:.3f} intra top1 {summ['avg/intra/top1']:.3f}")
    metrics = {
        "run": cfg["run_name"],
        "headline": headline(history, eng.last_k),
        "last_rounds": eng.last_k,
        "final": history[-1],
        "timings": timings,
        "device": str(device),
    }
    _write_outputs(out_dir, cfg, metrics, all_rows, tracker, extra=getattr(method, "artifacts", None))
    return metrics


def run_pretrain(cfg: Dict[str, Any], out_dir: Path, tracker=None) -> Dict[str, Any]:
    """Train one participant's model on its private data alone (SOLO/BASE) and save it.

    The model is initialised exactly as a federated run with the same seed initialises
    that participant, so "scratch" and "base" starts differ only by the pretraining.
    """
    from dataclasses import replace

    from ..tracking import NullTracker
    tracker = tracker or NullTracker()
    pc = PretrainConfig(**cfg["pretrain"])
    device = _setup_torch(pc.device, pc.threads, malloc_tuning=pc.malloc_tuning)
    check_bf16(pc.bf16, device)
    seed = int(cfg["seed"])
    data = load_federated(Path(cfg["paths"]["partition"]), None, device)
    if cfg["participant"] not in data.names:
        raise ConfigError(f"participant {cfg['participant']!r} not in scenario {cfg['scenario']!r}: {data.names}")
    idx = data.names.index(cfg["participant"])
    model = build_models([cfg["arch"]] * (idx + 1), data.num_classes, data.image_shape[0], pc.norm, seed)[idx]
    eng = EngineConfig(rounds=pc.epochs, local_epochs=1, local_batch=pc.batch, optimizer=pc.optimizer, lr=pc.lr,
                       weight_decay=pc.weight_decay, momentum=pc.momentum, norm=pc.norm, eval_batch=pc.eval_batch,
                       device=pc.device, last_k=1, bf16=pc.bf16, channels_last=pc.channels_last)
    own = replace(data, clients=[data.clients[idx]])
    fed = Federation(own, [model], [cfg["arch"]], eng, seed, device)
    client = fed.clients[0]
    tests = {c.domain: c.get("test") for c in data.clients}  # evaluated on every domain
    opt = fed.make_optimizer(model, "local")  # one optimiser over all epochs: plain supervised training
    prog = _Progress(cfg["run_name"], pc.epochs)
    rows, history = [], []
    for ep in range(1, pc.epochs + 1):
        loss = fed.train_local(client, epochs=1, optimizer=opt)
        tracker.log_metrics({f"{client.name}/train/loss": loss}, step=ep)
        if ep % pc.eval_every == 0 or ep == pc.epochs:
            ep_rows = [{**row, "round": ep} for row in fed.evaluate(tests)]
            rows.extend(ep_rows)
            summ = summarise(ep_rows)
            history.append(summ)
            tracker.log_metrics(summ, step=ep)
            prog(ep, f"loss {loss:.3f} intra top1 {summ['avg/intra/top1']:.3f} inter top1 {summ['avg/inter/top1']:.3f}")
    metrics = {"run": cfg["run_name"], "headline": headline(history, 1), "final": history[-1], "device": str(device)}
    ckpt = {"arch": cfg["arch"], "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "participant": client.name, "scenario": cfg["scenario"], "seed": seed}
    _write_outputs(out_dir, cfg, metrics, rows, tracker, checkpoint=ckpt)
    return metrics


def _write_outputs(out_dir: Path, cfg, metrics, rows, tracker, checkpoint=None, extra=None) -> None:
    import yaml

    out_dir = Path(out_dir)
    with store.atomic_dir(out_dir) as tmp:
        (tmp / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        write_rounds_csv(tmp / "rounds.csv", rows)
        if checkpoint is not None:
            torch.save(checkpoint, tmp / "model.pt")
        if extra:
            extra(tmp)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        for name in ("config.yaml", "metrics.json", "rounds.csv"):
            tracker.log_artifact(tmp / name)
        for p in sorted(tmp.glob("*.png")) + sorted(tmp.glob("*.npz")):
            tracker.log_artifact(p)
