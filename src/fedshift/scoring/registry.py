"""The scoring registry and what an entry of it is (:class:`Scorer`); :mod:`fedshift.scoring` documents them."""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

from ..registry import Registry


class Scorer:
    """A metric set of the scoring registry: what each evaluation adds to the per-domain rows."""

    name: str = ""
    #: its rows go to rounds.csv (and, under engine.select: best_val, the validation rows with them)
    rows: bool = False

    def extras(self, rows: Sequence[Mapping], sizes: Mapping[str, int]) -> Tuple[List[dict], Dict[str, float]]:
        """(rows, metrics) from one evaluation's per-domain ``rows`` (participant, arch, domain, kind, top1,
        top5) and the test-set sizes per domain."""
        raise NotImplementedError


SCORERS: "Registry[type]" = Registry(
    "scorer", group="fedshift.scorers",
    check=lambda obj: "" if isinstance(obj, type) and issubclass(obj, Scorer) else "not a subclass of fedshift.scoring.Scorer")


def scorers(names: Sequence[str], where: str = "scoring.metrics") -> List[Scorer]:
    """The registry's scorers of ``names`` (an unknown name: one line listing the known ones)."""
    return [SCORERS.get(n, key=where)() for n in names]

