"""Resolve input locations. `pkg://<package>/<path>` names a data file shipped inside an
installed Python package (how the real datasets arrive offline); anything else is a path/URI."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from sparkml_dist import storage
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
    local = storage.local_path(path) if "://" not in path or path.startswith("file:") else None
    if local is None:
        return []
    p = local
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_")))
    return []


def fingerprint(paths: list[str]) -> str:
    """sha256 over the input files, for the manifest: names and bytes of local files; names,
    sizes and modification times of remote ones (reading a bucket through to hash it would cost
    more than the job)."""
    digest = hashlib.sha256()
    for path in paths:
        if not local_files(path) and "://" in path and not path.startswith("file:"):
            for entry in _remote_entries(path):
                digest.update(f"{entry.name}:{entry.size}:{entry.mtime_ns}".encode())
            continue
        for f in local_files(path):
            digest.update(f.name.encode())
            digest.update(str(os.path.getsize(f)).encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def _remote_entries(path: str) -> list[storage.Entry]:
    if storage.is_dir(path):
        return [e for e in storage.list_dir(path) if not e.is_dir]
    name = storage.name_of(path)
    return [e for e in storage.list_dir(path.rsplit("/", 1)[0]) if e.name == name]
