"""The figures a researcher expects next to the tables (FCCL+ / FedH2L style).

* :func:`participant_curves`: accuracy per round, one panel per participant, one line per
  method (inter-domain and intra-domain rows).
* :func:`domain_heatmap`: participant x evaluated-domain accuracy (mean of the last k
  rounds), one panel per method; the diagonal is intra-domain, the rest inter-domain.
* :func:`cross_correlation_figure`: FCCL's cross-correlation matrices (``cross_correlation.npz``
  of a run) on a diverging colour map over [-1, 1] (0 = white), first and last round;
  :func:`draw_correlations`: the run's own ``cross_correlation.png`` (FCCL+ Fig. 8 style),
  from the matrices the engine recorded (:mod:`fedshift.methods.fccl_figures`).
* :func:`ablation_bars`: one bar per method/variant of an ablation table, inter and intra,
  with the std over seeds as error bars.
* :func:`feature_embedding`: t-SNE (or PCA) of the features of several models on the same
  images, coloured by class and by domain (FedH2L Fig. 1, FCCL+ Fig. 7).

:func:`report_figures` draws all of them for a report folder and returns the Markdown
that links them; ``fedshift.report.report.make_report`` calls it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .frames import ordered, participant_archs
from .palette import method_colours


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _metric(scenario: str) -> str:
    try:
        from ..data import SCENARIOS

        return f"top{SCENARIOS.get(scenario).headline_topk}"
    except Exception:
        return "top1"


# ---------------------------------------------------------------------------------------
# Accuracy per participant
# ---------------------------------------------------------------------------------------

def participant_curves(df: pd.DataFrame, path: Path, title: str, methods: Optional[List[str]] = None) -> None:
    """Rows: inter / intra; columns: participants; lines: methods (mean over seeds, band = sd)."""
    plt = _plt()
    import seaborn as sns

    metric = _metric(df["scenario"].iloc[0])
    per = df.groupby(["method", "seed", "round", "participant", "kind"], as_index=False)[metric].mean()
    per[metric] *= 100
    parts = sorted(per["participant"].unique(), key=_natural)
    order = ordered(set(per["method"]), methods)
    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(2, len(parts), figsize=(2.8 * len(parts) + 1.6, 5.2), sharex=True, sharey="row",
                             squeeze=False)
    from matplotlib.ticker import MaxNLocator

    palette = method_colours(order, methods)  # the same colour per method in every figure of the report
    archs = participant_archs(df[df["method"] != "base_pretrain"])
    for row, kind in enumerate(("inter", "intra")):
        for col, p in enumerate(parts):
            ax = axes[row, col]
            d = per[(per["kind"] == kind) & (per["participant"] == p)]
            sns.lineplot(data=d, x="round", y=metric, hue="method", hue_order=order, palette=palette, marker="o",
                         markersize=3, errorbar="sd" if d["seed"].nunique() > 1 else None, ax=ax, legend=False)
            where = "others' domains" if kind == "inter" else "own domain"
            ax.set_title(f"{p}" + (f" [{archs[p]}]" if p in archs else "") + f" ({where})", fontsize=9)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
            ax.set_xlabel("round" if row == 1 else "")
            ax.set_ylabel(f"{kind} {metric} (%)" if col == 0 else "")
    handles = [plt.Line2D([], [], color=palette[m], marker="o", label=m) for m in order]
    fig.legend(handles=handles, loc="center right", title="method", fontsize=8)
    fig.suptitle(f"per-participant accuracy: {title}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.4 / fig.get_figwidth(), 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def domain_matrix(df: pd.DataFrame, method: str, last_k: int = 3, metric: str = "top1") -> pd.DataFrame:
    """Participant x evaluated domain, mean of the last ``last_k`` rounds over seeds (percent)."""
    d = df[(df["method"] == method) & (df["round"] > 0)]
    rounds = sorted(d["round"].unique())[-last_k:]
    d = d[d["round"].isin(rounds)]
    m = d.pivot_table(index="participant", columns="domain", values=metric, aggfunc="mean") * 100
    parts = sorted(m.index, key=_natural)
    own = d[d["kind"] == "intra"].drop_duplicates("participant").set_index("participant")["domain"]
    cols = [own[p] for p in parts if p in own.index and own[p] in m.columns]
    cols += [c for c in sorted(m.columns, key=_natural) if c not in cols]
    return m.loc[parts, cols]


def domain_heatmap(df: pd.DataFrame, path: Path, title: str, methods: Optional[List[str]] = None,
                   last_k: int = 3) -> None:
    plt = _plt()
    metric = _metric(df["scenario"].iloc[0])
    order = ordered(set(df["method"]), methods)
    n = len(order)
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    mats = {m: domain_matrix(df, m, last_k, metric) for m in order}
    size = max(max(mat.shape) for mat in mats.values())
    fig, axes = plt.subplots(rows, cols, figsize=(cols * (0.55 * size + 1.6), rows * (0.55 * size + 1.3)),
                             squeeze=False)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    for ax, m in zip(axes.ravel(), order):
        mat = mats[m]
        im = ax.imshow(mat.values, cmap="viridis", vmin=0, vmax=100)
        ax.grid(False)
        for i in range(mat.shape[0]):
            for j in range(mat.shape[1]):
                v = mat.values[i, j]
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7,
                        color="black" if v > 60 else "white", fontweight="bold" if mat.index[i] == mat.columns[j]
                        or j == i else "normal")
        ax.set_xticks(range(mat.shape[1]), mat.columns, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(mat.shape[0]), mat.index, fontsize=7)
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("evaluated domain", fontsize=7)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label=f"{metric} accuracy (%)")
    fig.suptitle(f"participant x evaluated domain, mean of the last {last_k} rounds: {title}", fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# Cross-correlation (FCCL / FCCL+ runs)
# ---------------------------------------------------------------------------------------

def cross_correlation_figure(npz: Path, path: Path, title: str, rounds: Optional[Sequence[int]] = None) -> None:
    """Rows: participants; columns: (round, public | private); diverging map, [-1, 1]."""
    plt = _plt()
    data = np.load(npz)
    all_rounds = [int(r) for r in data["rounds"]]
    rounds = list(rounds) if rounds else sorted({all_rounds[0], all_rounds[-1]})
    names = [str(n) for n in data["participants"]]
    k = len(names)
    kinds = [kd for kd in ("public", "private") if kd in data]
    ncol = len(rounds) * len(kinds)
    fig, axes = plt.subplots(k, ncol, figsize=(1.9 * ncol + 1.2, 1.9 * k + 0.7), squeeze=False)
    im = None
    for c, (r, kind) in enumerate([(r, kd) for r in rounds for kd in kinds]):
        ri = all_rounds.index(r)
        for i in range(k):
            ax = axes[i, c]
            im = ax.imshow(data[kind][ri, i], cmap="RdBu_r", vmin=-1, vmax=1)
            ax.grid(False)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"round {r}\n{kind} data", fontsize=8)
            if c == 0:
                ax.set_ylabel(names[i], fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.7, ticks=[-1, -0.5, 0, 0.5, 1],
                 label="cross-correlation")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def draw_correlations(corr: Dict[int, Dict[str, np.ndarray]], names: List[str], path: Path, title: str,
                      max_rounds: int = 5) -> None:
    """Heatmaps like FCCL+ Fig. 8: rows = participants, per round a public and a private matrix."""
    plt = _plt()
    rounds = sorted(corr)
    if len(rounds) > max_rounds:  # first, last and evenly spaced in between
        idx = np.unique(np.linspace(0, len(rounds) - 1, max_rounds).round().astype(int))
        rounds = [rounds[i] for i in idx]
    k = len(names)
    fig, axes = plt.subplots(k, 2 * len(rounds), figsize=(2.0 * 2 * len(rounds), 2.0 * k + 0.6), squeeze=False)
    for col, r in enumerate(rounds):
        for part, kind in enumerate(("public", "private")):
            for i in range(k):
                ax = axes[i, 2 * col + part]
                im = ax.imshow(corr[r][kind][i], cmap="Blues", vmin=-1, vmax=1)
                ax.set_xticks([])
                ax.set_yticks([])
                if i == 0:
                    ax.set_title(f"round {r}\n{kind}", fontsize=8)
                if col == 0 and part == 0:
                    ax.set_ylabel(names[i], fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# Ablations
# ---------------------------------------------------------------------------------------

def ablation_bars(table: pd.DataFrame, std: Optional[pd.DataFrame], path: Path, title: str) -> None:
    """``table``: rows = methods/variants, columns include ``AVG→`` and ``AVG↩`` (percent)."""
    plt = _plt()
    cols = [c for c in ("AVG→", "AVG↩") if c in table.columns]
    x = np.arange(len(table.index))
    width = 0.8 / max(len(cols), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(x) + 2), 3.6))
    colours = {"AVG→": "#4C72B0", "AVG↩": "#DD8452"}
    for i, c in enumerate(cols):
        err = (std[c].reindex(table.index).fillna(0).values  # one seed: no spread, no bar
               if std is not None and c in std.columns else None)
        bars = ax.bar(x + (i - (len(cols) - 1) / 2) * width, table[c].values, width, yerr=err, capsize=3,
                      label="inter-domain (AVG→)" if c == "AVG→" else "intra-domain (AVG↩)", color=colours[c])
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
    ax.set_xticks(x, table.index, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%)")
    lo = float(np.nanmin(table[cols].values)) if cols else 0.0
    ax.set_ylim(max(0.0, lo - 15), min(100.0, float(np.nanmax(table[cols].values)) + 8) if cols else 100)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# Feature embeddings
# ---------------------------------------------------------------------------------------

def embed(features: np.ndarray, method: str = "tsne", seed: int = 0) -> np.ndarray:
    """2-D embedding of (N, d) features: t-SNE (perplexity <= 30) or PCA."""
    if method == "pca" or len(features) < 10:
        from sklearn.decomposition import PCA

        return PCA(n_components=2, random_state=seed).fit_transform(features)
    from sklearn.manifold import TSNE

    perplexity = float(min(30, max(5, len(features) // 4)))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", max_iter=500, random_state=seed).fit_transform(features)


def feature_embedding(models: Dict[str, "object"], images, labels: np.ndarray, domains: np.ndarray, path: Path,
                      title: str, method: str = "tsne", seed: int = 0) -> None:
    """One column per model: its features of the same images, embedded in 2-D; top row
    coloured by class, bottom row by domain."""
    import torch

    from ..data.loading import normalize

    plt = _plt()
    embs = {}
    with torch.no_grad():
        x = normalize(images)
        for name, model in models.items():
            was = model.training
            model.eval()
            embs[name] = embed(model.features(x).float().cpu().numpy(), method, seed)
            model.train(was)
    doms = sorted(set(domains.tolist()), key=_natural)
    fig, axes = plt.subplots(2, len(models), figsize=(3.2 * len(models), 6.2), squeeze=False)
    for c, (name, e) in enumerate(embs.items()):
        ax = axes[0, c]
        sc = ax.scatter(e[:, 0], e[:, 1], c=labels, cmap="tab10", s=6, vmin=-0.5, vmax=9.5)
        ax.set_title(name, fontsize=9)
        ax = axes[1, c]
        for j, d in enumerate(doms):
            sel = domains == d
            ax.scatter(e[sel, 0], e[sel, 1], s=6, color=plt.cm.Set1(j % 9), label=d)
        for ax in axes[:, c]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0, 0].set_ylabel("coloured by class")
    axes[1, 0].set_ylabel("coloured by domain")
    fig.colorbar(sc, ax=axes[0, :].tolist(), shrink=0.8, label="class", ticks=range(10))
    axes[1, -1].legend(fontsize=7, markerscale=2, loc="best", title="domain", title_fontsize=7)
    fig.suptitle(f"{title} ({'t-SNE' if method == 'tsne' else 'PCA'} of features)", fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def pretrained_embedding(pretrain_root: Path, partition_dir: Path, scenario: str, seed: int, path: Path,
                         per_domain: int = 75, method: str = "tsne", ckpts=None) -> bool:
    """t-SNE of the BASE (pretrain) models of ``scenario``/``seed`` on every domain's test
    images; False when the checkpoints or the partition are missing. ``ckpts``: the checkpoints (the
    report's base_pretrain run folders); None: every ``seed<k>`` checkpoint under ``pretrain_root``."""
    import torch

    from ..data.loading import load_federated
    from ..models import create_model

    if ckpts is None:
        ckpts = sorted(Path(pretrain_root, scenario).glob(f"*/*/seed{seed}/model.pt"))
    ckpts = [c for c in ckpts if Path(c).exists()]
    if not ckpts or not Path(partition_dir, "manifest.json").exists():
        return False
    data = load_federated(Path(partition_dir), None, "cpu")
    xs, ys, ds = [], [], []
    for c in data.clients:
        x, y = c.get("test")
        pick = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:per_domain]  # splits are class-sorted
        xs.append(x[pick])
        ys.append(y[pick].numpy())
        ds += [c.domain] * len(ys[-1])
    images, labels, domains = torch.cat(xs), np.concatenate(ys), np.array(ds)
    models = {}
    for ck in ckpts:
        state = torch.load(ck, map_location="cpu", weights_only=True)
        model = create_model(state["arch"], num_classes=data.num_classes, in_channels=data.image_shape[0])
        try:
            model.load_state_dict(state["state_dict"])
        except RuntimeError:  # built with a non-default norm: skip rather than guess
            continue
        models[f"{state['participant']} ({state['arch']})"] = model
    if not models:
        return False
    feature_embedding(models, images, labels, domains, path, f"BASE models, {scenario} seed {seed}", method)
    return True


