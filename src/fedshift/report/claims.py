"""The papers' qualitative claims (``params/papers/claims.yaml``), evaluated on the papers' own
tables and on our runs.

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
  only when both sides have n ≥ MIN_N and their intervals (each at least the metric's resolution wide)
  are apart, else inconclusive. Means closer than floating-point noise are a tie (a tie does not beat).
* Rounds to a target on our runs, with per-seed values: each pair is decided by Gehan's generalised
  Wilcoxon statistic (:func:`fedshift.report.stats.gehan`: a seed that never reached the target is
  right-censored at its last round + 1, so only a reached seed can be certainly faster), its one-sided
  permutation p printed; CI-separated only when each side's seeds agree about reaching the target (all
  reached: their t intervals; none reached: [the censoring bound, ∞)) and the intervals are apart. A side
  whose seeds disagree about reaching it never gives a CI-separated verdict.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

import pandas as pd
import yaml

from ..errors import ConfigError
from .frames import is_homogeneous
from .frames import topk as _topk
from .published import BASE_PRETRAIN, claims_path, ours_method
from .stats import FLOAT_TOL, MIN_N, fmt_interval, gehan, mean_ci, no_verdict_reason, resolution


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


class Side(NamedTuple):
    """One side of a compared pair: our mean over seeds (or a printed value, n = 0), its 95% half-width,
    n, how many seeds reached a rounds target, the per-seed values and reached flags (when known), and
    the metric's resolution (:func:`fedshift.report.stats.resolution`)."""

    mean: float
    ci: float
    n: int
    reached: int
    seeds: Optional[Dict[int, float]] = None
    reached_by_seed: Optional[Dict[int, bool]] = None
    resolution: float = math.nan


def _beats(ma: float, mb: float, lower: bool, factor: float) -> bool:
    """a < factor·b (``lower``) or a > factor·b; equal to floating-point noise is a tie, and a tie does
    not beat."""
    diff = (factor * mb - ma) if lower else (ma - factor * mb)
    return diff > FLOAT_TOL * (1.0 + abs(ma) + abs(factor * mb))


def _pair(a: Side, b: Side, lower: bool, factor: float) -> Optional[bool]:
    """Does a beat b on the means? True / False, or None when censored rounds leave it open. A challenger
    that never reached its target does not beat a reference that did (the caller has already set aside a
    reference that never reached it: that pair is not evaluable)."""
    if not lower:
        return _beats(a.mean, b.mean, False, factor)
    if a.n > 0 and a.reached == 0:  # ours, never reached (a printed value has n = 0)
        return False
    a_exact, b_exact = a.reached == a.n, b.reached == b.n
    if a_exact and b_exact:
        return _beats(a.mean, b.mean, True, factor)
    if not a_exact and b_exact:  # a's mean is a lower bound
        return False if not _beats(a.mean, b.mean, True, factor) else None
    if a_exact and not b_exact:  # b's mean is a lower bound
        return True if _beats(a.mean, b.mean, True, factor) else None
    return None


def _never_reached(v: Side) -> bool:
    """Our side (n > 0) whose every seed missed the rounds target."""
    return v.n > 0 and v.reached == 0


def _partly_censored(v: Side) -> bool:
    """Our side whose seeds disagree about reaching the target at all."""
    return v.n > 0 and 0 < v.reached < v.n


def _interval(v: Side, factor: float = 1.0) -> Optional[Tuple[float, float]]:
    """The side's 95% interval (scaled by ``factor``) if it can carry a verdict, else None: at least
    :data:`MIN_N` seeds and a half-width of at least the metric's resolution. A side none of whose seeds
    reached the rounds target is [its smallest censoring bound, ∞) (each such seed would need at least
    its last round + 1); a side whose seeds disagree about reaching has none."""
    if v.n < MIN_N or _partly_censored(v):
        return None
    if v.reached == 0 and v.n > 0:
        low = min(v.seeds.values()) if v.seeds else v.mean
        return factor * low, math.inf
    if no_verdict_reason(v.ci, v.n, v.resolution):
        return None
    return factor * (v.mean - v.ci), factor * (v.mean + v.ci)


