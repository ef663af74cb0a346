"""FedH2L Table II-shaped tables (``papers/fedh2l.txt`` § IV-A) from ``runs.csv``.

Rows: one per (method, scenario), e.g. ``fedh2l`` on ``rotmnist_a05`` (alpha = 5 %); columns:
ACC / WDP / CDP of every participant and their average (Avg), in percent, mean ± std over
seeds. The value of one run and participant is taken at the evaluation with the best
validation ACC when the run wrote ``val_acc`` rows (engine ``select: best_val``, the
paper's "keep the model with the maximal ACC"), else the mean of the last ``last_k``
evaluations. Avg is the mean over participants within a seed, then over seeds.

Published numbers are data (``params/papers/published/<name>.csv``, named by the grid's
``report.published``): when a row exists there, the table shows the paper's value and
the difference (ours - paper) beside ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .frames import published_method_names, rename_published
from .tables import Table

METRICS = ("acc", "wdp", "cdp")
RUN = ["scenario", "public", "structure", "method", "seed"]
PUBLISHED_DIR = Path("params/papers/published")


def has_h2l_rows(df: pd.DataFrame) -> bool:
    return bool(df["kind"].isin(METRICS).any())


def selected_values(df: pd.DataFrame, last_k: int = 3) -> pd.DataFrame:
    """One row per (run, participant, metric): the value (fraction) of the selected model and its rule."""
    d = df[df["round"] > 0]
    pooled = d[d["kind"].isin(METRICS)]
    val = d[d["kind"] == "val_acc"]
    out = []
    for key, g in pooled.groupby(RUN + ["participant"]):
        v = val
        for col, k in zip(RUN + ["participant"], key):
            v = v[v[col] == k]
        if len(v):
            best = v.sort_values("round").loc[v.sort_values("round")["top1"].idxmax()]  # earliest maximum
            rows, rule = g[g["round"] == best["round"]], f"best_val@{int(best['round'])}"
        else:
            rounds = sorted(g["round"].unique())[-last_k:]
            rows, rule = g[g["round"].isin(rounds)], f"last_{len(rounds)}"
        for metric, m in rows.groupby("kind"):
            out.append({**dict(zip(RUN + ["participant"], key)), "metric": metric, "value": float(m["top1"].mean()),
                        "rule": rule})
    return pd.DataFrame(out, columns=RUN + ["participant", "metric", "value", "rule"])


def load_published(names: Sequence[str], root: Optional[Path] = None) -> Tuple[Optional[pd.DataFrame], List[str]]:
    """The published tables named (percent values); missing files are reported, not fatal."""
    root = PUBLISHED_DIR if root is None else root
    frames, missing = [], []
    for name in names:
        path = Path(root) / f"{name}.csv"
        if not path.exists():
            missing.append(str(path))
            continue
        p = pd.read_csv(path, dtype=str).fillna("")
        p["metric"] = p["metric"].str.split("/").str[-1]  # "acc" or "m0/acc" alike
        p["value"] = pd.to_numeric(p["value"], errors="coerce")
        frames.append(p[p["metric"].isin(METRICS)])
    return (pd.concat(frames, ignore_index=True) if frames else None), missing


def table2(sel: pd.DataFrame, published: Optional[pd.DataFrame] = None
           ) -> Tuple[pd.DataFrame, Dict[str, str]]:
    """Long table: per (method, scenario, participant incl. avg, metric) ours mean/std/seeds
    (percent), and the paper's value and the difference when published. Also returns the
    structure each (method, scenario) used."""
    per_seed = sel.pivot_table(index=["method", "scenario", "structure", "seed", "metric"], columns="participant",
                               values="value", aggfunc="mean")
    per_seed["avg"] = per_seed.mean(axis=1)
    long = per_seed.stack().rename("value").reset_index()
    g = long.groupby(["method", "scenario", "participant", "metric"])["value"]
    out = pd.DataFrame({"ours": g.mean() * 100, "std": g.std(ddof=1).fillna(0.0) * 100,
                        "seeds": g.size()}).reset_index()
    if published is not None and len(published):
        pub = published.groupby(["method", "scenario", "participant", "metric"], as_index=False)["value"].first()
        out = out.merge(pub.rename(columns={"value": "paper"}), how="left",
                        on=["method", "scenario", "participant", "metric"])
        out["delta"] = out["ours"] - out["paper"]
    else:
        out["paper"], out["delta"] = np.nan, np.nan
    structures = {f"{m} / {s}": st for (m, s, st) in per_seed.reset_index()[["method", "scenario", "structure"]]
                  .drop_duplicates().itertuples(index=False)}
    return out, structures


def to_markdown(long: pd.DataFrame, title: str, methods: Optional[Sequence[str]] = None) -> List[str]:
    """Table II shape: rows = method (scenario), columns = participant x (ACC, WDP, CDP), Avg last;
    each cell ``ours ± std`` and, when published, ``(paper p, Δ d)``."""
    parts = sorted(p for p in long["participant"].unique() if p != "avg") + ["avg"]
    cols = [(p, m) for p in parts for m in METRICS]
    order = list(methods or []) + sorted(m for m in long["method"].unique() if m not in (methods or []))
    idx = long.set_index(["method", "scenario", "participant", "metric"])
    rows = []
    for method in order:
        for scen in sorted(long.loc[long["method"] == method, "scenario"].unique()):
            cells, seeds = [], 0
            for p, m in cols:
                key = (method, scen, p, m)
                if key not in idx.index:
                    cells.append("")
                    continue
                r = idx.loc[key]
                seeds = int(r["seeds"])
                c = f"{r['ours']:.2f}" + (f" ± {r['std']:.2f}" if r["seeds"] > 1 else "")
                if pd.notna(r["paper"]):
                    c += f" ({r['paper']:.2f}, Δ {round(r['delta'], 2) or 0.0:+.2f})"  # no "-0.00"
                cells.append(c)
            rows.append([method, scen, *cells, seeds])
    table = Table(["method", "scenario"] + [f"{p} {m.upper()}" for p, m in cols] + ["seeds"], rows,
                  align="ll" + "r" * (len(cols) + 1))
    return [f"### {title}", "", "Percent; ours = mean ± std over seeds; (paper, Δ = ours - paper) where published.",
            "", table.text()]


def avg_markdown(long: pd.DataFrame, title: str) -> List[str]:
    """The Avg columns alone: one row per (method, scenario), ours ± std, paper, Δ."""
    a = long[long["participant"] == "avg"]
    rows = []
    for (method, scen), g in a.groupby(["method", "scenario"]):
        g = g.set_index("metric")
        cells = []
        for m in METRICS:
            r = g.loc[m]
            cells += [f"{r['ours']:.2f}" + (f" ± {r['std']:.2f}" if r["seeds"] > 1 else ""),
                      f"{r['paper']:.2f}" if pd.notna(r["paper"]) else "",
                      f"{round(r['delta'], 2) or 0.0:+.2f}" if pd.notna(r["delta"]) else ""]
        rows.append([method, scen, *cells, int(g["seeds"].max())])
    head = ["method", "scenario"] + [f"{m.upper()} {w}" for m in METRICS for w in ("ours", "paper", "Δ")] + ["seeds"]
    return [f"### {title}", "", "Percent; ours = mean ± std over seeds (a spread, not a confidence interval); "
            "Δ = ours - paper.", "", Table(head, rows, align="ll" + "r" * (len(head) - 2)).text()]


def h2l_section(df: pd.DataFrame, report_cfg: Dict, out_dir: Path, last_k: int = 3,
                published_dir: Optional[Path] = None) -> List[str]:
    """Markdown lines of the Table II section; writes ``h2l_table__<structure>.csv`` (long form) and
    ``h2l_selected.csv`` (the per-run selected values) into ``out_dir``."""
    if not has_h2l_rows(df):
        return []
    sel = selected_values(df, last_k)
    sel.to_csv(Path(out_dir) / "h2l_selected.csv", index=False)
    published, missing = load_published(report_cfg.get("published") or [], published_dir)
    published = rename_published(published, published_method_names(report_cfg))  # report.published_methods
    md = []
    for struct, s in sel.groupby("structure"):
        long, _ = table2(s, published)
        long.to_csv(Path(out_dir) / f"h2l_table__{struct}.csv", index=False)
        rules = sorted(s["rule"].str.replace(r"@\d+", "", regex=True).unique())
        md += avg_markdown(long, f"FedH2L Table II, Avg over nodes: {struct} (model: {', '.join(rules)})")
        md += to_markdown(long, f"FedH2L Table II-style ACC / WDP / CDP: {struct} (model: {', '.join(rules)})")
    if missing:
        md.append("Published tables not found: " + ", ".join(missing) + "\n")
    return md
