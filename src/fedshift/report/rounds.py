"""Rounds-to-accuracy tables and accuracy-vs-rounds curves of the global model
(FedMMD/FedFusion, Yao et al. 2019: Figures 4-5, Table 2 and § 4.2).

Input: the ``kind == "global"`` rows of ``runs.csv`` (the server-side evaluation of the
global model on the pooled test set, ``engine.global_eval_every``). For each (scenario,
public, structure) group:

* ``rounds_<slug>.csv`` / a Markdown table: per method, the first evaluated round whose
  top-1 reaches each target of ``report.targets``: the mean over *all* seeds, a seed that never
  reaches it counted as its last evaluated round + 1 (the mean is then a lower bound, printed
  ``≥``; "never" when no seed reaches it), with ``reached/n`` beside every cell (issue 21 item 7:
  dropping those seeds made a method that rarely gets there look fast), the
  reduction versus ``fedavg`` (1 - rounds / rounds_fedavg, as Table 2), and the final
  accuracy (mean of the last ``last_k`` evaluations); published numbers (``report.published``
  tables, metrics ``rounds_to/<t>`` and ``global/top1``) beside ours, matched on method and
  on the scenario or the scenario it stands in for (``report.published_scenarios``);
* ``global_curves__<slug>.png``: test accuracy per round per method, targets dashed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import pandas as pd

from .frames import tuned_budget, tuned_values
from .tables import Table, TableText

BASELINE = "fedavg"
GROUP = ["scenario", "public", "structure"]
PUBLISHED_DIR = Path(__file__).resolve().parents[3] / "params" / "papers" / "published"


def first_round(curve: pd.DataFrame, target: float) -> Optional[int]:
    hit = curve[curve["top1"] >= target]
    return int(hit["round"].min()) if len(hit) else None


def rounds_table(g: pd.DataFrame, targets: Sequence[float], last_k: int = 3,
                 baseline: str = BASELINE) -> pd.DataFrame:
    """Rows = methods; per target: mean rounds over every seed (a seed that never reaches it counts as its
    last round + 1: a lower bound), seeds reaching it, reduction vs ``baseline`` (%); plus the final top-1
    (%) and the number of seeds."""
    rows = []
    for method, gm in g.groupby("method", sort=False):
        row: Dict[str, object] = {"method": method}
        seeds = sorted(gm["seed"].unique())
        finals = []
        per_t: Dict[float, List[int]] = {t: [] for t in targets}
        for s in seeds:
            curve = gm[gm["seed"] == s].sort_values("round")
            evald = curve[curve["round"] > 0]
            finals.append(evald["top1"].tail(last_k).mean() if len(evald) else float("nan"))
            for t in targets:
                r = first_round(curve, t)
                per_t[t].append((r, True) if r is not None else (int(curve["round"].max()) + 1, False))
        for t in targets:
            row[f"rounds_to/{t:g}"] = sum(r for r, _ in per_t[t]) / len(per_t[t]) if per_t[t] else float("nan")
            row[f"reached/{t:g}"] = sum(ok for _, ok in per_t[t])
        row["global/top1"] = 100 * sum(finals) / len(finals)
        row["seeds"] = len(seeds)
        rows.append(row)
    table = pd.DataFrame(rows).set_index("method")
    for t in targets:
        col = f"rounds_to/{t:g}"
        ref = table[col].get(baseline, float("nan"))
        table[f"reduce/{t:g}"] = 100 * (1 - table[col] / ref) if ref == ref and ref > 0 else float("nan")
    order = [baseline] + sorted(m for m in table.index if m != baseline) if baseline in table.index \
        else sorted(table.index)
    return table.loc[order]


def load_published(names: Sequence[str], directory: Path = PUBLISHED_DIR) -> pd.DataFrame:
    """Rows of the named published tables (missing files are skipped: the report says which)."""
    frames = []
    for n in names:
        p = Path(directory) / f"{n}.csv"
        if p.exists():
            frames.append(pd.read_csv(p, dtype={"table": str}))
    cols = ["paper", "table", "scenario", "method", "participant", "metric", "value", "flag", "note"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def _fmt_rounds(v: float, reached: int, seeds: int) -> str:
    """``12.5 (2/2)``; ``≥ 14.0 (1/2)`` when a seed never reached it; ``never (0/2)``."""
    if reached == 0:
        return f"never ({reached}/{seeds})"
    s = f"{v:.1f}" if seeds > 1 else f"{v:.0f}"
    return f"{s} ({reached}/{seeds})" if reached == seeds else f"≥ {s} ({reached}/{seeds})"


def to_markdown(table: pd.DataFrame, targets: Sequence[float], title: str,
                published: Optional[pd.DataFrame] = None, tuned: Optional[Dict[str, str]] = None) -> TableText:
    """``tuned``: method -> its tune's chosen values: a ``tuned`` column when a row was (``no`` on the others)."""
    head = ["method"]
    for t in targets:
        head += [f"rounds to {100 * t:g}%", "reduce"]
    head += ["final top-1 (%)", "seeds"]
    mark = any((tuned or {}).get(m) for m in table.index)
    if mark:
        head += ["tuned"]
    has_pub = published is not None and len(published) > 0
    if has_pub:
        head += ["published (paper, table)"]
    rows = []
    for method, row in table.iterrows():
        cells = [str(method)]
        for t in targets:
            cells.append(_fmt_rounds(row[f"rounds_to/{t:g}"], int(row[f"reached/{t:g}"]), int(row["seeds"])))
            red = row[f"reduce/{t:g}"]
            censored = int(row[f"reached/{t:g}"]) < int(row["seeds"]) or int(
                table.loc[BASELINE, f"reached/{t:g}"] if BASELINE in table.index else 0) < int(
                table.loc[BASELINE, "seeds"] if BASELINE in table.index else 1)
            if method == BASELINE and red == red:
                cells.append("(ref)")
            else:
                cells.append("-" if red != red or censored else f"{red:.1f}%")  # no reduction from a lower bound
        cells += [f"{row['global/top1']:.2f}", str(int(row["seeds"]))]
        cells += [(tuned or {}).get(method) or "no"] if mark else []
        if has_pub:
            pub = published[published["method"] == method]
            cells.append("; ".join(f"{r.metric} = {r.value:g} ({r.paper} {r.table})" for r in pub.itertuples())
                         or "-")
        rows.append(cells)
    return Table(head, rows, title, align="l" + "r" * (len(head) - 1 - mark - has_pub) + "l" * (mark + has_pub)).text()