def _apart(low: float, high: float) -> bool:
    """high < low, beyond floating-point noise (two intervals apart)."""
    return not math.isinf(high) and _beats(high, low, True, 1.0)


def _separation(va: Side, vb: Side, lower: bool, factor: float) -> Optional[Tuple[bool, bool]]:
    """(a beats b with the 95% intervals apart, b beats a with the intervals apart); None when either side
    has no interval that can carry a verdict (n < MIN_N, narrower than the resolution, seeds that disagree
    about reaching a rounds target)."""
    ia, ib = _interval(va), _interval(vb, factor)
    if ia is None or ib is None:
        return None
    if lower:
        return _apart(ib[0], ia[1]), _apart(ia[0], ib[1])
    return _apart(ia[0], ib[1]), _apart(ib[0], ia[1])


def _observations(v: Side, factor: float = 1.0) -> Optional[List[Tuple[float, bool]]]:
    """(rounds, reached) per seed, scaled by ``factor``, when the per-seed values are known."""
    if not v.seeds or v.reached_by_seed is None:
        return None
    return [(factor * x, bool(v.reached_by_seed.get(s, True))) for s, x in sorted(v.seeds.items())]


def _fmt_term(name: str, v: Side) -> str:
    if v.n == 0:  # a printed value of the paper: no seeds of ours behind it
        return f"{name} {v.mean:.2f}"
    if v.reached < v.n:
        return f"{name} ≥ {v.mean:.2f} (reached {v.reached}/{v.n})"
    return f"{name} {fmt_interval(v.mean, v.ci, v.n, bounded=False)} (n={v.n})"


def _ratio_text(v: Side, vr: Side) -> str:
    """v / reference, with ≥ / ≤ where a censored side makes the ratio a bound, '?' where both are (a term
    that is the reference itself is named so by the caller, never divided by itself)."""
    v_low, r_low = v.n > 0 and v.reached < v.n, vr.n > 0 and vr.reached < vr.n  # a censored mean is a lower bound
    if v_low and r_low:
        return "? (both are lower bounds)"
    return ("≥ " if v_low else "≤ " if r_low else "") + f"{v.mean / vr.mean:.2f}"


def _target_text(metric: str) -> str:
    t = metric.split("/", 1)[1]
    try:
        return f"{float(t) * 100:g} %"
    except ValueError:
        return t


def _gehan_text(u: int, pairs: int, p: float) -> str:
    return (f"Gehan U = {u:+d} over {pairs} seed pairs (+: fewer rounds; a never-reaching seed censored at its "
            f"last round + 1), one-sided permutation p = {p:.3f}")


