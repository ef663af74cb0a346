"""What schedule a table's runs trained on, said from the runs themselves (``runs.csv`` / the records): rounds x
local epochs per method, grouped where methods share one; a stepwise method's rounds (FedH2L, AGG, IND: one
minibatch step per participant per round, ``engine.local_epochs`` not theirs) as steps; the papers' SOLO/BASE row
(``base_pretrain``) as pretraining only. Used by the report's tables and the docs' generated tables."""

from __future__ import annotations

from typing import Dict, List, Mapping

import pandas as pd

from ..errors import ConfigError
from .collect import PRETRAIN_METHOD


def first(sub: pd.DataFrame, col: str) -> str:
    """The column's distinct non-empty values, joined."""
    vals = sub[col].dropna().astype(str).unique() if col in sub.columns else []
    return ", ".join(sorted(v for v in vals if v)) if len(vals) else ""


def grouped(values: Mapping[str, str]) -> str:
    """``{method: text}`` as one text when every method has it, else ``text (m1, m2); text (m3)``."""
    by: Dict[str, List[str]] = {}
    for method, text in values.items():
        by.setdefault(text, []).append(method)
    if len(by) == 1:
        return next(iter(by))
    return "; ".join(f"{text} ({', '.join(ms)})" for text, ms in by.items())


def _stepwise(base: str) -> bool:
    from ..methods import METHODS
    from ..methods.stepwise import StepwiseMethod

    try:
        return issubclass(METHODS.get(base), StepwiseMethod)
    except (ConfigError, KeyError):  # a plugin's method not installed here: its epochs as recorded
        return False


def schedules(runs: pd.DataFrame) -> Dict[str, str]:
    """{method: its schedule} in the runs' method order."""
    out: Dict[str, str] = {}
    for method, sub in runs.groupby("method", sort=False):
        ep = pd.to_numeric(sub["local_epochs"], errors="coerce").dropna().unique() if "local_epochs" in sub else []
        epochs = ", ".join(f"{e:g}" for e in sorted(ep))  # 2, not the 2.0 a column with a pretrain row's NaN holds
        rounds = pd.to_numeric(sub["round"], errors="coerce").max()
        base = first(sub, "base_method") or str(method)
        if method == PRETRAIN_METHOD:  # its rows sit at the federated runs' last round; it trained none
            out[method] = "pretraining only, no federated round"
        elif rounds != rounds:
            out[method] = "rounds not recorded"
        elif _stepwise(base):
            out[method] = f"{int(rounds):,} rounds of one minibatch step"
        else:
            out[method] = f"{int(rounds):,} rounds" + (f" x {epochs} local epoch{'s' if epochs != '1' else ''}"
                                                       if epochs else "")
    return out


def schedule_note(runs: pd.DataFrame) -> str:
    """``Schedule, from the runs: ...`` for one table."""
    return f"Schedule, from the runs: {grouped(schedules(runs))}." if len(runs) else ""