# ---------------------------------------------------------------------------------------
# The report's figures
# ---------------------------------------------------------------------------------------

def _natural(s) -> Tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(s)))


def _slug(*parts) -> str:
    return "__".join(str(p) for p in parts)


def _run_dir(runs: pd.DataFrame, default: Path) -> Path:
    """The run folder of one (method, seed)'s rows (collect's ``run_dir``), else ``default`` (runs.csv from
    before issue 50)."""
    if "run_dir" in runs.columns and runs["run_dir"].notna().any():
        return Path(runs["run_dir"].dropna().iloc[0])
    return default


def report_figures(df: pd.DataFrame, out: Path, report_cfg: Optional[dict] = None, last_k: int = 3,
                   runs_root: Path = Path("results/federate"), pretrain_root: Path = Path("results/pretrain"),
                   partitions_root: Path = Path("build/partitions"), tables: Optional[Dict] = None) -> List[str]:
    """Draw every figure into ``out``; return Markdown lines linking them.

    ``tables``: {(name, scenario, public, structure): (table, std)} of the named (ablation)
    tables, drawn as bar charts."""
    md: List[str] = ["## Figures", ""]
    order = (report_cfg or {}).get("method_order")  # the grid's methods: rows, panels and colours in its order
    for (scen, pub, struct), sub in df.groupby(["scenario", "public", "structure"]):
        slug = _slug(scen, pub, struct)
        title = f"{scen} / public {pub} / {struct}"
        participant_curves(sub, out / f"participants__{slug}.png", title, order)
        domain_heatmap(sub, out / f"domains__{slug}.png", title, order, last_k=last_k)
        md += [f"![per-participant accuracy](participants__{slug}.png)", "",
               f"![participant x domain](domains__{slug}.png)", ""]
        for (method, seed), runs in sub.groupby(["method", "seed"]):
            npz = _run_dir(runs, Path(runs_root) / scen / pub / method / struct / f"seed{seed}") / "cross_correlation.npz"
            if npz.exists():
                name = f"crosscorr__{_slug(scen, pub, method, struct, f'seed{seed}')}.png"
                cross_correlation_figure(npz, out / name, f"{method} cross-correlation with the others' mean "
                                                          f"(FCCL+ Fig. 8): {title}, seed {seed}")
                md += [f"![cross-correlation {method}]({name})", ""]
    for (name, scen, pub, struct), (table, std) in (tables or {}).items():
        fname = f"ablation__{_slug(name, scen, pub, struct)}.png"
        ablation_bars(table, std, out / fname, f"{name}: {scen} / {pub} / {struct}")
        md += [f"![{name}]({fname})", ""]
    for scen, seed in sorted({(s, int(sd)) for s, sd in zip(df["scenario"], df["seed"])})[:1]:
        fname = f"tsne__{_slug(scen, f'seed{seed}')}.png"
        solo = df[(df["method"] == "base_pretrain") & (df["scenario"] == scen) & (df["seed"] == seed)]
        ckpts = (sorted({Path(d) / "model.pt" for d in solo["run_dir"].dropna()}) if "run_dir" in solo.columns
                 else None)  # the grid's own BASE runs (run folders carry their identity: issue 50)
        try:
            ok = pretrained_embedding(Path(pretrain_root), Path(partitions_root) / scen, scen, seed, out / fname,
                                      ckpts=ckpts)
        except Exception as exc:  # a figure never fails the report
            logging.getLogger(__name__).warning("t-SNE figure skipped: %s", exc)
            ok = False
        if ok:
            md += [f"![t-SNE]({fname})", ""]
    return md
