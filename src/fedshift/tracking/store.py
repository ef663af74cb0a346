"""The MLflow store and what its UI shows: the SQLite store created once and relocated with its folder,
each experiment created with its description and kind, and the "headline view" a federated experiment
opens on."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Dict

from .calls import default_uri, retry

log = logging.getLogger(__name__)

REPORT_EXPERIMENT = "report"  # the experiment of the report runs (report_run)


def init_store(root: Path | None = None) -> str:
    """Create the SQLite store (schema migrations) once, before parallel jobs race to do it,
    and point a moved store's artifact locations at this folder (:func:`relocate_store`)."""
    import mlflow

    uri = default_uri(root)
    mlflow.set_tracking_uri(uri)
    retry(mlflow.MlflowClient(uri).search_experiments, max_results=1)
    here = Path(root or os.getcwd()).resolve()
    moved = relocate_store(here) if uri == f"sqlite:///{here / 'mlflow.db'}" else 0  # a server's store is left alone
    if moved:
        log.info("MLflow: %d artifact locations pointed at %s (the store was copied or moved)", moved,
                 here / "mlartifacts")
    return uri


# MLflow stores absolute artifact locations (a relative one is made absolute when the experiment
# is created), so a project folder copied elsewhere (`cp -r`, a shared disk, an archive) would
# point its runs at the old folder's mlartifacts/. Every location fedshift creates ends in
# /mlartifacts/<experiment>...: relocation swaps the part before /mlartifacts/ for this folder.
_LOCATION_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                     ("logged_models", "artifact_location"))


def relocate_store(root: Path | None = None) -> int:
    """Rewrite the store's ``file://.../mlartifacts/...`` locations that point outside
    ``root`` (default: the working folder) to ``root/mlartifacts/...``; return how many changed.
    Only the local SQLite store ``root/mlflow.db`` is touched."""
    root = Path(root or os.getcwd()).resolve()
    db = root / "mlflow.db"
    if not db.exists():
        return 0
    here = (root / "mlartifacts").as_uri()
    changed = 0
    con = sqlite3.connect(str(db), timeout=30)
    try:
        with con:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
            for table, col in _LOCATION_COLUMNS:
                if table not in tables:
                    continue
                rows = con.execute(f"select rowid, {col} from {table} where {col} like 'file://%/mlartifacts/%'")
                for rowid, loc in rows.fetchall():
                    new = here + loc[loc.rfind("/mlartifacts/") + len("/mlartifacts"):]
                    if new != loc:
                        con.execute(f"update {table} set {col} = ? where rowid = ?", (new, rowid))
                        changed += 1
    finally:
        con.close()
    return changed


def experiment_id(client, name: str, root: Path) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        eid = client.create_experiment(name, artifact_location=(root / "mlartifacts" / name).as_uri())
    except Exception:  # created meanwhile by a parallel job
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
    if _federated_experiment(name):
        set_headline_view(client, eid)
    describe_experiment(client, eid, name)
    return eid


# MLflow 3 opens on its GenAI home and shows an experiment's GenAI overview (traces) in "GenAI" mode,
# the default of its "GenAI | Model training" switch, which the browser keeps (localStorage
# `mlflow.workflowType`). A URL's `workflowType=machine_learning` selects "Model training" (3.17);
# the experiment tag `mlflow.experimentKind: custom_model_development` is what earlier 3.x UIs read
# (3.17 ignores it while the switch exists; written for them). `mlflow.note.content` is the
# description at the top of the experiment's page, whose first line shows without expanding it.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"


def headline_view_path(experiment_id: str) -> str:
    """The hash route of an experiment's headline view, in "Model training" mode."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={SHARED_VIEW_KEY}&workflowType=machine_learning"


def experiment_description(name: str, experiment_id: str) -> str:
    """The experiment's description (Markdown): what its runs are and how to land on the answer."""
    if name == REPORT_EXPERIMENT:
        return ("fedshift reports: one run per grid.\n\nRun name `report/<report.name>` (`report/main`: the "
                "default grid). Its artifacts hold `report.md`, the tables (CSV) and the figures; the "
                "same files are in `results/report/` (or `results/ablations/<name>/report/`).")
    if name.endswith("-pretrain"):
        return (f"SOLO/BASE pretraining runs of scenario {name[:-len('-pretrain')]}, one per "
                "participant x architecture x seed.\n\n"
                "Run name `<arch> <participant> s<seed> <identity>`; the report's "
                "`base_pretrain` row. The federated runs are in the experiment named after the scenario.")
    if name.endswith("-tune"):
        return (f"Tuning candidates of scenario {name[:-len('-tune')]}: one run per candidate x tuning seed, "
                "scored on the validation holdout.\n\n"
                "Run name `tune/<method> <values> s<seed> <structure> <public set> <identity>`, tags "
                "`fedshift.kind: tune`, `tune.<parameter>`, `tune.diverged`. The chosen values and every "
                "candidate's score: `tuned.csv` and the report's Tuned hyper-parameters section (docs/tuning.md). "
                "The seeded runs are in the experiment named after the scenario.")
    # The experiments list shows a description as raw text (its start: plain words); the runs page shows the
    # rendered first line without expanding it (the link). Issue 50, benchmarks/results/first_view/.
    return (f"Federated runs of scenario {name}. **[Open the headline view]({headline_view_path(experiment_id)})**: "
            "AVG inter / intra of every run side by side.\n\n"
            "One run per method x seed x structure x public set, run name `<method> s<seed> <structure> <public set> "
            "<identity>` (the identity: the first characters of the run's settings hash, tag `fedshift.identity`; "
            "two grids that set a method differently give two runs). The headline view: federated runs sorted by "
            "name, first columns "
            "`table/AVG_inter` and `table/AVG_intra` (percent, rounded to 0.01: the AVG columns of the "
            "report's tables for that seed), then `time/total_s`, `method`, `structure`; a first chart "
            "section with the headline per method. Per-round curves: `avg/inter/top1`, "
            "`<participant>/inter/top1`. Pretraining runs: experiment "
            f"`{name}-pretrain`; the tables with their intervals: `results/report/report.md`.")


