"""What schedule a table's runs trained on, said from the runs themselves (``runs.csv`` / the records): rounds x
local epochs per method, grouped where methods share one; a stepwise method's rounds (FedH2L, AGG, IND: one
minibatch step per participant per round, ``engine.local_epochs`` not theirs) as steps; the papers' SOLO/BASE row
(``base_pretrain``) as pretraining only. Used by the docs' generated tables (fedshift.archive.docs), which
know the methods; this layer does not import them."""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional

import pandas as pd

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


def schedules(runs: pd.DataFrame, stepwise: Optional[Callable[[str], bool]] = None) -> Dict[str, str]:
    """{method: its schedule} in the runs' method order. ``stepwise(base_method)``: whether a method takes one
    minibatch step per round (the caller knows the methods; this layer does not import them)."""
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
        elif stepwise is not None and stepwise(base):
            out[method] = f"{int(rounds):,} rounds of one minibatch step"
        else:
            out[method] = f"{int(rounds):,} rounds" + (f" x {epochs} local epoch{'s' if epochs != '1' else ''}"
                                                       if epochs else "")
    return out
