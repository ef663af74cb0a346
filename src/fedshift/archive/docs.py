"""The docs' measured tables, rendered from the committed archive (issue 52): no measured number is typed
into the docs by hand.

A Markdown file holds a block per table between two marker comments::

    <!-- generated: table params/papers/fedh2l_table2.yaml params/papers/fedh2l_table2_seedlocal.yaml -->
    ... (written by `fedshift docs-tables`) ...
    <!-- end generated -->

The first word is the block's kind (:data:`KINDS`), then the grid files it reads (each planned as
``snakemake --configfile <grid>`` plans it) and ``key=value`` options. Every block reads only the
grids' **current** records (:func:`fedshift.archive.grid_status`: same settings as the grid asks now,
same data where built) and names the runs it lacks and the stale records it left out, with the command
that produces them. Kinds:

* ``table``: per (scenario, method) the headline metrics, mean ± 95 % CI half-width over seeds (Student
  t; n in its column, ``+ k diverged`` beside it for seeds recorded as diverged, which no mean includes; the
  mean alone at n = 1), the published value in brackets where the grid's ``report.published`` tables hold
  it, and the code version(s) of the records; its caption says, from the records, the schedule per method,
  the score reported, the scoring and test protocols and what the intervals cover;
* ``claims``: the papers' conclusions (``params/papers/claims.yaml``, option ``ids=a,b``) on those records,
  through :func:`fedshift.report.claims.evaluate_claims`: **held**, **not held** or **inconclusive** with the
  numbers, and what the intervals cover. Option ``shared=m1,m2``: methods the block's grids have in common
  although only one grid runs them (two readings of a paper that differ in other methods only, e.g. FedH2L's
  ``private+seed`` reading leaves AGG, FedMD, FedAvg and FedProx as they are): a grid that does not run one
  takes its rows from the grid that does, per scenario and only where the records say both ran on the same
  partitions (inputs.json), structure, data draw, model selection and test protocol (:func:`shared_rows`);
* ``tuned``: the tuned values (every candidate's validation score) from the archived selections;
* ``cost``: per method, CPU kind and threads, the training + evaluation seconds of a run (median, range)
  from the records' own timings, and what the runs still without a record would take at those medians.

``fedshift docs-tables`` rewrites the blocks; ``--check`` (and tests/test_docs_tables.py) re-renders them
and fails where a block's text differs from its rendering.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from ..errors import ConfigError
from . import RECORDS, grid_name, grid_status

BLOCK = re.compile(r"(<!-- generated: (?P<head>[^\n]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
DOC_FILES = ("README.md", "docs/*.md")


# ----------------------------------------------------------------------------- one grid's records
@dataclasses.dataclass
class GridRecords:
    grid: str  # the grid file
    name: str  # its report name (records/<name>/)
    report: dict  # its report block
    runs: pd.DataFrame  # collect's frame of its current records (empty when none)
    planned: List[Tuple[str, str, str, int]]  # (scenario, method, structure, seed) of every federated run
    missing: List[Tuple[str, str, str, int]]  # of those, the ones without a current record
    stale: List[str]  # one line per stale record
    chosen: List[Path]  # current archived tuning selections
    diverged: List[dict] = dataclasses.field(default_factory=list)  # recorded divergences (collect.divergence)


def grid_records(grid: str, root: Path = RECORDS) -> GridRecords:
    """The current records of grid file ``grid`` and what it still lacks."""
    from ..experiments import plan_grid, snakemake_config
    from ..report.collect import divergence, load_run
    from ..tune import plan_tune
    from . import tune_record_path

    if not Path(grid).is_file():
        raise ConfigError(f"generated block: grid file {grid} not found")
    exp = snakemake_config([Path(grid)])
    plan, _ = plan_grid(exp)
    tune = plan_tune(exp, plan)
    status = grid_status(plan, tune, root)
    current = status.current("federate")
    outcome = [(s, divergence(s.path)) for s in current.values()]
    diverged = [d for _, d in outcome if d]  # recorded divergences: outcomes, in no mean
    finished = [s for s, d in outcome if not d]
    frames = [load_run(s.path) for s in finished]
    pretrain = [s.path for s in status.current("pretrain").values()]
    if frames and pretrain:  # the papers' SOLO/BASE row (base_pretrain), as collect adds it
        from . import read_config
        from ..report.collect import pretrain_rows

        frames.append(pretrain_rows([(read_config(s.path), int(f["round"].max())) for s, f in zip(finished, frames)],
                                    pretrain))
    runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    planned = [(j.scenario, j.method, j.structure, j.seed) for j in plan.federate]
    missing = [(j.scenario, j.method, j.structure, j.seed) for j in plan.federate if j not in current]
    name = plan.report.get("name")
    chosen = [tune_record_path(g, name, root) for g, state in sorted(status.tune.items()) if state == "current"]
    return GridRecords(grid, grid_name(name), dict(plan.report), runs, planned, missing,
                       [s.line() for s in status.stale()], chosen, diverged)


def _seeds(seeds: Sequence[int]) -> str:
    s = sorted(set(int(x) for x in seeds))
    return ("seed " if len(s) == 1 else "seeds ") + ", ".join(str(x) for x in s)


def _several_structures(recs: Sequence[GridRecords]) -> bool:
    """Whether the grids plan more than one structure: their tables and lists then name each row's."""
    return len({st for r in recs for _, _, st, _ in r.planned}) > 1


