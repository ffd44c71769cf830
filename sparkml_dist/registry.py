"""One registry per axis of growth (training methods, communication backends, ...).

An entry is registered once, by name, from the module that defines it. Built-in entries are
found like plugins: by module name, imported on the first lookup, so that reading a config does
not import torch and the modules that register depend on this one, never the other way round.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from sparkml_dist.errors import ConfigError

T = TypeVar("T")


def resolve(reference: str) -> Callable[..., Any]:
    """The function a registry entry names as 'module:function', imported where it is called:
    an entry stays light (reading a config imports neither torch nor pyspark), and any process
    (a rank, an executor, a served model) finds the function by its module."""
    module, sep, function = reference.partition(":")
    if not sep or not module or not function:
        raise ConfigError(f"{reference!r}: a registry entry names a function as 'module:function'")
    return getattr(importlib.import_module(module), function)


class Registry(Generic[T]):
    """Name -> entry for one config key (e.g. `train.strategy`)."""

    def __init__(self, key: str, builtin_modules: tuple[str, ...] = ()):
        self.key = key
        self._builtin_modules = builtin_modules
        self._entries: dict[str, T] = {}
        self._lock = threading.RLock()
        self._loaded = False

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add `entry` under `name`. Registering the same name twice is an error unless
        `replace=True` or it is the very same entry (a module imported twice, e.g. by a worker)."""
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"{self.key}: {name!r} is not a valid name (letters, digits, '_' and '-')")
        with self._lock:
            current = self._entries.get(name)
            if current is not None and not replace and not _same_entry(current, entry):
                raise ValueError(
                    f"{self.key}={name} is registered already ({current!r}); pass replace=True to override it"
                )
            self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The entry, or a ConfigError that names the key and every known choice."""
        self._load_builtins()
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(
                f"{self.key}: unknown value {name!r}; known: {', '.join(self.names())}. "
                f"A new one is registered from its own module (see docs/architecture.md)"
            )
        return entry

    def names(self) -> list[str]:
        self._load_builtins()
        with self._lock:
            return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        self._load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[tuple[str, T]]:
        names = self.names()
        return iter([(n, self._entries[n]) for n in names])

    def _load_builtins(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # set first: a built-in module may look itself up while importing
            for module in self._builtin_modules:
                importlib.import_module(module)


def _same_entry(a: object, b: object) -> bool:
    """The same definition seen twice: equal objects, or objects of the same class and name from
    the same module (a re-imported module makes new but identical instances)."""
    if a is b or a == b:
        return True
    return (type(a).__qualname__, type(a).__module__, getattr(a, "name", None)) == (
        type(b).__qualname__,
        type(b).__module__,
        getattr(b, "name", None),
    )
