"""Paper-style tables and figures from ``runs.csv``.

* Inter-domain (``p→``) and intra-domain (``p↩``) tables, the layout of FCCL+ Tables VIII / IX: rows =
  methods in the grid's order (``report.method_order``), columns = each participant and AVG; the number
  is the mean over the last ``last_k`` evaluated rounds (3 in the papers), averaged over seeds (± the 95%
  t half-width when there are several). Top-1 or top-5 per the scenario's convention (the authors' code:
  top-1 on Digits/Office-Caltech, top-5 on Office31/Office-Home). Bold: :data:`BOLD_RULE`.
* Figures: accuracy per round per method, inter and intra, one PNG per (scenario, public set,
  structure); colours from the grid's method order (:mod:`.palette`).
* Named tables from ``report.tables`` in the experiment config (ablation grids).
* The grid's comparison (``report.reference`` / ``report.compare``, :mod:`.comparison`) and its own claims
  (``report.claims``, :mod:`.grid_claims`); the paper delta where it names published tables.

Every table goes through :mod:`.tables` (report.md, report.html, tables.tex). Everything lands in the
output folder (written as a whole, atomically) and is logged to an MLflow run in the experiment ``report``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pandas as pd

from ..data.store import atomic_dir
from ..tracking import report_run
from .comparison import comparison_section, separated_cells  # Δ paired by seed; the bold cells' rule
from .delta_markdown import interval_coverage  # what the intervals cover, said once for every section
from .figures import report_figures  # per-participant, heatmaps, cross-correlation, ablations, t-SNE
from .frames import headline_frame, ordered, participant_archs
from .frames import selection_note, tuned_budget, tuned_values
from .frames import topk as _topk
from .grid_claims import grid_claims_section
from .h2l import h2l_section  # FedH2L Table II (ACC / WDP / CDP) when the runs wrote pooled rows
from .html import write_views  # report.html (figures embedded), claims.html, tables.tex
from .palette import method_colours
from .records import diverged_section, records_section  # issue 52: which numbers come from committed records, and with which code
from .paper_delta import delta_report  # published tables (report.published) and the papers' claims
from .rounds import rounds_report
from . import runs_read
from .ours import parse_sizes
from .stats import MIN_N, fmt_interval, half_width, images_behind, resolution
from .tables import Cell, Table, TableText


def seed_table(head: pd.DataFrame, kind: str, metric: str) -> pd.DataFrame:
    """Rows = (method, seed), columns = each participant and AVG (the mean over participants of that seed),
    in percent: the numbers behind one table, seed by seed."""
    h = head[head["kind"] == kind]
    per_seed = h.pivot_table(index=["method", "seed"], columns="participant", values=metric, aggfunc="mean")
    parts = list(dict.fromkeys(h.sort_values("participant")["participant"]))
    per_seed = per_seed[[p for p in parts if p in per_seed.columns]]
    per_seed["AVG"] = per_seed.mean(axis=1)
    arrow = "→" if kind == "inter" else "↩"
    per_seed.columns = [f"{c}{arrow}" for c in per_seed.columns]
    return per_seed * 100


def paper_table(head: pd.DataFrame, kind: str, metric: str,
                methods: Optional[List[str]] = None) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Rows = methods, columns = participants + AVG + seeds: (mean, std over seeds), in percent,
    unrounded (rounding happens once, when printed: the CI of a cell is computed from these). Rows in the
    order of ``methods`` (the grid's), the others after them."""
    per_seed = seed_table(head, kind, metric)
    mean = per_seed.groupby(level="method").mean()
    std = per_seed.groupby(level="method").std(ddof=1)  # nan with one seed: there is no spread to show
    n = per_seed.groupby(level="method").size()
    order = ordered(mean.index, methods)
    mean, std = mean.loc[order], std.loc[order]
    out = mean.copy()
    out["seeds"] = n.loc[order].values
    return out, std


def ci_table(std: pd.DataFrame, n: pd.Series) -> pd.DataFrame:
    """95% confidence half-width of the seed mean (Student t, n - 1 dof) from the unrounded std table;
    nan for n < 2."""
    half = std.copy()
    for method in std.index:
        k = int(n.loc[method])
        half.loc[method] = [half_width(v, k) for v in std.loc[method]]
    return half


def _header(col: str, archs: Optional[Dict[str, str]]) -> str:
    """``m20→ (lenet)``: the participant's column with its architecture (heterogeneous tables)."""
    part = col.rstrip("→↩")
    return f"{col} ({archs[part]})" if archs and part in archs else col