def lacking(recs: Sequence[GridRecords]) -> List[str]:
    """Lines naming the runs without a current record and the stale records, with how to produce them."""
    md = []
    for r in recs:
        if r.missing:
            by: Dict[str, Dict[str, List[int]]] = {}
            several = _several_structures([r])
            for scen, method, struct, seed in r.missing:
                by.setdefault(f"{method} ({struct})" if several else method, {}).setdefault(scen, []).append(seed)
            parts = []
            for m, scens in by.items():
                groups: Dict[str, List[str]] = {}  # the same seeds missing on several scenarios: said once
                for s, seeds in scens.items():
                    groups.setdefault(_seeds(seeds), []).append(s)
                parts += [f"{m} on {', '.join(ss)} ({sd})" for sd, ss in groups.items()]
            md.append(f"No committed record yet for {len(r.missing)} of the {len(r.planned)} runs of `{r.grid}`: "
                      + "; ".join(parts) + f". They come from `snakemake --cores all --configfile {r.grid}` "
                      f"(in pieces: docs/fedh2l.md, \"Running the grid in pieces\"), then `fedshift archive {r.grid}` "
                      f"and a commit of `records/{r.name}/`.")
        if r.diverged:
            from ..report.collect import divergence_text

            md.append(f"Diverged, recorded as their outcome (a non-finite loss or weight stopped them: rerunning "
                      f"repeats it; no score, in no mean): {len(r.diverged)} of the {len(r.planned)} runs of "
                      f"`{r.grid}`: " + "; ".join(divergence_text(d) for d in r.diverged) + ".")
        if r.stale:
            md.append(f"Stale records of `{r.grid}`, left out: " + "; ".join(r.stale) + ".")
    return md


def _code(runs: pd.DataFrame) -> str:
    codes = sorted(set(runs["code"].dropna().astype(str))) if "code" in runs.columns else []
    return "; ".join(re.sub(r"^code (\w+) \(commit (\w+)(, dirty)?\)$", lambda m: m.group(2) + (" (dirty)" if m.group(3)
                                                                                               else ""), c)
                     for c in codes) or "unrecorded"


# ----------------------------------------------------------------------------- kind: table
def _published(recs: Sequence[GridRecords]) -> Optional[pd.DataFrame]:
    from ..report.frames import published_method_names, rename_published
    from ..report.published import load_published

    frames = []
    for r in recs:
        for entry in r.report.get("published") or []:
            name = entry if isinstance(entry, str) else entry["name"]
            frames.append(rename_published(load_published(name), published_method_names(r.report)))
    return pd.concat(frames, ignore_index=True) if frames else None


