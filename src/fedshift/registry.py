"""Name -> factory registries (timm-style): importing a module registers its entries.

Every user-facing name (datasets, scenarios, public sets, models, structures,
methods) goes through a :class:`Registry`, so an unknown name fails with one error
that lists the valid choices, and ``fedshift list <kind>`` prints them.

Plugins: a registry with an entry-point ``group`` (``fedshift.methods``,
``fedshift.models``, ``fedshift.scenarios``, ``fedshift.public_sets``) also holds what
installed packages declare under that group in their ``pyproject.toml``::

    [project.entry-points."fedshift.methods"]
    fedprox_twist = "fedprox_twist:FedProxTwist"

The entry point's name is the registered name, its object the registered object. They
are loaded the first time the registry is asked a name, so built-ins never wait for
them. A plugin that fails to import, or whose name a built-in (or another plugin)
already holds, is left out with one line naming its package (a warning, and the error
when that name is asked for); the built-ins still work. See docs/extending.md.
"""

from __future__ import annotations

import difflib
import logging
from importlib import metadata
from typing import Callable, Dict, Generic, Iterator, List, Optional, TypeVar

from .errors import ConfigError

T = TypeVar("T")
log = logging.getLogger("fedshift.plugins")


def entry_points(group: str) -> List["metadata.EntryPoint"]:
    """The installed entry points of one group (read afresh: pip may have installed one since)."""
    return list(metadata.entry_points(group=group))


def _dist(ep) -> str:
    d = getattr(ep, "dist", None)
    return f"{d.name} {d.version}" if d is not None else "an unnamed package"


def _caller_module() -> str:
    """The module that registered a name: the first frame outside this file."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "?") if frame is not None else "?"


class Registry(Generic[T]):
    """A mapping from lowercase names to objects, filled by the ``register`` decorator
    and (for a registry with a ``group``) by the installed packages' entry points."""

    def __init__(self, kind: str, group: Optional[str] = None, check: Optional[Callable[[T], str]] = None):
        self.kind = kind
        self.group = group
        self.check = check  # plugin object -> "" or what is wrong with it (e.g. not a Method subclass)
        self._items: Dict[str, T] = {}
        self._origin: Dict[str, str] = {}  # name -> "built-in <module>" or "plugin <package> <version>"
        self.broken: Dict[str, str] = {}  # plugin name -> the one-line reason it was left out
        self._plugins_loaded = group is None

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator: ``@MODELS.register("lenet")`` (defaults to the object's ``__name__``)."""

        def deco(obj: T) -> T:
            key = name or getattr(obj, "__name__")
            self.add(key, obj)
            return obj

        return deco

    def add(self, name: str, obj: T, origin: Optional[str] = None) -> None:
        if name != name.lower():
            raise ValueError(f"{self.kind} names are lowercase, got {name!r}")
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = obj
        if origin or name not in self._origin:
            self._origin[name] = origin or f"built-in {_caller_module()}"

    # -- plugins ------------------------------------------------------------------------
    def load_plugins(self, reload: bool = False) -> None:
        """Register the entry points of ``group`` (once; ``reload`` reads them again)."""
        if self.group is None or (self._plugins_loaded and not reload):
            return
        self._plugins_loaded = True
        for ep in entry_points(self.group):
            if ep.name in self.broken or self._origin.get(ep.name, "").startswith(f"plugin {_dist(ep)}"):
                continue
            self._load_one(ep)

    def _load_one(self, ep) -> None:
        pkg = _dist(ep)
        where = f"{self.kind} plugin {ep.name!r} (entry point {ep.value!r} of package {pkg}, group {self.group})"
        if ep.name in self._items:
            self._refuse(ep.name, f"{where} clashes with the {self.kind} of that name already registered "
                                  f"({self._origin[ep.name]}); rename the entry point")
            return
        if ep.name != ep.name.lower():
            self._refuse(ep.name, f"{where}: {self.kind} names are lowercase; rename the entry point")
            return
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001  any import failure becomes one line naming the package
            first = (str(exc).strip().splitlines() or [""])[0]
            self._refuse(ep.name, f"{where} failed to import: {type(exc).__name__}: {first}")
            return
        own = getattr(obj, "name", None)
        wrong = self.check(obj) if self.check else ""
        if not wrong and isinstance(own, str) and own != ep.name:
            wrong = f"its object is named {own!r}; give the entry point and the object one name"
        if wrong:
            self._refuse(ep.name, f"{where}: {wrong}")
            return
        if ep.name in self._items and self._items[ep.name] is not obj:  # registered by its own import
            self._refuse(ep.name, f"{where} clashes with the {self.kind} of that name already registered "
                                  f"({self._origin[ep.name]}); rename the entry point")
            return
        self._items[ep.name] = obj
        self._origin[ep.name] = f"plugin {pkg} ({ep.value})"

    def _refuse(self, name: str, msg: str) -> None:
        self.broken[name] = msg
        log.warning("%s", msg)

    def origin(self, name: str) -> str:
        """Where a name comes from: ``built-in <module>`` or ``plugin <package> <version> (<object>)``."""
        self.load_plugins()
        return self._origin.get(name) or self.broken.get(name, "unknown")

    # -- look-ups -----------------------------------------------------------------------
    def get(self, name: str, key: str | None = None) -> T:
        """Look a name up; an unknown name raises ConfigError naming the valid ones.

        ``key`` is the config key the name came from, used in the message.
        """
        self.load_plugins()
        try:
            return self._items[name]
        except (KeyError, TypeError):
            where = f"{key}: " if key else ""
            if isinstance(name, str) and name in self.broken:
                raise ConfigError(f"{where}{self.broken[name]}") from None
            close = difflib.get_close_matches(str(name), self._items, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{where}unknown {self.kind} {name!r}{hint}; valid {self.kind}s: "
                + ", ".join(self.names())
            ) from None

    def names(self) -> List[str]:
        self.load_plugins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self.load_plugins()
        return len(self._items)
