"""A new method against its baselines (issue 50): Δ paired by seed with its t interval and n, a verdict only
at n >= 3 with the interval clear of 0, bold only where the best is separated, the grid's own claims, and
the LaTeX tables that pdflatex compiles showing the same numbers.

The unit tests check the arithmetic against scipy's paired t test (an independent implementation); the
end-to-end test runs the example plugin (examples/fedprox_adaptive, a method from an outside package)
against FedAvg and FedMD on the tiny grid at seeds 0-2 (two rounds), then recomputes every Δ and interval
of the comparison section from runs.csv with numpy and scipy, and reads the same numbers back from the PDF
that tables.tex compiles to."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from conftest import REPO
from fedshift.errors import ConfigError
from fedshift.experiments import load_experiments
from fedshift.report.comparison import (CONTAINS_ZERO, HIGHER, LOWER, SAME, comparison_pairs, delta_verdict,
                                        paired_delta, separated_best)
from fedshift.report.report import column_resolution, headline_frame, paper_table, seed_table, to_markdown
from helpers import tiny_grid

TINY_DATA = {"scenarios": {"rotmnist": {}}, "public": {"photo_patches": {}}}


# ----------------------------------------------------------------------------- the arithmetic


def test_paired_delta_is_scipys_paired_t_interval():
    rng = np.random.default_rng(3)
    a = {s: float(v) for s, v in enumerate(rng.normal(60, 5, 5))}
    b = {s: a.get(s, 60.0) - 1.0 + float(rng.normal(0, 0.4)) for s in range(1, 6)}  # seed 5 only here, 0 only in a
    mean, half, n, seeds = paired_delta(a, b)
    assert seeds == [1, 2, 3, 4] and n == 4  # only the seeds both ran
    x, y = [a[s] for s in seeds], [b[s] for s in seeds]
    ci = stats.ttest_rel(x, y).confidence_interval(0.95)
    assert mean == pytest.approx(np.mean(np.subtract(x, y)), abs=1e-12)
    assert (mean - half, mean + half) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert delta_verdict(mean, half, n) == (HIGHER if ci.low > 0 else LOWER if ci.high < 0 else CONTAINS_ZERO)


@pytest.mark.parametrize("deltas,verdict", [
    ([1.0, 1.2, 0.9], HIGHER),
    ([-1.0, -1.2, -0.9], LOWER),
    ([1.0, -1.2, 0.9], CONTAINS_ZERO),
    ([5.0, 6.0], "inconclusive: n = 2"),  # a clear gap, but two seeds carry no verdict
    ([0.0, 0.0, 0.0], SAME),  # the two methods computed the same numbers (issue 50: FedAvgM under eval_models local)
    ([0.5, 0.5, 0.5], "inconclusive: every seed gave the same Δ (half-width below the metric's resolution)"),
    # 10.73 % on each seed against 10.40 %: floating point leaves a half-width of ~1e-14, not a measured spread
    ([10.73 - 10.4, 10.73 - 10.4, 10.73 - 10.4 + 1e-14], "inconclusive: every seed gave the same Δ (half-width "
                                                          "below the metric's resolution)"),
    ([1e-13, -1e-13, 0.0], SAME),  # the same numbers to floating-point noise
    ([5.0, 5.0, 5.0], "inconclusive: every seed gave the same Δ (half-width below the metric's resolution)"),
    ([2.0, 1.0, -2.0], SAME),  # within half a step of 5 points: the same numbers on every seed
])
def test_delta_verdict(deltas, verdict):
    mean, half, n, _ = paired_delta(dict(enumerate(deltas)), dict.fromkeys(range(len(deltas)), 0.0))
    res = 5.0 if 5.0 in deltas or 2.0 in deltas else None  # 20 test images: an accuracy moves in steps of 5 points
    assert delta_verdict(mean, half, n, deltas, res) == verdict


def test_separated_best_needs_three_seeds_and_a_clear_interval():
    seeds = {"a": {0: 60.0, 1: 70.0, 2: 80.0}, "b": {0: 59.0, 1: 69.2, 2: 78.9}}  # a wins every seed by ~1
    assert separated_best(seeds) == "a"  # paired: the per-method intervals (±25) overlap, the differences' do not
    seeds["b"] = {0: 61.0, 1: 68.0, 2: 79.0}  # the seeds disagree
    assert separated_best(seeds) is None
    two = {"a": {0: 90.0, 1: 91.0}, "b": {0: 10.0, 1: 11.0}}
    assert separated_best(two) is None  # n = 2: never bold, however far apart
    apart = {"a": {0: 90.0, 1: 91.0, 2: 90.5}, "b": {5: 10.0, 6: 11.0, 7: 10.5}}  # no seed in common: unpaired
    assert separated_best(apart) == "a"
    apart["b"] = {5: 10.0, 6: 11.0}
    assert separated_best(apart) is None
    assert separated_best({"a": {0: 1.0, 1: 2.0, 2: 3.0}}) is None  # one row: nothing to be separated from
    same = {"a": {0: 60.0, 1: 70.0, 2: 80.0}, "b": {0: 59.0, 1: 69.0, 2: 79.0 + 1e-12}}
    assert separated_best(same) is None  # +1 on every seed: a width of floating-point noise measures nothing


def test_tables_bold_only_the_separated_best_and_never_below_three_seeds():
    rows = []
    per = {"fedavg": [50.0, 60.0, 70.0], "moon": [51.0, 61.2, 70.9], "fedmd": [49.0, 62.0, 69.0]}
    for (m, vals), p, d in itertools.product(per.items(), ("p0", "p1"), ("p0", "p1")):
        for s, v in enumerate(vals):
            rows.append(dict(scenario="rotmnist", public="x", structure="st", method=m, seed=s, round=1,
                             participant=p, domain=d, kind="intra" if p == d else "inter",
                             top1=(v + (8 if p == "p1" and m == "fedmd" else 0)) / 100, top5=1.0))
    head = headline_frame(pd.DataFrame(rows), 3)
    table, std = paper_table(head, "inter", "top1", ["fedavg", "moon", "fedmd"])
    md = to_markdown(table, "t", None, None, seed_table(head, "inter", "top1"))
    lines = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert list(table.index) == ["fedavg", "moon", "fedmd"]  # the grid's order
    # p0: moon beats fedavg on every seed (+1, +1.2, +0.9) but not fedmd (+2, −0.8, +1.9): no bold
    assert "**" not in lines["moon"].split(" | ")[1]
    # p1: fedmd 8 points up: beats moon by +6, +6.8, +6.1 and fedavg by more: bold; AVG: fedmd − moon = +2, +4.8,
    # +2.1, interval [−0.98, +6.9]: no bold
    assert lines["fedmd"].split(" | ")[2].startswith("**") and md.count("**") == 2
    # on 10 test images an accuracy moves in steps of 10 points: fedmd's +6 to +8 on p1 are not measured apart
    coarse = column_resolution(pd.DataFrame({"test_sizes": ['{"p0": 10, "p1": 10}']}), "inter", "top1", table.columns)
    assert coarse == {"p0→": 10.0, "p1→": 10.0, "AVG→": 5.0}
    assert "**" not in to_markdown(table, "t", None, None, seed_table(head, "inter", "top1"), coarse)
    two = head[head["seed"] < 2]
    t2, _ = paper_table(two, "inter", "top1")
    assert "**" not in to_markdown(t2, "t", None, None, seed_table(two, "inter", "top1"))  # n = 2: never


def test_what_the_paired_intervals_cover_follows_data_seed():
    from fedshift.report.comparison import covers

    assert covers(pd.DataFrame({"data_seed": ["fixed", "fixed"]})).startswith("training noise for one data draw")
    assert covers(pd.DataFrame({"data_seed": ["run"]})).startswith("data draws and training noise")
    assert covers(pd.DataFrame({"data_seed": ["run", "fixed"]})).startswith("mixed draws")


def test_pairs_from_reference_and_compare():
    methods = ["fedavg", "fedavgm", "moon"]
    assert comparison_pairs({"reference": "fedavg"}, methods) == [("fedavgm", "fedavg"), ("moon", "fedavg")]
    assert comparison_pairs({"compare": {"method": "fedavgm"}}, methods) == [("fedavgm", "fedavg"), ("fedavgm", "moon")]
    both = {"reference": "fedavg", "compare": {"method": "fedavgm", "against": ["moon", "fedavg"]}}
    assert comparison_pairs(both, methods) == [("fedavgm", "fedavg"), ("moon", "fedavg"), ("fedavgm", "moon")]
    assert comparison_pairs({}, methods) == []


# ----------------------------------------------------------------------------- the grid's keys, checked at plan time


@pytest.mark.parametrize("report,message", [
    ({"reference": "fedavgg"}, "report.reference: 'fedavgg' is not run by the grid (did you mean 'fedavg'?); "
                               "valid: base_pretrain, fedavg, fedmd"),
    ({"compare": {"method": "fedmd", "against": ["fedprox"]}}, "report.compare.against: 'fedprox' is not run"),
    ({"compare": {"method": "fedmd", "against": ["fedmd"]}}, "is the compared method itself"),
    ({"compare": {"against": ["fedmd"]}}, "report.compare: 'method' is a required property"),
    ({"reference": 3}, "report.reference: 3 is not of type 'string'"),
    ({"claims": [{"id": "c", "text": "t", "metric": "inter", "compare": [["fedmd", "fedavgm"]]}]},
     "report.claims: claim 'c': method 'fedavgm' is not run by the grid (did you mean 'fedavg'?)"),
    ({"claims": [{"id": "c", "text": "t", "metric": "inter", "compare": [["fedmd@digits", "fedavg"]]}]},
     "report.claims: claim 'c': scenario 'digits' is not run by the grid"),
    ({"claims": [{"id": "c", "text": "t", "compare": [["fedmd", "fedavg"]]}]}, "report.claims: claim 'c' lacks 'metric'"),
    ({"claims": [{"id": "c", "text": "t", "metric": "inter", "compare": ["fedmd", "fedavg"]}]},
     "compare must be a list of pairs"),
    ({"claims": "no/such/claims.yaml"}, "report.claims: no file 'no/such/claims.yaml'"),
])
def test_bad_comparison_keys_stop_the_plan_in_one_line(report, message, tiny_data):
    grid = tiny_grid(methods=["fedavg", "fedmd"])
    grid.pop("methods")
    grid["report"] = report
    with pytest.raises(ConfigError) as err:
        load_experiments(grid, TINY_DATA, build=str(tiny_data))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_claims_file_and_the_grids_method_order(tmp_path, tiny_data):
    f = tmp_path / "claims.yaml"
    f.write_text("claims:\n  - {id: c, text: FedMD beats FedAvg, metric: intra, compare: [[fedmd, fedavg]]}\n")
    grid = tiny_grid(methods=["fedmd", "fedavg"], report={"claims": str(f), "reference": "fedavg"})
    grid.pop("methods")
    plan = load_experiments(grid, TINY_DATA, build=str(tiny_data))
    assert plan.report["method_order"] == ["fedmd", "fedavg"]  # table rows and colours in the grid's order
    assert "method_order" not in grid["report"]  # the grid's own block stays as written


# ----------------------------------------------------------------------------- end to end on the tiny grid


@pytest.fixture(scope="module")
def tiny_n3(tiny_data, tmp_path_factory):
    """The example plugin against FedAvg and FedMD at seeds 0-2 (two rounds), collected and reported."""
    from fedshift import runner
    from fedshift.methods import METHODS
    from fedshift.report.collect import collect
    from fedshift.report.report import make_report

    tmp = tmp_path_factory.mktemp("compare")
    with pytest.MonkeyPatch.context() as mp:  # as its entry point registers it (tests/test_grid_files.py)
        mp.syspath_prepend(str(REPO / "examples/fedprox_adaptive"))
        import fedprox_adaptive

        METHODS.load_plugins()
        mp.setitem(METHODS._items, "fedprox_adaptive", fedprox_adaptive.FedProxAdaptive)
        mp.setitem(METHODS._origin, "fedprox_adaptive", "plugin fedshift-fedprox-adaptive (test)")
        claim = {"id": "beats_fedavg", "text": "The plugin beats FedAvg", "metric": "inter", "paired": "seeds",
                 "compare": [["fedprox_adaptive", "fedavg"]]}
        grid = tiny_grid(methods=["fedavg", "fedprox_adaptive", "fedmd"], engine={"rounds": 2},
                         report={"title": "plugin_vs_baselines", "claims": [claim],
                                 "compare": {"method": "fedprox_adaptive", "against": ["fedavg", "fedmd"]}})
        grid.pop("methods")
        grid["grid"][0]["seeds"] = [0, 1, 2]
        plan = load_experiments(grid, TINY_DATA, results=str(tmp / "results"), build=str(tiny_data))
        dirs = []
        for job, cfg in plan.federate.items():
            dirs.append(tmp / "runs" / job.path)
            runner.run_federate(cfg, dirs[-1])
        collect(dirs, tmp / "runs.csv")
        make_report(tmp / "runs.csv", tmp / "rep", plan.report, tracking=False)
    return tmp


def _by_hand(runs: pd.DataFrame, method: str, kind: str) -> dict:
    """seed -> the AVG of one method (percent): every participant's accuracy on the domains of its kind, in
    the evaluated rounds after round 0 (two of them: the last three there are), averaged in one go (each
    participant has the same number of domains and rounds, so the nested means of the report are this one)."""
    d = runs[(runs["method"] == method) & (runs["kind"] == kind) & (runs["round"] > 0)]
    return {int(s): 100 * float(g["top1"].mean()) for s, g in d.groupby("seed")}


def _signed(x: float) -> str:
    """How the report prints a signed number: two decimals, never "-0.00"."""
    s = f"{x:+.2f}"
    return "+0.00" if s == "-0.00" else s


def _expected(tmp):
    runs = pd.read_csv(tmp / "runs.csv")
    sizes = json.loads(runs["test_sizes"].dropna().iloc[0])  # {participant: test images}, from the partition
    # an AVG is an unweighted mean of the participants' accuracies: it moves in steps of 100 / (k² / Σ 1/n_j)
    res = 100 * sum(1 / n for n in sizes.values()) / len(sizes) ** 2
    out = []
    for ref, kind in itertools.product(("fedavg", "fedmd"), ("inter", "intra")):
        a, b = _by_hand(runs, "fedprox_adaptive", kind), _by_hand(runs, ref, kind)
        x, y = [a[s] for s in (0, 1, 2)], [b[s] for s in (0, 1, 2)]
        d = np.subtract(x, y)
        ci = stats.ttest_rel(x, y).confidence_interval(0.95)
        half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
        assert (d.mean() - half, d.mean() + half) == pytest.approx((ci.low, ci.high), abs=1e-9)  # two roads agree
        verdict = ("no difference" if (np.abs(d) < res / 2).all() else "inconclusive: every seed gave the same"
                   if half < res else HIGHER if ci.low > 0 else LOWER if ci.high < 0 else CONTAINS_ZERO)
        out.append(dict(ref=ref, metric=f"{kind}/top1", a=np.mean(x), b=np.mean(y), delta=d.mean(), low=ci.low,
                        high=ci.high, verdict=verdict))
    return out


def test_comparison_section_matches_a_hand_computation(tiny_n3):
    frame = pd.read_csv(tiny_n3 / "rep/comparison.csv").set_index(["reference", "metric"])
    md = (tiny_n3 / "rep/report.md").read_text()
    assert "## Comparison: `fedprox_adaptive` against `fedavg`, `fedmd`" in md
    for e in _expected(tiny_n3):
        row = frame.loc[(e["ref"], e["metric"])]
        assert row["n"] == 3 and row["seeds"] == "0 1 2" and row["method"] == "fedprox_adaptive"
        assert (row["delta"], row["ci_low"], row["ci_high"]) == pytest.approx((e["delta"], e["low"], e["high"]),
                                                                               abs=1e-9)
        assert row["verdict"].startswith(e["verdict"])
        line = (f"| fedprox_adaptive − {e['ref']} | {e['metric']} | 3 | 0, 1, 2 | {e['a']:.2f} | {e['b']:.2f} | "
                f"{_signed(e['delta'])} | [{_signed(e['low'])}, {_signed(e['high'])}] | {row['verdict']} |")
        assert line in md, line
    assert "The intervals cover training noise for one data draw (`data_seed: fixed`" in md  # the tiny grid's
    # the grid's own claim, judged on the same per-seed differences
    claim = pd.read_csv(tiny_n3 / "rep/grid_claims.csv").iloc[0]
    e = next(x for x in _expected(tiny_n3) if x["ref"] == "fedavg" and x["metric"] == "inter/top1")
    assert f"Δ = {e['delta']:+.2f}, 95% CI [{e['low']:+.2f}, {e['high']:+.2f}] (n=3)" in claim["numbers"]
    want = ("held (CI-separated)" if e["low"] > 0 else "NOT held (CI-separated)" if e["high"] < 0
            else "held by the means only: inconclusive" if e["delta"] > 0 else "NOT held by the means only: inconclusive")
    assert claim["verdict"] == want
    assert "## Paper delta" not in md and "Table VIII" not in md  # the grid reproduces no paper
    html = (tiny_n3 / "rep/report.html").read_text()
    assert html.count('<img src="data:image/png;base64,') == md.count("](") and "<h2>Figures</h2>" in html


def test_latex_tables_compile_and_show_the_same_numbers(tiny_n3, tmp_path):
    if not shutil.which("pdflatex") or not shutil.which("pdftotext"):
        if os.environ.get("FEDSHIFT_SKIP_LATEX") == "1":
            pytest.skip("FEDSHIFT_SKIP_LATEX=1 and no pdflatex / pdftotext")
        pytest.fail("pdflatex / pdftotext missing: apt-get install -y --no-install-recommends texlive-latex-base "
                    "texlive-latex-recommended poppler-utils (.ci/run does; FEDSHIFT_SKIP_LATEX=1 skips this test)")
    shutil.copy(tiny_n3 / "rep/tables.tex", tmp_path / "tables.tex")
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "tables.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    text = subprocess.run(["pdftotext", "-layout", "tables.pdf", "-"], cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout
    flat = re.sub(r"\s+", " ", text)
    for e in _expected(tiny_n3):
        assert f"{_signed(e['delta'])} [{_signed(e['low'])}, {_signed(e['high'])}]" in flat, e
    # the main table's AVG cell of each method: mean ± t half-width over the three seeds, by hand
    runs = pd.read_csv(tiny_n3 / "runs.csv")
    for method in ("fedavg", "fedprox_adaptive", "fedmd"):
        v = list(_by_hand(runs, method, "inter").values())
        half = stats.t.ppf(0.975, 2) * np.std(v, ddof=1) / np.sqrt(3)
        cell = (f"{np.mean(v):.2f} ± {half:.2f}" if 0 <= np.mean(v) - half and np.mean(v) + half <= 100
                else f"{np.mean(v):.2f} [")
        assert cell in flat, (method, cell)
    tex = (tiny_n3 / "rep/tables.tex").read_text()
    assert tex.count("\\toprule") == tex.count("\\bottomrule") >= 4 and "\\usepackage{booktabs}" in tex
