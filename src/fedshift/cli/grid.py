"""``fedshift validate | run``: the experiment grid, checked and planned before anything runs.

The one idea: merge grid files as ``snakemake --configfile`` does, check them as the workflow
plans them (jobs, tuning candidates, SLURM memory, data not built yet) and, for ``run``, hand
the checked grid with its dotted overrides to Snakemake. The grid layer (``fedshift.experiments``,
``fedshift.tune``, ``fedshift.resources``) is imported in the command bodies so that
``fedshift --help`` does not load it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from ..errors import ConfigError


def _data_not_built(plan, data_params: Path) -> Optional[str]:
    """One line naming the partitions / public sets the grid reads that `dvc repro` has not built yet
    (and the hand-supplied archives they need), or None when all are there. The grid itself is valid
    either way: Snakemake's dvc_repro job builds them, or stops with one line when it cannot."""
    from ..data.registry import DATASETS, PUBLIC_SETS, SCENARIOS
    from ..experiments import redrawn_from

    folders = {c["paths"]["partition"] for c in (*plan.federate.values(), *plan.needed_pretrain().values())}
    folders |= {c["paths"]["public"] for c in plan.federate.values() if c["paths"].get("public")}
    # a per-seed or per-protocol folder (engine.data_seed: run, test_protocol) is drawn by the workflow's
    # partition_seed / partition_protocol / public_seed rule from DVC's folder of its scenario or public set:
    # that one is what `dvc repro` must build (issue 51 R19, issue 47)
    redraws = {f: redrawn_from(f) for f in folders}
    folders = {str(r[1]) if r else f for f, r in redraws.items()}
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
    drawn = any(redraws.values())
    return (f"data not built yet: {', '.join(missing)}; build with {how}"
            + (" (the workflow's partition_seed / partition_protocol / public_seed jobs draw the grid's seed<k> "
               "folders from what it builds)" if drawn else "")
            + (f", which needs the hand-supplied archive(s) {', '.join(manual)} under data/ (docs/datasets.md)"
               if manual else "") + "; until then the workflow stops at its dvc_repro job")


def report_status(plan, tuned, report_cfg) -> list:
    """Lines saying whether the grid's report on disk is current (issue 50): every run it read is still the
    run folder it read (:func:`fedshift.report.runs_read.stale_runs`) and one the grid asks for now (a run
    folder it plans, or a committed record the archive finds current, issue 52)."""
    from ..archive import grid_status
    from ..experiments import planned_folders, results_root
    from ..report import runs_read

    folder = Path(results_root(report_cfg)) / "report"
    frame = runs_read.read(folder)
    if frame is None:
        return []
    status = grid_status(plan, tuned)
    records = {str(s.path) for kind in ("federate", "pretrain") for s in status.current(kind).values()}
    stale = runs_read.stale_runs(frame, planned=planned_folders(plan) | records)
    if not stale:
        return [f"report {folder}: current ({len(frame)} run folders read, each the run the grid asks for)"]
    return ([f"report {folder}: {len(stale)} of {len(frame)} run folders it read are stale "
             "(snakemake reruns them and the report):"] + [f"  {line}" for line in stale])


def cmd_validate(args) -> None:
    from ..experiments import check_built_data, plan_grid, snakemake_config

    exp = snakemake_config([Path(f) for f in args.experiments])
    plan, data_params = plan_grid(exp, args.data_params)
    from ..tune import plan_tune  # issue 36: the tune block, checked as the workflow plans it

    tuned = plan_tune(exp, plan)
    check_built_data([*plan.federate.values(), *plan.pretrain.values(), *tuned.candidates.values()], data_params)
    needed = plan.needed_pretrain()
    print(f"ok: {len(needed)} pretrain and {len(plan.federate)} federate jobs"
          + (f", {len(tuned.candidates)} tuning candidate jobs" if tuned.candidates else ""))
    for line in report_status(plan, tuned, exp.get("report")):
        print(line)
    # What a cluster will be asked for (the workflow's mem_mb, fedshift.resources): the largest request per kind.
    from ..resources import WRAPPER_MB, job_estimate, slurm_mem_mb

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


def _grid_plan(items, verb: str):
    """(grid files, overrides, merged grid, plan) of ``fedshift run | archive [GRID ...] KEY=VALUE ...``:
    the files merged as ``snakemake --configfile`` merges them, each dotted override set, then planned. The
    grid's notes are not printed here: Snakemake prints them when it plans (they were printed twice; issue 50)."""
    from ..experiments import plan_grid, snakemake_config
    from ..overrides import apply_overrides

    grids = [i for i in items if "=" not in i]
    overrides = [i for i in items if "=" in i]
    for g in grids:
        if not Path(g).exists():
            raise ConfigError(f"fedshift {verb}: {g}: no such grid file, and not a KEY=VALUE override")
    exp = apply_overrides(snakemake_config([Path(g) for g in grids or ["params/experiments.yaml"]], quiet=True),
                          overrides)
    plan, _ = plan_grid(exp)
    return grids, overrides, exp, plan