def describe_experiment(client, experiment_id: str, name: str) -> None:
    """Write the description and the experiment kind (also into a store made before they existed)."""
    retry(client.set_experiment_tag, experiment_id, DESCRIPTION_TAG, experiment_description(name, experiment_id))
    retry(client.set_experiment_tag, experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


# ---------------------------------------------------------------------------------------
# The view MLflow opens on. MLflow 3 keeps an experiment page's columns, order and charts in
# the browser (localStorage); a "shared view" is the same state stored server-side as the
# experiment tag `mlflow.sharedViewState.<key>` and opened by `?viewStateShareKey=<key>` in the
# URL. fedshift writes one per federated experiment: federated runs by name, the report
# table's AVG inter / intra as the first columns, a first chart section with the headline.

SHARED_VIEW_TAG = "mlflow.sharedViewState."
SHARED_VIEW_KEY = "fedshift-headline"


def _federated_experiment(name: str) -> bool:
    """Experiments of federated runs: not MLflow's Default, the reports' or ``<scenario>-pretrain``
    (the names :func:`job_experiment` and :func:`report_run` give)."""
    return name not in (REPORT_EXPERIMENT, "Default") and not name.endswith(("-pretrain", "-tune"))


def headline_view_state(metric: str = "table/AVG_inter",
                        kind_filter: str = "tags.`fedshift.kind` = 'federate'") -> Dict[str, Any]:
    """The experiment page's view state (keys as MLflow 3.x writes them; unknown keys are
    ignored and missing ones defaulted by the UI)."""
    section = "fedshift-headline"
    line = {"lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear", "range": {},
            "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [],
            "ignoreOutliers": False, "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}
    chart = {"metricSectionId": section, "deleted": False, "isGenerated": False, "runsCountToCompare": 50}
    return {
        "searchFilter": kind_filter, "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
        "startTime": "ALL", "lifecycleFilter": "Active",
        "selectedColumns": [f"metrics.`{metric}`", "metrics.`table/AVG_intra`", "metrics.`time/total_s`",
                            "params.`method`", "params.`structure`"],
        "compareRunCharts": [
            {**chart, "uuid": "fedshift-headline-bar", "type": "BAR", "metricKey": metric, "displayName": metric},
            {**chart, **line, "uuid": "fedshift-acc-line", "type": "LINE", "metricKey": "avg/inter/top1",
             "displayName": "avg/inter/top1"},
            {**chart, "uuid": "fedshift-time-bar", "type": "BAR", "metricKey": "time/total_s",
             "displayName": "time/total_s"},
        ],
        "compareRunSections": [{"uuid": section, "name": "fedshift: headline per method", "display": True,
                                "isReordered": True, "deleted": False, "isGenerated": False}],
        "isAccordionReordered": True, "runListHidden": False, "hideEmptyCharts": True, "chartsSearchFilter": "",
        "viewMaximized": False,
    }


def set_headline_view(client, experiment_id: str) -> None:
    retry(client.set_experiment_tag, experiment_id, SHARED_VIEW_TAG + SHARED_VIEW_KEY,
           json.dumps(headline_view_state(), separators=(",", ":")))


def headline_view_urls(root: Path | None = None, base: str = "http://127.0.0.1:5000") -> Dict[str, str]:
    """Experiment name -> the URL of its headline view, for every federated experiment of the
    store (the view tag is written where an older store lacks it)."""
    import mlflow

    client = mlflow.MlflowClient(default_uri(root))
    out = {}
    for exp in retry(client.search_experiments):
        if not _federated_experiment(exp.name):
            continue
        if SHARED_VIEW_TAG + SHARED_VIEW_KEY not in exp.tags:
            set_headline_view(client, exp.experiment_id)
        if DESCRIPTION_TAG not in exp.tags:
            describe_experiment(client, exp.experiment_id, exp.name)
        out[exp.name] = f"{base}/{headline_view_path(exp.experiment_id)}"
    return out
