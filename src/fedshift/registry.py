"""Name -> factory registries (timm-style): importing a module registers its entries.

Every user-facing name (datasets, scenarios, public sets, models, structures,
methods) goes through a :class:`Registry`, so an unknown name fails with one error
that lists the valid choices, and ``fedshift list <kind>`` prints them.
"""

from __future__ import annotations

import difflib
from typing import Callable, Dict, Generic, Iterator, List, TypeVar

from .errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from lowercase names to objects, filled by the ``register`` decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: Dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator: ``@MODELS.register("lenet")`` (defaults to the object's ``__name__``)."""

        def deco(obj: T) -> T:
            key = name or getattr(obj, "__name__")
            self.add(key, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        if name != name.lower():
            raise ValueError(f"{self.kind} names are lowercase, got {name!r}")
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = obj

    def get(self, name: str, key: str | None = None) -> T:
        """Look a name up; an unknown name raises ConfigError naming the valid ones.

        ``key`` is the config key the name came from, used in the message.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            where = f"{key}: " if key else ""
            close = difflib.get_close_matches(str(name), self._items, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{where}unknown {self.kind} {name!r}{hint}; valid {self.kind}s: "
                + ", ".join(self.names())
            ) from None

    def names(self) -> List[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
