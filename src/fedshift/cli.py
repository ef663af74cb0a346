"""``fedshift``: one entry point, one subcommand per pipeline verb.

    fedshift list [{datasets,scenarios,public,models,structures,methods}] [--where] [--long]
    fedshift fetch DATASET            (DVC stage fetch@DATASET)
    fedshift public NAME              (DVC stage public@NAME)
    fedshift partition SCENARIO       (DVC stage partition@SCENARIO)
    fedshift pretrain CONFIG OUT      (Snakemake rule pretrain)
    fedshift federate CONFIG OUT      (Snakemake rule federate)
    fedshift collect OUT RUN_DIRS...  (Snakemake rule collect)
    fedshift report RUNS_CSV OUT      (Snakemake rule report)
    fedshift validate                 (check params/*.yaml without running anything)
    fedshift run [GRID...] KEY=VALUE... [-- SNAKEMAKE ARGS]   (snakemake on the grid with dotted overrides)
    fedshift relocate-store [ROOT]    (a copied mlflow.db reads its artifacts from ROOT/mlartifacts)
    fedshift ui-url                   (the MLflow URL of each experiment's headline view)
    fedshift evaluate RUN_DIR         (re-score a federated run's published models.pt)

Bad input ends with one line ``fedshift: error: <what and what is valid>`` and exit
status 2, before any long work starts; a job stopped by a diverged loss or corrupt data
ends with one line and status 1; a job stopped by SIGTERM/SIGINT keeps its last
checkpoint (a rerun resumes), marks its MLflow run KILLED and exits with 128 + signal.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from .errors import ConfigError

if TYPE_CHECKING:
    from .registry import Registry

log = logging.getLogger("fedshift")


def _registries() -> Dict[str, Callable[[], "Registry"]]:
    def datasets():
        from .data import DATASETS
        return DATASETS

    def scenarios():
        from .data import SCENARIOS
        return SCENARIOS

    def public():
        from .data import PUBLIC_SETS
        return PUBLIC_SETS

    def models():
        from .models import MODELS
        return MODELS

    def structures():
        from .models.structures import STRUCTURES, sync_homogeneous
        sync_homogeneous()  # homo_<model> for plugin models too
        return STRUCTURES

    def methods():
        from .methods import METHODS
        return METHODS

    return {"datasets": datasets, "scenarios": scenarios, "public": public, "models": models,
            "structures": structures, "methods": methods}


def cmd_list(args) -> None:
    """One name per line; a plugin's line names its package, ``--where`` every name's origin,
    ``--long`` what a method needs and its first docstring line. Without a kind: the kinds.
    A plugin left out (import failure, name clash) is one warning line on stderr (fedshift.registry)."""
    if args.kind is None:
        print("what `fedshift list KIND` prints (--where: where each name comes from; --long: what it needs "
              "and what it is):")
        for kind in sorted(_registries()):
            print(f"  {kind}")
        return
    reg = _registries()[args.kind]()
    for name in reg.names():
        origin = reg.origin(name)
        if args.where:
            print(f"{name}\t{origin}")
        elif args.long:
            print(f"{name}\t{_describe(args.kind, reg.get(name))}")
        else:
            print(f"{name}\t[{origin.split(' (')[0]}]" if origin.startswith("plugin ") else name)


def _first_line(obj) -> str:
    import inspect

    doc = inspect.getdoc(obj) or inspect.getdoc(inspect.getmodule(obj)) or ""
    return " ".join(doc.split("\n\n")[0].split())[:160]


def _describe(kind: str, obj) -> str:
    """``list --long``: for a method what it needs (public set, BASE checkpoints, one architecture)
    with its default params, then the first paragraph of its docstring."""
    if kind != "methods":
        return _first_line(obj)
    needs = []
    try:
        from .methods import resolve_method_params

        method = obj(resolve_method_params(obj.name if isinstance(getattr(obj, "name", None), str) else "", {}))
        if method.uses_public:
            needs.append("public set")
        if obj.needs_base(method.p):
            needs.append("BASE checkpoints (pretrain)")
    except Exception:  # noqa: BLE001 - a plugin whose defaults do not resolve alone: say so, list the rest
        needs.append("? (defaults do not resolve alone)")
    if obj.requires_homogeneous:
        needs.append("a homo_<model> structure")
    return f"needs: {', '.join(needs) or 'private data only'}\t{_first_line(obj)}"


def _data_params(path: Path) -> dict:
    from .experiments import load_yaml

    return load_yaml(path)


_SAFE_NAME = __import__("re").compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def _stage_name(args, arg: str) -> str:
    """The dataset/public set/scenario a data stage builds: the positional name, or with
    ``--dvc-stage`` the part after ``@`` of DVC's ``DVC_STAGE`` (``fetch@mnist5k``).

    dvc.yaml's ``cmd``s name nothing from params/data.yaml (DVC runs ``cmd`` through a shell,
    so an interpolated ``${item}`` such as ``z$(touch x)`` would run; issue 23 case 5): the
    name reaches fedshift through the environment, never through a shell, and is checked here.
    """
    name = getattr(args, arg)
    if args.dvc_stage:
        stage = os.environ.get("DVC_STAGE", "")
        if "@" not in stage:
            raise ConfigError(f"--dvc-stage: DVC_STAGE={stage!r} is not a foreach stage (<stage>@<name>); "
                              f"run it through `dvc repro` or name the {arg} instead")
        name = stage.split("@", 1)[1]
    if not name or not _SAFE_NAME.fullmatch(name):
        raise ConfigError(f"params/data.yaml: {arg} name {name!r} is not a plain name "
                          "(letters, digits, '_', '.', '-'; starting with a letter or digit)")
    setattr(args, arg, name)
    return name


def cmd_fetch(args) -> None:
    _stage_name(args, "dataset")  # before importing torch: a bad name fails in a second
    from .data import FetchContext, build

    params = _data_params(args.params)
    mirror = os.environ.get("FEDSHIFT_MIRROR") or params.get("mirror")
    ctx = FetchContext(data_dir=Path(args.data_dir), cache_dir=Path(args.cache_dir), mirror=mirror)
    overrides = (params.get("dataset_params") or {}).get(args.dataset)
    build.fetch_dataset(args.dataset, Path(args.out or f"build/datasets/{args.dataset}"), ctx, overrides)


def cmd_public(args) -> None:
    _stage_name(args, "name")  # before importing torch: a bad name fails in a second
    from .data import PUBLIC_SETS, build

    params = _data_params(args.params)
    spec = PUBLIC_SETS.get(args.name, key="public")
    overrides = (params.get("public") or {}).get(args.name)
    build.build_public(args.name, Path(args.datasets) / spec.dataset, Path(args.out or f"build/public/{args.name}"),
                       overrides)


def cmd_partition(args) -> None:
    _stage_name(args, "scenario")  # before importing torch: a bad name fails in a second
    from .data import DATASETS, build

    params = _data_params(args.params)
    overrides = (params.get("scenarios") or {}).get(args.scenario)
    if args.seed is not None:  # engine.data_seed: run: the run seed redraws the partition
        overrides = {**(overrides or {}), "seed": build.seed_override(args.scenario, args.seed)}
    dirs = {d: Path(args.datasets) / d for d in DATASETS.names()}
    build.partition(args.scenario, dirs, Path(args.out or f"build/partitions/{args.scenario}"), overrides)


def apply_thread_allocation(cfg: dict, kind: str, threads) -> None:
    """Torch threads follow the scheduler's allocation (``--threads``, the Snakemake rule's
    ``{threads}`` = SLURM's --cpus-per-task) unless the config names a number itself."""
    section = cfg.get("engine" if kind == "federate" else "pretrain")
    if threads and section is not None and not section.get("threads"):
        section["threads"] = int(threads)