BOLD_RULE = (f"**Bold**: the column's best mean, only where it is separated from every other row: with at least "
             f"{MIN_N} seeds in common, the 95% interval of the per-seed difference lies above 0 (paired t); with "
             f"fewer in common, both rows have n ≥ {MIN_N} and their 95% intervals do not overlap; an interval "
             "narrower than the metric's resolution (100 / the test images behind the column) separates nothing. "
             f"Never below {MIN_N} seeds.")


def to_markdown(table: pd.DataFrame, title: str, std: Optional[pd.DataFrame] = None,
                archs: Optional[Dict[str, str]] = None, per_seed: Optional[pd.DataFrame] = None,
                res: Optional[Dict[str, float]] = None, tuned: Optional[Dict[str, str]] = None) -> TableText:
    """``std`` here is the 95% half-width table (:func:`ci_table`): ``mean ± half`` (``mean [lo, hi]``
    where the interval is clipped to [0, 100]); bold where :data:`BOLD_RULE` holds, from ``per_seed``
    (:func:`seed_table`; none without it) and each column's resolution ``res`` (:func:`column_resolution`).
    ``tuned``: method -> the values its tune chose (``lr=0.003 beta=0.9``): a last column ``tuned`` when a
    row of the table was tuned (``no`` on the others)."""
    cols = [c for c in table.columns if c != "seeds"]
    bold = separated_cells(per_seed[cols].loc[list(table.index)], res) if per_seed is not None else {}
    tuned = {m: v for m, v in (tuned or {}).items() if m in table.index}
    mark = any(tuned.values())
    rows = []
    for method, row in table.iterrows():
        k = int(row["seeds"])
        cells = [Cell(fmt_interval(row[c], std.loc[method, c] if std is not None else float("nan"), k),
                      bold.get(c) == method) for c in cols]
        rows.append([method, *cells, k] + ([tuned.get(method) or "no"] if mark else []))
    head = ["method"] + [_header(c, archs) for c in cols] + ["seeds"] + (["tuned"] if mark else [])
    return Table(head, rows, title, align="l" + "r" * (len(cols) + 1) + "l" * mark).text()


def column_resolution(runs: pd.DataFrame, kind: str, metric: str, columns) -> Dict[str, float]:
    """column (``m20→``, ``AVG↩``) -> the step its accuracy moves by, 100 / the test images behind it, from
    the runs' recorded test sizes (none recorded: {}, the fallback)."""
    recorded = runs["test_sizes"].dropna() if "test_sizes" in runs.columns else pd.Series(dtype=str)
    sizes = parse_sizes(recorded.iloc[0]) if len(recorded) else {}
    if not sizes:
        return {}
    return {c: resolution(images_behind(f"{kind}/{metric}", "avg" if c.startswith("AVG") else c.rstrip("→↩"), sizes))
            for c in columns if c != "seeds"}


