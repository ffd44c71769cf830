"""The input formats by name (`data.format`, `stream.format`): one registry entry per kind of
source, and the sniffing that picks one from a path's extension or a directory's files.

An entry is light (no pyspark: reading a config needs it): what the format is and its reader as
a 'module:function' string, imported only where rows are read. A new format is a reader
(`(spark, path, location, DataConfig) -> RawRows`, see `data/sources.py`) and one
`SOURCE_FORMATS.register(SourceFormat(...))` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from sparkml_dist.registry import Registry, resolve

__all__ = [
    "SOURCE_FORMATS",
    "SourceFormat",
    "format_of",
    "format_of_files_in",
    "named_format",
    "register_source_format",
]


@dataclass(frozen=True)
class SourceFormat:
    """One `data.format`.

    `typed`: the source's own schema gives the columns and their types (data.columns only
    overrides roles); else the rows are text read by position, and data.columns lists every
    column in file order with its type. `extensions`: the file names that say this format.
    `catalog`: its location is a table's name, not a path (nothing to sniff, nothing to stream
    from as files)."""

    name: str
    reader: str
    typed: bool = True
    extensions: tuple[str, ...] = ()
    catalog: bool = False

    def read(self, *args: Any) -> Any:
        return resolve(self.reader)(*args)


SOURCE_FORMATS: Registry[SourceFormat] = Registry("data.format")


def register_source_format(fmt: SourceFormat, *, replace: bool = False) -> SourceFormat:
    """Make `fmt` a `data.format` (and `stream.format`) value, and its extensions name it."""
    return SOURCE_FORMATS.register(fmt.name, fmt, replace=replace)


_SOURCES = "sparkml_dist.data.sources"
for _builtin in (
    SourceFormat("csv", f"{_SOURCES}:read_csv", typed=False, extensions=(".csv",)),
    SourceFormat("parquet", f"{_SOURCES}:read_typed", extensions=(".parquet", ".pq")),
    SourceFormat("orc", f"{_SOURCES}:read_typed", extensions=(".orc",)),
    SourceFormat("json", f"{_SOURCES}:read_typed", extensions=(".json", ".jsonl")),
    SourceFormat("table", f"{_SOURCES}:read_typed", catalog=True),
):
    register_source_format(_builtin)

# what a path that names no format, in a directory whose files name none, is read as
DEFAULT_FORMAT = "csv"


def format_of(path: str, declared: str | None) -> str:
    """`data.format`, or the one the path's extension names, or for a local directory the one its
    files' extensions name (Spark writes a Parquet or ORC table as a directory of part files);
    csv when none names one."""
    if declared:
        return declared
    return named_format(path) or format_of_files_in(path) or DEFAULT_FORMAT


def named_format(path: str) -> str | None:
    """The format a path's extension names, if one does."""
    # Spark reads gzip and bzip2 text files as they are: rows.json.gz is JSON lines
    lower = path.lower().rstrip("/").removesuffix(".gz").removesuffix(".bz2")
    for name, fmt in SOURCE_FORMATS:
        if any(lower.endswith((ext, ext + "/*")) for ext in fmt.extensions):
            return name
    return None


def format_of_files_in(path: str, look_at: int = 1000) -> str | None:
    """The one format that the data files of a local directory name (None: not a local directory,
    or its files name none or several)."""
    if ":" in path:  # a URI: only then is the storage module (pyarrow) needed to say whose files
        from sparkml_dist.storage import is_remote  # pyarrow: not while a config is read

        if is_remote(path):
            return None
    folder = Path(path.removeprefix("file://").removeprefix("file:"))
    if not folder.is_dir():
        return None
    names = (f.name for f in folder.rglob("*") if not f.name.startswith((".", "_")))
    found = {named_format(name) for name in islice(names, look_at)}
    found.discard(None)
    return found.pop() if len(found) == 1 else None
