"""The report's statistics, in one place (no report module imports another for them).

* :func:`mean_ci`: mean over seeds and the half-width of the two-sided 95% Student t interval
  (n − 1 degrees of freedom); no interval for n < 2.
* :func:`clipped`: an accuracy's interval shown inside [0, 100] (the arithmetic is not changed;
  only what is printed: a bound beyond 0 or 100 cannot be an accuracy).
* :func:`verdict`: ours against a published number with a stated margin ``m`` (percentage
  points; grid key ``report.margin``, default :data:`DEFAULT_MARGIN`). Two one-sided t tests
  (TOST, Schuirmann 1987) at level 0.05 each, i.e. the 90% interval of Δ = ours − published lies
  inside [−m, +m], and the 95% half-width is itself no wider than m: **agrees within ±m**. The 95% interval of Δ lies wholly beyond the margin
  (Δ − h > m or Δ + h < −m): **differs (above / below)**. Anything else is **inconclusive**, and so is
  every cell with fewer than :data:`MIN_N` seeds (n = 1 has no interval; n = 2 has one degree of
  freedom, whose sample std is too unstable to bound a verdict) and every zero-width interval (all
  seeds printed the same number: the spread is unmeasured, not zero); those say why in brackets.
  The published value is taken as exact (the papers print no interval).
* The margin is a stated choice per published table (:func:`fedshift.report.claims.table_margin`:
  half the smallest printed gap a claim of that table rests on), never a "seed spread": none of the
  papers prints one.
* Rounding happens once, when a number is printed (:func:`fmt_interval`); every table and
  section computes from the unrounded values, so one cell has one interval everywhere.
"""

from __future__ import annotations

import math
from typing import Iterable, Tuple

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
TOST_ALPHA = 0.05  # each one-sided test; equivalent to the 90% interval inside the margin
DEFAULT_MARGIN = 3.0  # percentage points: a convention for tables no claim rests on (no paper prints a seed spread)
MIN_N = 3  # seeds per side before any verdict (agree / differ, held / NOT held) is given
LOW, HIGH = 0.0, 100.0  # accuracies in percent

AGREES = "agrees within margin"
INCONCLUSIVE = "inconclusive"
DIFFERS_ABOVE = "differs (above)"
DIFFERS_BELOW = "differs (below)"
NOT_RUN = "not run"
NO_VERDICT = "no verdict (proxy)"


def t_critical(n: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student t quantile with n − 1 degrees of freedom (n = 3, 95%: 4.303)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1)) if n >= 2 else math.nan


def mean_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> Tuple[float, float, int]:
    """(mean, half-width of the confidence interval, n); the half-width is nan for n < 2."""
    v = np.asarray([x for x in values if not pd.isna(x)], dtype=float)
    n = len(v)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(v[0]), math.nan, 1
    return float(v.mean()), t_critical(n, confidence) * float(v.std(ddof=1)) / math.sqrt(n), n


def half_width(std: float, n: int, confidence: float = CONFIDENCE) -> float:
    """The t half-width from an unrounded std over n seeds (nan for n < 2)."""
    return t_critical(n, confidence) * std / math.sqrt(n) if n >= 2 and not pd.isna(std) else math.nan


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


def no_verdict_reason(half: float, n: int) -> str:
    """Why an interval over ``n`` seeds cannot carry a verdict ('' when it can)."""
    if n < 2 or pd.isna(half):
        return f"n = {n}: no interval"
    if n < MIN_N:
        return f"n = {n} < {MIN_N}: too few seeds for a verdict"
    if half <= 0:
        return "zero-width interval: every seed gave the same number"
    return ""


def verdict(mean: float, half: float, published: float, n: int = 2, margin: float = DEFAULT_MARGIN) -> str:
    """agrees within margin / differs (above|below) / inconclusive (module docstring); ``half`` is the
    95% half-width over ``n`` seeds, the 90% TOST interval is derived from it."""
    if pd.isna(mean) or n < 1:
        return NOT_RUN
    why = no_verdict_reason(half, n)
    if why:
        return f"{INCONCLUSIVE} ({why})"
    delta = mean - published
    h90 = half * t_critical(n, 1 - 2 * TOST_ALPHA) / t_critical(n, CONFIDENCE)
    if -margin <= delta - h90 and delta + h90 <= margin and half <= margin:
        return AGREES
    if delta - half > margin:
        return DIFFERS_ABOVE
    if delta + half < -margin:
        return DIFFERS_BELOW
    return INCONCLUSIVE
