"""Dotted overrides of a grid from the command line (issue 39 point 1).

``fedshift run [GRID ...] engine.rounds=3 methods.fedprox.mu=0.1 -- <snakemake args>`` merges
the grid files as ``snakemake --configfile`` does (:func:`fedshift.experiments.snakemake_config`),
sets each ``KEY=VALUE`` (a dotted path; a list item by its index: ``grid.0.seeds=[0,1,2]``),
checks the result as ``fedshift validate`` does and runs Snakemake on the merged file. Values are
YAML (``3`` an int, ``0.1`` and ``1e-4`` floats, ``true`` a bool, ``[0, 1]`` a list).

Snakemake's own ``--config engine='{rounds: 3}'`` parses nested values with YAML's BaseLoader:
every scalar arrives as a string. :func:`coerce_cli_strings` types them the same way (the
workflow calls it on ``--config``'s values before validating). ``--config engine.rounds=3`` is
refused by Snakemake's own argument parser ("must start with a valid identifier"): that is
what ``fedshift run`` is for.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, List, Mapping, Sequence, Tuple

import yaml

from .errors import ConfigError

_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")  # 1e-4, 2.5E3: PyYAML 1.1 reads them as str


def parse_value(text: str) -> Any:
    """A command-line value as YAML would read it in a grid file, with ``1e-4`` a float too. Anchors and aliases
    (``&a``, ``*a``) are refused: a one-line value has no use for them, and an alias bomb expanded by the parser ran
    out of memory after minutes (issue 51 R17; grid files are bounded by config.safe_load_yaml instead)."""
    try:
        if any(isinstance(t, (yaml.AnchorToken, yaml.AliasToken)) for t in yaml.scan(text)):
            raise ConfigError(f"value {text[:60]!r}{'...' if len(text) > 60 else ''}: YAML anchors and aliases (&name, "
                              "*name) are not taken in a command-line value; write the values out")
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"value {text!r} is not valid YAML ({problem}); quote strings with spaces or colons")
    if isinstance(value, str) and _FLOAT.match(value.strip()):
        return float(value)
    return value


def parse_override(item: str) -> Tuple[List[str], Any]:
    """``"methods.fedprox.mu=0.1"`` -> (``["methods", "fedprox", "mu"]``, ``0.1``)."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not key.strip() or any(not p for p in parts):
        raise ConfigError(f"override {item!r}: expected KEY=VALUE with a dotted key, e.g. engine.rounds=3 "
                          "or methods.fedprox.mu=0.1")
    try:
        return parts, parse_value(text)
    except ConfigError as exc:
        raise ConfigError(f"override {key.strip()}: {exc}") from None


# The grid's JSON schema (experiments.SCHEMA; named here so this module stays on the config layer)
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "experiments.schema.yaml"


def _top_keys() -> List[str]:
    schema = yaml.safe_load(SCHEMA.read_text())
    return sorted(set(schema.get("properties") or {}) - {"overlay_of"} | {"data_params", "gpus_per_job", "threads_per_job"})


def apply_overrides(config: Mapping, items: Sequence[str]) -> dict:
    """``config`` with every ``KEY=VALUE`` of ``items`` set (a copy). A missing mapping on the way
    is created (``methods.fedprox.mu`` on a grid without ``methods:``); a list is indexed by number.
    The first key must be a grid key; the keys below are checked by the planner against the
    dataclasses (unknown keys name the valid ones)."""
    out = copy.deepcopy(dict(config))
    valid = _top_keys()
    for item in items:
        parts, value = parse_override(item)
        if parts[0] not in valid:
            import difflib

            close = difflib.get_close_matches(parts[0], valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"override {item!r}: unknown grid key {parts[0]!r}{hint}; valid: {', '.join(valid)}")
        node: Any = out
        for depth, part in enumerate(parts[:-1]):
            where = ".".join(parts[:depth + 1])
            node = _child(node, part, where, item, create=True)
        last, where = parts[-1], ".".join(parts)
        if isinstance(node, list):
            node[_index(node, last, where, item)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"override {item!r}: {'.'.join(parts[:-1])} is {node!r}, not a mapping")
    check_targets(out, items)
    return out


