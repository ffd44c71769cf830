"""Resolve input locations. `pkg://<package>/<path>` names a data file shipped inside an
installed Python package (how the real datasets arrive offline); anything else is a path/URI."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from sparkml_dist.errors import DataError

PKG_SCHEME = "pkg://"


def resolve_path(location: str) -> str:
    if not location.startswith(PKG_SCHEME):
        return location
    package, _, rel = location[len(PKG_SCHEME):].partition("/")
    spec = importlib.util.find_spec(package)  # does not import the package (its code may be broken)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"{location}: package '{package}' is not installed; run `make setup` "
            f"(it installs the dataset packages listed in requirements/datasets.txt)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.exists():
        raise DataError(f"{location}: no file '{rel}' inside package '{package}' ({path})")
    return str(path)


def local_files(path: str) -> list[Path]:
    """The local files behind a path (file or directory); empty for remote URIs."""
    p = Path(path.removeprefix("file://"))
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_")))
    return []


def fingerprint(paths: list[str]) -> str:
    """sha256 over the contents of the local input files (names and bytes), for the manifest."""
    digest = hashlib.sha256()
    for path in paths:
        for f in local_files(path):
            digest.update(f.name.encode())
            digest.update(str(os.path.getsize(f)).encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()