def _check(claim: dict, lookup, scenario: str, metric: Optional[str] = None) -> Optional[dict]:
    """Evaluate a claim's pairs in one group; None when none of its pairs is present there. A rounds pair
    neither side of which reached the target in any seed is *not evaluable* (nothing to be fewer than);
    a challenger that never reached a target its reference reached fails, and one that reached a target
    its reference never reached holds. On our runs a rounds pair with
    per-seed values is decided by Gehan's generalised Wilcoxon (censoring-aware ranks, :func:`gehan`) and
    is CI-separated only when neither side's seeds disagree about reaching the target."""
    lower = bool(claim.get("lower_is_better", False)) or claim.get("kind") == "ratio"
    ratio = claim.get("kind") == "ratio"
    factor = float(claim.get("below", 1.0)) if ratio else 1.0
    metric = metric or _resolve_metric(_claim_metric(claim, scenario) or "", scenario)
    part = claim.get("participant", "avg")
    paired = claim.get("paired") == "seeds" and not ratio
    rounds = metric.startswith("rounds_to/")
    total = len(claim["compare"])
    done, lines, failed, open_, separated, against, unreached, ranks = 0, [], False, 0, True, False, [], False
    for a, b in claim["compare"]:
        va, vb = lookup(*_term(a), metric, part), lookup(*_term(b), metric, part)
        if va is None or vb is None or pd.isna(va.mean) or pd.isna(vb.mean):
            lines.append(f"{a} vs {b}: not evaluated ({a if va is None or pd.isna(va.mean) else b} absent)")
            continue
        if rounds and _never_reached(vb) and _never_reached(va):
            unreached.append(b)
            lines.append(f"{a} vs {b}: not evaluable (neither reached {_target_text(metric)}: {b} in {vb.n} "
                         f"seed{'s' if vb.n != 1 else ''}; {_fmt_term(a, va)})")
            continue
        done += 1
        seeds = sorted(set(va.seeds) & set(vb.seeds)) if paired and va.seeds and vb.seeds else []
        if rounds and any(v.reached < v.n for v in (va, vb)):
            seeds = []  # a censored seed has no difference to pair
        if len(seeds) >= 2:  # paired over seeds: the interval of the per-seed differences
            d, dh, dn = mean_ci([(vb.seeds[s] - va.seeds[s]) if lower else (va.seeds[s] - vb.seeds[s]) for s in seeds])
            up = _beats(d, 0.0, False, 1.0)
            failed |= not up
            can = not no_verdict_reason(dh, dn, max(va.resolution, vb.resolution))
            above, below = _beats(d - dh, 0.0, False, 1.0), _beats(0.0, d + dh, False, 1.0)  # the CI clear of 0
            separated &= up and can and above
            against |= (not up) and can and below
            clear = (" (no verdict from this interval: n < 3 or no measured spread)" if not can else
                     " (CI clear of 0)" if above or below else " (CI includes 0)")
            lines.append(f"{a} − {b} paired over seeds {', '.join(str(s) for s in seeds)}: "
                         f"Δ = {d:+.2f}{' (lower is better)' if lower else ''}, 95% CI [{d - dh:+.2f}, {d + dh:+.2f}] (n={dn}): "
                         f"{'yes' if up else 'NO'}{clear}")
            continue
        oa, ob = (_observations(va), _observations(vb, factor)) if rounds else (None, None)
        gehan_line = ""
        ok: Optional[bool]
        if oa and ob:  # censoring-aware ranks decide a rounds pair of ours
            u, p_fewer, p_more = gehan(oa, ob)
            ok = True if u > 0 else False if u < 0 else None
            gehan_line = _gehan_text(u, len(oa) * len(ob), p_fewer if u >= 0 else p_more)
            ranks = True
        elif rounds and va.n > 0 and vb.n > 0 and (_partly_censored(va) or _partly_censored(vb)):
            ok = None  # seeds that disagree about reaching, without their per-seed rounds: nothing to rank
        else:
            pair = _pair(va, vb, lower, factor)
            ok = None if pair is None else bool(pair)  # numpy bools are not the singletons `is` compares
        if ok is None:
            open_ += 1
        failed |= ok is False
        sep = _separation(va, vb, True if ratio else lower, factor)
        sep_for, sep_against = sep or (False, False)
        separated &= bool(ok) and sep_for
        against |= ok is False and sep_against
        word = {True: "yes", False: "NO", None: "open (censored)"}[ok]
        if ok is not None and va.n and vb.n:  # ours on both sides: say whether this pair alone could decide
            word += (" (no interval on one side: n < 3 or no measured spread)" if sep is None else
                     " (intervals apart)" if (sep_for if ok else sep_against) else " (intervals overlap)")
        ref = claim.get("ratio_vs")
        vr = lookup(ref, None, metric, part) if ref else None
        if ref and vr is not None and not pd.isna(vr.mean) and vr.mean:
            ratios = ", ".join(f"{t}: the reference" if _term(t)[0] == ref else f"{t} / {ref} = {_ratio_text(v, vr)}"
                               for t, v in ((a, va), (b, vb)))
            text = f"{_fmt_term(a, va)}, {_fmt_term(b, vb)}; {ratios}"
            lines.append(f"{text}{'; ' + gehan_line if gehan_line else ''}: {a} {'<' if lower else '>'} {b}: {word}")
        elif ratio:
            r = va.mean / vb.mean if vb.mean else math.nan
            bound = ("? " if va.reached < va.n and vb.reached < vb.n else
                     "≤ " if va.reached == va.n and vb.reached < vb.n else
                     "≥ " if va.reached < va.n and vb.reached == vb.n else "")
            shown = "(both are lower bounds)" if bound == "? " else f"{r:.2f}"
            lines.append(f"{_fmt_term(a, va)} / {_fmt_term(b, vb)} = {bound}{shown} < {factor:g}"
                         f"{'; ' + gehan_line if gehan_line else ''}: {word}")
        else:
            lines.append(f"{_fmt_term(a, va)} {'<' if lower else '>'} {_fmt_term(b, vb)}"
                         f"{'; ' + gehan_line if gehan_line else ''}: {word}")
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
                numbers="; ".join(lines), metric=metric, basis="ranks" if ranks else "means")


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
                    return Side(hit["value_num"].iloc[0], math.nan, 0, 0) if len(hit) else None  # n = 0: printed

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
                seeds, reached = None, None
                if per_seed is not None and len(per_seed):
                    s = per_seed[(per_seed["scenario"] == want) & (per_seed["public"] == public)
                                 & (per_seed["structure"] == struct) & (per_seed["method"] == method)
                                 & (per_seed["metric"] == metric) & (per_seed["participant"] == part)]
                    s = s[s["value"].notna()]
                    seeds = {int(k): float(v) for k, v in zip(s["seed"], s["value"])}
                    flags = s["reached"] if "reached" in s else pd.Series(True, index=s.index)
                    reached = {int(k): bool(f) for k, f in zip(s["seed"], flags)}
                res = h["resolution"] if "resolution" in h and not pd.isna(h["resolution"]) else resolution(None)
                return Side(h["mean"], h["ci"], int(h["n"]), int(h["reached"]), seeds, reached, float(res))

            for metric in _metrics(c, g["metric"], target, scen):
                r = _check(c, look, target, metric)
                if r:
                    rows.append(dict(base, who="ours", scenario=target, our_scenario=scen, public=public,
                                     structure=struct, proxy=target != scen, **r))
    cols = ["id", "paper", "claim", "source", "claim_structure", "who", "scenario", "our_scenario", "public",
            "structure", "proxy", "metric", "status", "held", "separated", "against", "pairs", "numbers", "basis"]
    out = pd.DataFrame(rows, columns=cols)
    out["verdict"] = [claim_verdict(r) for _, r in out.iterrows()]  # what the reader sees
    return out.drop_duplicates(subset=["id", "who", "scenario", "our_scenario", "public", "structure", "metric",
                                       "numbers"])