def _metrics(long: pd.DataFrame, pooled: bool) -> List[Tuple[str, str]]:
    """(metric key, column title) of the headline metrics the records carry, in the papers' order: FedH2L's
    ACC / WDP / CDP where the runs wrote them (``pooled``), else AVG inter / intra, and the global model's."""
    have = set(long["metric"]) if len(long) else set()
    if pooled and {"acc", "wdp", "cdp"} <= have:
        return [("acc", "ACC"), ("wdp", "WDP"), ("cdp", "CDP")]
    out = []
    for kind, title in (("inter", "AVG inter"), ("intra", "AVG intra")):
        for k in ("top1", "top5"):
            if f"{kind}/{k}" in have:
                out.append((f"{kind}/{k}", f"{title} {k}"))
                break
    if "global/top1" in have:
        out.append(("global/top1", "global top1"))
    return out


def render_table(recs: Sequence[GridRecords], opts: Mapping[str, str]) -> List[str]:
    from ..report.frames import topk
    from ..report.ours import aggregate, ours_long
    from ..report.stats import fmt_interval, resolution, spread_unmeasured

    frames = [r.runs.assign(_grid=r.grid) for r in recs if len(r.runs)]
    md: List[str] = []
    if frames:
        runs = pd.concat(frames, ignore_index=True)
        long = ours_long(runs)
        scen_k = {s: topk(s) for s in runs["scenario"].unique()}
        long = long[~long["metric"].str.match(r"(inter|intra)/top\d") | long.apply(
            lambda r: r["metric"].endswith(scen_k.get(r["scenario"], "top1")), axis=1)]
        agg = aggregate(long)
        agg = agg[agg["participant"].isin(["avg", "global"])]  # the participants' average; a global model's own row
        metrics = _metrics(agg, bool(runs["kind"].isin(["acc", "wdp", "cdp"]).any()))
        pub = _published(recs)
        order = list(dict.fromkeys(m for r in recs for _, m, _, _ in r.planned))
        keys = agg[["scenario", "method", "structure"]].drop_duplicates()
        div: Dict[Tuple[str, str, str], List[dict]] = {}  # recorded divergences per row: beside n, in no mean
        for d in (d for r in recs for d in r.diverged):
            div.setdefault((d["scenario"], d["method"], d["structure"]), []).append(d)
        only = [k for k in div if not ((keys["scenario"] == k[0]) & (keys["method"] == k[1])
                                       & (keys["structure"] == k[2])).any()]  # every seed diverged: a row all the same
        if only:
            keys = pd.concat([keys, pd.DataFrame(only, columns=["scenario", "method", "structure"])], ignore_index=True)
        several = _several_structures(recs)  # every row's structure is a planned one (base_pretrain's too)
        md += ["| scenario | method | " + ("structure | " if several else "") + " | ".join(t for _, t in metrics)
               + " | n | code |", "|---|---|" + ("---|" if several else "") + "---:|" * len(metrics) + "---:|---|"]
        bracketed = False  # the caption names the paper's brackets only when a cell has one
        unmeasured = 0.0  # the coarsest resolution of a cell whose seeds agree to within it (marked ‡)
        ns: List[int] = []
        keys = keys.assign(_o=keys["method"].map(lambda m: order.index(m) if m in order else len(order)))
        for scen, method, struct, _ in keys.sort_values(["scenario", "_o", "structure"]).itertuples(index=False):
            cells, n = [], 0
            for metric, _ in metrics:
                hit = agg[(agg["scenario"] == scen) & (agg["method"] == method) & (agg["structure"] == struct)
                          & (agg["metric"] == metric)]
                if not len(hit):
                    cells.append("–")
                    continue
                h = hit.iloc[0]
                n = max(n, int(h["n"]))
                cell = fmt_interval(h["mean"], h["ci"], int(h["n"]))
                if int(h["n"]) >= 2 and not pd.isna(h["ci"]) and spread_unmeasured(h["ci"], h["resolution"]):
                    cell += "‡"
                    unmeasured = max(unmeasured, float(h["resolution"]))
                if pub is not None:
                    p = pub[(pub["scenario"] == scen) & (pub["method"] == method) & (pub["participant"] == "avg")
                            & (pub["metric"] == metric)]
                    if len(p):
                        cell += f" ({float(p['value_num'].iloc[0]):.2f})"
                        bracketed = True
                cells.append(cell)
            sub = runs[(runs["scenario"] == scen) & (runs["method"] == method) & (runs["structure"] == struct)]
            row_div = div.get((scen, method, struct), [])
            k = len(row_div)
            if k:  # the code a diverged seed ran with is listed too
                sub = pd.concat([sub, pd.DataFrame({"code": [d.get("code") for d in row_div]})], ignore_index=True)
            md.append(f"| {scen} | {method} | " + (f"{struct} | " if several else "") + " | ".join(cells)
                      + f" | {n}{f' + {k} diverged' if k else ''} | {_code(sub)} |")
            ns.append(n)
        md += ["", "Mean over seeds ± the 95 % confidence half-width (Student t, n − 1 degrees of freedom; the mean "
               "alone at n = 1), percent, " + ("average over the participants" if any(m != "global/top1" for m, _ in metrics)
                                                 else "the global model") + (", paper in brackets" if bracketed else "")
               + "; code: the commit each record's run was made with."]
        if min(ns, default=3) < 3:
            md[-1] += (" A row with n < 3 gives no verdict: no difference involving it ranks one method above "
                       "another (docs/verdicts.md).")
        if unmeasured:
            within = ("every seed gave the same number (the records do not say the test size, so no coarser "
                      "resolution is assumed)" if unmeasured <= resolution(None) else
                      f"the seeds agree to within the metric's resolution (one test image, {unmeasured:.2g} points)")
            md[-1] += (f" ‡: {within}: the spread is unmeasured, not zero, and no verdict rests on that cell "
                       "(docs/verdicts.md).")
        if div:
            md[-1] += (" `+ k diverged`: seeds whose loss or weights became non-finite (their recorded outcome: "
                       "rerunning repeats it). They have no score, so the row's mean and interval are over the "
                       "seeds that finished, which is not the method's result at this setting: a row with a "
                       "diverged seed gives no verdict.")
        md[-1] += " " + run_conditions(runs)
    else:
        md.append("No committed record backs this table yet.")
    return md + [""] + _with_blank(lacking(recs))


