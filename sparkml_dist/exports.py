"""Lazy public names: a package lists where each of its names lives, and imports the module on
first use, so that importing the package starts no Spark and imports no torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: `exports` maps a public name to the module that
    defines it; a name once imported is kept in `namespace` (the package's globals), so later
    lookups do not come back here."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