def curves_figure(df: pd.DataFrame, path: Path, title: str, methods: Optional[List[str]] = None) -> None:
    """Mean accuracy over participants per round, one line per method (colours of the grid's method order
    ``methods``, :func:`fedshift.report.palette.method_colours`), band = ± one std over seeds; labels inside
    each panel, whole-number round ticks, the participants' architectures under the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    df = df[df["method"] != "base_pretrain"]  # one point (the pretrain runs' final epoch), no curve
    metric = _topk(df["scenario"].iloc[0])
    avg = (df.groupby(["method", "seed", "round", "participant", "kind"], as_index=False)[metric].mean()
             .groupby(["method", "seed", "round", "kind"], as_index=False)[metric].mean())
    avg[metric] *= 100
    order = ordered(set(avg["method"]), methods)
    archs = participant_archs(df)
    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharex=True)
    labels = ("inter-domain (each model on the other participants' domains)", "intra-domain (each model on its own domain)")
    marker = "o" if avg["round"].nunique() <= 40 else None  # 200 evaluations of a FedH2L run: a line, no dots
    for ax, kind, label in zip(axes, ("inter", "intra"), labels):
        sns.lineplot(data=avg[avg["kind"] == kind], x="round", y=metric, hue="method", hue_order=order,
                     palette=method_colours(order, methods), marker=marker,
                     errorbar=("sd") if avg["seed"].nunique() > 1 else None, ax=ax)
        ax.set_title(label, fontsize=11)
        ax.set_ylabel(f"{metric} accuracy (%)\nmean over participants", fontsize=9)
        ax.set_xlabel("communication round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes:
        if ax.get_legend():
            ax.get_legend().remove()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=9, frameon=False,
               title="method" + (" (band: ± 1 sd over seeds)" if avg["seed"].nunique() > 1 else ""),
               title_fontsize=9)
    parts = ", ".join(f"{p}: {a}" for p, a in archs.items())
    fig.suptitle(title + (f"\nparticipants: {parts}" if parts else ""), fontsize=10)
    rows = -(-len(labels) // 6)
    fig.tight_layout(rect=(0, 0.08 + 0.05 * rows, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _slug(*parts: str) -> str:
    return "__".join(str(p) for p in parts)


def protocol_note(runs: pd.DataFrame) -> str:
    """The test protocol of one table's runs (issue 47: runs.csv's ``test_protocol``, absent = clean),
    said with what it is for the scenario (its registry entry's ``authors_test``)."""
    from ..data import SCENARIOS

    scen = str(runs["scenario"].iloc[0]) if len(runs) else ""
    said = []
    recorded = runs["test_protocol"].fillna("").astype(str) if "test_protocol" in runs else pd.Series(["clean"])
    for p in sorted({v or "clean" for v in recorded}):
        if p == "authors":
            text = SCENARIOS.get(scen).authors_test if scen in SCENARIOS else ""
            said.append(f"**authors** (the authors' code's test set{': ' + text if text else ''})")
        else:
            said.append("**clean** (held-out test images, none of them in a training split: audited by source row "
                        "and pixel hash)")
    return "Test protocol: " + "; ".join(said) + "."


def mixed_protocols(runs: pd.DataFrame) -> List[str]:
    """A warning line when the rows of one table were scored under different ``eval_models`` / ``weighting``
    (runs published before the grid's ``scoring:`` block made one protocol per table, or collected from
    several grids): such rows do not compare like for like."""
    if "protocol" not in runs.columns:
        return []
    per = (runs.dropna(subset=["protocol"]).loc[lambda d: d["protocol"].astype(str) != ""]
           .groupby("method")["protocol"].first())
    if per.nunique() < 2:
        return []
    return ["**⚠ Mixed scoring protocols in this table:** " + "; ".join(f"{m}: {p}" for m, p in per.items())
            + " (`eval_models: local` scores each participant's own model after local updating, `global` the "
            "averaged model; one `scoring:` block per scenario scores every row alike).", ""]


def make_report(runs_csv: Path, out_dir: Path, report_cfg: Optional[Dict] = None, last_k: int = 3,
                tracking: bool = True) -> List[Path]:
    df = pd.read_csv(runs_csv)
    report_cfg = report_cfg or {}
    written: List[Path] = []
    # every method of the report in the grid's order (report.method_order), then the rest: table rows and colours
    order = ordered(set(df["method"]), report_cfg.get("method_order"))
    figure_cfg = {**report_cfg, "method_order": order}

    with atomic_dir(Path(out_dir)) as tmp:
        full, df = df, df[df["kind"] != "global"]  # global-model rows: report/rounds.py
        head = headline_frame(df, last_k) if len(df) else pd.DataFrame(
            columns=["scenario", "public", "structure", "method", "seed", "participant", "kind", "top1", "top5"])
        md = [f"# {report_cfg.get('title', 'fedshift report')}", "",
              f"Mean accuracy (%) of the last {last_k} communication rounds, averaged over seeds; ± = 95% "
              "confidence half-width of that mean (Student t, seeds − 1 degrees of freedom; n = the seeds "
              "column; no interval with one seed). An interval reaching beyond 0 or 100 is printed clipped, "
              "as `mean [low, high]`. Numbers are rounded once, when printed. `std_table_*.csv` hold the seed "
              "std, `ci_table_*.csv` the half-widths (unrounded). Rows: methods in the grid's order; columns: each "
              "participant (with its architecture) and AVG, the mean over participants. Inter-domain (→): a "
              "participant's model on the other participants' domains, their mean; intra-domain (↩): on its own "
              f"domain. {BOLD_RULE} Every table is also in `report.html` and, as LaTeX (booktabs), in `tables.tex`.",
              "", f"**What the intervals cover:** {interval_coverage(full)}", ""]
        if (df["method"] == "base_pretrain").any():
            md += ["`base_pretrain` is the papers' SOLO/BASE row: each participant trained alone on its private "
                   "data for `pretrain.epochs` epochs (the pretrain runs, final epoch); `base` is the same without "
                   "communication on the federated schedule (rounds x local epochs).", ""]
        for (scen, pub, struct), h in head.groupby(["scenario", "public", "structure"]):
            slug = _slug(scen, pub, struct)
            sub = df[(df.scenario == scen) & (df.public == pub) & (df.structure == struct)]
            md += results_tables(h, sub, f"{scen} / public {pub} / {struct}", order, tmp, slug)
            md.append(selection_note(sub[sub["method"] != "base_pretrain"], last_k)
                      + tuned_budget(report_cfg, sub) + "\n")  # issue 36: which selection, which rows tuned
            md.append(protocol_note(sub) + "\n")  # issue 47: which test set the table's numbers are on
            curves_figure(sub, tmp / f"curves__{slug}.png", f"{scen} / public {pub} / {struct}", order)
            md.append(f"![curves](curves__{slug}.png)\n")
        named = {}  # (table name, scenario, public, structure) -> (table, std): ablation bar charts
        for spec in report_cfg.get("tables", []):
            h = head[head["method"].isin(spec["methods"])]
            for key in ("scenarios", "structures", "public"):
                if spec.get(key):
                    col = {"scenarios": "scenario", "structures": "structure", "public": "public"}[key]
                    h = h[h[col].isin(spec[key])]
            for (scen, pub, struct), hh in h.groupby(["scenario", "public", "structure"]):
                sub = df[(df.scenario == scen) & (df.public == pub) & (df.structure == struct)]
                both: List[pd.DataFrame] = []
                md += results_tables(hh, sub, f"{scen} / {pub} / {struct}", spec["methods"], both=both,
                                     title=spec.get("title", spec["name"]))
                (t_inter, sd_inter), (t_intra, sd_intra) = both
                table = pd.concat([t_inter.drop(columns="seeds"), t_intra], axis=1)
                table.to_csv(tmp / f"{spec['name']}__{_slug(scen, pub, struct)}.csv")
                named[(spec["name"], scen, pub, struct)] = (table, pd.concat([sd_inter, sd_intra], axis=1))
                md.append(protocol_note(sub) + "\n")  # issue 47: which test set the table's numbers are on
        md += comparison_section(full, report_cfg, tmp, last_k)  # issue 50: report.reference / report.compare
        md += grid_claims_section(full, report_cfg, tmp, last_k)  # issue 50: the grid's own claims (report.claims)
        md += tuned_section(report_cfg, tmp)  # issue 36: the values chosen on validation, every candidate's score
        md += delta_report(full, figure_cfg, tmp, last_k)
        md.extend(h2l_section(df, report_cfg, tmp, last_k))
        md += rounds_report(full, tmp, figure_cfg, last_k)
        md += report_figures(df, tmp, figure_cfg, last_k, tables=named)
        md += records_section(report_cfg, full)
        md += diverged_section(Path(runs_csv))  # issue 52: diverged seeds, counted beside the tables
        md += runs_read.section(Path(runs_csv), tmp)  # issue 50: the run folders read, each with its identity
        (tmp / "report.md").write_text("\n".join(md))
        write_views(md, tmp, report_cfg.get("title", "fedshift report"))
        written = sorted(tmp.iterdir())
    final = [Path(out_dir) / p.name for p in written]
    if tracking and os.environ.get("FEDSHIFT_TRACKING", "mlflow") != "none":
        with report_run(report_cfg.get("name")) as tr:
            for p in final:
                tr.log_artifact(p)
    return final


def results_tables(head: pd.DataFrame, runs: pd.DataFrame, where: str, methods: Optional[List[str]],
                   out: Optional[Path] = None, slug: str = "", both: Optional[list] = None,
                   title: str = "") -> List[str]:
    """The inter- and intra-domain tables of one group (``head``: its headline frame, ``runs``: its rows),
    rows in the order of ``methods``; with ``out``, their CSVs (mean, std, 95% half-width: same layout).
    ``both`` receives (table, std) of each, for the named tables' CSV and bar chart."""
    metric = _topk(head["scenario"].iloc[0])
    archs = participant_archs(runs[runs["method"] != "base_pretrain"])
    md: List[str] = []
    for kind, label in (("inter", "Inter-domain"), ("intra", "Intra-domain")):
        t, sd = paper_table(head, kind, metric, methods)
        ci = ci_table(sd, t["seeds"])
        if out is not None:
            t.to_csv(out / f"table_{kind}__{slug}.csv")
            sd.to_csv(out / f"std_table_{kind}__{slug}.csv")  # std over seeds, same layout
            ci.to_csv(out / f"ci_table_{kind}__{slug}.csv")  # 95% CI half-width, same layout
        name = f"{title} ({kind}, {metric})" if title else f"{label} {metric}"
        md.append(to_markdown(t, f"{name}: {where}", ci, archs, seed_table(head, kind, metric),
                              column_resolution(runs, kind, metric, t.columns), tuned_values(runs)))
        if kind == "inter" and not title:
            md += mixed_protocols(runs)
        if both is not None:
            both.append((t, sd))
    return md


def _on_edge(candidates, chosen) -> bool:
    """Whether ``chosen`` is the smallest or largest of three or more numeric candidates (a space-separated list)."""
    try:
        values = [float(v) for v in str(candidates).split()]
        c = float(chosen)
    except ValueError:
        return False
    return len(values) > 2 and c in (min(values), max(values))


def tuned_section(report_cfg: Dict, out: Path) -> List[str]:
    """The ``tuned`` table (method, parameter, candidates, chosen, validation score; every candidate's score
    in ``scores``), copied into the report as ``tuned.csv``."""
    t = (report_cfg or {}).get("tuned")
    if not t or not Path(t["table"]).exists():
        return []
    df = pd.read_csv(t["table"])
    df.to_csv(Path(out) / "tuned.csv", index=False)
    b = t.get("budget") or {}
    lines = ["## Tuned hyper-parameters", "",
             f"Chosen on the validation holdout by {t.get('metric')} (best evaluation of each candidate, mean over "
             f"tuning seeds {b.get('seeds')}; {b.get('rounds')} rounds, early-stopping patience {b.get('patience')}); "
             "test data never seen. `val score`: the chosen candidate's; `diverged`: how many candidates' loss or "
             "weights became non-finite (never chosen); `scores`: every candidate's values and validation score (%), "
             "`diverged` in place of a score; `(tie of k: first listed)` after a chosen value: the best-scoring "
             "candidates hold k values of this parameter and the first listed is taken; `(no effect)`: no value "
             "of this parameter changed any candidate's score; `budget`: candidates x rounds x tuning seeds "
             "(docs/tuning.md).", ""]
    edges, inert, rows = [], [], []
    for r in df.itertuples(index=False):
        chosen = f"{r.chosen}"
        if _on_edge(r.candidates, r.chosen):
            chosen += " (edge)"
            edges.append(f"{r.method} {r.parameter}")
        tied = int(r.tied_values) if "tied_values" in df.columns else 1  # per parameter (issue 50)
        if tied > 1:  # chosen by order among equal scores (often: all at chance)
            chosen += f" (tie of {tied}: first listed)"
        if "no_effect" in df.columns and str(r.no_effect) == "True":
            chosen += " (no effect)"
            inert.append(f"{r.method} {r.parameter} ({r.scenario} / {r.structure})")
        div = (f"{r.diverged} of {r.n_candidates}" if "n_candidates" in df.columns else "")
        rows.append([r.scenario, r.public, r.method, r.structure, r.parameter, r.candidates, chosen,
                     f"{r.val_score:.2f}", div, getattr(r, "budget", ""), r.scores])
    lines.append(Table(["scenario", "public", "method", "structure", "parameter", "candidates", "chosen",
                        "val score (%)", "diverged", "budget", "scores"], rows, align="lllllllrlrl").text())
    if edges:
        lines += ["", f"**Chosen at the edge of its range** (the smallest or largest of more than two numeric "
                      f"candidates): {', '.join(edges)}. The best value may lie outside the range searched; "
                      "widen it before reading these rows as tuned."]
    if inert:
        lines += ["", f"**No effect on any score:** {', '.join(inert)}: every value gave every candidate the same "
                      "validation score (the method may not use it under this grid's scoring or data: read its "
                      "Params in `fedshift list --long`)."]
    lines += unequal_budgets(df)
    return lines + [""]


def unequal_budgets(tuned: pd.DataFrame) -> List[str]:
    """A warning per (scenario, public, structure) whose tuned methods had different budgets (candidates x
    rounds x tuning seeds): a method searched with fewer candidates is compared at a disadvantage (issue 50)."""
    if "budget" not in tuned.columns:
        return []
    out = []
    per = tuned.drop_duplicates(["scenario", "public", "structure", "method"])
    for (scen, pub, struct), g in per.groupby(["scenario", "public", "structure"]):
        if g["budget"].nunique() > 1:
            each = ", ".join(f"{r.method} {r.n_candidates} x {r.rounds} x {len(str(r.seeds).split())} = {r.budget}"
                             for r in g.itertuples(index=False))
            out += ["", f"**⚠ Unequal tuning budgets** on {scen} / {pub} / {struct} (candidates x rounds x tuning "
                        f"seeds = rounds of tuning): {each}. A method tuned with fewer candidates is compared at a "
                        "disadvantage: give every method the same number of candidates."]
    return out