def _die_with_parent() -> None:
    """SIGTERM this job when the process that started it dies (Linux prctl PR_SET_PDEATHSIG).

    The Snakemake rules ``exec`` the job, so its parent is Snakemake: after ``kill -9`` of
    Snakemake the job stops like any SIGTERM (checkpoint kept, nothing published) instead of
    finishing and publishing behind a dead workflow whose metadata still marks it incomplete,
    which Snakemake then redid from scratch after ``--unlock`` (issue 23 case 8).
    """
    import ctypes
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the job simply outlives its parent, as before
        log.warning("--die-with-parent: prctl is not available here; the job outlives its parent")
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _job(kind: str, args) -> None:
    import signal

    from .tracking import Interrupted

    def interrupted(signum, frame):
        raise Interrupted(signum)

    # Abandon the current step at once: the last checkpoint (end of the previous round) stays on disk.
    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    if getattr(args, "die_with_parent", False):
        _die_with_parent()
    from .provenance import run_lock

    try:
        with run_lock(Path(args.out)):  # one job per run folder: a second one names the PID (issue 38)
            _run_job(kind, args)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run_job(kind: str, args) -> None:
    from . import runner
    from .engine import checkpoint
    from .config import safe_load_yaml

    cfg = safe_load_yaml(Path(args.config).read_text(), str(args.config))  # aliases bounded (issue 38)
    apply_thread_allocation(cfg, kind, getattr(args, "threads", None))
    fn = runner.run_pretrain if kind == "pretrain" else runner.run_federate
    if kind == "federate":  # issue 36: a tuned run takes its chosen values; a candidate records divergence
        from . import tune

        cfg = tune.apply_chosen(cfg)
        fn = tune.run_candidate if "tune" in cfg else fn
    allow = bool(getattr(args, "resume_across_code_change", False)
                 or os.environ.get("FEDSHIFT_RESUME_ACROSS_CODE_CHANGE", "") not in ("", "0"))
    if allow:
        import functools

        fn = functools.partial(fn, allow_code_change=True)
    if args.no_tracking or os.environ.get("FEDSHIFT_TRACKING", "mlflow") == "none":
        fn(cfg, Path(args.out))
        return
    from .config import flatten

    import time

    from .tracking import environment_params, job_run, log_job_summary

    # A rerun of the same job (same config hash) continues the MLflow run its checkpoint area names;
    # any other earlier run of the job is replaced (tracking.job_run).
    info = checkpoint.read_job_info(checkpoint.partial_dir(Path(args.out)))
    resume = info.get("mlflow_run_id") if info.get("config_hash") == checkpoint.config_hash(cfg) else None
    with job_run(cfg, kind, resume_run_id=resume) as tracker:
        if not tracker.resumed:
            tracker.log_params(flatten({k: v for k, v in cfg.items() if k not in ("paths",)}))
            tracker.log_params(environment_params())
            if cfg.get("tuned") or cfg.get("tune"):  # issue 36: what was tuned and how, as tags too
                from .tune import mlflow_tags

                tracker.set_tags(mlflow_tags(cfg))
        t0 = time.time()
        metrics = fn(cfg, Path(args.out), tracker)
        last = (cfg.get("engine") or {}).get("rounds") or (cfg.get("pretrain") or {}).get("epochs")
        try:  # tracking never costs a result: the run's files are already published
            from .runner import tracked_summary

            metrics = metrics or {}
            if kind == "federate":  # the keys the method keeps out of MLflow (Method.tracked_metrics)
                metrics = tracked_summary(cfg, metrics)
            log_job_summary(tracker, metrics, cfg["scenario"], time.time() - t0, step=last)
        except Exception as exc:
            log.warning("MLflow job summary not logged (%s: %s)", type(exc).__name__, exc)


