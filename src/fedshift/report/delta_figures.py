"""The paper delta as a figure: ours (mean ± 95% CI) against the published value, per metric."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from .palette import method_colours


def delta_figure(cells: pd.DataFrame, path: Path, title: str, order: Optional[Sequence[str]] = None) -> None:
    """Ours (mean ± 95% CI) against the published value, one panel per metric, one point per cell
    (square = AVG / server model, circle = a participant); the diagonal is agreement. Colours: the grid's
    method ``order`` (:func:`fedshift.report.palette.method_colours`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = cells[cells["published"].notna()].copy()
    if "ours_method" in cells.columns:  # the published BASE is drawn as (and coloured like) our base_pretrain
        cells["method"] = [m if o == m else f"{m} = ours {o}" for m, o in zip(cells["method"], cells["ours_method"])]
    metrics = list(dict.fromkeys(cells["metric"]))
    methods = list(dict.fromkeys(cells["method"]))
    ours = {m: m.split(" = ours ")[-1] for m in methods}
    colour = {m: method_colours(ours.values(), order)[ours[m]] for m in methods}
    cols = min(len(metrics), 3)
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.8 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        c = cells[cells["metric"] == metric]
        for m in methods:
            g = c[c["method"] == m]
            for summary in (False, True):
                gg = g[g["participant"].isin(["avg", "global"]) == summary]
                if len(gg):
                    bounded = not metric.startswith("rounds_to/")  # accuracy intervals drawn inside [0, 100]
                    ci = gg["ci"].fillna(0)
                    lo = (gg["ours"] - ci).clip(lower=0) if bounded else gg["ours"] - ci
                    hi = (gg["ours"] + ci).clip(upper=100) if bounded else gg["ours"] + ci
                    yerr = [gg["ours"] - lo, hi - gg["ours"]]
                    ax.errorbar(gg["published"], gg["ours"], yerr=yerr, fmt="s" if summary else "o",
                                ms=8 if summary else 4, color=colour[m], capsize=3, alpha=0.9,
                                markeredgecolor="black" if summary else "none")
        err = c["ci"].fillna(0)
        lo = float(min(c["published"].min(), (c["ours"] - err).min()))
        hi = float(max(c["published"].max(), (c["ours"] + err).max()))
        if not metric.startswith("rounds_to/"):
            lo, hi = max(lo, 0.0), min(hi, 100.0)
        pad = (hi - lo) * 0.08 + 1
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", lw=1, ls="--")
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("published (%)" if not metric.startswith("rounds_to/") else "published (rounds)")
        ax.set_ylabel("ours: mean ± 95% CI over seeds")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    handles = [plt.Line2D([], [], marker="s", ls="", color=colour[m], markeredgecolor="black", label=m) for m in methods]
    handles.append(plt.Line2D([], [], ls="--", color="grey", label="ours = published"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle("\n".join(textwrap.wrap(title + " (square = AVG, circle = a participant)", 40 * cols + 20)),
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * (len(handles) > 4), 1, 0.97))
    fig.savefig(path, dpi=120)
    plt.close(fig)
