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
from typing import Any, Dict, Literal, Mapping, Type, TypeVar, Union, get_args, get_origin

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
    kwargs = {}
    for key, value in overrides.items():
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