def cmd_pretrain(args) -> None:
    _job("pretrain", args)


def cmd_federate(args) -> None:
    _job("federate", args)


def cmd_collect(args) -> None:
    from .report.collect import collect

    collect([Path(p) for p in args.runs], Path(args.out), [Path(p) for p in args.pretrain or []])


def cmd_report(args) -> None:
    from .report.report import make_report

    from .config import safe_load_yaml

    report_cfg = safe_load_yaml(Path(args.config).read_text(), str(args.config)) if args.config else {}
    make_report(Path(args.runs_csv), Path(args.out), report_cfg or {}, tracking=not args.no_tracking)


def _data_not_built(plan, data_params: Path) -> Optional[str]:
    """One line naming the partitions / public sets the grid reads that `dvc repro` has not built yet
    (and the hand-supplied archives they need), or None when all are there. The grid itself is valid
    either way: Snakemake's dvc_repro job builds them, or stops with one line when it cannot."""
    from .data.registry import DATASETS, PUBLIC_SETS, SCENARIOS

    folders = {c["paths"]["partition"] for c in (*plan.federate.values(), *plan.needed_pretrain().values())}
    folders |= {c["paths"]["public"] for c in plan.federate.values() if c["paths"].get("public")}
    missing = sorted(f for f in folders if not (Path(f) / "manifest.json").is_file())
    if not missing:
        return None
    datasets = set()
    for f in missing:
        kind, name = Path(f).parent.name, Path(f).name
        if kind == "partitions" and name in SCENARIOS:
            datasets |= set(SCENARIOS.get(name).datasets)
        elif kind == "public" and name in PUBLIC_SETS:
            datasets.add(PUBLIC_SETS.get(name).dataset)
    manual = sorted(d for d in datasets if d in DATASETS and DATASETS.get(d).manual)
    how = ("`dvc repro`" if data_params == Path("params/data.yaml") else
           f"`dvc repro` after copying {data_params} over params/data.yaml (DVC builds from that file only)")
    return (f"data not built yet: {', '.join(missing)}; build with {how}"
            + (f", which needs the hand-supplied archive(s) {', '.join(manual)} under data/ (docs/datasets.md)"
               if manual else "") + "; until then the workflow stops at its dvc_repro job")


