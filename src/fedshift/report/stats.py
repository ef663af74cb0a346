"""The report's statistics, in one place (no report module imports another for them).

* :func:`mean_ci`: mean over seeds and the half-width of the two-sided 95% Student t interval
  (n − 1 degrees of freedom); no interval for n < 2. Sums are exactly rounded (``math.fsum``), so the
  order of the seeds never changes a digit.
* :func:`resolution`: the smallest step the number can move by. An accuracy on n test images moves in
  steps of 100/n points; a cell's n is the number of test images behind it (:func:`effective_images`);
  a rounds count moves by whole rounds. Where the test size is not recorded the fallback is
  100 / :data:`FALLBACK_TEST_IMAGES` points (no test set of these benchmarks comes near a million images,
  so every real difference between seeds is larger, and floating-point noise, 1e-12 or less, is smaller).
* :func:`no_verdict_reason`: an interval carries a verdict only with n ≥ :data:`MIN_N` seeds (n = 2 has
  one degree of freedom, too unstable to bound anything) and a half-width of at least the resolution:
  a narrower interval means every seed gave the same number to the metric's resolution (10.73 %, three
  times, gives a half-width of 5.4e-15 in floating point): its spread is unmeasured, i.e. unbounded,
  not zero.
* :func:`clipped`: an accuracy's interval shown inside [0, 100] (the arithmetic is not changed;
  only what is printed: a bound beyond 0 or 100 cannot be an accuracy).
* :func:`verdict`: ours against a published number with a margin ``m`` (percentage points) grounded in
  the printed number's own uncertainty (:func:`grounded_margin`). Two one-sided t tests (TOST,
  Schuirmann 1987) at level 0.05 each, i.e. the 90% interval of Δ = ours − published inside [−m, +m],
  and the 95% half-width itself no wider than m: **agrees within margin**. The 95% interval of Δ wholly
  beyond the margin (Δ − h > m or Δ + h < −m): **differs (above / below)**. Anything else is
  **inconclusive**, and so is every interval that cannot carry a verdict (:func:`no_verdict_reason`,
  the reason in brackets). A cell without a grounded margin is **no margin: descriptive only**.
* :func:`grounded_margin`: m = 1.96 · √(SE² + s²), SE = 100 · √(p (1 − p) / N) the binomial standard
  error of the printed accuracy p on the paper's N test images, s the paper's printed std (none of
  the four papers prints one), never below 100 / N (the printed number's own resolution) nor below our
  metric's resolution. 1.96 · that is the printed number's own 95% band as an estimate of its protocol's
  accuracy: inside it, ours cannot be told apart from it; beyond it, ours differs by more than the
  printed number's own noise.
* :func:`gehan`: Gehan's generalised Wilcoxon statistic for two samples of rounds-to-target where a
  seed that never reached the target is right-censored, with its exact permutation p-value.
* Rounding happens once, when a number is printed (:func:`fmt_interval`); every table and
  section computes from the unrounded values, so one cell has one interval everywhere.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
TOST_ALPHA = 0.05  # each one-sided test; equivalent to the 90% interval inside the margin
MIN_N = 3  # seeds per side before any verdict (agree / differ, held / NOT held) is given
LOW, HIGH = 0.0, 100.0  # accuracies in percent
FALLBACK_TEST_IMAGES = 1_000_000  # the resolution's n where the test size is not recorded (module docstring)
Z95 = 1.959963984540054  # two-sided 95% normal quantile: the printed number's own band (grounded_margin)
ROUND_STEP = 1.0  # a rounds-to-target count moves by whole rounds
FLOAT_TOL = 1e-9  # relative: two computed numbers closer than this (of their magnitude) are equal

AGREES = "agrees within margin"
INCONCLUSIVE = "inconclusive"
DIFFERS_ABOVE = "differs (above)"
DIFFERS_BELOW = "differs (below)"
NOT_RUN = "not run"
NO_VERDICT = "no verdict (proxy)"
NO_MARGIN = "no margin: descriptive only"


@functools.lru_cache(maxsize=None)
def t_critical(n: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student t quantile with n − 1 degrees of freedom (n = 3, 95%: 4.303)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1)) if n >= 2 else math.nan


def mean_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> Tuple[float, float, int]:
    """(mean, half-width of the confidence interval, n); the half-width is nan for n < 2. Exactly rounded
    sums: the same seeds in any order give the same digits."""
    v = [float(x) for x in values if not pd.isna(x)]
    n = len(v)
    if n == 0:
        return math.nan, math.nan, 0
    mean = math.fsum(v) / n
    if n == 1:
        return mean, math.nan, 1
    var = math.fsum((x - mean) ** 2 for x in v) / (n - 1)
    return mean, t_critical(n, confidence) * math.sqrt(var) / math.sqrt(n), n


def half_width(std: float, n: int, confidence: float = CONFIDENCE) -> float:
    """The t half-width from an unrounded std over n seeds (nan for n < 2)."""
    return t_critical(n, confidence) * std / math.sqrt(n) if n >= 2 and not pd.isna(std) else math.nan


def resolution(n_test: Optional[float]) -> float:
    """The step, in percentage points, of an accuracy on ``n_test`` test images (100 / n); the fallback
    100 / :data:`FALLBACK_TEST_IMAGES` where the test size is unknown (None, nan, not positive)."""
    if n_test is None or pd.isna(n_test) or n_test <= 0:
        return HIGH / FALLBACK_TEST_IMAGES
    return HIGH / float(n_test)


def effective_images(sizes: Sequence[Optional[float]], pooled: bool) -> float:
    """The number of test images behind a number computed from several test sets: their sum when the
    images are pooled (FedH2L's CDP / ACC), else the effective size of an unweighted mean of per-set
    accuracies, k² / Σ 1/n_j (FCCL Eq. 22's inter, a table's AVG; equal sets give the sum). nan when a
    size is unknown."""
    if not sizes or any(s is None or pd.isna(s) or s <= 0 for s in sizes):
        return math.nan
    n = [float(s) for s in sizes if s is not None]
    if pooled:
        return math.fsum(n)
    return len(n) ** 2 / math.fsum(1.0 / s for s in n)


POOLED_METRICS = ("acc", "cdp")  # FedH2L: accuracy on the test images pooled (all nodes' / the other nodes')


def images_behind(metric: str, participant: str, sizes: Mapping[str, Optional[float]]) -> float:
    """The number of test images behind one cell, from ``sizes`` = {participant: test images} (``global``:
    a server model's test set, else all participants' pooled): a participant's own set for intra / WDP,
    the other participants' sets for inter (FCCL Eq. 22: an unweighted mean of per-set accuracies) and
    CDP (pooled), every set for ACC and for a table's AVG (:func:`effective_images`). nan when a size it
    needs is unknown or the metric is not an accuracy (rounds)."""
    kind = str(metric).split("/")[0]
    parts = [p for p in sizes if p != "global"]
    if kind in ("rounds_to", "reduction"):
        return math.nan
    if participant == "global" or kind == "global":
        if "global" in sizes:
            return math.nan if sizes["global"] is None else float(sizes["global"])
        return effective_images([sizes[p] for p in parts], pooled=True)
    pooled = kind in POOLED_METRICS
    if participant == "avg":
        return effective_images([sizes[p] for p in parts], pooled=pooled)
    if participant not in sizes:
        return math.nan
    if kind in ("intra", "wdp"):
        return effective_images([sizes[participant]], pooled=True)
    if kind == "acc":
        return effective_images([sizes[p] for p in parts], pooled=True)
    return effective_images([sizes[p] for p in parts if p != participant], pooled=pooled)


def clipped(mean: float, half: float, low: float = LOW, high: float = HIGH) -> Tuple[float, float]:
    """The interval mean ± half shown inside [low, high]."""
    return max(low, mean - half), min(high, mean + half)


def fmt_interval(mean: float, half: float, n: int, bounded: bool = True, digits: int = 2) -> str:
    """``mean ± half`` rounded once; ``mean [lo, hi]`` when the interval had to be clipped to [0, 100];
    the mean alone when there is no interval (n < 2)."""
    if pd.isna(mean):
        return "–"
    s = f"{mean:.{digits}f}"
    if n < 2 or pd.isna(half):
        return s
    if bounded and (mean - half < LOW or mean + half > HIGH):
        lo, hi = clipped(mean, half)
        return f"{s} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{s} ± {half:.{digits}f}"


def spread_unmeasured(half: float, res: Optional[float] = None) -> bool:
    """A half-width below the metric's resolution (``res``; None or nan = the fallback for an unknown test
    size): the seeds agree to within one test image, so their spread is unmeasured, not zero."""
    return bool(half < (resolution(None) if res is None or pd.isna(res) else float(res)))


def no_verdict_reason(half: float, n: int, res: Optional[float] = None) -> str:
    """Why an interval over ``n`` seeds cannot carry a verdict ('' when it can). ``res``: the metric's
    resolution (:func:`resolution`; None = the fallback for an unknown test size)."""
    if n < 2 or pd.isna(half):
        return f"n = {n}: no interval"
    if n < MIN_N:
        return f"n = {n} < {MIN_N}: too few seeds for a verdict"
    res = resolution(None) if res is None or pd.isna(res) else float(res)
    if spread_unmeasured(half, res):
        return (f"half-width below the metric's resolution {res:.2g}: every seed gave the same number, "
                "the spread is unmeasured")
    return ""


def grounded_margin(printed: float, n_test: Optional[float], printed_std: Optional[float] = None,
                    our_resolution: Optional[float] = None) -> float:
    """The equivalence margin (points) of one printed accuracy (module docstring); nan when the paper's
    test size is unknown (no margin can be grounded)."""
    if n_test is None or pd.isna(n_test) or n_test <= 0 or pd.isna(printed):
        return math.nan
    p = min(max(float(printed) / HIGH, 0.0), 1.0)
    se = HIGH * math.sqrt(p * (1 - p) / float(n_test))
    s = 0.0 if printed_std is None or pd.isna(printed_std) else float(printed_std)
    floor = max(HIGH / float(n_test), 0.0 if our_resolution is None or pd.isna(our_resolution) else our_resolution)
    return max(Z95 * math.sqrt(se * se + s * s), floor)


def _le(a: float, b: float) -> bool:
    """a ≤ b up to floating-point noise (:data:`FLOAT_TOL` of their magnitude)."""
    return a <= b + FLOAT_TOL * (1.0 + abs(a) + abs(b))


def verdict(mean: float, half: float, published: float, n: int = 2, margin: float = math.nan,
            res: Optional[float] = None) -> str:
    """agrees within margin / differs (above|below) / inconclusive / no margin (module docstring); ``half``
    is the 95% half-width over ``n`` seeds (the 90% TOST interval is derived from it), ``res`` the metric's
    resolution (None: the fallback), ``margin`` nan: no grounded margin."""
    if pd.isna(mean) or n < 1:
        return NOT_RUN
    if pd.isna(margin):
        return NO_MARGIN
    why = no_verdict_reason(half, n, res)
    if why:
        return f"{INCONCLUSIVE} ({why})"
    delta = mean - published
    h90 = half * t_critical(n, 1 - 2 * TOST_ALPHA) / t_critical(n, CONFIDENCE)
    if _le(-margin, delta - h90) and _le(delta + h90, margin) and _le(half, margin):
        return AGREES
    if not _le(delta - half, margin):
        return DIFFERS_ABOVE
    if not _le(-margin, delta + half):
        return DIFFERS_BELOW
    return INCONCLUSIVE


# ----------------------------------------------------------------------------- censored rounds


def _gehan_u(a: Sequence[Tuple[float, bool]], b: Sequence[Tuple[float, bool]]) -> int:
    """Σ over pairs of +1 where a's seed certainly needed fewer rounds than b's, −1 where b's certainly did.
    A seed is (rounds, reached); one that never reached the target is right-censored at ``rounds`` (it
    would need at least that many), so only a reached seed can be certainly faster: x reached and x < y,
    whether y is a reached count or a censoring bound."""
    return sum(int(rx and x < y) - int(ry and y < x) for x, rx in a for y, ry in b)


def gehan(a: Sequence[Tuple[float, bool]], b: Sequence[Tuple[float, bool]], max_exact: int = 200_000
          ) -> Tuple[int, float, float]:
    """Gehan's generalised Wilcoxon statistic U (positive: ``a`` needs fewer rounds) and its one-sided
    permutation p-values (P[U* ≥ U], P[U* ≤ U]) over every relabelling of the pooled seeds (exact when
    there are at most ``max_exact`` of them, else 100,000 relabellings drawn with a fixed seed)."""
    pooled = list(a) + list(b)
    na, nt = len(a), len(pooled)
    u = _gehan_u(a, b)
    if na == 0 or na == nt:
        return u, 1.0, 1.0
    splits: Iterable[Tuple[int, ...]]
    if math.comb(nt, na) <= max_exact:
        splits = itertools.combinations(range(nt), na)
    else:
        rng = np.random.default_rng(0)
        splits = (tuple(int(i) for i in rng.choice(nt, na, replace=False)) for _ in range(100_000))
    ge = le = total = 0
    for idx in splits:
        chosen = set(idx)
        us = _gehan_u([pooled[i] for i in idx], [pooled[i] for i in range(nt) if i not in chosen])
        ge += us >= u
        le += us <= u
        total += 1
    return u, ge / total, le / total
