"""One colour per method in every figure of a report, from a qualitative palette in the grid's method order.

The grid's methods take the palette's colours in the order the grid lists them (``report.method_order``,
written by :func:`fedshift.experiments.load_experiments`), so no two methods of one grid share a colour
(up to :func:`palette`'s length) whatever their names: a plugin beside MOON, FedAvgM beside FedAvg. Rows the
grid does not list (the report's ``base_pretrain``) follow, sorted. The palette is matplotlib's tab10 (the
most distinct ten: the grid's first methods), then tab20's light shades, then tab20b, without their greys
(grid lines, seed bands and neutral text are grey: a grey method line reads as background).
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Sequence, Tuple

Colour = Tuple[float, float, float, float]


def palette():
    from matplotlib import colormaps

    pal = ([colormaps["tab10"](i) for i in range(10)] + [colormaps["tab20"](i) for i in range(1, 20, 2)]
           + [colormaps["tab20b"](i) for i in range(20)])
    return [c for c in pal if not _grey(c)]


def _grey(colour) -> bool:
    r, g, b = colour[:3]
    return max(r, g, b) - min(r, g, b) < 0.02


def _name(method: str) -> str:
    return str(method).split(" ")[0]  # "base (federated schedule)" is base


def method_colours(methods: Iterable[str], order: Optional[Sequence[str]] = None) -> Dict[str, Colour]:
    """method -> colour: a method of ``order`` (the grid's methods, in its order) takes the colour of its
    position there, any other the next free colours in sorted order, so a method keeps its colour in every
    figure of the report whatever subset a figure shows."""
    methods = list(methods)
    order = list(dict.fromkeys(order or []))
    extra = sorted({_name(m) for m in methods} - set(order))
    slots = {m: i for i, m in enumerate(order + extra)}
    pal = palette()
    return {m: pal[slots[_name(m)] % len(pal)] for m in methods}