def cmd_validate(args) -> None:
    from .experiments import load_experiments, snakemake_config

    exp = snakemake_config([Path(f) for f in args.experiments])
    data_params = Path(exp.pop("data_params", None) or args.data_params)
    plan = load_experiments(exp, data_params)
    from .tune import plan_tune  # issue 36: the tune block, checked as the workflow plans it

    tuned = plan_tune(exp, plan)
    needed = plan.needed_pretrain()
    print(f"ok: {len(needed)} pretrain and {len(plan.federate)} federate jobs"
          + (f", {len(tuned.candidates)} tuning candidate jobs" if tuned.candidates else ""))
    # What a cluster will be asked for (the workflow's mem_mb, fedshift.resources): the largest request per kind.
    from .resources import WRAPPER_MB, job_estimate, slurm_mem_mb

    gpus = int(exp.get("gpus_per_job", 0) or 0)
    for kind, jobs in (("pretrain", needed), ("federate", plan.federate)):
        if jobs:
            cfg = max(jobs.values(), key=lambda c: job_estimate(c, gpus=gpus).total)
            print(f"largest {kind} SLURM memory request: {slurm_mem_mb(cfg, gpus=gpus)} MB ({cfg['run_name']}: "
                  f"estimated peak {job_estimate(cfg, gpus=gpus).describe()}, + {WRAPPER_MB:.0f} MB for Snakemake "
                  "in the allocation)")
    missing = _data_not_built(plan, data_params)
    if missing:  # a notice, not an error: the grid is valid, its data is just not there yet
        print(missing, file=sys.stderr)


def cmd_run(args) -> None:
    """Merge the grid files (as ``snakemake --configfile`` does), set the dotted overrides, check
    the result as ``validate`` does, write it to ``results/configs/run-<hash>.yaml`` (the file a
    later ``snakemake --configfile`` can name again) and exec Snakemake on it."""
    import hashlib

    from .experiments import dump_config, load_experiments, snakemake_config, write_if_changed
    from .overrides import apply_overrides

    grids = [i for i in args.items if "=" not in i]
    overrides = [i for i in args.items if "=" in i]
    for flag in ("--configfile", "--configfiles"):
        if flag in args.snakemake_args:
            raise ConfigError(f"fedshift run: {flag} after `--`: name grid files before `--` and give overrides "
                              "as KEY=VALUE before it (e.g. fedshift run params/papers/fedmmd_offline.yaml engine.rounds=3)")
    for g in grids:
        if not Path(g).exists():
            raise ConfigError(f"fedshift run: {g}: no such grid file, and not a KEY=VALUE override")
    exp = apply_overrides(snakemake_config([Path(g) for g in grids or ["params/experiments.yaml"]]), overrides)
    data_params = Path(exp.get("data_params") or "params/data.yaml")
    plan = load_experiments({k: v for k, v in exp.items() if k not in ("data_params", "gpus_per_job", "threads_per_job")},
                            data_params)
    text = dump_config(exp)
    path = Path("results/configs") / f"run-{hashlib.sha256(text.encode()).hexdigest()[:10]}.yaml"
    write_if_changed(path, text)
    smk = list(args.snakemake_args) or ["--cores", "all"]
    cmd = [sys.executable, "-m", "snakemake", "--configfile", str(path), *smk]
    print(f"fedshift run: {', '.join(overrides) or 'no override'} on {' + '.join(grids) or 'params/experiments.yaml'}: "
          f"{len(plan.needed_pretrain())} pretrain and {len(plan.federate)} federate jobs planned; "
          f"grid written to {path}\n$ snakemake --configfile {path} {' '.join(smk)}", file=sys.stderr, flush=True)
    os.execv(sys.executable, cmd)