SELECT_WORDS = {"best_val": "each participant's test score at its best validation round (engine.select: best_val)",
                "last_k": "the mean of the last evaluated rounds' test scores (engine.select: last_k)"}


def run_conditions(runs: pd.DataFrame) -> str:
    """What ran, from the records themselves: the schedule (rounds x local epochs, per method where they
    differ: :mod:`fedshift.report.schedule`), the score each run reports, the scoring and test protocols, and
    what the intervals cover."""
    from ..report.delta_markdown import interval_coverage
    from ..methods import METHODS
    from ..methods.stepwise import StepwiseMethod
    from ..report.schedule import first, grouped, schedules

    def stepwise(base: str) -> bool:  # engine.local_epochs is not theirs: a round is one minibatch step
        try:
            return issubclass(METHODS.get(base), StepwiseMethod)
        except (ConfigError, KeyError):  # a plugin's method not installed here: its epochs as recorded
            return False

    select, scoring, tests = {}, {}, {}
    for method, sub in runs.groupby("method", sort=False):
        sel = first(sub, "select") or "last_k"
        select[method] = SELECT_WORDS.get(sel, f"engine.select: {sel}")
        scoring[method] = first(sub, "protocol") or "each participant's own model"
        tests[method] = first(sub, "test_protocol") or "clean"
    cover = interval_coverage(runs)
    return (f"Schedule, from the records: {grouped(schedules(runs, stepwise))}. Reported: {grouped(select)}. Scored (the "
            f"grid's `scoring:`, where a server delivers a model): {grouped(scoring)}. Test protocol: "
            f"{grouped(tests)}. {cover[:1].upper() + cover[1:]}")


def _with_blank(lines: List[str]) -> List[str]:
    out: List[str] = []
    for line in lines:
        out += [line, ""]
    return out


