"""`pkg://<package>/<path>`: a data file shipped inside an installed Python package (how the
real datasets arrive offline), resolved to its path without importing the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sparkml_dist.errors import DataError

PKG_SCHEME = "pkg://"


def resolve_path(location: str) -> str:
    """A `pkg://` location as the file's path; anything else unchanged."""
    if not location.startswith(PKG_SCHEME):
        return location
    package, _, rel = location[len(PKG_SCHEME) :].partition("/")
    spec = importlib.util.find_spec(package)  # does not import the package (its code may be broken)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"{location}: package '{package}' is not installed; run `make setup` "
            f"(it installs the dataset packages listed in requirements/datasets.txt)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.exists():
        raise DataError(f"{location}: no file '{rel}' inside package '{package}' ({path})")
    return str(path)
