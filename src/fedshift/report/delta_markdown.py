"""The paper delta as Markdown: a section's cells, the per-table summary, the claims table, the
schedules of a comparison side by side, and what the seeds' intervals cover."""

from __future__ import annotations

from typing import List, Mapping, Optional

import pandas as pd

from .frames import participant_archs
from .published import BASE, BASE_PRETRAIN
from .stats import fmt_interval
from .tables import Table, TableText


def _fmt_ours(r) -> str:
    if r["metric"].startswith("rounds_to/"):
        if r["reached"] < r["n"]:
            return f"≥ {r['ours']:.1f} (reached {r['reached']}/{r['n']})"
        return fmt_interval(r["ours"], r["ci"], r["n"], bounded=False, digits=1) + f" (reached {r['reached']}/{r['n']})"
    return fmt_interval(r["ours"], r["ci"], r["n"])


def _fmt_delta(r) -> str:
    if pd.isna(r["delta"]):
        return "–"
    return ("≥ " if r["reached"] < r["n"] else "") + f"{r['delta']:+.2f}"


def _fmt_margin(r) -> str:
    if r["proxy"] or pd.isna(r["published"]) or r.get("derived", False):
        return "–"
    return "none" if pd.isna(r.get("margin")) else f"±{r['margin']:.2f}"


def cells_markdown(cells: pd.DataFrame, title: str, schedule: str = "", margin_reason: str = "",
                   not_comparable: Optional[Mapping[str, str]] = None) -> List[str]:
    """One section's lines: its heading, what it says before the cells, the cells' table, its notes. A proxy
    section (our stand-in scenario) opens with both schedules and has no verdict column: its numbers and Δ
    are shown, not judged. A section on the paper's data states how its margins were reached
    (``margin_reason``) and, where a method's runs differ from the table's protocol (``not_comparable``:
    {our method: what differs}), what differs; those cells say "not comparable"."""
    proxy = bool(cells["proxy"].any())
    not_comparable = dict(not_comparable or {})
    head = ["method", "participant", "metric", "n", "ours (mean ± 95% CI)", "published", "Δ"]
    lines = [f"### {title}", ""]
    if proxy:
        lines += [schedule, "", "No verdicts here: a stand-in run on another schedule cannot agree or differ "
                  "with the paper; the numbers and Δ are for orientation only.", ""]
    else:
        if not_comparable:
            what = sorted(set(not_comparable.values()))
            if len(what) == 1:
                lines += [f"**Not comparable** with the paper's protocol (params/papers/protocols.yaml): {what[0]} "
                          f"(no verdict for {', '.join(not_comparable)}).", ""]
            else:  # methods that differ alike, named together
                by_text = {d: [m for m, x in not_comparable.items() if x == d] for d in dict.fromkeys(not_comparable.values())}
                lines += ["**Not comparable** with the paper's protocol (params/papers/protocols.yaml), no verdict:", ""]
                lines += [f"- {', '.join(ms)}: {d}" for d, ms in by_text.items()] + [""]
            if any(d.startswith("rounds") or "; rounds" in d for d in what) and schedule:
                lines += [schedule, ""]
        if margin_reason:
            lines += [f"Margin: {margin_reason}.", ""]
        head += ["margin", "verdict"]
    rows = []
    for _, r in cells.iterrows():
        pub = "–" if pd.isna(r["published"]) else f"{r['published']:.2f}" + (" ⚑" if r["flag"] else "")
        name = r["method"] if r["ours_method"] in (r["method"], BASE) else f"{r['method']} (ours: {r['ours_method']})"
        row = [name, r["participant"], r["metric"], r["n"], _fmt_ours(r), pub, _fmt_delta(r)]
        rows.append(row if proxy else row + [_fmt_margin(r), r["verdict"]])
    lines.append(Table(head, rows, align="lllrrrr" + ("" if proxy else "rl")).text())
    if (cells["ours_method"] == BASE_PRETRAIN).any():
        lines.append("\nThe published `base` (SOLO/BASE) row is matched with our `base_pretrain`; our federated "
                     "`base` is listed as an extra, unmatched row.")
    flagged = cells[cells["flag"] != ""]
    for _, r in flagged.drop_duplicates("flag").iterrows():
        lines.append(f"\n⚑ {r['method']} / {r['participant']}: {r['flag']}")
    reused = cells[cells["note"].str.contains("same numbers as", na=False)]
    for method, g in reused.groupby("method", sort=False):
        src = g["note"].iloc[0].split("same numbers as", 1)[1].split(";")[0].strip()
        lines.append(f"\n↺ {method}: the paper reprints the same numbers as {src}")
    return lines + [""]