# ----------------------------------------------------------------------------- kind: claims
VERDICT_WORD = (("held (CI-separated)", "held"), ("NOT held (CI-separated)", "not held"),
                ("held by the means only", "inconclusive (the means hold it; the intervals do not separate it)"),
                ("NOT held by the means only", "inconclusive (the means do not hold it; the intervals do not "
                                               "separate it)"))


def word(verdict: str) -> str:
    """held / not held / inconclusive / not evaluable yet, from the report's verdict line."""
    for prefix, w in sorted(VERDICT_WORD, key=lambda x: -len(x[0])):
        if verdict.startswith(prefix):
            return w
    if verdict.startswith("partly evaluable"):
        return "not evaluable yet (" + verdict.split(": ", 1)[-1] + " comparisons have records)"
    return verdict


def _compared(claim: Mapping, names: Optional[Mapping[str, str]]) -> List[Tuple[str, str]]:
    """``claim``'s compared items (``method`` or ``method@scenario``) as (our method name, scenario or '')."""
    out = []
    for pair in claim.get("compare") or []:
        for item in pair:
            method, _, at = str(item).partition("@")
            out.append(((names or {}).get(method, method), at))
    return out


def _lacking_for_claim(claim: Mapping, runs: pd.DataFrame, names: Optional[Mapping[str, str]]) -> str:
    """Which of ``claim``'s compared methods (``method`` or ``method@scenario``) have no record at which of
    its scenarios: ``fedh2l at rotmnist_a05, rotmnist_a10; ind at rotmnist_a15``."""
    have = set(zip(runs["scenario"], runs["method"]))
    scenarios = claim.get("scenarios") or sorted(runs["scenario"].unique())
    miss: Dict[str, List[str]] = {}
    for method, at in _compared(claim, names):
        for scen in ([at] if at else scenarios):
            if (scen, method) not in have and scen not in miss.get(method, []):
                miss.setdefault(method, []).append(scen)
    return "; ".join(f"{m} at {', '.join(sorted(ss))}" for m, ss in miss.items())


# What a row taken from another grid of a claims block must share with the grid's own records, per scenario
# (besides the partitions, read from each record's inputs.json): otherwise it is not the same comparison.
SHARED_SAME = ("structure", "public", "data_seed", "select", "protocol", "test_protocol")


def _partitions(frame: pd.DataFrame) -> Optional[frozenset]:
    """The partition manifests' sha256 the records in ``frame`` read (their inputs.json,
    :func:`fedshift.provenance.read`); None when a record does not say."""
    from ..provenance import read

    seen = set()
    for folder in frame["record"].dropna().unique():
        rec = read(Path(folder))
        if rec is None:
            return None
        seen |= {(k, v) for k, v in rec["inputs"].items() if k.startswith("partition/")}
    return frozenset(seen) or None


def shared_rows(r: GridRecords, recs: Sequence[GridRecords],
                shared: Sequence[str]) -> Tuple[pd.DataFrame, List[str], set]:
    """``r``'s runs plus, for each method of ``shared`` that ``r`` does not run, the rows of the block's grid
    that runs it, at each scenario where ``r`` has records and both sides' records agree on the partitions
    and on :data:`SHARED_SAME`; sentences saying where those rows came from, or why not; and the (method,
    scenario) pairs refused for a difference."""
    own = {m for _, m, _, _ in r.planned}
    frames, notes, took, refused_at = [r.runs], [], {}, set()
    mine_of = {s: (g, _partitions(g)) for s, g in r.runs.groupby("scenario")} if len(r.runs) else {}
    for m in shared:
        if m in own:
            continue
        donors = [o for o in recs if o is not r and m in {pm for _, pm, _, _ in o.planned}]
        if not donors:
            raise ConfigError(f"generated claims block: shared={','.join(shared)}: no grid of the block runs {m!r} "
                              f"(the grids: {', '.join(o.grid for o in recs)})")
        o = donors[0]
        rows = o.runs[o.runs["method"] == m] if len(o.runs) else pd.DataFrame()
        taken, refused = [], []
        for scen, g in (rows.groupby("scenario", sort=True) if len(rows) else []):
            if scen not in mine_of:
                continue  # nothing of r's own to compare with at this scenario
            mine, own_parts = mine_of[scen]
            differ = [c for c in SHARED_SAME if set(mine[c].astype(str)) != set(g[c].astype(str))]
            parts = (own_parts, _partitions(g))
            if None in parts:
                differ.append("partitions (a record has no inputs.json)")
            elif parts[0] != parts[1]:
                differ.append("partitions (inputs.json)")
            if differ:
                refused.append(f"{scen} (differs in {', '.join(differ)})")
                refused_at.add((m, scen))
            else:
                frames.append(g)
                taken.append(scen)
        if taken:
            took.setdefault((o.grid, ", ".join(taken)), []).append(m)
        if refused:
            notes.append(f"`{r.grid}` does not take {m}'s rows from `{o.grid}` at {', '.join(refused)}.")
    notes[:0] = [f"`{r.grid}` does not run {', '.join(ms)}: {'its' if len(ms) == 1 else 'their'} rows are those of "
                 f"`{donor}` at {at} (block option shared=; both grids' records show the same partitions, "
                 "structure, data draw, model selection and test protocol there)." for (donor, at), ms in took.items()]
    runs = pd.concat(frames, ignore_index=True) if len(frames) > 1 else r.runs
    return runs, notes, refused_at