def _grid_names(config: Mapping) -> Tuple[List[str], List[str], List[str]]:
    """(method labels, their base methods, scenarios) the grid's blocks run (unvalidated: read with care)."""
    blocks = [b for b in (config.get("grid") or []) if isinstance(b, Mapping)]
    labels = list(dict.fromkeys(m for b in blocks for m in (b.get("methods") or []) if isinstance(m, str)))
    variants = config.get("variants") if isinstance(config.get("variants"), Mapping) else {}
    bases = list(dict.fromkeys(str((variants.get(m) or {}).get("method", m)) if isinstance(variants.get(m), Mapping)
                               else m for m in labels))
    scenarios = list(dict.fromkeys(s for b in blocks for s in (b.get("scenarios") or []) if isinstance(s, str)))
    return labels, bases, scenarios


def check_targets(config: Mapping, items: Sequence[str]) -> None:
    """Refuse, in one line, a command-line override of a method, variant or scenario that ``config`` (the grid
    after every override) does not run: it would change nothing (issue 50; the README's own
    ``methods.fedprox.mu=0.1`` on a grid without FedProx planned without a word). ``items``: ``KEY=VALUE``
    or dotted keys (``coerce_cli_strings``' list for ``snakemake --config``). A misspelt key of a method the
    grid runs is refused by the planner with did-you-mean (the Params dataclass)."""
    import difflib

    labels, bases, scenarios = _grid_names(config)
    for item in items:
        parts = item.partition("=")[0].strip().split(".")

        def refuse(name: str, valid: List[str], kind: str, key: str) -> None:
            if name in valid:
                return
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"override {item!r}: the grid runs no {kind} {name!r}{hint}, so {key} would change "
                              f"nothing; the grid's {kind}s: {', '.join(valid) or 'none'}")

        if len(parts) < 2:
            continue
        if parts[0] == "methods":
            refuse(parts[1], bases, "method", f"methods.{parts[1]}")
        elif parts[0] == "variants":
            refuse(parts[1], labels, "method", f"variants.{parts[1]}")
        elif parts[0] == "scenario_overrides":
            refuse(parts[1], scenarios, "scenario", f"scenario_overrides.{parts[1]}")
            if len(parts) > 3 and parts[2] == "methods":
                refuse(parts[3], bases, "method", f"scenario_overrides.{parts[1]}.methods.{parts[3]}")


def _index(seq: list, part: str, where: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(seq):
        raise ConfigError(f"override {item!r}: {where}: {part!r} is not an index of this list "
                          f"(0..{len(seq) - 1})")
    return int(part)


def _child(node: Any, part: str, where: str, item: str, create: bool) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, where, item)]
    if not isinstance(node, dict):
        raise ConfigError(f"override {item!r}: {where.rsplit('.', 1)[0]} is {node!r}, not a mapping")
    if node.get(part) is None and create:
        node[part] = {}
    return node[part]


def _typed(value: Any) -> Any:
    """A ``--config`` leaf typed as YAML would (strings that are not valid YAML stay strings)."""
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, str):
        try:
            return parse_value(value)
        except ConfigError:
            return value
    return value


def coerce_cli_strings(config: dict, given: Mapping) -> List[str]:
    """Type the values Snakemake's ``--config`` passed as strings (``given``: its parsed
    ``--config`` mapping), in ``config`` (the merged workflow config, changed in place): a
    string leaf of ``given`` (or of a list in it) becomes :func:`parse_value` of it. Returns the
    dotted keys it set."""
    done: List[str] = []

    def walk(sub: Mapping, prefix: List[str]) -> None:
        for key, value in sub.items():
            path = prefix + [str(key)]
            if isinstance(value, Mapping):
                walk(value, path)
                continue
            typed = _typed(value)
            node = config
            for part in path[:-1]:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            node[path[-1]] = typed
            done.append(".".join(path))

    walk(given, [])
    return done
