"""One colour per method in every figure of a report: the colour depends on the method's name only.

The papers' methods take fixed slots of a 40-colour palette (matplotlib's tab10, then tab20's light
shades, then tab20b: the first ten are the most distinct and go to the most common methods) in the
order of :data:`KNOWN`; the greys of tab10 / tab20 are left out (grid lines, seed bands and the
neutral text are grey: a grey method line read as background, and FedH2L's and IND's were two greys
in one Table II figure); any other name (a variant, a plugin) takes a slot from a CRC32 of its name, so
it too keeps its colour from figure to figure and from report to report.
"""

from __future__ import annotations

import zlib
from typing import Dict, Iterable, Tuple

KNOWN = ("fedavg", "fccl_plus", "base_pretrain", "fedmd", "base", "fccl", "fedprox", "fedh2l", "fedmmd", "feddf",
         "moon", "fedproc", "fedrs", "fedmatch", "rhfl", "fml", "rcfl", "ind", "agg", "fedfusion_single",
         "fedfusion_multi", "fedfusion_conv", "l2", "solo", "moon_tau5", "moon_tau1", "fedh2l_async")


def _palette():
    from matplotlib import colormaps

    pal = ([colormaps["tab10"](i) for i in range(10)] + [colormaps["tab20"](i) for i in range(1, 20, 2)]
           + [colormaps["tab20b"](i) for i in range(20)])
    return [c for c in pal if not _grey(c)]


def _grey(colour) -> bool:
    r, g, b = colour[:3]
    return max(r, g, b) - min(r, g, b) < 0.02


def method_colour(method: str) -> Tuple[float, float, float, float]:
    pal = _palette()
    name = str(method).split(" ")[0]  # "base (federated schedule)" is base
    i = KNOWN.index(name) if name in KNOWN else len(KNOWN) + zlib.crc32(name.encode()) % (len(pal) - len(KNOWN))
    return pal[i % len(pal)]


def method_colours(methods: Iterable[str]) -> Dict[str, Tuple[float, float, float, float]]:
    return {m: method_colour(m) for m in methods}