def render_claims(recs: Sequence[GridRecords], opts: Mapping[str, str]) -> List[str]:
    from ..report.claims import claim_verdict, evaluate_claims, group_kinds, load_claims
    from ..report.delta_markdown import interval_coverage
    from ..report.frames import published_method_names
    from ..report.ours import aggregate, ours_long

    ids = [i for i in opts.get("ids", "").split(",") if i]
    claims = [c for c in load_claims() if not ids or c["id"] in ids]
    claims.sort(key=lambda c: ids.index(c["id"]) if c["id"] in ids else 0)  # the block's order: (2), (3), (4)
    unknown = sorted(set(ids) - {c["id"] for c in claims})
    if unknown:
        raise ConfigError(f"generated claims block: unknown claim id(s) {unknown}; see params/papers/claims.yaml")
    shared = [m for m in opts.get("shared", "").split(",") if m]
    runs_of, notes, refused = {}, [], {}
    for r in recs:
        runs_of[r.grid], said, refused[r.grid] = shared_rows(r, recs, shared)
        notes += said
    md: List[str] = []
    for c in claims:
        md.append(f"* **{c['id']}**: {c['text']} ({c.get('source', '')})")
        for r in recs:
            runs = runs_of[r.grid]
            if not len(r.runs):
                md.append(f"  * `{r.grid}`: not evaluable yet: no committed record")
                continue
            names = published_method_names(r.report)
            absent = sorted({m for m, _ in _compared(c, names)} - {m for _, m, _, _ in r.planned} - set(shared))
            long = ours_long(runs)
            v = evaluate_claims([c], aggregate(long), {}, kinds=group_kinds(runs), per_seed=long, method_names=names)
            v = v[v["who"] == "ours"]
            if not len(v):
                if absent:  # no sitting can change that: the grid does not run them and takes no rows of them
                    md.append(f"  * `{r.grid}`: not evaluated: the grid does not run {', '.join(absent)}")
                    continue
                lack = _lacking_for_claim(c, runs, names)
                md.append(f"  * `{r.grid}`: not evaluable yet: no record of "
                          + (lack or "the methods it compares"))
                continue
            compared = {m for m, _ in _compared(c, names)}
            borrowed = set(runs["method"]) - set(r.runs["method"])  # their divergences are recorded by their grid
            diverged = r.diverged + [d for o in recs if o is not r for d in o.diverged if d["method"] in borrowed]
            for row in v.to_dict("records"):
                verdict = word(claim_verdict(row))
                apart = sorted(m for m in compared if (m, row["scenario"]) in refused[r.grid])
                if (absent or apart) and verdict.startswith("not evaluable yet"):  # no record can complete it
                    verdict = ("not evaluated as a whole: " + (f"the grid does not run {', '.join(absent)}" if absent
                               else f"{', '.join(apart)} not shared here (below)"))
                div = sorted(d["method"] for d in diverged if d["scenario"] == row["scenario"]
                             and d["method"] in compared)
                if div:  # a mean over the seeds that finished is not the method's result: no verdict
                    verdict = ("inconclusive (diverged seeds have no score: "
                               + ", ".join(f"{m} {div.count(m)}" for m in dict.fromkeys(div)) + ")")
                md.append(f"  * `{r.grid}`, {row['scenario']}: **{verdict}** — {row['numbers']}")
    if notes:
        md += ["", "Rows shared between the grids: " + " ".join(notes)]
    covered = [interval_coverage(r.runs) for r in recs if len(r.runs)]
    if covered:
        md += ["", "What the intervals cover: " + " ".join(dict.fromkeys(covered)) + " Verdicts as the report's "
               "claims section gives them: held / not held only with the 95 % intervals apart (n ≥ 3 per side; "
               "per-seed differences for a claim marked `paired: seeds`), else inconclusive."]
    return md + [""]


