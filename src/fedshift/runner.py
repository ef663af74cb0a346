"""Run one job from its resolved config file: a BASE pretraining or a federated run.

Why one file of ~500 lines: building, publishing and pretraining a job share one sequence of
checks (folder, provenance, atomic outputs, tracking) that must read in order; the run loop
itself lives in :mod:`fedshift.engine.loop`.

The composition floor: it builds the data, the models and the method from a config and
drives the engine (:mod:`fedshift.engine`), so it stands above ``methods/`` (which stand
on the engine); nothing below imports it (layers: docs/extending.md, tests/test_layers.py).
A federated job is built (:func:`build_federate`), run (:class:`fedshift.engine.loop.RunLoop`:
rounds, resume, checkpoint payload, timings) and published (:func:`publish_federate`); the engine
section of its config travels as one :class:`EngineConfig` (:func:`engine_config`).

A job writes into a temporary folder beside its output folder and renames it into
place at the end, so a failed or interrupted job never leaves files a rerun would
take for finished. Outputs (the source of truth for Snakemake and the report):

* ``metrics.json``: headline numbers (mean of the last ``last_k`` evaluated rounds);
* ``rounds.csv``: one row per (round, participant, evaluated domain) with top-1/top-5;
* ``config.yaml``: the resolved config (also an MLflow artifact);
* ``model.pt`` (pretraining) - the checkpoint federated methods start from;
* ``models.pt`` (federated runs) - every participant's final weights (weights only), so a
  result can be re-scored without retraining (``fedshift evaluate RUN_DIR``).

Every job checkpoints itself every ``checkpoint_every`` rounds/epochs into
``<out_dir>.partial/`` (see :mod:`fedshift.engine.checkpoint`); a rerun of the same
job resumes from there and ends bit-identical on the CPU. Before training, the job
checks that its results folder is writable and that the partition and public files
match their manifests' sha256 and label ranges.
"""

from __future__ import annotations

import csv
import logging
import os
import time
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

from .data import store
from .data.store import check_writable
from .data.loading import load_federated
from . import provenance
from .engine import checkpoint, fused
from .engine.config import EngineConfig, PretrainConfig, ScoringConfig, check_cuda, malloc_keep_mb
from .engine.cpu import bf16_on, check_bf16, check_bf16_train, kind_record, set_trim, tune_allocator
from .engine.federation import Federation, derive_seeds, resolve_device, summarise
from .engine.loop import FederateJob, Progress, RunLoop, device_note
from .engine.sampling import check_engine, write_sampled
from .errors import ConfigError, NonFiniteError, RunError
from .report.collect import DIVERGED
from .methods import create_method
from .models import create_model
from .scoring import scorers
from .tracking import NullTracker
from .engine import selection as tune  # issue 36: early stopping and the validation score of tuning candidates

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
                 malloc_tuning: Union[bool, int] = False) -> torch.device:
    try:
        check_cuda(device_spec)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    torch.set_flush_denormal(True)  # denormal floats in late training slow CPU kernels by orders of magnitude
    keep_mb = malloc_keep_mb(malloc_tuning)
    if keep_mb:
        tune_allocator(keep_mb)
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
    ckpt = read_torch(path, "rerun the pretrain job that wrote it", keys=("arch", "state_dict"))
    if ckpt.get("arch") != arch:
        raise ConfigError(f"{path} holds a {ckpt.get('arch')!r} model, the structure assigns {arch!r}")
    model.load_state_dict(ckpt["state_dict"])


