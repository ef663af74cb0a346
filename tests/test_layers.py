"""The import graph of src/fedshift: every import goes down the layers, no circles, no
module that nothing imports.

Layers, bottom to top (docs/extending.md draws them); a module may import its own unit
(the same subpackage, e.g. engine -> engine) or any unit on a lower layer, nothing on
its own layer from another unit and nothing above:

    0 errors
    1 config, registry, losses, overrides (dotted KEY=VALUE overrides of a grid)
    2 data, models
    3 tracking
    4 engine (round loop, evaluation, checkpoints), report (tables, figures)
    5 methods (stand on the engine)
    6 runner (the composition: builds data, models and method from a config, drives the engine),
      resources (the memory a job needs, from its config: SLURM's mem_mb)
    7 experiments (the grid)
    8 tune (tune, then run)
    9 archive (the committed run records: staleness against the grid, the docs' generated tables)
    10 cli, the package itself, testing (tiny federations and the resume check for tests)

Every import counts, lazy ones inside functions too (they run as well); only imports
under ``if TYPE_CHECKING:`` are left out. Imports are read with ``ast``, nothing is run.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

from conftest import REPO

SRC = REPO / "src"
LAYERS = {
    "fedshift.errors": 0,
    "fedshift.config": 1, "fedshift.registry": 1, "fedshift.losses": 1, "fedshift.overrides": 1,
    "fedshift.data": 2, "fedshift.models": 2,
    "fedshift.tracking": 3, "fedshift.provenance": 3,
    "fedshift.engine": 4, "fedshift.report": 4,
    "fedshift.methods": 5,
    "fedshift.runner": 6, "fedshift.resources": 6,
    "fedshift.experiments": 7,
    "fedshift.tune": 8,
    "fedshift.archive": 9,
    "fedshift.cli": 10, "fedshift.testing": 10, "fedshift": 10,
}
ENTRY = {"fedshift", "fedshift.cli", "fedshift.cli.__main__", "fedshift.testing"}  # the package, the console script
# (and `python -m fedshift.cli`, which the rules and tests run), and what tests import

# Known, owned by another issue; the coordinator empties it once that issue is merged.
KNOWN_CIRCLES: list = []  # the report circle was cut when the report half of issue 22 landed
KNOWN_UNUSED: set = set()  # engine/fused.py is called since issue 25 landed: nothing is exempt


def modules() -> Dict[str, Path]:
    out = {}
    for path in sorted((SRC / "fedshift").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The fedshift modules ``name`` imports (``from pkg import mod`` -> pkg.mod when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    out = set()
    for target in found:
        while target and target not in known:  # fedshift.data.store.x -> fedshift.data.store
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def graph() -> Dict[str, Set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def layer(mod: str) -> Tuple[str, int]:
    unit = max((u for u in LAYERS if mod == u or mod.startswith(u + ".")), key=len)
    return unit, LAYERS[unit]


def test_every_module_has_a_layer():
    assert all(layer(m) for m in graph())


def test_no_import_runs_up_or_across():
    wrong = []
    for mod, targets in graph().items():
        unit, lvl = layer(mod)
        for t in sorted(targets):
            tunit, tlvl = layer(t)
            if tunit != unit and tlvl >= lvl:
                wrong.append(f"{mod} (layer {lvl}) imports {t} (layer {tlvl})")
    assert not wrong, "\n".join(wrong)


def circles(g: Dict[str, Set[str]]) -> List[Set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    out: List[Set[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_no_import_circle():
    found = [c for c in circles(graph()) if c not in KNOWN_CIRCLES]
    assert not found, found


def test_no_module_that_nothing_imports():
    g = graph()
    used = set().union(*g.values())
    used |= {m.rpartition(".")[0] for m in used}  # a package's __init__ runs when a module of it is imported
    unused = sorted(set(g) - used - ENTRY - KNOWN_UNUSED)
    assert not unused, unused


def test_the_checks_can_fail():
    """The graph reader sees lazy, relative and ``from pkg import module`` imports, and the
    circle finder finds a circle (so the tests above pass for the right reason)."""
    g = graph()
    assert "fedshift.methods.base" in g["fedshift.runner"] or "fedshift.methods" in g["fedshift.runner"]
    assert "fedshift.runner" in g["fedshift.cli.jobs"]  # `from .. import runner` inside a function
    assert "fedshift.cli.jobs" in g["fedshift.cli"]  # `from . import jobs` inside main
    assert "fedshift.methods.fedavg" in g["fedshift.methods"]  # `from . import fedavg` in __init__
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert layer("fedshift.engine.federation") == ("fedshift.engine", 4)


# Inside a unit that issue 35 split by idea, its modules go down too: fedshift.report's paper delta
# (shared frames and statistics, the papers' data, the computations, their rendering, the section) and
# fedshift.tracking (how a call is made, the store, the adapter, the job policy, the package's interface),
# fedshift.losses (the shared helpers, one module per kind of loss, the package's interface) and
# fedshift.cli (one module per command group, the parser that dispatches to them, `python -m`).
SUBLAYERS = {
    "fedshift.report": {
        "stats": 0, "frames": 0, "palette": 0,
        "published": 1,
        "ours": 2, "verdicts": 2, "claims": 2,
        "delta_markdown": 3, "delta_figures": 3,
        "paper_delta": 4,
        "report": 5,
    },
    "fedshift.tracking": {"base": 0, "calls": 0, "store": 1, "mlflow_adapter": 2, "jobs": 3, "": 4},
    "fedshift.losses": {
        "_common": 0,
        "classification": 1, "correlation": 1, "distillation": 1, "regularization": 1,
        "contrastive": 1, "consensus": 1, "h2l": 1, "domain": 1,
        "": 2,
    },
    "fedshift.cli": {"names": 0, "data_stages": 0, "jobs": 0, "grid": 0, "reporting": 0, "mlflow_store": 0,
                     "": 1, "__main__": 2},
}


def test_split_units_import_downward():
    g = graph()
    wrong = []
    for unit, levels in SUBLAYERS.items():
        def full(name):
            return f"{unit}.{name}" if name else unit
        for name, lvl in levels.items():
            for t in sorted(g[full(name)]):
                tname = next((n for n in levels if full(n) == t), None)
                if tname is not None and levels[tname] >= lvl:
                    wrong.append(f"{full(name)} (level {lvl}) imports {t} (level {levels[tname]})")
    assert not wrong, "\n".join(wrong)