def cmd_ui_url(args) -> None:
    from .tracking import headline_view_urls

    urls = headline_view_urls(base=args.base.rstrip("/"))
    if not urls:
        raise ConfigError("the MLflow store holds no federated experiment yet: run the workflow first")
    for name, url in sorted(urls.items()):
        print(f"{name}\t{url}")


def cmd_relocate_store(args) -> None:
    from .tracking import relocate_store

    root = Path(args.root).resolve()
    if not (root / "mlflow.db").exists():
        raise ConfigError(f"{root} holds no mlflow.db; give the project folder of the copied store")
    print(f"{relocate_store(root)} artifact locations now under {root / 'mlartifacts'}")


def cmd_evaluate(args) -> None:
    from .runner import evaluate_run

    summary = evaluate_run(Path(args.run_dir), device=args.device, bf16=args.bf16, force=args.force)
    from .config import safe_load_yaml

    cfg_path = Path(args.run_dir) / "config.yaml"
    rounds = ((safe_load_yaml(cfg_path.read_text(), str(cfg_path)) or {}).get("engine") or {}).get("rounds")
    print(f"# {args.run_dir}: the published models.pt = the final models after round {rounds} "
          "(not the best round); re-scored on every domain's test set")
    for key in sorted(summary):
        if key.startswith("avg/"):
            print(f"{key} {summary[key]:.4f}")


def _plain_help(parser) -> None:
    """--help is read in a terminal: no RST/Markdown backticks (the docstrings keep them for Sphinx)."""
    import argparse

    parser.description = (parser.description or "").replace("``", "").replace("`", "") or None
    for action in parser._actions:
        if action.help:
            action.help = action.help.replace("``", "").replace("`", "")
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _plain_help(sub)
            for choice in action._choices_actions:
                choice.help = (choice.help or "").replace("`", "")


