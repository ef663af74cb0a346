"""The papers' qualitative claims (``params/papers/claims.yaml``), evaluated on the papers' own
tables and on our runs, and the equivalence margin a table's claims imply.

* Each claim is a list of comparisons (:func:`evaluate_claims`): a claim holds only when every pair it
  names was evaluated and holds ("partly evaluable: k of n" otherwise, "NOT held" as soon as one
  evaluated pair fails).
* ``structure: homogeneous | heterogeneous`` limits it to our runs of that kind (participants'
  architectures all equal or not); ``kind: ratio`` compares rounds-to-target ratios (challenger /
  reference < ``below``, default 1) at every target the runs have when ``metric: rounds_to/*``; a
  challenger that never reaches the target does NOT hold the claim; ``ratio_vs: <method>`` (rounds
  claims) prints each side's rounds as a ratio to that method and, on our runs, evaluates the claim at
  every target they have (an unstated optimiser choice scales every method's rounds, so only ratios
  compare across schedules).
* On our runs "held" and "NOT held" need the same evidence (:func:`claim_verdict`): "CI-separated"
  only when both sides have n ≥ MIN_N and their intervals are apart, else inconclusive.
* :func:`table_margin`: half the smallest printed gap a claim of a table rests on, so that agreeing
  within the margin cannot turn the claim around.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import pandas as pd
import yaml

from ..errors import ConfigError
from .frames import is_homogeneous
from .frames import topk as _topk
from .published import BASE_PRETRAIN, claims_path, ours_method
from .stats import DEFAULT_MARGIN, MIN_N, fmt_interval, mean_ci, no_verdict_reason


STRUCTURES = ("homogeneous", "heterogeneous")
CLAIM_KINDS = ("order", "ratio")


def load_claims(path: Optional[Path] = None) -> List[dict]:
    path = Path(path or claims_path())
    doc = yaml.safe_load(path.read_text()) or {}
    return check_claims(doc.get("claims", []), str(path))


def check_claims(claims: List[dict], where: str) -> List[dict]:
    """``claims`` (a list in the schema of params/papers/claims.yaml) when valid, else a one-line
    ConfigError naming ``where``, the claim and the key."""
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise ConfigError(f"{where}: claims must be a list of mappings (id, paper, text, metric, compare)")
    for c in claims:
        for key in ("id", "paper", "text", "metric", "compare"):
            if key not in c:
                raise ConfigError(f"{where}: claim {c.get('id', '?')!r} lacks {key!r}")
        if (not isinstance(c["compare"], list) or not c["compare"]
                or not all(isinstance(p, list) and len(p) == 2 for p in c["compare"])):
            raise ConfigError(f"{where}: claim {c['id']!r}: compare must be a list of pairs [a, b] (a beats b), "
                              f"got {c['compare']!r}")
        if c.get("structure") is not None and c["structure"] not in STRUCTURES:
            raise ConfigError(f"{where}: claim {c['id']!r}: structure {c['structure']!r} must be one of "
                              f"{', '.join(STRUCTURES)}")
        if c.get("kind", "order") not in CLAIM_KINDS:
            raise ConfigError(f"{where}: claim {c['id']!r}: kind {c['kind']!r} must be one of {', '.join(CLAIM_KINDS)}")
        if c.get("paired") not in (None, "seeds") or (c.get("paired") and c.get("kind") == "ratio"):
            raise ConfigError(f"{where}: claim {c['id']!r}: paired {c['paired']!r} must be 'seeds' (or absent), "
                              "and a ratio claim cannot be paired")
        metrics = c["metric"] if isinstance(c["metric"], dict) else {"default": c["metric"]}
        if not metrics or not all(isinstance(k, str) and isinstance(v, str) for k, v in metrics.items()):
            raise ConfigError(f"{where}: claim {c['id']!r}: metric must be a metric key or a mapping "
                              f"{{scenario: metric key}}, got {c['metric']!r}")
        rounds = {str(v).startswith("rounds_to/") for v in metrics.values()}
        if (c.get("kind") == "ratio" or c.get("ratio_vs")) and rounds != {True}:
            raise ConfigError(f"{where}: claim {c['id']!r}: kind ratio needs metric rounds_to/<target> or rounds_to/*, "
                              f"got {c['metric']!r}")
    return claims


def _term(term: str) -> Tuple[str, Optional[str]]:
    method, _, scen = str(term).partition("@")
    return method, scen or None


def _resolve_metric(metric: str, scenario: str) -> str:
    if metric in ("inter", "intra"):
        return f"{metric}/{_topk(scenario)}"
    return metric


def _pair(a, b, lower: bool, factor: float) -> Optional[bool]:
    """Does a beat b (a < factor·b when ``lower``, else a > factor·b)? a, b = (mean, ci, n, reached).
    True / False, or None when censored rounds leave it open. A challenger that never reached its target
    (reached = 0) does not beat a reference that did (the caller has already set aside a reference that
    never reached it: that pair is not evaluable)."""
    (ma, na, ra), (mb, nb, rb) = (a[0], a[2], a[3]), (b[0], b[2], b[3])
    if not lower:
        return ma > factor * mb
    if na > 0 and ra == 0:  # ours, never reached (a printed value has n = 0)
        return False
    a_exact, b_exact = ra == na, rb == nb
    if a_exact and b_exact:
        return ma < factor * mb
    if not a_exact and b_exact:  # a's mean is a lower bound
        return False if ma >= factor * mb else None
    if a_exact and not b_exact:  # b's mean is a lower bound
        return True if ma < factor * mb else None
    return None


def _never_reached(v) -> bool:
    """Our side (n > 0) whose every seed missed the rounds target."""
    return v[2] > 0 and v[3] == 0


def _interval(v, factor: float = 1.0) -> Optional[Tuple[float, float]]:
    """The side's 95% interval (scaled by ``factor``) if it can carry a verdict, else None: at least
    :data:`MIN_N` seeds and a non-zero width. A censored side (some seeds never reached the target) is
    [its mean, ∞): the mean counts those seeds at their last round + 1, a lower bound."""
    mean, ci, n, reached = v[:4]
    if n < MIN_N:
        return None
    if reached < n:
        return factor * mean, math.inf
    if no_verdict_reason(ci, n):
        return None
    return factor * (mean - ci), factor * (mean + ci)


def _separation(va, vb, lower: bool, factor: float) -> Tuple[bool, bool]:
    """(a beats b with the 95% intervals apart, b beats a with the intervals apart); both False when
    either side has no interval that can carry a verdict (n < MIN_N, zero width)."""
    ia, ib = _interval(va), _interval(vb, factor)
    if ia is None or ib is None:
        return False, False
    if lower:
        return ia[1] < ib[0], ia[0] > ib[1]
    return ia[0] > ib[1], ia[1] < ib[0]


def _fmt_term(name: str, v) -> str:
    mean, ci, n, reached = v[:4]
    if n == 0:  # a printed value of the paper: no seeds of ours behind it
        return f"{name} {mean:.2f}"
    if reached < n:
        return f"{name} ≥ {mean:.2f} (reached {reached}/{n})"
    return f"{name} {fmt_interval(mean, ci, n, bounded=False)} (n={n})"


def _ratio_text(v, vr) -> str:
    """v / reference, with ≥ / ≤ where a censored side makes the ratio a bound, '?' where both are."""
    r = v[0] / vr[0]
    v_low, r_low = v[2] > 0 and v[3] < v[2], vr[2] > 0 and vr[3] < vr[2]  # a censored mean is a lower bound
    if v_low and r_low:
        return f"? ({r:.2f} from two lower bounds)"
    return ("≥ " if v_low else "≤ " if r_low else "") + f"{r:.2f}"


def _target_text(metric: str) -> str:
    t = metric.split("/", 1)[1]
    try:
        return f"{float(t) * 100:g} %"
    except ValueError:
        return t


def _check(claim: dict, lookup, scenario: str, metric: Optional[str] = None) -> Optional[dict]:
    """Evaluate a claim's pairs in one group; None when none of its pairs is present there. A rounds pair
    whose reference never reached the target in any seed is *not evaluable* (nothing to be fewer than);
    a challenger that never reached a target its reference reached fails."""
    lower = bool(claim.get("lower_is_better", False)) or claim.get("kind") == "ratio"
    ratio = claim.get("kind") == "ratio"
    factor = float(claim.get("below", 1.0)) if ratio else 1.0
    metric = metric or _resolve_metric(_claim_metric(claim, scenario) or "", scenario)
    part = claim.get("participant", "avg")
    paired = claim.get("paired") == "seeds" and not ratio
    rounds = metric.startswith("rounds_to/")
    total = len(claim["compare"])
    done, lines, failed, open_, separated, against, unreached = 0, [], False, 0, True, False, []
    for a, b in claim["compare"]:
        va, vb = lookup(*_term(a), metric, part), lookup(*_term(b), metric, part)
        if va is None or vb is None or pd.isna(va[0]) or pd.isna(vb[0]):
            lines.append(f"{a} vs {b}: not evaluated ({a if va is None or pd.isna(va[0]) else b} absent)")
            continue
        if rounds and _never_reached(vb):
            unreached.append(b)
            lines.append(f"{a} vs {b}: not evaluable ({b} never reached {_target_text(metric)} in {vb[2]} "
                         f"seed{'s' if vb[2] != 1 else ''}; {_fmt_term(a, va)})")
            continue
        done += 1
        seeds = sorted(set(va[4]) & set(vb[4])) if paired and len(va) > 4 and va[4] and vb[4] else []
        if len(seeds) >= 2:  # paired over seeds: the interval of the per-seed differences
            d, dh, dn = mean_ci([(vb[4][s] - va[4][s]) if lower else (va[4][s] - vb[4][s]) for s in seeds])
            ok = bool(d > 0)
            failed |= not ok
            can = not no_verdict_reason(dh, dn)
            separated &= ok and can and d - dh > 0
            against |= (not ok) and can and d + dh < 0
            lines.append(f"{a} − {b} paired over seeds {', '.join(str(s) for s in seeds)}: "
                         f"Δ = {d:+.2f}{' (lower is better)' if lower else ''}, 95% CI [{d - dh:+.2f}, {d + dh:+.2f}] (n={dn}): "
                         f"{'yes' if ok else 'NO'}")
            continue
        ok = _pair(va, vb, lower, factor)
        ok = None if ok is None else bool(ok)  # numpy bools are not the singletons `is` compares
        if ok is None:
            open_ += 1
        failed |= ok is False
        sep_for, sep_against = _separation(va, vb, lower, factor) if not ratio else (False, False)
        if ratio:  # a ratio claim compares two rounds counts against `below`: CI-separated when both
            sep_for, sep_against = _separation(va, vb, True, factor)  # intervals clear it (b scaled by it)
        separated &= bool(ok) and sep_for
        against |= ok is False and sep_against
        word = {True: "yes", False: "NO", None: "open (censored)"}[ok]
        ref = claim.get("ratio_vs")
        vr = lookup(ref, None, metric, part) if ref else None
        if ref and vr is not None and not pd.isna(vr[0]) and vr[0]:
            lines.append(f"{_fmt_term(a, va)}, {_fmt_term(b, vb)}; {a} / {ref} = {_ratio_text(va, vr)}, "
                         f"{b} / {ref} = {_ratio_text(vb, vr)}: {a} {'<' if lower else '>'} {b}: {word}")
        elif ratio:
            r = va[0] / vb[0] if vb[0] else math.nan
            bound = "≤ " if va[3] == va[2] and vb[3] < vb[2] else ("≥ " if va[3] < va[2] and vb[3] == vb[2] else "")
            lines.append(f"{_fmt_term(a, va)} / {_fmt_term(b, vb)} = {bound}{r:.2f} < {factor:g}: {word}")
        else:
            lines.append(f"{_fmt_term(a, va)} {'<' if lower else '>'} {_fmt_term(b, vb)}: {word}")
    if not done and not unreached:
        return None
    if not done:
        status = f"not evaluable: {', '.join(dict.fromkeys(unreached))} never reached {_target_text(metric)}"
    elif failed:
        status = "NOT held"
    elif done < total or open_:
        status = f"partly evaluable: {done - open_} of {total}"
    else:
        status = "held"
    return dict(status=status, held=status == "held", separated=status == "held" and separated,
                against=status == "NOT held" and against, pairs=f"{done - open_}/{total}",
                numbers="; ".join(lines), metric=metric)


def _claim_metric(claim: dict, scenario: str, our_scenario: Optional[str] = None) -> Optional[str]:
    """The claim's metric in a scenario: a mapping ``{scenario: metric}`` (published or our scenario name,
    ``default`` for the rest) gives each scenario its own target; None where the mapping names none."""
    m = claim["metric"]
    if not isinstance(m, dict):
        return m
    for key in (our_scenario, scenario, "default"):
        if key and key in m:
            return m[key]
    return None


def _metrics(claim: dict, available: Iterable[str], scenario: str, our_scenario: Optional[str] = None) -> List[str]:
    """The concrete metrics a claim is evaluated on: its own (per scenario, where it maps them), or, for
    ``rounds_to/*``, every rounds target present. A rounds claim is judged at its target only: a
    target the paper never names says nothing about its claim."""
    m = _claim_metric(claim, scenario, our_scenario)
    if m is None:
        return []
    if m == "rounds_to/*":
        return sorted({x for x in available if str(x).startswith("rounds_to/")})
    return [_resolve_metric(m, scenario)]


def group_kinds(runs: pd.DataFrame) -> Dict[Tuple[str, str, str], str]:
    """(scenario, public, structure) -> homogeneous / heterogeneous, from the participants' architectures."""
    if "arch" not in runs.columns:
        return {}
    fed = runs[runs["method"] != BASE_PRETRAIN]
    return {key: STRUCTURES[0] if is_homogeneous(g) else STRUCTURES[1]
            for key, g in fed.groupby(["scenario", "public", "structure"], sort=False)}


def evaluate_claims(claims: List[dict], agg: Optional[pd.DataFrame], published: Dict[str, pd.DataFrame],
                    scenario_map: Mapping[str, str] = (), paper_tables: Optional[Iterable[str]] = None,
                    kinds: Optional[Mapping[Tuple[str, str, str], str]] = None,
                    per_seed: Optional[pd.DataFrame] = None,
                    method_names: Optional[Mapping[str, str]] = None) -> pd.DataFrame:
    """held / NOT held / partly evaluable per claim, on the paper's own tables (those in ``paper_tables``,
    default all) and, per (scenario, public, structure) group where its methods ran, on ours. ``kinds``
    (:func:`group_kinds`) limits a claim with ``structure`` to our groups of that kind; a group of unknown
    kind is skipped for such a claim. ``per_seed`` (:func:`ours_long`): a claim with ``paired: seeds``
    compares our two sides seed by seed (the interval of the per-seed differences), where both have
    at least two seeds in common. ``method_names``: a claim's (published) method -> our method that
    stands for it on our runs (``report.published_methods``)."""
    scenario_map = dict(scenario_map or {})
    kinds = dict(kinds or {})
    rows = []
    for c in claims:
        scope = set(c.get("scenarios", []))
        want_kind = c.get("structure")
        base = dict(id=c["id"], paper=c["paper"], claim=c["text"], source=c.get("source", ""),
                    claim_structure=want_kind or "")
        # the paper's own numbers
        names = [t for t in c.get("published", []) if t in published and (paper_tables is None or t in paper_tables)]
        for name in names:  # each published table on its own (the same method can differ between tables)
            p = published[name][published[name]["participant"] != "delta_base"]
            for scen in sorted(set(p["scenario"])):
                if scope and scen not in scope:
                    continue

                def look(method, at, metric, part, scen=scen, p=p):
                    hit = p[(p["scenario"] == (at or scen)) & (p["method"] == method) & (p["metric"] == metric)
                            & (p["participant"] == part)]
                    return (hit["value_num"].iloc[0], math.nan, 0, 0) if len(hit) else None  # n = 0: printed

                for metric in _metrics(c, p.loc[p["scenario"] == scen, "metric"], scen):
                    r = _check(c, look, scen, metric)
                    if r:
                        rows.append(dict(base, who=f"paper ({name})", scenario=scen, our_scenario="", public="",
                                         structure="", proxy=False, **r))
        if agg is None or agg.empty:
            continue
        if "reached" not in agg.columns:
            agg = agg.assign(reached=agg["n"])
        for (scen, public, struct), g in agg.groupby(["scenario", "public", "structure"], sort=False):
            target = scenario_map.get(scen, scen)
            if scope and target not in scope:
                continue
            if want_kind and kinds.get((scen, public, struct)) != want_kind:
                continue  # a claim about homogeneous models says nothing about heterogeneous runs, and vice versa
            sub = agg[(agg["public"] == public) & (agg["structure"] == struct)]

            def look(method, at, metric, part, scen=scen, sub=sub, public=public, struct=struct):
                want = scen
                if at:
                    want = next((s for s in sub["scenario"].unique() if scenario_map.get(s, s) == at), None)
                here = sub[sub["scenario"] == want]
                method = ours_method(here["method"], dict(method_names or {}).get(method, method))
                hit = here[(here["method"] == method) & (here["metric"] == metric) & (here["participant"] == part)]
                if not len(hit):
                    return None
                h = hit.iloc[0]
                seeds = None
                if per_seed is not None and len(per_seed):
                    s = per_seed[(per_seed["scenario"] == want) & (per_seed["public"] == public)
                                 & (per_seed["structure"] == struct) & (per_seed["method"] == method)
                                 & (per_seed["metric"] == metric) & (per_seed["participant"] == part)]
                    seeds = {int(k): float(v) for k, v in zip(s["seed"], s["value"]) if not pd.isna(v)}
                return (h["mean"], h["ci"], int(h["n"]), int(h["reached"]), seeds)

            for metric in _metrics(c, g["metric"], target, scen):
                r = _check(c, look, target, metric)
                if r:
                    rows.append(dict(base, who="ours", scenario=target, our_scenario=scen, public=public,
                                     structure=struct, proxy=target != scen, **r))
    cols = ["id", "paper", "claim", "source", "claim_structure", "who", "scenario", "our_scenario", "public",
            "structure", "proxy", "metric", "status", "held", "separated", "against", "pairs", "numbers"]
    out = pd.DataFrame(rows, columns=cols)
    out["verdict"] = [claim_verdict(r) for _, r in out.iterrows()]  # what the reader sees
    return out.drop_duplicates(subset=["id", "who", "scenario", "our_scenario", "public", "structure", "metric",
                                       "numbers"])


MEANS_ONLY = "held by the means only: inconclusive"
NOT_MEANS_ONLY = "NOT held by the means only: inconclusive"


def claim_verdict(r: Mapping) -> str:
    """The verdict a reader sees. On our runs "held" and "NOT held" need the same evidence: the 95%
    intervals apart (each side n ≥ MIN_N, non-zero width; paired claims: the interval of the per-seed
    differences clear of 0), else the means alone decided and the verdict is inconclusive. The paper's
    tables have no seeds: their printed numbers are read as they stand."""
    if r["who"] != "ours":
        return r["status"]
    if r["status"] == "held":
        return "held (CI-separated)" if r["separated"] else MEANS_ONLY
    if r["status"] == "NOT held":
        return "NOT held (CI-separated)" if r.get("against") else NOT_MEANS_ONLY
    return r["status"]


def table_margin(name: str, table: pd.DataFrame, claims: Sequence[dict],
                 explicit: Optional[float] = None) -> Tuple[float, str]:
    """The equivalence margin of one published table and its reason (issue 34 item 3).

    ``report.margin`` in the grid wins (reason: set by the grid). Otherwise half the smallest printed gap
    that a claim of ``claims.yaml`` reading this table rests on (the pair's printed values, in the claimed
    direction): agreeing within that margin cannot turn the claim around. A table no claim rests on keeps
    :data:`DEFAULT_MARGIN`, said to be a convention (no paper prints a seed spread). Units are the table's:
    percentage points for accuracies, rounds for rounds-to-target tables."""
    if explicit is not None:
        return explicit, f"±{explicit:g}, set by the grid (`report.margin`)"
    best = None
    p = table[table["participant"] != "delta_base"] if len(table) else table
    for c in claims:
        if name not in (c.get("published") or []):
            continue
        lower = bool(c.get("lower_is_better", False)) or c.get("kind") == "ratio"
        scope = set(c.get("scenarios") or [])
        for scen in sorted(set(p["scenario"])) if len(p) else []:
            if scope and scen not in scope:
                continue
            metric = _claim_metric(c, scen)
            if metric is None or metric == "rounds_to/*":
                continue
            metric = _resolve_metric(metric, scen)
            part = c.get("participant", "avg")

            def value(term):
                method, at = _term(term)
                hit = p[(p["scenario"] == (at or scen)) & (p["method"] == method) & (p["metric"] == metric)
                        & (p["participant"] == part)]
                return float(hit["value_num"].iloc[0]) if len(hit) else None

            for a, b in c["compare"]:
                va, vb = value(a), value(b)
                if va is None or vb is None:
                    continue
                gap = (vb - va) if lower else (va - vb)
                if gap > 0 and (best is None or gap < best[0]):
                    best = (gap, f"{c['id']}: {a} {va:g} vs {b} {vb:g} on {scen} ({metric})")
    if best is None:
        return DEFAULT_MARGIN, (f"±{DEFAULT_MARGIN:g}, a convention: no claim of params/papers/claims.yaml rests "
                                "on this table (no paper prints a seed spread to derive one from)")
    m = round(best[0] / 2, 2)
    return m, f"±{m:g}, half the smallest printed gap a claim of this table rests on ({best[1]})"
