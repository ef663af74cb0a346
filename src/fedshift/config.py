"""Typed configuration: dataclass defaults + YAML overrides, checked key by key.

Every component (method, scenario, dataset, engine) declares its hyper-parameters as
a dataclass whose fields carry commented defaults; YAML only overrides. ``resolve``
rejects unknown keys (naming the valid ones) and wrong types before any job starts.
"""

from __future__ import annotations

import dataclasses
import math
import difflib
import types
import typing
from typing import Any, Dict, Literal, Mapping, Sequence, Type, TypeVar, Union, get_args, get_origin

from .errors import ConfigError

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin in (list, tuple):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against type ``tp``; return it converted (int -> float, list -> tuple)."""
    origin = get_origin(tp)
    bad = ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    if tp is Any:
        return value
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{where}: invalid value {value!r}; valid: {', '.join(map(repr, get_args(tp)))}")
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                continue
        raise bad
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad
        args = [a for a in get_args(tp) if a is not Ellipsis]
        items = [_coerce(v, args[0], f"{where}[{i}]") if args else v for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # NaN/inf lr, weight_decay, lam, mu, tau... fail here, not in round 1
                raise ConfigError(f"{where}: {value!r} is not a finite number")
            return float(value)
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    if dataclasses.is_dataclass(tp):
        return resolve(tp, value, where)
    if isinstance(value, tp):
        return value
    raise bad


def resolve(cls: Type[T], overrides: Mapping[str, Any] | None, where: str) -> T:
    """Instantiate dataclass ``cls`` from its defaults updated with ``overrides``.

    ``where`` names the config location in error messages (e.g. ``methods.fccl_plus``).
    """
    overrides = {} if overrides is None else overrides
    if isinstance(overrides, cls):
        return overrides
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} keys, got {overrides!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    moved = getattr(cls, "moved_keys", None) or {}  # a ClassVar: keys that live elsewhere now
    kwargs = {}
    for key, value in overrides.items():
        if key not in fields and key in moved:
            raise ConfigError(f"{where}.{key}: this key moved to {moved[key]}; set it there")
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{where}.{key}: unknown key{hint}; valid keys: {', '.join(sorted(fields))}"
            )
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    try:
        obj = cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return obj


def to_dict(obj: Any) -> Dict[str, Any]:
    """Dataclass -> plain dict with lists for tuples (YAML/JSON friendly)."""

    def conv(v):
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    return conv(obj)


def flatten(d: Mapping[str, Any], prefix: str = "", sep: str = ".") -> Dict[str, Any]:
    """Nested mapping -> {"a.b.c": value} (for MLflow params)."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key, sep))
        else:
            out[key] = v
    return out


def values_text(values: Mapping[str, Any]) -> str:
    """``lr=0.01 beta=0.9``: tuned values (a tuning candidate's, or a tune's choice) as one short phrase,
    ``engine.`` dropped: MLflow run names and tags, the report's ``tuned`` column (issue 50)."""
    return " ".join(f"{str(k).replace('engine.', '')}={v}" for k, v in values.items())


# ------------------------------------------------------------------------- YAML with bounded aliases
YAML_MIN_NODES = 100_000  # expanded values any file may hold; past it, at most 10x its distinct values


def safe_load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` whose aliases may not expand the document past ``max(YAML_MIN_NODES,
    10 x its distinct values)`` values (issue 38: a 580-byte alias bomb passed ``validate`` and
    exhausted memory when the values were walked). Anchors and aliases used as shorthand (the
    grids' shared ``methods`` lists) stay well under it. Raises :class:`ConfigError` naming
    ``where``; YAML syntax errors propagate as ``yaml.YAMLError`` (callers name line and column)."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        memo: Dict[int, int] = {}

        def size(n, active=()) -> int:
            if id(n) in memo:
                return memo[id(n)]
            if id(n) in active:
                raise ConfigError(f"{where}: a YAML alias refers to itself (recursive anchor); write the values out")
            total = 1
            if isinstance(n, yaml.SequenceNode):
                total += sum(size(c, active + (id(n),)) for c in n.value)
            elif isinstance(n, yaml.MappingNode):
                total += sum(size(k, active + (id(n),)) + size(v, active + (id(n),)) for k, v in n.value)
            memo[id(n)] = total = min(total, 1 << 62)
            return total

        expanded = size(node)
        limit = max(YAML_MIN_NODES, 10 * len(memo))
        if expanded > limit:
            raise ConfigError(f"{where}: YAML aliases expand {len(memo):,} values into {expanded:,}, more than "
                              f"{limit:,} (an alias bomb?); write the values out or nest fewer aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml_file(path, required: Sequence[str] = (), fix: str = "") -> Any:
    """A YAML file read with :func:`safe_load_yaml`: a missing file, a syntax error (``file:line:column``) or, when
    ``required`` is given, a document that is not a mapping holding those keys is one :class:`ConfigError` ending
    with ``fix`` (issue 51 Q19: a run folder's config.yaml without ``engine:`` was a KeyError traceback, an invalid
    one a ParserError traceback)."""
    import yaml
    from pathlib import Path

    path = Path(path)
    tail = f"; {fix}" if fix else ""
    if not path.is_file():
        raise ConfigError(f"missing config file {path}{tail}")
    try:
        data = safe_load_yaml(path.read_text(), str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)  # file:line:column
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML: {problem}{tail}") from None
    if required:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping with the keys {', '.join(required)}, got "
                              f"{type(data).__name__}{tail}")
        missing = [k for k in required if k not in data]
        if missing:
            raise ConfigError(f"{path}: missing key {missing[0]!r}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}"
                              f"{tail}")
    return data