def main(argv: List[str] | None = None) -> int:
    from importlib import metadata

    try:  # the installed distribution's version (the package root is above cli in the layers)
        __version__ = metadata.version("fedshift")
    except metadata.PackageNotFoundError:
        __version__ = "unknown (not installed)"
    parser = argparse.ArgumentParser(prog="fedshift", description="\n\n".join(__doc__.split("\n\n")[:2]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fedshift {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="print registered names, one per line (plugins marked)")
    p.add_argument("kind", nargs="?", choices=sorted(_registries()), help="which registry to print (none: the kinds)")
    p.add_argument("--where", action="store_true", help="print where each name comes from (built-in module or plugin package)")
    p.add_argument("-l", "--long", action="store_true",
                   help="also print what each name needs (methods: public set, BASE checkpoints, one architecture) "
                        "and the first paragraph of its docstring")
    p.set_defaults(fn=cmd_list)

    for name, fn, arg in (("fetch", cmd_fetch, "dataset"), ("public", cmd_public, "name"),
                          ("partition", cmd_partition, "scenario")):
        p = sub.add_parser(name, help=f"{name} stage (DVC)")
        p.add_argument(arg, nargs="?", default=None,
                       help={"dataset": "dataset name (fedshift list datasets)",
                             "name": "public-set name (fedshift list public)",
                             "scenario": "scenario name (fedshift list scenarios)"}[arg] + "; or --dvc-stage")
        p.add_argument("--dvc-stage", action="store_true",
                       help=f"take the {arg} from DVC_STAGE (<stage>@<{arg}>), as dvc.yaml does")
        p.add_argument("--params", type=Path, default=Path("params/data.yaml"))
        p.add_argument("--out", default=None)
        p.add_argument("--datasets", default="build/datasets", help="folder of fetched datasets")
        if name == "partition":
            p.add_argument("--seed", type=int, default=None,
                           help="draw with this seed instead of params/data.yaml's (engine.data_seed: run)")
        p.add_argument("--data-dir", default="data", help="manually supplied archives (data.dvc)")
        p.add_argument("--cache-dir", default="build/downloads", help="downloaded archives")
        p.set_defaults(fn=fn)

    for name, fn in (("pretrain", cmd_pretrain), ("federate", cmd_federate)):
        p = sub.add_parser(name, help=f"run one {name} job from its resolved config")
        p.add_argument("config", help=f"resolved {name} config (YAML) written by the Snakemake rule")
        p.add_argument("out", help="run folder to publish (written atomically; a rerun resumes its checkpoint)")
        p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
        p.add_argument("--die-with-parent", action="store_true",
                       help="stop (keeping the checkpoint) when the parent process dies (the Snakemake rules)")
        p.add_argument("--threads", type=int, default=None,
                       help="torch threads when the config sets none (the rules pass their allocation)")
        p.add_argument("--resume-across-code-change", action="store_true",
                       help="resume a checkpoint written by other fedshift code (else refused; also "
                            "FEDSHIFT_RESUME_ACROSS_CODE_CHANGE=1, e.g. under Snakemake)")
        p.set_defaults(fn=fn)

    p = sub.add_parser("collect", help="gather run folders into one tidy CSV")
    p.add_argument("out", help="tidy CSV to write")
    p.add_argument("runs", nargs="+", help="finished federated run folders (each holds rounds.csv)")
    p.add_argument("--pretrain", nargs="*", default=None,
                   help="pretrain run folders: their final epoch becomes the base_pretrain (SOLO/BASE) row")
    p.set_defaults(fn=cmd_collect)

    p = sub.add_parser("report", help="tables and figures from the tidy CSV")
    p.add_argument("runs_csv", help="tidy CSV written by `fedshift collect`")
    p.add_argument("out", help="report folder to publish (report.md, tables, figures)")
    p.add_argument("--config", default=None, help="report section of the experiment config (YAML)")
    p.add_argument("--no-tracking", action="store_true")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("evaluate", help="re-score a federated run's published models (models.pt)")
    p.add_argument("run_dir", help="finished federated run folder (config.yaml + models.pt)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="evaluate under bf16 autocast (--bf16) or in float32 (--no-bf16); default: as the run")
    p.add_argument("--force", action="store_true",
                   help="score a run whose recorded partition differs from the current one (both hashes printed)")
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("validate", help="check the experiment grid and configs")
    p.add_argument("--experiments", nargs="+", default=["params/experiments.yaml"], metavar="GRID",
                   help="grid file(s), merged in order as snakemake --configfile merges them "
                        "(an overlay such as fedh2l_table2_quick.yaml after the file it adds to)")
    p.add_argument("--data-params", default="params/data.yaml")
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("run", help="run Snakemake on grid files with dotted overrides: "
                                   "fedshift run [GRID ...] engine.rounds=3 methods.fedprox.mu=0.1 -- -n",
                       description="Merge the GRID files (default params/experiments.yaml) as snakemake --configfile "
                                   "does, set each KEY=VALUE (dotted key, YAML value; a list item by index: "
                                   "grid.0.seeds=[0,1]), check the grid as `fedshift validate` does, write it to "
                                   "results/configs/run-<hash>.yaml and run snakemake --configfile on it with the "
                                   "arguments after -- (default: --cores all).")
    p.add_argument("items", nargs="*", metavar="GRID | KEY=VALUE", help="grid files, then dotted overrides")
    p.set_defaults(fn=cmd_run, snakemake_args=[])

    p = sub.add_parser("ui-url", help="print, per federated experiment, the MLflow URL that opens on the "
                                      "headline view (AVG inter/intra first; start `mlflow ui` first)")
    p.add_argument("--base", default="http://127.0.0.1:5000", help="where `mlflow ui` serves (default: %(default)s)")
    p.set_defaults(fn=cmd_ui_url)

    p = sub.add_parser("relocate-store", help="point a copied or moved mlflow.db at this folder's mlartifacts/ "
                                              "(every workflow start does it too)")
    p.add_argument("root", nargs="?", default=".", help="the project folder holding mlflow.db (default: .)")
    p.set_defaults(fn=cmd_relocate_store)

    _plain_help(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: List[str] = []
    if argv[:1] == ["run"] and "--" in argv:  # `fedshift run ... -- <snakemake args>`: the tail goes to Snakemake as is
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if args.command == "run":
        args.snakemake_args = tail
    # INFO lines on stdout (the rules send it to logs/); stderr keeps progress, warnings and errors,
    # which the rules also show in Snakemake's terminal
    out, err = logging.StreamHandler(sys.stdout), logging.StreamHandler(sys.stderr)
    out.addFilter(lambda record: record.levelno < logging.WARNING)
    err.setLevel(logging.WARNING)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", handlers=[out, err])
    from .errors import RunError
    from .tracking import Interrupted

    try:
        args.fn(args)
    except ConfigError as exc:
        print(f"fedshift: error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"fedshift: error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        import signal

        print(f"fedshift: stopped by {signal.Signals(exc.signum).name}; the last checkpoint is kept, "
              "rerun the same command to resume", file=sys.stderr)
        return 128 + exc.signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