# ----------------------------------------------------------------------------- kind: tuned
def render_tuned(recs: Sequence[GridRecords], opts: Mapping[str, str]) -> List[str]:
    from ..tune import table_rows

    md: List[str] = []
    for r in recs:
        rows = table_rows(r.chosen) if r.chosen else []
        if not rows:
            md += [f"No committed tuning record of `{r.grid}` yet: `snakemake --cores all --configfile {r.grid}`, "
                   f"then `fedshift archive {r.grid}`.", ""]
            continue
        md += [f"Tuned on validation (`{r.grid}`; metric {rows[0]['metric']}, {rows[0]['rounds']} rounds, tuning "
               f"seeds {rows[0]['seeds']}, patience {rows[0]['patience']}):", "",
               "| scenario | method | parameter | candidates | chosen | val score (%) | diverged | all candidates (val %) |",
               "|---|---|---|---|---|---:|---|---|"]
        for x in rows:
            md.append(f"| {x['scenario']} | {x['method']} | {x['parameter']} | {x['candidates']} | {x['chosen']} | "
                      f"{x['val_score']:.2f} | {x['diverged']} of {x['n_candidates']} | {x['scores']} |")
        md.append("")
    return md


# ----------------------------------------------------------------------------- kind: cost
def run_costs(recs: Sequence[GridRecords]) -> pd.DataFrame:
    """One row per federated record: method, the CPU kind and torch threads it ran with (metrics.json
    ``numerics.cpu_kind``, config ``engine.threads``) and its training + evaluation seconds (``timings``)."""
    import json

    from ..report.collect import PRETRAIN_METHOD
    from . import read_config

    rows = []
    for r in recs:
        if not len(r.runs):
            continue
        fed = r.runs[r.runs["method"] != PRETRAIN_METHOD]
        for (method, run_dir), _ in fed.groupby(["method", "run_dir"], sort=False):
            m = json.loads((Path(run_dir) / "metrics.json").read_text())
            t = m.get("timings") or {}
            if "train_s" not in t:
                continue
            threads = (read_config(Path(run_dir)).get("engine") or {}).get("threads")
            rows.append({"method": method, "kind": (m.get("numerics") or {}).get("cpu_kind") or m.get("device", "?"),
                         "threads": threads if threads is not None else "all",
                         "seconds": float(t["train_s"]) + float(t.get("eval_s") or 0.0)})
    return pd.DataFrame(rows, columns=["method", "kind", "threads", "seconds"])


