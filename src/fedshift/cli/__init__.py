"""``fedshift``: one entry point, one subcommand per pipeline verb.

    fedshift list [{datasets,scenarios,public,models,structures,methods}] [--where] [--long]
    fedshift fetch DATASET            (DVC stage fetch@DATASET)
    fedshift public NAME              (DVC stage public@NAME)
    fedshift partition SCENARIO       (DVC stage partition@SCENARIO)
    fedshift dvc-repro -- STAGES...   (Snakemake rule dvc_repro: dvc repro of the stages a grid reads)
    fedshift pretrain CONFIG OUT      (Snakemake rule pretrain)
    fedshift federate CONFIG OUT      (Snakemake rule federate)
    fedshift collect OUT RUN_DIRS...  (Snakemake rule collect)
    fedshift report RUNS_CSV OUT      (Snakemake rule report)
    fedshift validate                 (check params/*.yaml without running anything)
    fedshift run [GRID...] KEY=VALUE... [-- SNAKEMAKE ARGS]   (snakemake on the grid with dotted overrides)
    fedshift relocate-store [ROOT]    (a copied mlflow.db reads its artifacts from ROOT/mlartifacts)
    fedshift ui-url                   (the MLflow URL of each experiment's headline view)
    fedshift evaluate RUN_DIR         (re-score a federated run's published models.pt)
    fedshift archive [GRID...] KEY=VALUE...   (finished runs' records into the committed records/<grid>/)
    fedshift docs-tables [--check]    (the docs' measured tables rendered from records/)

Bad input ends with one line ``fedshift: error: <what and what is valid>`` and exit
status 2, before any long work starts; a job stopped by a diverged loss or corrupt data
ends with one line and status 1; a job stopped by SIGTERM/SIGINT keeps its last
checkpoint (a rerun resumes), marks its MLflow run KILLED and exits with 128 + signal.

This module is the parser and the dispatch; each command group lives in its own module:
``names`` (list), ``data_stages`` (fetch, public, partition), ``jobs`` (pretrain, federate,
evaluate), ``grid`` (validate, run, archive), ``reporting`` (collect, report, docs-tables) and ``mlflow_store``
(ui-url, relocate-store). The parser names each command's function as (module, name) and
``main`` imports the command modules only once the arguments are parsed, and those import
fedshift's heavier layers (torch, MLflow, pandas) only inside the commands, so ``fedshift --help``
and a usage error load none of it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import metadata
from pathlib import Path
from typing import List

from ..errors import ConfigError, RunError
from . import names

__all__ = ["main"]


def _plain_help(parser) -> None:
    """--help is read in a terminal: no RST/Markdown backticks (the docstrings keep them for Sphinx)."""
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
    try:  # the installed distribution's version (the package root is above cli in the layers)
        __version__ = metadata.version("fedshift")
    except metadata.PackageNotFoundError:
        __version__ = "unknown (not installed)"
    parser = argparse.ArgumentParser(prog="fedshift", description="\n\n".join(__doc__.split("\n\n")[:2]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fedshift {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="print registered names, one per line (plugins marked)")
    p.add_argument("kind", nargs="?", choices=sorted(names._registries()), help="which registry to print (none: the kinds)")
    p.add_argument("--where", action="store_true", help="print where each name comes from (built-in module or plugin package)")
    p.add_argument("-l", "--long", action="store_true",
                   help="also print what each name needs (methods: public set, BASE checkpoints, one architecture) "
                        "and the first paragraph of its docstring")
    p.set_defaults(fn=("names", "cmd_list"))

    for name, fn, arg in (("fetch", ("data_stages", "cmd_fetch"), "dataset"),
                          ("public", ("data_stages", "cmd_public"), "name"),
                          ("partition", ("data_stages", "cmd_partition"), "scenario")):
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
        if name in ("partition", "public"):
            p.add_argument("--seed", type=int, default=None,
                           help="draw with this seed instead of params/data.yaml's (engine.data_seed: run)")
        if name == "partition":
            p.add_argument("--test-protocol", choices=("clean", "authors"), default=None,
                           help="test set to build: clean (held out) or the authors' code's (docs/datasets.md); "
                                "default: params/data.yaml's")
        p.add_argument("--data-dir", default="data", help="manually supplied archives (data.dvc)")
        p.add_argument("--cache-dir", default="build/downloads", help="downloaded archives")
        p.set_defaults(fn=fn)

    p = sub.add_parser("dvc-repro", help="the workflow's dvc_repro rule: dvc repro of the stages a grid reads, "
                                         "one line when a file it needs is not built")
    p.add_argument("targets", nargs="*", help="DVC stages (partition@<scenario>, public@<set>)")
    p.add_argument("--data", default="params/data.yaml", help="the grid's data params file")
    p.add_argument("--log", default="logs/dvc_repro.log", help="where dvc's output goes")
    p.add_argument("--expect", nargs="*", default=[], help="files the grid needs (manifests)")
    p.set_defaults(fn=("data_stages", "cmd_dvc_repro"))

    for name, fn in (("pretrain", ("jobs", "cmd_pretrain")), ("federate", ("jobs", "cmd_federate"))):
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
    p.add_argument("runs", nargs="+", help="finished federated run folders or their committed records "
                                           "(records/...; each holds rounds.csv or rounds.csv.gz)")
    p.add_argument("--pretrain", nargs="*", default=None,
                   help="pretrain run folders: their final epoch becomes the base_pretrain (SOLO/BASE) row")
    p.set_defaults(fn=("reporting", "cmd_collect"))

    p = sub.add_parser("report", help="tables and figures from the tidy CSV")
    p.add_argument("runs_csv", help="tidy CSV written by `fedshift collect`")
    p.add_argument("out", help="report folder to publish (report.md, tables, figures)")
    p.add_argument("--config", default=None, help="report section of the experiment config (YAML)")
    p.add_argument("--archive", default=None,
                   help="the workflow's archive status (JSON): committed records read or left out as stale, listed "
                        "with their code version in the report")
    p.add_argument("--no-tracking", action="store_true")
    p.set_defaults(fn=("reporting", "cmd_report"))

    p = sub.add_parser("archive", help="copy each finished run's record (config, inputs, metrics, curves; no weights) "
                                       "into the committed archive records/<grid>/",
                       description="Plan the GRID files with the KEY=VALUE overrides as `fedshift run` does, then copy "
                                   "every finished run's record (config.yaml, inputs.json, metrics.json, rounds.csv, "
                                   "gzip-compressed when long, and the tuning selection it used; never the weights) "
                                   "into records/<report name>/. A run that has not finished, ran with other settings "
                                   "or on data that changed since is skipped with one line saying so. Snakemake then "
                                   "plans no job for an archived run whose record is current, and collect reads the "
                                   "record.")
    p.add_argument("items", nargs="*", metavar="GRID | KEY=VALUE", help="grid files, then dotted overrides")
    p.add_argument("--records", default="records", help="archive root (default: %(default)s)")
    p.add_argument("--results", default="results", help="where the runs were published (default: %(default)s)")
    p.set_defaults(fn=("grid", "cmd_archive"))

    p = sub.add_parser("docs-tables", help="render the docs' measured tables from the committed archive "
                                           "(between <!-- generated: NAME --> markers); --check: only compare")
    p.add_argument("files", nargs="*", help="Markdown files holding marker blocks (default: README.md and docs/*.md)")
    p.add_argument("--records", default="records", help="archive root (default: %(default)s)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming every block whose text differs from its rendering")
    p.set_defaults(fn=("reporting", "cmd_docs_tables"))

    p = sub.add_parser("evaluate", help="re-score a federated run's published models (models.pt)")
    p.add_argument("run_dir", help="finished federated run folder (config.yaml + models.pt)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="evaluate under bf16 autocast (--bf16) or in float32 (--no-bf16); default: as the run")
    p.add_argument("--force", action="store_true",
                   help="score a run whose recorded partition differs from the current one (both hashes printed)")
    p.set_defaults(fn=("jobs", "cmd_evaluate"))

    p = sub.add_parser("validate", help="check the experiment grid and configs")
    p.add_argument("--experiments", nargs="+", default=["params/experiments.yaml"], metavar="GRID",
                   help="grid file(s), merged in order as snakemake --configfile merges them "
                        "(an overlay such as fedh2l_table2_quick.yaml after the file it adds to)")
    p.add_argument("--data-params", default="params/data.yaml")
    p.set_defaults(fn=("grid", "cmd_validate"))

    p = sub.add_parser("run", help="run Snakemake on grid files with dotted overrides: "
                                   "fedshift run [GRID ...] engine.rounds=3 methods.fedprox.mu=0.1 -- -n",
                       description="Merge the GRID files (default params/experiments.yaml) as snakemake --configfile "
                                   "does, set each KEY=VALUE (dotted key, YAML value; a list item by index: "
                                   "grid.0.seeds=[0,1]), check the grid as `fedshift validate` does, write it to "
                                   "results/configs/run-<hash>.yaml and run snakemake --configfile on it with the "
                                   "arguments after -- (default: --cores all).")
    p.add_argument("items", nargs="*", metavar="GRID | KEY=VALUE", help="grid files, then dotted overrides")
    p.set_defaults(fn=("grid", "cmd_run"), snakemake_args=[])

    p = sub.add_parser("ui-url", help="print, per federated experiment, the MLflow URL that opens on the "
                                      "headline view (AVG inter/intra first; start `mlflow ui` first)")
    p.add_argument("--base", default="http://127.0.0.1:5000", help="where `mlflow ui` serves (default: %(default)s)")
    p.set_defaults(fn=("mlflow_store", "cmd_ui_url"))

    p = sub.add_parser("relocate-store", help="point a copied or moved mlflow.db at this folder's mlartifacts/ "
                                              "(every workflow start does it too)")
    p.add_argument("root", nargs="?", default=".", help="the project folder holding mlflow.db (default: .)")
    p.set_defaults(fn=("mlflow_store", "cmd_relocate_store"))

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
    # Only now, the arguments parsed: `--help` and a usage error load none of the commands' code.
    from . import data_stages, grid, jobs, mlflow_store, reporting
    from ..tracking import Interrupted

    module, fn = args.fn
    groups = {"names": names, "data_stages": data_stages, "jobs": jobs, "grid": grid,
              "reporting": reporting, "mlflow_store": mlflow_store}
    try:
        rc = getattr(groups[module], fn)(args)  # a command may return an exit status (`run`: Snakemake's)
    except ConfigError as exc:
        print(f"fedshift: error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"fedshift: error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        import signal  # not loaded by `fedshift --help`: only a stopped job needs its names

        print(f"fedshift: stopped by {signal.Signals(exc.signum).name}; the last checkpoint is kept, "
              "rerun the same command to resume", file=sys.stderr)
        return 128 + exc.signum
    return int(rc or 0)