def read_torch(path: Path, fix: str, keys=()) -> Dict[str, Any]:
    """``torch.load(weights_only=True)`` of a published file (BASE ``model.pt``, ``models.pt``); a
    damaged file or a missing key is one line naming the file, the key and ``fix`` (issue 38)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip (PytorchStreamReader), pickle errors, not a torch file
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(f"{path} is damaged, torch cannot read it ({type(exc).__name__}: {first}); {fix}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{path} holds a {type(obj).__name__}, expected a dict; {fix}")
    for key in keys:
        if key not in obj:
            raise ConfigError(f"{path} lacks the key {key!r} (has {sorted(obj)}); {fix}")
    return obj


def check_finite_state(state: Dict[str, torch.Tensor], where: str, fix: str) -> None:
    """Every floating tensor of a state dict is finite; else one line naming ``where`` and the tensor."""
    for key, t in state.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise RunError(f"{where}: tensor {key!r} holds {bad} non-finite value(s) (NaN/inf); {fix}")


def verify_inputs(folders: List[Path]) -> float:
    """sha256 of every partition/public file against its manifest (once per job); returns seconds."""
    t = time.time()
    for folder in folders:
        store.verify_manifest(folder)  # its one-line errors say how to rebuild the folder (store.rebuild_hint)
    return time.time() - t


def check_labels(data) -> None:
    """Every private/val/test label lies in [0, num_classes)."""
    for c in data.clients:
        for split, (_, y) in c.splits.items():
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= data.num_classes):
                raise ConfigError(f"participant {c.name!r} split {split!r}: labels span {int(y.min())}..{int(y.max())}, "
                                  f"outside 0..{data.num_classes - 1}; rebuild the partition with `dvc repro`")


def _torch_rng() -> Dict[str, Any]:
    return checkpoint.global_rng_state()


RERUN = "the job (`snakemake` reruns it; run `dvc repro` first if the data is not up to date)"


def _manifest_paths(manifests: Dict[str, str], cfg: Dict[str, Any], public_dir: Optional[Path]) -> Dict[str, Path]:
    """Where each of ``FederatedData.manifests`` was read (``partition/<name>``, ``public/<name>``)."""
    out = {}
    for name in manifests:
        folder = Path(cfg["paths"]["partition"]) if name.startswith("partition/") else public_dir
        out[name] = Path(folder) / store.MANIFEST
    return out


def scoring_config(cfg: Dict[str, Any]) -> ScoringConfig:
    """The typed scoring protocol of a resolved config (its ``scoring`` block; absent: the defaults)."""
    return ScoringConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in (cfg.get("scoring") or {}).items()})


# the keys a job reads from its resolved config (fedshift.experiments writes them all)
RUN_KEYS = {"federate": ("run_name", "scenario", "method", "base_method", "seed", "archs", "method_params", "engine",
                         "paths"),
            "pretrain": ("run_name", "scenario", "participant", "arch", "seed", "pretrain", "paths")}


def read_run_config(path: Path, kind: str, fix: str = "") -> Dict[str, Any]:
    """A job's resolved config (``fedshift federate|pretrain CONFIG``, a run folder's ``config.yaml``): invalid YAML
    or a missing key is one line naming the file (issue 51 Q19), not a ParserError / KeyError traceback."""
    from .config import read_yaml_file

    return read_yaml_file(path, RUN_KEYS[kind], fix or f"give a {kind} config written by the workflow "
                          f"(results/configs/{kind}/...) or a published run folder's config.yaml")


def engine_config(cfg: Dict[str, Any], **override: Any) -> EngineConfig:
    """The typed engine section of a resolved config (YAML lists become tuples), with ``override`` applied."""
    return EngineConfig(**{**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg["engine"].items()},
                           **override})


def run_federate(cfg: Dict[str, Any], out_dir: Path, tracker=None, allow_code_change: bool = False) -> Dict[str, Any]:
    """Run a federated job described by a resolved config (see ``fedshift.experiments``): build it
    (:func:`build_federate`), run its rounds (:class:`RunLoop`: resume, checkpoints, timings), publish it
    (:func:`publish_federate`).

    Resumes from ``<out_dir>.partial/checkpoint.pt`` when it belongs to the same config, inputs and
    code (``allow_code_change``: resume a checkpoint written by other fedshift code).
    """
    tracker = tracker or NullTracker()
    job = build_federate(cfg, Path(out_dir), tracker)
    ckpt = job.load_checkpoint(allow_code_change)
    if ckpt is not None:  # a resume across a code change is recorded in inputs.json (issue 51 R39)
        provenance.note_code_change(job.record, ckpt)
    loop = RunLoop(job, tracker)
    try:
        loop.run(ckpt)
    except NonFiniteError as exc:  # the job still fails; its outcome is kept for the archive (issue 52)
        record_divergence(job, loop, tracker, exc)
        raise
    return publish_federate(job, loop, tracker)


def record_divergence(job: FederateJob, loop: RunLoop, tracker, exc: Exception) -> Path:
    """A run stopped by a non-finite loss or weight (``engine.on_nonfinite: fail``) is an outcome of its
    config, data and code, not a missing result: rerunning repeats it. Its record is written to
    ``<run>.partial/diverged/`` (config.yaml, inputs.json, the rounds evaluated before it, and metrics.json
    with ``diverged: true``, the round and the error), which a later successful run clears with the rest of
    the checkpoint area; ``fedshift archive`` commits it as the run's record, so tables count the seed as
    diverged instead of listing it as a run still to make. The job itself still fails (exit status 1)."""
    cfg, fed = job.cfg, job.fed
    metrics = {"run": cfg["run_name"], "diverged": True, "diverged_round": int(fed.round),
               "error": str(exc).splitlines()[0], "evaluated_rounds": len(loop.history),
               "timings": {**loop.timings, "resumed_after_rounds": loop.resumed}, "device": str(job.device)}
    folder = job.partial / DIVERGED
    _write_outputs(folder, cfg, metrics, loop.all_rows, NullTracker(), inputs=job.record)
    try:  # tracking never costs a result
        tracker.set_tags({"diverged": "true", "diverged.round": str(fed.round)})
    except Exception:
        pass
    print(f"[{cfg['run_name']}] diverged in round {fed.round}: recorded in {folder} "
          "(`fedshift archive` commits it as this seed's outcome)", file=sys.stderr, flush=True)
    return folder


def build_federate(cfg: Dict[str, Any], out_dir: Path, tracker) -> FederateJob:
    """Check the results folder and the inputs, then build the data, the models (BASE checkpoints loaded), the
    method and the federation of a federated job; tag the tracker with its data and code."""
    check_writable(out_dir)
    eng = engine_config(cfg)
    device = _setup_torch(eng.device, eng.threads, eng.deterministic, eng.malloc_tuning)
    set_trim(eng.malloc_trim)
    check_bf16(eng.bf16, device)
    check_bf16_train(eng.bf16_train, device)
    seed = int(cfg["seed"])
    torch.manual_seed(seed)
    method = create_method(cfg["base_method"], cfg["method_params"], cfg["scenario"], f"methods.{cfg['method']}")
    public_dir = Path(cfg["paths"]["public"]) if method.uses_public and cfg["paths"].get("public") else None
    verify_s = verify_inputs([Path(cfg["paths"]["partition"])] + ([public_dir] if public_dir else []))
    # Validation data (a val split, or the partition's holdout left out of training: issue 36) when the
    # run selects by it (engine.select: best_val) or is a tuning candidate.
    data = load_federated(Path(cfg["paths"]["partition"]), public_dir, device, cfg.get("participants"),
                          holdout=eng.select == "best_val" or "tune" in cfg)
    check_labels(data)
    archs = cfg["archs"]
    scoring = scoring_config(cfg)
    check_engine(method, eng, scoring)
    if eng.server_model:  # stateless clients share participant 0's model (same init as a per-client run)
        models = build_models(archs[:1], data.num_classes, data.image_shape[0], eng.norm, seed) * len(archs)
    else:
        models = build_models(archs, data.num_classes, data.image_shape[0], eng.norm, seed)
    base_models = None
    if cfg["paths"].get("pretrained"):  # BASE checkpoints: the start (init: base) and/or a teacher (theta^*)
        base_models = build_models(archs, data.num_classes, data.image_shape[0], eng.norm, seed)
        for m, a, ck in zip(base_models, archs, cfg["paths"]["pretrained"]):
            load_checkpoint(m, Path(ck), a)
        if method.init_from == "base":
            for m, b in zip(models, base_models):
                m.load_state_dict(b.state_dict())
    fed = Federation(data, models, archs, eng, seed, device, scoring)
    fed.base_models = [b.to(device) for b in base_models] if base_models else None
    fed.method_name = cfg["method"]
    fed.setup(method)  # the method's setup(ctx), with the federation's round context
    fused.decide_for_run(fed, method, log)  # engine.fused_clients: logs once which path trains the clients
    tracker.set_tags({f"data.{k}": v for k, v in data.manifests.items()})
    cfg_hash = checkpoint.config_hash(cfg)
    partial = checkpoint.partial_dir(out_dir)
    checkpoint.write_job_info(partial, cfg_hash, getattr(tracker, "run_id", None))
    base_files = {f"base/{i}": Path(ck) for i, ck in enumerate(cfg["paths"].get("pretrained") or [])}
    inputs = checkpoint.input_hashes(data.manifests, base_files)
    record = provenance.record(inputs, {**_manifest_paths(data.manifests, cfg, public_dir), **base_files}, cfg_hash)
    provenance.base_origins(record, base_files)  # BASE made by other code: said and recorded (issue 51 R23)
    tracker.set_tags(provenance.tags(record["code"]))  # also on a resume: the code that runs now
    return FederateJob(cfg, out_dir, eng, device, method, fed, verify_s, cfg_hash, partial, inputs, record,
                       scorers(scoring.metrics))


def eval_numerics(eng, device: torch.device, levers) -> Dict[str, Any]:
    """How this machine evaluated (``auto`` settings resolve per CPU kind, issue 40): the CPU kind,
    bf16 autocast, folded BatchNorm, NHWC input and torch's version, so two runs' scores can be told
    apart when they come from machines of different kinds."""
    fold, channels_last = levers
    kind = kind_record() if device.type == "cpu" else {"cpu_kind": device.type}
    return {**kind, "eval_bf16": bf16_on(eng.bf16, device),
            "eval_fold_bn": bool(fold), "eval_channels_last": bool(channels_last), "torch": torch.__version__}


def train_numerics(fed) -> Dict[str, Any]:
    """How this machine trained each participant (``engine.bf16_train`` / ``recompute_budget_mb`` resolve
    per CPU kind and model, issue 40): bf16 autocast of its training forwards, and the batch above
    which its blocks were checkpointed (null: never)."""
    seen: Dict[str, Any] = {"train_bf16": {}, "recompute_above_batch": {}}
    for c in fed.clients:
        m = c.model
        seen["train_bf16"][c.name] = bool(getattr(m, "train_bf16", False))
        above = int(getattr(m, "recompute_batch", 0))
        seen["recompute_above_batch"][c.name] = above if getattr(m, "recompute", False) and above < sys.maxsize else None
    return seen


def publish_federate(job: FederateJob, loop: RunLoop, tracker) -> Dict[str, Any]:
    """metrics.json (headline, the method's model selection and summary), rounds.csv, models.pt, the method's
    artifacts: published atomically once the data are rechecked; the checkpoint area is then cleared."""
    cfg, eng, fed, method, history = job.cfg, job.eng, job.fed, job.method, loop.history
    metrics = {
        "run": cfg["run_name"],
        "headline": {**headline(history, eng.last_k), **loop.global_eval.summary(eng.last_k)},
        "last_rounds": min(eng.last_k, len(history)),  # what the headline averages (default last_k 3 > rounds 2)
        "final": history[-1] if history else {},
        "timings": {**loop.timings, "resumed_after_rounds": loop.resumed},
        "device": str(job.device),
        "skipped_batches": fed.skipped_batches,
        "checked_batches": fed.checked_batches,
    }
    if fed.skipped_batches:
        print(f"[{cfg['run_name']}] done with {fed.skipped_batches} of {fed.checked_batches} batches skipped "
              "for a non-finite loss (engine.on_nonfinite: skip_batch)", flush=True)
    if eng.select == "best_val":  # model selection on validation data (engine/selection.py)
        metrics["headline"], metrics["selected_rounds"] = tune.best_val_headline(history, loop.eval_rounds)
    if "tune" in cfg:  # a tuning candidate's validation score (fedshift.tune.select reads it)
        metrics["tune"] = (tune.score(loop.history_g, loop.rounds_g, cfg["tune"]["metric"]) if tune.global_metric(cfg)
                           else tune.score(history, loop.eval_rounds, cfg["tune"]["metric"]))
    metrics.update(method.run_summary(fed.ctx))  # e.g. FedH2L's communication bytes
    if len({c.domain for c in fed.clients}) < 2:  # their NaN is written as null and listed (store.json_text, R26)
        metrics["notes"] = ["inter-domain metrics (inter/*, cdp) are undefined with one domain: there is no other "
                            "domain's test set to score on"]
    states: Dict[int, Dict[str, torch.Tensor]] = {}  # a model shared by clients (server_model) is stored once
    for c in fed.clients:
        if id(c.model) not in states:
            states[id(c.model)] = checkpoint.module_state(c.model)
    models_pt = {"participants": {c.name: {"arch": c.arch, "state_dict": states[id(c.model)]} for c in fed.clients},
                 "scenario": cfg["scenario"], "run": cfg["run_name"]}
    metrics["numerics"] = {**eval_numerics(eng, job.device, fed.eval_levers()), **train_numerics(fed)}
    tracker.set_tags({f"numerics.{k}": str(v) for k, v in metrics["numerics"].items()})
    provenance.recheck(job.record, cfg["run_name"], RERUN)  # data rebuilt during the run: publish nothing
    def extra(folder: Path) -> None:
        write_sampled(fed, folder)  # sampled.csv: the clients each round drew (absent when every client trains)
        method.artifacts(folder)

    _write_outputs(job.out_dir, cfg, metrics, loop.all_rows, tracker, extra=extra,
                   models=models_pt, inputs=job.record)
    checkpoint.clear(job.partial)
    return metrics


def run_pretrain(cfg: Dict[str, Any], out_dir: Path, tracker=None, allow_code_change: bool = False) -> Dict[str, Any]:
    """Train one participant's model on its private data alone (SOLO/BASE) and save it.

    The model is initialised exactly as a federated run with the same seed initialises
    that participant, so "scratch" and "base" starts differ only by the pretraining.
    Checkpointed every ``pretrain.checkpoint_every`` epochs (model, optimiser, RNG).
    """
    from dataclasses import replace

    tracker = tracker or NullTracker()
    out_dir = Path(out_dir)
    check_writable(out_dir)
    pc = PretrainConfig(**cfg["pretrain"])
    device = _setup_torch(pc.device, pc.threads, malloc_tuning=pc.malloc_tuning)
    check_bf16(pc.bf16, device)
    seed = int(cfg["seed"])
    verify_s = verify_inputs([Path(cfg["paths"]["partition"])])
    data = load_federated(Path(cfg["paths"]["partition"]), None, device)
    check_labels(data)
    if cfg["participant"] not in data.names:
        raise ConfigError(f"participant {cfg['participant']!r} not in scenario {cfg['scenario']!r}: {data.names}")
    idx = data.names.index(cfg["participant"])
    model = build_models([cfg["arch"]] * (idx + 1), data.num_classes, data.image_shape[0], pc.norm, seed)[idx]
    eng = EngineConfig(rounds=pc.epochs, local_epochs=1, local_batch=pc.batch, optimizer=pc.optimizer, lr=pc.lr,
                       weight_decay=pc.weight_decay, momentum=pc.momentum, norm=pc.norm, eval_batch=pc.eval_batch,
                       device=pc.device, last_k=1, bf16=pc.bf16, channels_last=pc.channels_last,
                       recompute=pc.recompute)
    own = replace(data, clients=[data.clients[idx]])
    fed = Federation(own, [model], [cfg["arch"]], eng, seed, device)
    fed.method_name = "pretrain"
    client = fed.clients[0]
    tests = {c.domain: c.get("test") for c in data.clients}  # evaluated on every domain
    opt = fed.make_optimizer(model, "local")  # one optimiser over all epochs: plain supervised training
    cfg_hash = checkpoint.config_hash(cfg)
    partial = checkpoint.partial_dir(out_dir)
    checkpoint.write_job_info(partial, cfg_hash, getattr(tracker, "run_id", None))
    inputs = checkpoint.input_hashes(data.manifests)
    record = provenance.record(inputs, _manifest_paths(data.manifests, cfg, None), cfg_hash)
    tracker.set_tags(provenance.tags(record["code"]))
    ckpt = (checkpoint.load(partial, cfg_hash, inputs, code=record["code"], allow_code_change=allow_code_change,
                            last_round=pc.epochs, models=[model]) if pc.checkpoint_every else None)
    if ckpt is not None:
        provenance.note_code_change(record, ckpt)
    prog = Progress(cfg["run_name"], pc.epochs, device_note(pc.device, device))
    rows, history = [], []
    timings = {"checkpoint_s": 0.0, "verify_s": verify_s}
    start = 1
    if ckpt is not None:
        model.load_state_dict(ckpt["models"][0])
        opt.load_state_dict(ckpt["optimizer"])
        fed.set_rng_state(ckpt["rng"]["federation"])
        checkpoint.set_global_rng_state(ckpt["rng"]["global"])
        rows, history, start = ckpt["rows"], ckpt["history"], ckpt["round"] + 1
        log.info("resuming %s after epoch %d from %s", cfg["run_name"], ckpt["round"], partial)
    for ep in range(start, pc.epochs + 1):
        fed.round = ep
        loss = fed.train_local(client, epochs=1, optimizer=opt)
        fed.check_weights()
        tracker.log_metrics({f"{client.name}/train/loss": loss}, step=ep)
        if ep % pc.eval_every == 0 or ep == pc.epochs:
            ep_rows = [{**row, "round": ep} for row in fed.evaluate(tests)]
            rows.extend(ep_rows)
            summ = summarise(ep_rows)
            history.append(summ)
            tracker.log_metrics(summ, step=ep)
            prog(ep, f"loss {loss:.3f} intra top1 {summ['avg/intra/top1']:.3f} inter top1 {summ['avg/inter/top1']:.3f}")
        if pc.checkpoint_every and ep % pc.checkpoint_every == 0 and ep < pc.epochs:
            t = time.time()
            timings["checkpoint_bytes"] = checkpoint.save(partial, {
                "config_hash": cfg_hash, "inputs": inputs, "round": ep, "run_id": getattr(tracker, "run_id", None),
                "code": record["code"], "code_changes": record.get("resumed_across_code_change", []),
                "models": [checkpoint.module_state(model)], "optimizer": checkpoint.to_cpu(opt.state_dict()),
                "rng": {"federation": fed.rng_state(), "global": _torch_rng()},
                "rows": rows, "history": history})
            timings["checkpoint_s"] += time.time() - t
    metrics = {"run": cfg["run_name"], "headline": headline(history, 1), "final": history[-1], "device": str(device),
               "timings": timings}
    ckpt = {"arch": cfg["arch"], "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "participant": client.name, "scenario": cfg["scenario"], "seed": seed}
    provenance.recheck(record, cfg["run_name"], RERUN)
    _write_outputs(out_dir, cfg, metrics, rows, tracker, checkpoint=ckpt, inputs=record)
    checkpoint.clear(partial)
    return metrics


def _write_outputs(out_dir: Path, cfg, metrics, rows, tracker, checkpoint=None, extra=None, models=None,
                   inputs=None) -> None:
    """Publish the job's folder atomically; a full disk / file-size limit is one line (RunError)."""
    out_dir = Path(out_dir)
    try:
        _publish(out_dir, cfg, metrics, rows, tracker, checkpoint, extra, models, inputs)
    except (OSError, RuntimeError) as exc:  # full disk / ulimit -f; atomic_dir removed its temporary folder
        if isinstance(exc, RunError):
            raise
        raise store.write_failure("the results", out_dir.parent,
                                  store.tensor_bytes([checkpoint, models]) + (1 << 20), exc) from None


def _publish(out_dir: Path, cfg, metrics, rows, tracker, checkpoint, extra, models, inputs=None) -> None:
    import yaml

    with store.atomic_dir(out_dir) as tmp:
        (tmp / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        if inputs is not None:  # what the run was made from (fedshift.provenance)
            (tmp / provenance.INPUTS).write_text(store.json_text(inputs))
        write_rounds_csv(tmp / "rounds.csv", rows)
        if checkpoint is not None:
            torch.save(checkpoint, tmp / "model.pt")
        if models is not None:
            torch.save(models, tmp / "models.pt")
        if extra:
            extra(tmp)
        (tmp / "metrics.json").write_text(store.json_text(metrics))  # strict JSON: NaN -> null, listed (R26)
        for name in ("config.yaml", "metrics.json", "rounds.csv") + ((provenance.INPUTS,) if inputs else ()):
            tracker.log_artifact(tmp / name)
        for p in sorted(tmp.glob("*.png")) + sorted(tmp.glob("*.npz")) + sorted(tmp.glob("models.pt")):
            tracker.log_artifact(p)


def evaluate_run(run_dir: Path, device: str = "cpu", bf16: Optional[bool] = None, force: bool = False) -> Dict[str, float]:
    """Re-score a federated run from its published ``models.pt`` (no training): the summary of
    every participant on every domain's test set (the last row block of ``rounds.csv``).
    ``bf16`` overrides the run's ``engine.bf16`` (bf16 autocast of the evaluation), to measure
    what it changes on the same weights.

    A run whose recorded data (``inputs.json``, :mod:`fedshift.provenance`) differs from the
    current partition is refused: its test sets may hold the run's training images. ``force``
    scores it anyway, printing both hashes. Non-finite weights are refused."""
    run_dir = Path(run_dir)
    path = run_dir / "models.pt"
    if not (run_dir / "config.yaml").exists() or not path.exists():
        raise ConfigError(f"{run_dir} holds no config.yaml + models.pt; give a finished federated run folder "
                          "(results/federate/<scenario>/<public>/<method>/<structure>/seed<n>-<identity>)")
    fix = f"rerun the job that published {run_dir}"
    cfg = read_run_config(run_dir / "config.yaml", "federate", fix)
    _check_evaluated_data(run_dir, cfg, force)
    saved = read_torch(path, fix, keys=("participants",))["participants"]
    eng = engine_config(cfg, device=device, **({} if bf16 is None else {"bf16": bool(bf16)}))
    dev = _setup_torch(device, eng.threads)
    check_bf16(eng.bf16, dev)
    verify_inputs([Path(cfg["paths"]["partition"])])  # a test set changed in place must not be scored
    data = load_federated(Path(cfg["paths"]["partition"]), None, dev, cfg.get("participants"))
    check_labels(data)
    for name in data.names:
        if not isinstance(saved.get(name), dict) or "arch" not in saved[name] or "state_dict" not in saved[name]:
            raise ConfigError(f"{path}: key 'participants.{name}' (with 'arch' and 'state_dict') is missing; {fix}")
        check_finite_state(saved[name]["state_dict"], f"{path} participant {name!r}",
                           "the run diverged or the file is damaged: its scores would be chance; " + fix)
    archs = [saved[name]["arch"] for name in data.names]
    models = build_models(archs, data.num_classes, data.image_shape[0], eng.norm, int(cfg["seed"]))
    for m, name in zip(models, data.names):
        m.load_state_dict(saved[name]["state_dict"])
    fed = Federation(data, models, archs, eng, int(cfg["seed"]), dev)  # predicts with the classifiers
    rows = fed.evaluate()
    summ = summarise(rows)
    sizes = {d: len(y) for d, (_, y) in fed.test_sets().items()}
    for scorer in scorers(scoring_config(cfg).metrics):  # what every evaluation of the run added
        summ.update(scorer.extras(rows, sizes)[1])
    return summ


def _check_evaluated_data(run_dir: Path, cfg: Dict[str, Any], force: bool) -> None:
    """The partition ``evaluate`` scores on is the one the run trained on (issue 38, case 2)."""
    rec = provenance.read(run_dir)
    part = Path(cfg["paths"]["partition"]) / store.MANIFEST
    now = store.sha256_file(part) if part.exists() else "missing"
    old = {k: v for k, v in (rec or {}).get("inputs", {}).items() if k.startswith("partition/")}
    if not old:  # nothing recorded = nothing to compare (issue 51 R21: an inputs.json without a partition entry)
        msg = (f"{run_dir} records no input hashes ({provenance.INPUTS}: published before fedshift recorded them), "
               if rec is None else f"{run_dir}/{provenance.INPUTS} records no partition (no 'partition/<name>' "
               "among its inputs), ") + f"so its partition cannot be told from the current {part} (sha256 {now[:12]})"
        if not force:
            raise ConfigError(f"{msg}; rerun the job, or pass --force to score it anyway")
        print(f"fedshift: warning: {msg}; scoring anyway (--force)", file=sys.stderr, flush=True)
        return
    for name, digest in old.items():
        if digest != now:
            msg = (f"{run_dir} was trained on {name} sha256 {str(digest)[:12]}, {part} now has sha256 {now[:12]}")
            if not force:
                raise ConfigError(f"{msg}: the current test sets may hold that run's training images; rerun the "
                                  "job (snakemake reruns it), or pass --force to score it anyway")
            print(f"fedshift: warning: {msg}; scoring on the current partition anyway (--force)",
                  file=sys.stderr, flush=True)