def render_cost(recs: Sequence[GridRecords], opts: Mapping[str, str]) -> List[str]:
    """What a run of each method cost, from the records (so a piece can be sized to the time at hand), and
    what the runs still without a record would cost at those figures."""
    cost = run_costs(recs)
    if not len(cost):
        return ["No committed record with timings backs this table yet.", ""]
    order = list(dict.fromkeys(m for r in recs for _, m, _, _ in r.planned))
    cost = cost.assign(_o=cost["method"].map(lambda m: order.index(m) if m in order else len(order)))
    md = ["| method | CPU kind | threads | n | train + eval s per run: median (min-max) |", "|---|---|---:|---:|---:|"]
    for (_, method, kind, threads), g in cost.groupby(["_o", "method", "kind", "threads"], sort=True):
        sec = g["seconds"]
        md.append(f"| {method} | {kind} | {threads} | {len(g)} | {sec.median():,.0f} ({sec.min():,.0f}-{sec.max():,.0f}) |")
    md += ["", "From each record's metrics.json: `timings.train_s + eval_s`, the training and evaluation inside the "
               "run (summed over its sittings when it resumed; not start-up, data loading or checkpoints), on the CPU "
               "kind that made it (`numerics.cpu_kind`) with the grid's `engine.threads`. Per-run time depends on "
               "the machine and on what ran beside it, so read it as a planning figure for the same kind, never as a speed comparison (that is "
               "`benchmarks/bench_vs_reference.py`, side by side in one sitting)."]
    med = cost.groupby("method")["seconds"].median()
    missing = [m for r in recs for _, m, _, _ in r.missing]
    if missing:
        sized = [m for m in missing if m in med.index]
        unknown = sorted({m for m in missing if m not in med.index}, key=lambda m: order.index(m) if m in order else 0)
        if not sized:  # nothing to add up: no "about 0 CPU-s"
            md[-1] += (f" The {len(missing)} run(s) without a record are of {', '.join(unknown)}, which no record "
                       "sizes yet.")
        else:
            md[-1] += (f" The {len(sized)} run(s) without a record of {', '.join(dict.fromkeys(sized))} would take "
                       f"about {sum(float(med[m]) for m in sized):,.0f} CPU-s at these medians"
                       + (f", plus the {len(missing) - len(sized)} of {', '.join(unknown)} (no record yet to size them)"
                          if unknown else "") + ".")
    return md + [""]


KINDS: Dict[str, Callable[[Sequence[GridRecords], Mapping[str, str]], List[str]]] = {
    "table": render_table, "claims": render_claims, "tuned": render_tuned, "cost": render_cost}


# ----------------------------------------------------------------------------- blocks in files
def parse_head(head: str, where: str) -> Tuple[str, List[str], Dict[str, str]]:
    words = head.split()
    if not words or words[0] not in KINDS:
        raise ConfigError(f"{where}: generated block {head!r}: the first word must be one of {', '.join(KINDS)}")
    grids = [w for w in words[1:] if "=" not in w]
    opts = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    if not grids:
        raise ConfigError(f"{where}: generated block {head!r} names no grid file")
    return words[0], grids, opts


def render_file(text: str, where: str, root: Path = RECORDS,
                cache: Optional[Dict[str, GridRecords]] = None) -> str:
    """``text`` with every generated block re-rendered from the records."""
    cache = {} if cache is None else cache

    def one(m: "re.Match") -> str:
        kind, grids, opts = parse_head(m.group("head"), where)
        recs = [cache.setdefault(g, grid_records(g, root)) for g in grids]
        body = "\n".join(KINDS[kind](recs, opts)).rstrip("\n") + "\n"
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(one, text)


def doc_files(root: Path = Path(".")) -> List[Path]:
    out: List[Path] = []
    for pattern in DOC_FILES:
        out += sorted(Path(root).glob(pattern))
    return out


def check_or_write(files: Sequence[Path], root: Path = RECORDS, write: bool = True) -> List[str]:
    """Re-render each file's blocks; write the changed files (``write``) and return one line per block whose
    text differed from its rendering."""
    from ..data.store import atomic_write_text

    cache: Dict[str, GridRecords] = {}
    changed = []
    for f in files:
        text = Path(f).read_text()
        if "<!-- generated:" not in text:
            continue
        new = render_file(text, str(f), root, cache)
        if new == text:
            continue
        old_blocks = {m.group("head"): m.group("body") for m in BLOCK.finditer(text)}
        for m in BLOCK.finditer(new):
            if old_blocks.get(m.group("head")) != m.group("body"):
                changed.append(f"{f}: block `{m.group('head')}` differs from its records")
        if write:
            atomic_write_text(Path(f), new)
    return changed