MEANS_ONLY = "held by the means only: inconclusive"
NOT_MEANS_ONLY = "NOT held by the means only: inconclusive"
RANKS_ONLY = "held by the seeds' ranks only: inconclusive"
NOT_RANKS_ONLY = "NOT held by the seeds' ranks only: inconclusive"


def claim_verdict(r: Mapping) -> str:
    """The verdict a reader sees. On our runs "held" and "NOT held" need the same evidence: the 95%
    intervals apart (each side n ≥ MIN_N and a half-width of at least the metric's resolution; a rounds
    side whose seeds disagree about reaching the target has none; paired claims: the interval of the
    per-seed differences clear of 0), else the means (or, for rounds with per-seed values, Gehan's
    censoring-aware ranks) alone decided and the verdict is inconclusive. The paper's tables have no
    seeds: their printed numbers are read as they stand."""
    if r["who"] != "ours":
        return r["status"]
    ranks = r.get("basis") == "ranks"
    if r["status"] == "held":
        return "held (CI-separated)" if r["separated"] else (RANKS_ONLY if ranks else MEANS_ONLY)
    if r["status"] == "NOT held":
        return "NOT held (CI-separated)" if r.get("against") else (NOT_RANKS_ONLY if ranks else NOT_MEANS_ONLY)
    return r["status"]