def summary_markdown(summary: pd.DataFrame) -> TableText:
    rows = []
    for _, r in summary.iterrows():
        scen = r["scenario"] + (f" (proxy: {r['our_scenario']})" if r["proxy"] else "")
        tau = "" if pd.isna(r["kendall_tau"]) else f"{r['kendall_tau']:+.2f}"
        same = "" if r["same_order"] is None or pd.isna(r["same_order"]) else ("yes" if r["same_order"] else "no")
        counts = ("no verdicts (proxy)" if r["proxy"] else
                  f"{r['agree']} / {r['inconclusive']} / {r['differ']} (min n={r['min_n']})")
        other = "" if r["proxy"] else f"{r['not_comparable']} / {r['descriptive']}"
        rows.append([r["table"], scen, f"{r['public']} / {r['structure']}", r["metric"], r["cells"],
                     f"{r['mean_abs_delta']:.2f}", counts, other, tau, same])
    head = ["table", "scenario (ours)", "public / structure", "metric", "cells", "mean |Δ|",
            "agree / inconclusive / differ", "not comparable / descriptive only", "ranking τ", "same order"]
    return Table(head, rows, align="llllrrllrl").text()


def claims_markdown(claims: pd.DataFrame) -> TableText:
    rows = []
    for _, r in claims.iterrows():
        where = (f"{r['who']}: {r['scenario']}" if r["who"].startswith("paper") else
                 f"ours: {r['our_scenario']} / {r['public']} / {r['structure']}"
                 + (f" (proxy for {r['scenario']}: another schedule)" if r["proxy"] else ""))
        if r["claim_structure"]:
            where += f" [{r['claim_structure']} claim]"
        rows.append([f"{r['id']}: {r['claim']}", r["paper"], where, r["verdict"], f"{r['pairs']} pairs: {r['numbers']}"])
    return Table(["claim", "paper", "where", "verdict", "numbers"], rows, align="lllll").text()


def schedule_note(runs: pd.DataFrame, source: str, paper: str, our_scenario: str, public: str, structure: str,
                  schedules: Mapping) -> str:
    """Both schedules of a proxy comparison, side by side (data, rounds, local epochs, models)."""
    g = runs[(runs["scenario"] == our_scenario) & (runs["public"] == public) & (runs["structure"] == structure)
             & (runs["method"] != BASE_PRETRAIN)]
    archs = participant_archs(g[g["participant"] != "global"])
    rounds = int(g["round"].max()) if len(g) else "?"
    epochs = (", ".join(str(int(e)) for e in sorted(g["local_epochs"].dropna().unique()))
              if "local_epochs" in g.columns and g["local_epochs"].notna().any() else "not recorded in runs.csv")
    models = ", ".join(f"{p} {a}" for p, a in archs.items()) or "?"
    theirs = schedules.get(source) or schedules.get(f"default_{paper}")
    ours = (f"**Schedule differs.** Ours: data {our_scenario} (public {public}), {rounds} rounds, local epochs "
            f"{epochs}, models {models}.")
    if not theirs:
        return ours + " The paper's: not recorded in params/papers/schedules.yaml."
    return (ours + f" The paper's: data {theirs.get('data', '?')}, {theirs.get('rounds', '?')} rounds, local epochs "
            f"{theirs.get('local_epochs', '?')}, models {theirs.get('models', '?')} ({theirs.get('source', '')}).")


# What a seed's redraw covers (the runs' `data_draw.redrawn`, fedshift.experiments.data_draw): the words
# the report prints for each redrawn split, in this order.
REDRAWN_WORDS = {"private": "private subsets", "public": "labeled public seed sets", "val": "validation sets",
                 "test": "test sets", "partition": "partitions (every split)", "public set": "public subset"}


def _listing(words: List[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def interval_coverage(runs: pd.DataFrame) -> str:
    """What the seeds' spread measures: training noise on one data draw (``data_seed: fixed``, every seed
    reads the same partition) or data draw + training (``data_seed: run``), said from what the runs' seeds
    actually redrew (their configs' ``data_draw.redrawn``: runs.csv's ``redrawn`` column)."""
    ds = set(runs["data_seed"].dropna().astype(str)) if "data_seed" in runs.columns else set()
    if ds == {"run"}:
        got = set()
        if "redrawn" in runs.columns:
            for v in runs.loc[runs["data_seed"].astype(str) == "run", "redrawn"].dropna().astype(str):
                got.update(w.strip() for w in v.split(","))
        words = [REDRAWN_WORDS[k] for k in REDRAWN_WORDS if k in got]
        if not words:
            return ("each seed drew its own data (`data_seed: run`; which splits is not recorded in runs.csv): the "
                    "intervals cover data draw and training noise.")
        fixed = "" if got & {"test", "partition"} else "; the test sets were the same for every seed"
        return (f"each seed drew its own {_listing(words)} (`data_seed: run`{fixed}): the intervals cover that "
                "draw and training noise.")
    if "run" in ds:
        return ("some groups redrew their data per seed (`data_seed: run`: data draw + training noise) and others "
                "share one draw (`data_seed: fixed`: training noise only); runs.csv's data_seed and redrawn columns "
                "say which.")
    return ("every seed trained and was evaluated on one data draw (`data_seed: fixed`): the intervals cover "
            "training noise (initialisation, batch order) only, not the variation of another draw of the "
            "partitions and test images, which can be as large: a test set of n images at accuracy p alone has a "
            "binomial sd of √(p(1 − p)/n), 2.7 points for 150 images at 88 %.")