def curves_figure(g: pd.DataFrame, path: Path, title: str, targets: Sequence[float],
                  methods: Optional[Sequence[str]] = None) -> None:
    """Global test accuracy per round, one line per method (colours of the grid's method order ``methods``),
    the targets dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    d = g.copy()
    d["top1"] *= 100
    order = ([BASELINE] if BASELINE in set(d["method"]) else []) + sorted(set(d["method"]) - {BASELINE})
    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    from matplotlib.ticker import MaxNLocator

    from .palette import method_colours

    sns.lineplot(data=d, x="round", y="top1", hue="method", hue_order=order, palette=method_colours(order, methods),
                 errorbar="sd" if d["seed"].nunique() > 1 else None, ax=ax)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for t in targets:
        ax.axhline(100 * t, color="grey", linestyle="--", linewidth=0.8)
    lo = max(0.0, min(100 * min(targets, default=0.5) - 25, d["top1"].quantile(0.2)))
    ax.set_ylim(lo, 100)
    ax.set_xlabel("communication round")
    ax.set_ylabel("global model top-1 test accuracy (%)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rounds_report(df: pd.DataFrame, out_dir: Path, report_cfg: Mapping, last_k: int = 3) -> List[str]:
    """Write the rounds tables and curves of every group with global evaluations; return Markdown."""
    g = df[df["kind"] == "global"]
    if g.empty:
        return []
    targets = [float(t) for t in report_cfg.get("targets") or []]
    published = load_published(report_cfg.get("published") or [])
    missing = [n for n in report_cfg.get("published") or [] if not (PUBLISHED_DIR / f"{n}.csv").exists()]
    stand_in: Mapping[str, str] = report_cfg.get("published_scenarios") or {}
    md = ["## Global model: rounds to accuracy (FedMMD/FedFusion protocol)", "",
          f"First evaluated round whose global top-1 reaches each target, mean over every seed with "
          f"(seeds reaching it / seeds) beside it; a seed that never reaches it counts as its last round + 1, so "
          f"such a mean is a lower bound (≥) and gets no reduction; reduction vs {BASELINE} as "
          f"FedFusion Table 2; final = mean of the last {last_k} evaluations.", ""]
    if missing:
        md += [f"Published tables not found (skipped): {', '.join(missing)}", ""]
    for (scen, pub, struct), gg in g.groupby(GROUP):
        slug = "__".join(str(p) for p in (scen, pub, struct))
        table = rounds_table(gg, targets, last_k)
        table.to_csv(Path(out_dir) / f"rounds__{slug}.csv")
        p = published[published["scenario"] == stand_in.get(scen, scen)]
        p = p[p["metric"].astype(str).str.startswith(("rounds_to/", "global/"))]
        md.append(to_markdown(table, targets, f"{scen} / public {pub} / {struct}", p, tuned_values(gg)))
        md += tuned_rounds_note(gg, report_cfg)  # issue 36: which rows ran at tuned values, by what budget
        curves_figure(gg, Path(out_dir) / f"global_curves__{slug}.png", f"{scen} / {struct}", targets,
                      report_cfg.get("method_order"))
        md.append(f"![global accuracy per round](global_curves__{slug}.png)\n")
    return md


def tuned_rounds_note(g: pd.DataFrame, report_cfg: Mapping) -> List[str]:
    """The line under a rounds table whose rows include tuned runs (issue 36): which methods ran at
    values chosen on validation (``tuned.csv``), and the tuning budget; else nothing."""
    if "tuned" not in g.columns or not g["tuned"].fillna(False).astype(bool).any():
        return []
    tuned = sorted(set(g.loc[g["tuned"].fillna(False).astype(bool), "method"]))
    rest = sorted(set(g["method"]) - set(tuned))
    line = (f"Tuned on the validation holdout (values and every candidate's score: section Tuned "
            f"hyper-parameters): {', '.join(tuned)}" + (f"; not tuned: {', '.join(rest)}" if rest else "") + ".")
    return [line + tuned_budget(report_cfg, g), ""]
