"""Claims a grid states about its own runs (``report.claims``), judged exactly as the papers' claims.

A grid lists them under its ``report:`` block, or names a YAML file that holds them under ``claims:``,
in the schema of params/papers/claims.yaml (``id``, ``text``, ``metric``, ``compare`` pairs
``[a, b]`` meaning a beats b; ``lower_is_better``, ``participant``, ``structure``, ``scenarios``,
``paired: seeds``, ``kind: ratio`` as there; ``paper`` may be left out: the grid is the source). They
are checked when the grid is planned (:func:`check_grid_claims`: every term names a method the grid
runs) and judged in the report by the papers' own functions (:func:`fedshift.report.claims.evaluate_claims`
and :func:`~fedshift.report.claims.claim_verdict`) on the same per-seed numbers as the tables
(:func:`fedshift.report.ours.ours_long`): *held (CI-separated)* only where both sides have at least
:data:`~fedshift.report.stats.MIN_N` seeds and their 95 % intervals are apart (a ``paired: seeds``
claim: the 95 % interval of the per-seed differences clear of 0), else *… by the means only:
inconclusive*; *partly evaluable* where a pair was not run.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, List, Mapping

import pandas as pd
import yaml

from ..errors import ConfigError
from .claims import _term, check_claims, evaluate_claims, group_kinds
from .delta_markdown import claims_markdown
from .ours import aggregate, ours_long
from .published import load_published
from .stats import MIN_N

SOURCE = "this grid"  # a grid claim's `paper` when it names none


def grid_claims(report_cfg: Mapping) -> List[dict]:
    """The grid's claims (``report.claims``: a list, or a file holding one under ``claims:``), checked;
    [] when it states none."""
    spec = (report_cfg or {}).get("claims")
    if not spec:
        return []
    where = "report.claims"
    if isinstance(spec, str):
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"report.claims: no file {spec!r} (a YAML file with a list under `claims:`, or "
                              "the list itself under report.claims)")
        doc = yaml.safe_load(path.read_text()) or {}
        spec, where = (doc.get("claims") if isinstance(doc, dict) else None), f"report.claims ({path})"
        if not spec:
            raise ConfigError(f"{where}: the file holds no list under `claims:`")
    claims = [{"paper": SOURCE, **c} if isinstance(c, dict) else c for c in spec]
    return check_claims(claims, where)


def check_grid_claims(report_cfg: Mapping, ran: Iterable[str], scenarios: Iterable[str]) -> None:
    """Every term of every grid claim names a method (or variant) the grid runs, and a ``method@scenario``
    term one of its scenarios; a one-line ConfigError with did-you-mean otherwise."""
    ran, scenarios = sorted(set(ran)), sorted(set(scenarios))
    for c in grid_claims(report_cfg):
        for pair in c["compare"]:
            for term in pair:
                method, scen = _term(term)
                for name, valid, what in ((method, ran, "method"), (scen, scenarios, "scenario")):
                    if name is not None and name not in valid:
                        close = difflib.get_close_matches(str(name), valid, n=1)
                        hint = f" (did you mean {close[0]!r}?)" if close else ""
                        raise ConfigError(f"report.claims: claim {c['id']!r}: {what} {name!r} is not run by the "
                                          f"grid{hint}; valid: {', '.join(valid)}")


def grid_claims_section(runs: pd.DataFrame, report_cfg: Mapping, out: Path, last_k: int = 3) -> List[str]:
    """The report's section of the grid's own claims (``grid_claims.csv`` written to ``out``); [] when the
    grid states none."""
    claims = grid_claims(report_cfg)
    if not claims:
        return []
    long = ours_long(runs, last_k, _targets(claims))
    named = sorted({t for c in claims for t in c.get("published") or []})
    published = {name: load_published(name) for name in named}
    verdicts = evaluate_claims(claims, aggregate(long), published, kinds=group_kinds(runs), per_seed=long)
    verdicts.to_csv(Path(out) / "grid_claims.csv", index=False)
    md = ["## Claims of this grid", "",
          "The grid's own claims (`report.claims`), judged as the papers' claims are: a claim is *held* only when "
          "every pair it names was run and holds, *NOT held* as soon as one fails, else *partly evaluable*. On our "
          f"runs *held* / *NOT held* need the same evidence: *(CI-separated)* when both sides have n ≥ {MIN_N} "
          "seeds and their 95% intervals do not overlap (a claim marked `paired: seeds`: the 95% interval of the "
          "per-seed differences clears 0), else *… by the means only: inconclusive*. Every pair's numbers: "
          "`grid_claims.csv`.", ""]
    if verdicts.empty:
        return md + ["No claim of the grid names methods that ran in one group.", ""]
    return md + [claims_markdown(verdicts), ""]


def _targets(claims: List[dict]) -> List[str]:
    """The rounds-to-accuracy targets a grid's claims name (``rounds_to/0.9`` -> ``0.9``)."""
    metrics = [m for c in claims for m in (c["metric"].values() if isinstance(c["metric"], dict) else [c["metric"]])]
    return sorted({m.split("/", 1)[1] for m in metrics if m.startswith("rounds_to/") and m != "rounds_to/*"})