def cmd_archive(args) -> None:
    """Copy every finished run of the grid (and the tuning selections its runs used) into the committed
    archive ``records/<grid>/`` (:mod:`fedshift.archive`); each run left out gets one line saying why."""
    from ..archive import archive_grid, grid_name
    from ..tune import plan_tune

    _, _, exp, plan = _grid_plan(args.items, "archive")
    tuned = plan_tune(exp, plan)
    counts = archive_grid(plan, tuned, Path(args.records), args.results)
    where = Path(args.records) / grid_name(plan.report.get("name"))
    print(f"fedshift archive: {counts['archived']} record(s) written, {counts['unchanged']} unchanged, "
          f"{counts['skipped']} run(s) skipped, in {where}/ (commit it: git add {where})", file=sys.stderr)


def cmd_run(args) -> int:
    """Merge the grid files (as ``snakemake --configfile`` does), set the dotted overrides, check
    the result as ``validate`` does, write it to ``results/configs/run-<hash>.yaml`` (the file a
    later ``snakemake --configfile`` can name again), run Snakemake on it and say where the report went."""
    import hashlib  # ~3 ms that only `run` needs, not `fedshift --help`

    from ..experiments import check_built_data, dump_config, results_root, write_if_changed

    for flag in ("--configfile", "--configfiles"):
        if flag in args.snakemake_args:
            raise ConfigError(f"fedshift run: {flag} after `--`: name grid files before `--` and give overrides "
                              "as KEY=VALUE before it (e.g. fedshift run params/papers/fedmmd_offline.yaml engine.rounds=3)")
    grids, overrides, exp, plan = _grid_plan(args.items, "run")
    data_params = Path(exp.get("data_params") or "params/data.yaml")
    check_built_data([*plan.federate.values(), *plan.pretrain.values()], data_params)  # issue 51 R18
    text = dump_config(exp)
    path = Path("results/configs") / f"run-{hashlib.sha256(text.encode()).hexdigest()[:10]}.yaml"
    write_if_changed(path, text)
    smk = list(args.snakemake_args) or ["--cores", "all"]
    cmd = [sys.executable, "-m", "snakemake", "--configfile", str(path), *smk]
    print(f"fedshift run: {', '.join(overrides) or 'no override'} on {' + '.join(grids) or 'params/experiments.yaml'}: "
          f"{len(plan.needed_pretrain())} pretrain and {len(plan.federate)} federate jobs planned; "
          f"grid written to {path}\n$ snakemake --configfile {path} {' '.join(smk)}", file=sys.stderr, flush=True)
    rc = _snakemake(cmd)
    report = Path(results_root(exp.get("report"))) / "report" / "report.md"
    dry = any(a in ("-n", "--dry-run", "--dryrun") for a in smk)
    if rc == 0 and not dry and report.exists():
        print(f"fedshift run: report: {report} (tables and figures beside it; HTML: snakemake --configfile {path} "
              "--report report.html)", file=sys.stderr)
        for line in _headline_urls({j.scenario for j in plan.federate}):
            print(line, file=sys.stderr)
    return rc


def _headline_urls(scenarios) -> list:
    """``fedshift run: MLflow <scenario>: <URL>`` per scenario of the grid: after ``mlflow ui``, the URL opens
    the headline view in "Model training" mode (docs/tracking.md); nothing when tracking is off or fails."""
    import os

    if os.environ.get("FEDSHIFT_TRACKING", "mlflow") == "none" or not (
            os.environ.get("MLFLOW_TRACKING_URI") or Path("mlflow.db").exists()):
        return []
    try:
        from ..tracking import headline_view_urls

        urls = headline_view_urls()
    except Exception:  # tracking never costs a result, nor the run's last lines
        return []
    return [f"fedshift run: MLflow {name} (after `mlflow ui`): {url}" for name, url in sorted(urls.items())
            if name in scenarios]


def _snakemake(cmd) -> int:
    """Run Snakemake and return its exit status. Ctrl-C reaches it too (one process group): it stops its
    jobs, and this process waits for it instead of leaving it behind."""
    import subprocess

    proc = subprocess.Popen(cmd)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue
