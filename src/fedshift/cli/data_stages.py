"""``fedshift fetch | public | partition``: the DVC data stages (dvc.yaml's ``cmd``s); ``fedshift dvc-repro``:
the workflow's ``dvc_repro`` rule.

The one idea: build one dataset, public set or partition named by a plain, checked name, which
reaches fedshift through the argument or DVC's ``DVC_STAGE``, never through a shell. The name
is checked before ``fedshift.data`` (and so torch) is imported, which is why each command
imports it in its body: a bad name fails in a second.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import ConfigError


def _data_params(path: Path) -> dict:
    from ..experiments import load_yaml  # the grid layer (yaml): only once a stage runs

    return load_yaml(path)


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


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
    from ..data import FetchContext, build

    params = _data_params(args.params)
    mirror = os.environ.get("FEDSHIFT_MIRROR") or params.get("mirror")
    ctx = FetchContext(data_dir=Path(args.data_dir), cache_dir=Path(args.cache_dir), mirror=mirror)
    overrides = (params.get("dataset_params") or {}).get(args.dataset)
    build.fetch_dataset(args.dataset, Path(args.out or f"build/datasets/{args.dataset}"), ctx, overrides)


def cmd_public(args) -> None:
    _stage_name(args, "name")  # before importing torch: a bad name fails in a second
    from ..data import PUBLIC_SETS, build

    params = _data_params(args.params)
    spec = PUBLIC_SETS.get(args.name, key="public")
    overrides = (params.get("public") or {}).get(args.name)
    build.build_public(args.name, Path(args.datasets) / spec.dataset, Path(args.out or f"build/public/{args.name}"),
                       overrides, seed=args.seed)


def cmd_partition(args) -> None:
    _stage_name(args, "scenario")  # before importing torch: a bad name fails in a second
    from ..data import DATASETS, build

    params = _data_params(args.params)
    overrides = (params.get("scenarios") or {}).get(args.scenario)
    if args.seed is not None:  # engine.data_seed: run: the run seed redraws the partition
        overrides = {**(overrides or {}), "seed": build.seed_override(args.scenario, args.seed)}
    if args.test_protocol is not None:  # a grid's test_protocol (issue 47): its own partition
        overrides = build.with_protocol(args.scenario, overrides, args.test_protocol)
    dirs = {d: Path(args.datasets) / d for d in DATASETS.names()}
    build.partition(args.scenario, dirs, Path(args.out or f"build/partitions/{args.scenario}"), overrides)


def cmd_dvc_repro(args) -> None:
    """``dvc repro`` of the stages a grid reads (the workflow's ``dvc_repro`` rule), its output into ``--log``;
    one line when the grid's data file is not params/data.yaml (DVC builds from that file only) or a file the
    grid needs was not built. In Python rather than in the rule's shell: Snakemake prints every job's shell
    command, and the error lines written there read as an error on every successful run (issue 50)."""
    import filecmp
    import subprocess

    data, log = Path(args.data), Path(args.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    Path("data").mkdir(exist_ok=True)
    if data != Path("params/data.yaml") and not (Path("params/data.yaml").exists() and data.exists()
                                                 and filecmp.cmp(data, "params/data.yaml", shallow=False)):
        msg = (f"this grid needs the data of {data}, but dvc repro builds from params/data.yaml: copy it there "
               f"(cp {data} params/data.yaml) or merge its scenarios/public sets into it, then rerun")
        log.write_text(f"fedshift: error: {msg}\n")
        raise ConfigError(msg)
    with open(log, "w") as out:
        rc = subprocess.call(["dvc", "repro", *args.targets], stdout=out, stderr=subprocess.STDOUT)
    for f in args.expect:  # a stage missing from params/data.yaml: this line names it
        if not Path(f).exists():
            msg = f"dvc repro did not build {f}: add its scenario/public set to {data} (dvc builds from params/data.yaml)"
            with open(log, "a") as out:
                out.write(f"fedshift: error: {msg}\n")
            raise ConfigError(msg)
    if rc:
        from ..errors import RunError

        raise RunError(f"dvc repro {' '.join(args.targets)} failed (exit {rc}); its output: {log}")
