"""Paper-delta report: our numbers beside the published ones, the differences judged.

This module assembles the section (:func:`delta_report`: reads ``report.*`` of the grid, writes the CSVs and
figures, returns the Markdown); the parts live beside it, one idea each: :mod:`.published` (the papers'
tables and their arithmetic), :mod:`.ours` (our numbers per cell), :mod:`.verdicts` (a cell judged, a table
summarised), :mod:`.claims` (the papers' claims), :mod:`.protocols` (each table's protocol and margins), :mod:`.delta_markdown` and
:mod:`.delta_figures` (how it is shown). What the section computes:

* Published numbers are data: ``params/papers/published/<paper>_<table>.csv``, one row per
  printed cell (columns in :data:`fedshift.report.published.COLUMNS`, contract in that folder's README). A grid names the
  tables it reproduces under ``report.published`` (a grid that names none has no paper delta, and the
  papers' claims are not judged on its runs: its own claims are ``report.claims``, :mod:`.grid_claims`); ``report.published_scenarios`` maps an
  offline stand-in scenario to the published one (``{digits_offline: digits}``), and every
  comparison through that mapping is labelled *proxy* and compares the AVG only (a stand-in's
  domains are not the paper's, even where a name such as ``mnist`` agrees).
* Ours: per seed, the headline number of :func:`fedshift.report.frames.headline_frame` (mean of
  the last ``last_k`` rounds) in percent; across seeds the mean ± the 95% confidence half-width
  of Student's t with n − 1 degrees of freedom (:func:`fedshift.report.stats.mean_ci`), rounded
  once when printed, printed clipped to [0, 100]. FedH2L's WDP / CDP / ACC
  are the engine's pooled rows when the run wrote them (``kind`` wdp / cdp / acc, taken at the
  best validation ACC, :func:`fedshift.report.ours.pooled_selected`), else derived from the same frame: WDP = intra
  top-1, CDP = inter top-1 (mean over the other domains), ACC = (WDP + (n − 1) CDP) / n (all
  domains' test sets, equal sizes). Where a run
  table has ``kind == "global"`` rows (a server model evaluated on the test set), they give
  ``global/top1`` and ``rounds_to/<target>`` (first round reaching the target). A seed that never
  reaches the target stays in the mean, censored at its last round + 1 (the mean is then a lower
  bound, printed ``≥``, without an interval), and every such cell carries ``reached/n``.
* The published ``base`` row (the papers' SOLO/BASE: 50 epochs alone) is matched with our
  ``base_pretrain`` wherever a group has it; our federated ``base`` (no communication, on the
  federated schedule) then stays as an extra, unmatched row (issue 21 item 3).
* Verdict per cell (:func:`fedshift.report.stats.verdict`): *agrees within margin* (TOST: the
  90% interval of Δ inside ±margin, and the 95% half-width no wider), *differs (above / below)* (the 95%
  interval of Δ wholly beyond the margin), else *inconclusive* (always below 3 seeds or with a half-width
  below the metric's resolution). The margin is per cell, grounded in the printed number's own
  uncertainty (:func:`fedshift.report.protocols.cell_margin`: 1.96 × the binomial standard error at the
  paper's test size, never below one test image), *no margin: descriptive only* where the test size is
  unknown. A cell whose run differs from the table's protocol (``params/papers/protocols.yaml``: rounds,
  local epochs, public augmentation, test protocol, models, image size;
  :func:`fedshift.report.protocols.differences`) is *not comparable: <what differs>*. Proxy cells (a
  stand-in scenario) get no verdict: their section states both schedules
  (``params/papers/schedules.yaml``) and gives the numbers and Δ. A row the paper did not print (a
  derived AVG) gets none either and counts nowhere.
* Per table: cells compared, mean |Δ|, the verdict counts, and (not for proxies) whether the
  methods' ranking on the AVG agrees with the paper's (Kendall τ and "same order").
* The printed averages are re-checked against the printed cells (:func:`fedshift.report.published.check_printed`): an
  AVG that is not the mean of its row, a Δ that is not AVG − BASE AVG, a "reduction" that is
  not (ref − x) / ref. The CSVs carry these as ``flag`` (the printed value is kept).
* Claims: ``params/papers/claims.yaml`` lists each paper's qualitative conclusions as
  comparisons (:func:`fedshift.report.claims.evaluate_claims`), evaluated on the paper's own tables and on ours: a claim
  holds only when every pair it names was evaluated and holds ("partly evaluable: k of n"
  otherwise, "NOT held" as soon as one evaluated pair fails); ``structure: homogeneous |
  heterogeneous`` limits it to our runs of that kind (participants' architectures all equal or
  not); ``kind: ratio`` compares rounds-to-target ratios (challenger / reference < ``below``,
  default 1) at every target the runs have when ``metric: rounds_to/*``; a challenger that never
  reaches the target does NOT hold the claim; ``ratio_vs: <method>`` (rounds claims) prints each
  side's rounds as a ratio to that method and, on our runs, evaluates the claim at every target they
  have (an unstated optimiser choice scales every method's rounds, so only ratios compare across
  schedules); "CI-separated" only when both sides have n ≥ 3 and intervals at least the resolution wide
  that do not overlap; rounds pairs are ranked by Gehan's censoring-aware statistic and never
  CI-separated where a side's seeds disagree about reaching the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Mapping, Optional

import pandas as pd

from ..errors import ConfigError
from .claims import (MEANS_ONLY, NOT_MEANS_ONLY, NOT_RANKS_ONLY, RANKS_ONLY, evaluate_claims, group_kinds,
                     load_claims)
from .delta_figures import delta_figure
from .delta_markdown import cells_markdown, claims_markdown, schedule_note, summary_markdown
from .frames import published_method_names, rename_published
from .ours import aggregate, ours_long, value_source
from .protocols import cell_margin, differences, load_protocols, margin_reason, protocols_path, run_values
from .published import PublishedSpec, all_published, claims_path, load_published, published_inconsistencies, schedules
from .stats import FALLBACK_TEST_IMAGES, MIN_N
from .verdicts import NOT_COMPARABLE, compare, summarize

VERDICT_RULES = (
    "**How each verdict is reached** (checkable by hand from the row): Δ = ours − published. The cell's margin "
    "m = 1.96 × √(SE² + s²), SE = 100 × √(p (1 − p) / N) the binomial standard error of the printed accuracy p "
    "(a fraction) on the N test images behind the printed cell in the paper (its own test set for an intra / "
    "WDP cell; for an unweighted mean of several sets, inter and AVG, N = k² / Σ 1/nⱼ; pooled sets, CDP and "
    "ACC, N = Σ nⱼ; the sizes and their sources are data, params/papers/protocols.yaml), s the paper's printed "
    "std (none of the four papers prints one), never below 100 / N nor our resolution; where N is unknown the "
    "cell has **no margin: descriptive only**. With h the 95% Student-t half-width of our mean over n seeds "
    "and h₉₀ = h × t₀.₉₅,ₙ₋₁ / t₀.₉₇₅,ₙ₋₁ its 90% counterpart: **agrees within margin** when −m ≤ Δ − h₉₀ and "
    "Δ + h₉₀ ≤ m (two one-sided t tests at 5%) and h ≤ m; **differs (above / below)** when Δ − h > m or "
    f"Δ + h < −m; otherwise **inconclusive**, and always with n < {MIN_N} seeds or when h is below the metric's "
    "resolution (100 / the number of test images behind our cell, from the run's partition; 100 / "
    f"{FALLBACK_TEST_IMAGES:,} where the run does not record it; one round for a rounds count): such seeds "
    "gave the same number and their spread is unmeasured. A cell whose run differs from the table's protocol "
    "(rounds, local epochs, public augmentation, test protocol, models, image size; params/papers/"
    "protocols.yaml against the run's resolved config) is **not comparable: <what differs>**, with no verdict; "
    "a row the paper did not print (a derived AVG) gets no verdict and counts in no summary or ranking.")


def report_margin(report_cfg: Mapping) -> Optional[float]:
    """``report.margin`` (the table's units) when the grid sets it, else None; it only widens a grounded
    margin (:func:`fedshift.report.protocols.cell_margin`), never creates one. A clear error for anything
    but a positive number."""
    m = report_cfg.get("margin")
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
        raise ConfigError(f"report.margin: {m!r} must be a positive number of percentage points (it widens each "
                          "grounded margin to at least this; leave it out to use the grounded margins)")
    return float(m)


def delta_report(runs: pd.DataFrame, report_cfg: Mapping, out_dir: Path, last_k: int = 3,
                 published_root: Optional[Path] = None, claims_file: Optional[Path] = None,
                 protocols_file: Optional[Path] = None) -> List[str]:
    """Write ``delta__<table>.csv/.png``, ``delta_summary.csv``, ``claims.csv``,
    ``published_flags.csv`` into ``out_dir``; return the Markdown section."""
    out_dir = Path(out_dir)
    specs = [PublishedSpec.parse(e) for e in report_cfg.get("published", []) or []]
    if not specs:  # a grid that reproduces no paper: no paper delta, and the papers' claims are not its own
        return []
    scenario_map = dict(report_cfg.get("published_scenarios") or {})
    published = all_published(published_root)
    renamed = published_method_names(report_cfg)  # report.published_methods: our reading of a published row
    tables = {s.name: rename_published(load_published(s.name, published_root), renamed) for s in specs}
    targets = sorted({m.split("/", 1)[1] for t in tables.values() for m in t["metric"] if m.startswith("rounds_to/")})
    long = ours_long(runs, last_k, targets)
    agg = aggregate(long)
    explicit = report_margin(report_cfg)
    claims = load_claims(claims_file) if (claims_file or claims_path().is_file()) else []
    protocols = load_protocols(protocols_file) if (protocols_file or protocols_path().is_file()) else {}
    schedule_table = schedules()
    md = ["## Paper delta", "",
          "Ours: mean over seeds ± the 95% confidence half-width (Student t, n − 1 degrees of freedom; n shown) of "
          f"{value_source(runs, last_k)}, rounded once; an interval beyond 0 or 100 is printed clipped as "
          "`mean [low, high]`; what the intervals cover: the report's opening. "
          "Rounds to a target: a seed that never reaches it counts as its last round + 1 (`≥`: a lower bound), "
          "with `reached k/n`. **Proxy** sections (our scenario stands in for the published one; AVG cells only, "
          "its domains are not the paper's) state both schedules and give no verdicts. ⚑ = the printed value "
          "does not recompute (kept as printed).", "", VERDICT_RULES, ""]
    if renamed:
        md += ["Compared with the published rows of another name (`report.published_methods`): "
               + ", ".join(f"our `{o}` as the paper's `{p}`" for p, o in renamed.items()) + ".", ""]
    all_cells = []
    for spec in specs:
        entry = protocols.get(spec.name)
        std = entry["printed_std"] if entry else None

        def margins(r, our_res, entry=entry, std=std):
            block = entry["scenarios"].get(r["scenario"]) if entry else None
            m = cell_margin(block, std, r["metric"], r["participant"], r["value_num"], our_res)
            return max(m, explicit) if explicit is not None and not pd.isna(m) else m

        cells = compare(agg, tables[spec.name], scenario_map, spec, margins)
        if cells.empty:
            md.append(f"{spec.name}: no run of this grid matches the published table's scenarios/methods.\n")
            continue
        for (scen, our, pubset, struct), g in cells.groupby(["scenario", "our_scenario", "public", "structure"], sort=False):
            paper = g["table"].iloc[0].split(" ")[0]
            proxy = bool(g["proxy"].any())
            block = entry["scenarios"].get(scen) if entry else None
            differ = {} if proxy else differences(runs, block, our, pubset, struct, f"{spec.name} / {scen}")
            judged = g.index[g["published"].notna() & ~g["derived"].astype(bool)]
            for i in judged:
                if cells.at[i, "ours_method"] in differ:  # the paper's data under another protocol: no verdict
                    cells.at[i, "verdict"] = f"{NOT_COMPARABLE}: {differ[cells.at[i, 'ours_method']]}"
            g = cells.loc[g.index]
            label = f"{g['table'].iloc[0]}: {scen}" + (f" — PROXY: ours on {our}" if our != scen else "") + f" / {pubset} / {struct}"
            grp = runs[(runs["scenario"] == our) & (runs["public"] == pubset) & (runs["structure"] == struct)]
            ours_tp = run_values(grp, our)["test_protocol"] if len(grp) else ["clean"]
            label += (f" — test protocol: ours {' / '.join(ours_tp)}, the paper's "  # issue 47: every table says it
                      f"{block.get('test_protocol') if block else 'not recorded'}")
            note = schedule_note(runs, spec.name, paper, our, pubset, struct, schedule_table)
            why = "" if proxy else margin_reason(block, std, g.loc[judged, "margin"], explicit)
            md += cells_markdown(g, label, note, why, differ)
        all_cells.append(cells)
        cells.to_csv(out_dir / f"delta__{spec.name}.csv", index=False)
        title = f"{cells['table'].iloc[0]}: ours vs published" + (" (proxy: other schedule)" if cells["proxy"].any() else "")
        delta_figure(cells, out_dir / f"delta__{spec.name}.png", title, report_cfg.get("method_order"))
        md.append(f"![delta](delta__{spec.name}.png)\n")
    if all_cells:
        summary = summarize(pd.concat(all_cells, ignore_index=True))
        summary.to_csv(out_dir / "delta_summary.csv", index=False)
        md += ["### Per-table summary", "", summary_markdown(summary)]
    wanted = {s.name for s in specs}
    verdicts = evaluate_claims(claims, agg, published, scenario_map, paper_tables=wanted, kinds=group_kinds(runs),
                               per_seed=long, method_names=renamed)
    verdicts.to_csv(out_dir / "claims.csv", index=False)
    if len(verdicts):
        md += ["### Claims", "", "A claim is held only when every pair it names was evaluated and holds; NOT held "
               "as soon as one evaluated pair fails; otherwise partly evaluable (k of n pairs). A claim naming a "
               "structure is evaluated only on our runs of that kind. A rounds claim is judged at its own "
               "target only (per scenario where params/papers/claims.yaml maps targets); where neither side "
               "reached it in any seed the pair is *not evaluable*, a challenger that never reached a target its "
               "reference reached fails, and one that reached a target its reference never reached holds. On our runs *held* and *NOT held* need the same evidence: "
               f"*(CI-separated)* when both sides have n ≥ {MIN_N} and their 95% intervals (each at least the "
               "metric's resolution wide) do not overlap, else *… by the means only: inconclusive* (n < 3 or "
               "overlapping intervals cannot order the methods). The intervals are per side, except for a claim "
               "marked `paired: seeds`: its sides share their seeds (and evaluation images), so it is judged on "
               "the per-seed differences, CI-separated when their 95% interval clears 0. A rounds pair with "
               "per-seed values is ordered by Gehan's generalised Wilcoxon statistic (a never-reaching seed is "
               "censored at its last round + 1: only a reached seed can be certainly faster; the one-sided "
               "permutation p is printed), *… by the seeds' ranks only: inconclusive* unless both sides' seeds "
               "agree about reaching the target and their intervals ([the censoring bound, ∞) for a side that "
               "never reached it) are apart.", "",
               claims_markdown(verdicts)]

        def counts(v):
            c = v["verdict"].map(lambda x: x.split(":")[0] if x.startswith(("partly", "not evaluable")) else x
                                 ).value_counts()
            kinds = (("held (CI-separated)", MEANS_ONLY, RANKS_ONLY, "NOT held (CI-separated)", NOT_MEANS_ONLY,
                      NOT_RANKS_ONLY)
                     if (v["who"] == "ours").all() else ("held", "NOT held"))
            return ", ".join(f"{int(c.get(k, 0))} {k}" for k in (*kinds, "partly evaluable", "not evaluable"))

        ours = verdicts[verdicts["who"] == "ours"]
        paper = verdicts[verdicts["who"] != "ours"]
        md.append(f"Claims on our runs: {counts(ours)} ({int(ours['proxy'].sum())} of these {len(ours)} evaluations "
                  f"on proxy scenarios, another schedule); on the papers' own tables: {counts(paper)}.\n")
    flags = published_inconsistencies({k: v for k, v in published.items() if k in wanted})
    if len(flags):
        flags.to_csv(out_dir / "published_flags.csv", index=False)
        md += ["### Flagged published values (the paper's own arithmetic or cross-table conflicts)", ""]
        for (paper, table, flag), g in flags.groupby(["paper", "table", "flag"], sort=False):
            where = ", ".join(f"{r['scenario']} {r['method']} {r['participant']} {r['metric']} = {r['value']}"
                              for _, r in g.iterrows())
            md.append(f"- {paper} {table}: {where}: {flag}")
        md.append("")
    return md
